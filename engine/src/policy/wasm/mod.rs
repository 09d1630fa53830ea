//! The WebAssembly policy host: resume policies as sandboxed plugins that
//! operators replace while the server runs.
//!
//! A policy is a wasm module that imports nothing and exports `memory`,
//! `rewind_abi_version`, `rewind_facts_ptr` and `rewind_decide` (see
//! [`rewind_policy_sdk`]; plugins are written with its `rewind_policy!`
//! macro). [`PolicyHost`] runs one *generation* at a time and implements
//! the engine's [`Policy`](crate::policy::Policy) trait.
//!
//! # What the host does
//!
//! - **Load** ([`PolicyHost::load`], [`PolicyHost::load_file`], memory-mapped):
//!   compile with Cranelift (in this process, or in a child process that
//!   keeps the compiler's code and a hostile module's compile out of this
//!   one: [`PolicyCompiler`]), then refuse, with a [`LoadError`] that says
//!   what is wrong, any module that is not wasm, imports anything, lacks an
//!   export or has one of the wrong type, starts with more memory than the
//!   cap, declares another ABI version, or points its facts buffer outside
//!   memory or off 8-byte alignment.
//! - **Validate** ([`PolicyHost::validate`]): run the candidate on every
//!   row of the decision table and a seeded stream of random facts
//!   ([`vectors`]), under the real budgets. Any trap, exhausted budget or
//!   verdict outside the row's safe set fails it, with a
//!   [`ValidationReport`] naming the facts and what happened.
//! - **Swap** ([`PolicyHost::swap`]): a validated module becomes the next
//!   generation (numbered from 1), published through an
//!   [`ArcSwap`](arc_swap::ArcSwap). Each thread keeps its own instance of the
//!   generation it last used; a decision checks the live generation number
//!   (one atomic load; the `ArcSwap` is read, wait-free, only when it
//!   changed) and makes one typed call: no instantiation, no lock. A
//!   thread picks up a new generation on its next decision; a decision
//!   already running finishes on the module it started with (the thread
//!   holds an `Arc` to it).
//! - **Contain** every call: fuel, deadline and memory are re-armed per
//!   decision. A trap, an exhausted budget or an answer outside
//!   `facts.allowed` becomes `facts.default()`, the fault is reported in
//!   [`PolicyAnswer::fault`](crate::policy::PolicyAnswer) and counted on the
//!   generation ([`GenerationStats`]); after a trap the thread's instance is
//!   thrown away and re-created, since its memory may be half-updated.
//! - **Roll back** ([`PolicyHost::rollback`]) to the previous good
//!   generation on command, and automatically when a generation's fault
//!   rate passes [`AutoRollback::max_fault_rate`] after
//!   [`AutoRollback::min_decisions`].
//!
//! # Why each budget exists
//!
//! A policy runs on every reconnect, so it must not be able to take more
//! than a bounded slice of the server. Fuel bounds its instructions
//! (deterministic: a loop stops after the same work everywhere, which makes
//! validation reproducible); the epoch deadline, advanced by a ticker thread
//! every [`PolicyHostConfig::epoch_tick`], bounds its wall-clock time even
//! where fuel under-counts; `StoreLimits` caps its memory (a growth bomb
//! traps at the cap); a small `max_wasm_stack` turns runaway recursion into
//! a trap instead of a crashed host thread. None of these can make a
//! decision looser: every fallback is the host's own default verdict, which
//! is in the safe set by construction (invariant 6 in `docs/invariants.md`).
//!
//! # Files, and who may import whom
//!
//! Each concept has one owner, and imports only go down this list (a file
//! uses only files above it; none imports one below, so there are no
//! circles). Besides these, files use `crate::policy` (the trait,
//! [`PolicyFault`](crate::policy::PolicyFault), the SDK's types), never the
//! other way round.
//!
//! ```text
//! config      budgets and switches                     (no sibling imports)
//! vectors     the facts validation runs on             (no sibling imports)
//! plugins     the embedded .wasm files                 (no sibling imports)
//! ticker      the epoch thread                         (no sibling imports)
//! stats       per-generation counters, status types    (no sibling imports)
//! report      what validation found                    (no sibling imports)
//! error       what can go wrong                        <- report
//! compiler    wasm to machine code, here or in a child <- config, error
//! instance    one Store + typed call                   <- config, error
//! module      compile and check at load                <- compiler, config, error, instance
//! validate    run a candidate on the vectors           <- config, instance, module, report, vectors
//! generation  a published module; the live pointer     <- config, module, stats
//! cache       per-thread instances, the hot path       <- generation, instance
//! host        PolicyHost: load, swap, roll back        <- cache, compiler, config, error, generation,
//!                                                         module, plugins, report, stats,
//!                                                         ticker, validate
//! ```
//!
//! An instance is built from a compiled module and the budgets only; the
//! cache is handed only the `generation::LiveGeneration` (never the
//! host), and reports faults in its answer, on which the host applies the
//! automatic-rollback rule.
//!
//! # Example
//!
//! ```
//! use rewind_engine::policy::wasm::{plugins, PolicyHost};
//! use rewind_engine::policy::{Policy, CursorFact, ResumeFacts, SessionFact, Verdict};
//!
//! let host = PolicyHost::with_default_policy()?;
//! let facts = ResumeFacts::new(SessionFact::Live, CursorFact::Foreign).with_safe_set();
//! assert_eq!(host.decide(&facts).code, Verdict::Conflict.code());
//!
//! let status_400 = host.load("status-400", plugins::STATUS_400)?;
//! let generation = host.swap(&status_400)?;
//! let answer = host.decide(&facts);
//! assert_eq!((answer.code, answer.generation), (Verdict::BadRequest.code(), generation));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cache;
mod compiler;
mod config;
mod error;
mod generation;
mod host;
mod instance;
mod module;
pub mod plugins;
mod report;
mod stats;
mod ticker;
mod validate;
pub mod vectors;

pub use compiler::compile_child_main;
pub use config::{AutoRollback, ChildCompiler, PolicyCompiler, PolicyHostConfig};
pub use error::{HostError, LoadError, RollbackError, SwapError};
pub use host::PolicyHost;
pub use module::PolicyModule;
pub use report::{ValidationFailure, ValidationReport};
pub use stats::{GenerationState, GenerationStats, GenerationStatus, LoadCounts, PolicyStatus};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_types_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<PolicyHost>();
        assert_send_sync::<PolicyModule>();
        assert_send_sync::<PolicyStatus>();
        assert_send_sync::<ValidationReport>();
        assert_send_sync::<LoadError>();
        assert_send_sync::<SwapError>();
        assert_send_sync::<PolicyCompiler>();
        assert_send_sync::<ChildCompiler>();
    }

    /// Each file's source, by the name the module doc's import table uses.
    const FILES: [(&str, &str); 14] = [
        ("cache", include_str!("cache.rs")),
        ("compiler", include_str!("compiler.rs")),
        ("config", include_str!("config.rs")),
        ("error", include_str!("error.rs")),
        ("generation", include_str!("generation.rs")),
        ("host", include_str!("host.rs")),
        ("instance", include_str!("instance.rs")),
        ("module", include_str!("module.rs")),
        ("plugins", include_str!("plugins.rs")),
        ("report", include_str!("report.rs")),
        ("stats", include_str!("stats.rs")),
        ("ticker", include_str!("ticker.rs")),
        ("validate", include_str!("validate.rs")),
        ("vectors", include_str!("vectors.rs")),
    ];

    /// The sibling files `source` imports (`use super::name...`).
    fn imports(source: &str) -> Vec<&str> {
        let mut found: Vec<&str> = source
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix("use super::"))
            .filter_map(|rest| {
                let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c == '_'))?;
                (end > 0).then(|| &rest[..end])
            })
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    }

    /// The import table of the module doc: (file, what it may import), in
    /// the doc's order.
    fn documented_order() -> Vec<(String, Vec<String>)> {
        let doc: Vec<&str> = include_str!("mod.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .skip_while(|l| !l.contains("who may import whom"))
            .skip_while(|l| l.trim() != "```text")
            .skip(1)
            .take_while(|l| l.trim() != "```")
            .collect();
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        for line in doc {
            let (head, deps) = match line.split_once("<-") {
                Some((head, deps)) => (head, deps),
                None if line.contains("(no sibling imports)") => (line, ""),
                // A continuation of the row above.
                None => ("", line),
            };
            let deps = deps
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_owned);
            match head.split_whitespace().next() {
                Some(name) => rows.push((name.to_owned(), deps.collect())),
                None => rows.last_mut().expect("a row first").1.extend(deps),
            }
        }
        rows
    }

    #[test]
    fn files_import_only_files_above_them_as_the_module_doc_says() {
        let order = documented_order();
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        let mut files: Vec<&str> = FILES.iter().map(|(n, _)| *n).collect();
        files.sort_unstable();
        let mut documented = names.clone();
        documented.sort_unstable();
        assert_eq!(documented, files, "every file has one row in the table");
        for (name, source) in FILES {
            let row = names.iter().position(|n| *n == name).expect("listed");
            let actual = imports(source);
            for used in &actual {
                let at = names.iter().position(|n| n == used).expect("listed");
                assert!(at < row, "{name} imports {used}, which is not above it");
            }
            let mut said: Vec<&str> = order[row].1.iter().map(String::as_str).collect();
            said.sort_unstable();
            assert_eq!(said, actual, "the table's imports of {name}");
        }
    }
}
