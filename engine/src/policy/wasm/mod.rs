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
//!   compile with Cranelift, then refuse, with a [`LoadError`] that says
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
mod config;
mod error;
mod host;
mod instance;
mod module;
pub mod plugins;
mod stats;
mod ticker;
mod validate;
pub mod vectors;

pub use config::{AutoRollback, PolicyHostConfig};
pub use error::{HostError, LoadError, RollbackError, SwapError};
pub use host::PolicyHost;
pub use module::PolicyModule;
pub use stats::{GenerationState, GenerationStats, GenerationStatus, PolicyStatus};
pub use validate::{ValidationFailure, ValidationReport};

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
    }
}
