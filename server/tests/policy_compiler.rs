//! Policies compiled in a child process (`rewind compile-policy`, what
//! `rewind serve` does by default) load, refuse and decide exactly as
//! policies compiled in the host's own process; a child that fails, hangs
//! or cannot be started is a clear load error and loads nothing.

use std::time::Duration;

use rewind_engine::policy::wasm::plugins::{self, fixtures};
use rewind_engine::policy::wasm::vectors::{decision_table, RandomFacts};
use rewind_engine::policy::wasm::{
    ChildCompiler, HostError, LoadError, PolicyCompiler, PolicyHost, PolicyHostConfig,
};
use rewind_engine::policy::Policy;

/// The configuration `rewind serve` uses: this workspace's `rewind` binary
/// as the compiler.
fn child_config() -> PolicyHostConfig {
    // SAFETY: `rewind compile-policy` calls `compile_child_main` and
    // nothing else, and this test links the same `rewind-engine` as it.
    let child = unsafe { ChildCompiler::new(env!("CARGO_BIN_EXE_rewind"), ["compile-policy"]) };
    PolicyHostConfig::default().compiler(PolicyCompiler::ChildProcess(child))
}

/// A host whose compiler is `program` with `args`, which never gets as far
/// as handing back code (so no contract of `ChildCompiler::new` is at
/// stake); returns why it could not start.
fn host_with_failing_compiler(program: &str, args: &[&str], timeout: Duration) -> LoadError {
    // SAFETY: none of the programs these tests run exits 0, so the host
    // never loads anything they write.
    let child = unsafe { ChildCompiler::new(program, args.iter().copied()) }.timeout(timeout);
    let config = PolicyHostConfig::default().compiler(PolicyCompiler::ChildProcess(child));
    match PolicyHost::new(config) {
        Err(HostError::Load(e)) => e,
        Err(other) => panic!("expected a load error, got {other}"),
        Ok(_) => panic!("a host started although its compiler cannot compile"),
    }
}

#[test]
fn policies_compiled_by_the_child_decide_as_the_same_policies_compiled_in_process() {
    let child = PolicyHost::new(child_config()).expect("the default policy compiles in a child");
    let here = PolicyHost::with_default_policy().unwrap();
    for (name, wasm) in [
        ("strict", plugins::STRICT),
        ("status-400", plugins::STATUS_400),
    ] {
        let from_child = child.load(name, wasm).unwrap();
        let from_here = here.load(name, wasm).unwrap();
        assert!(child.validate(&from_child).passed());
        child.swap(&from_child).unwrap();
        here.swap(&from_here).unwrap();
        let mut random = RandomFacts::new(7);
        let facts = decision_table()
            .into_iter()
            .chain(random.by_ref().take(500));
        let mut compared = 0;
        for facts in facts {
            let (a, b) = (child.decide(&facts), here.decide(&facts));
            assert_eq!(
                (a.code, a.fault),
                (b.code, b.fault),
                "{name} answered differently for {facts:?}"
            );
            compared += 1;
        }
        assert!(compared > 500);
    }
    assert_eq!(child.live_generation(), 3);
}

#[test]
fn a_module_is_refused_with_the_same_words_whichever_process_compiles_it() {
    let child = PolicyHost::new(child_config()).unwrap();
    let here = PolicyHost::with_default_policy().unwrap();
    let truncated = &plugins::DEFAULT[..plugins::DEFAULT.len() / 2];
    for (what, wasm) in [
        ("not wasm", &b"#!/bin/sh\necho hi\n"[..]),
        ("empty", &b""[..]),
        ("a header and nothing else", &b"\0asm\x01\0\0\0\x05"[..]),
        ("truncated", truncated),
        ("wrong ABI", fixtures::WRONG_ABI),
        ("imports", fixtures::IMPORTS),
    ] {
        let from_child = child.load(what, wasm).unwrap_err();
        let from_here = here.load(what, wasm).unwrap_err();
        assert_eq!(from_child.to_string(), from_here.to_string(), "{what}");
        assert!(
            !matches!(from_child, LoadError::Compiler { .. }),
            "{what}: {from_child}"
        );
    }
    // The refusals changed nothing: the default policy is still live.
    assert_eq!(child.live_generation(), 1);
}

#[test]
fn a_compiler_that_never_answers_is_killed_after_its_timeout() {
    let e = host_with_failing_compiler("sleep", &["60"], Duration::from_millis(300));
    let text = e.to_string();
    assert!(matches!(e, LoadError::Compiler { .. }), "{text}");
    assert!(
        text.contains("sleep") && text.contains("did not finish within 300ms and was killed"),
        "{text}"
    );
}

#[test]
fn a_compiler_that_fails_is_reported_with_its_status_and_what_it_said() {
    let e = host_with_failing_compiler(
        "sh",
        &[
            "-c",
            "cat > /dev/null; echo 'compiler fell over' >&2; exit 7",
        ],
        Duration::from_secs(30),
    );
    let text = e.to_string();
    assert!(matches!(e, LoadError::Compiler { .. }), "{text}");
    assert!(
        text.contains("failed (exit status: 7): compiler fell over"),
        "{text}"
    );
    // A child that does not even read its request: the same report.
    let e = host_with_failing_compiler("sh", &["-c", "exit 9"], Duration::from_secs(30));
    assert!(e.to_string().contains("failed (exit status: 9)"), "{e}");
}

#[test]
fn a_compiler_that_cannot_be_started_is_named_in_the_error() {
    let e = host_with_failing_compiler(
        "/nonexistent/rewind",
        &["compile-policy"],
        Duration::from_secs(30),
    );
    let text = e.to_string();
    assert!(
        text.contains("/nonexistent/rewind could not be started"),
        "{text}"
    );
    assert!(
        std::error::Error::source(&e).is_some(),
        "the OS error is kept as the source"
    );
}

#[test]
fn the_child_compiles_through_the_hosts_compilation_cache() {
    let dir = tempfile::tempdir().unwrap();
    let files = |dir: &std::path::Path| -> usize {
        let mut count = 0;
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    stack.push(entry.path());
                } else {
                    count += 1;
                }
            }
        }
        count
    };
    let config = child_config().compilation_cache_dir(Some(dir.path().join("cache")));
    let host = PolicyHost::new(config.clone()).unwrap();
    // wasmtime writes its cache entries from the compiling process, the
    // child, which has exited by the time `new` returns.
    assert!(
        files(dir.path()) > 0,
        "the child left nothing in the cache directory"
    );
    drop(host);
    let again = PolicyHost::new(config).unwrap();
    assert_eq!(again.live_name(), "default");
}

#[test]
fn a_timeout_too_long_for_the_clock_means_no_timeout_not_a_panic() {
    // SAFETY: `rewind compile-policy` calls `compile_child_main` and
    // nothing else.
    let child = unsafe { ChildCompiler::new(env!("CARGO_BIN_EXE_rewind"), ["compile-policy"]) }
        .timeout(Duration::MAX);
    let host =
        PolicyHost::new(PolicyHostConfig::default().compiler(PolicyCompiler::ChildProcess(child)))
            .unwrap();
    host.load("strict", plugins::STRICT).unwrap();
    assert_eq!(host.status().loads.loaded, 2);
}

#[test]
fn the_host_counts_loads_by_outcome_and_a_failed_compiler_apart() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("compiler-broken");
    // The real compiler, unless the flag file exists: then it fails.
    let script = format!(
        "[ -e '{}' ] && {{ echo 'compiler out of order' >&2; exit 7; }}; exec '{}' compile-policy",
        broken.display(),
        env!("CARGO_BIN_EXE_rewind")
    );
    // SAFETY: the script either fails (exit 7, nothing loaded) or execs
    // `rewind compile-policy`, which calls `compile_child_main` and
    // nothing else.
    let child = unsafe { ChildCompiler::new("sh", ["-c", script.as_str()]) };
    let host =
        PolicyHost::new(PolicyHostConfig::default().compiler(PolicyCompiler::ChildProcess(child)))
            .unwrap();
    let loads = |host: &PolicyHost| {
        let l = host.status().loads;
        (l.loaded, l.refused, l.compiler_failed)
    };
    // Every load's time is added, whatever its outcome: each of these
    // starts a child process, which takes well over a nanosecond.
    let mut time = host.status().loads.time;
    let mut grew = |host: &PolicyHost, what: &str| {
        let now = host.status().loads.time;
        assert!(now > time, "{what}: load time {now:?} after {time:?}");
        time = now;
    };
    assert_eq!(loads(&host), (1, 0, 0), "the first module counts");
    assert!(host.load("not-wasm", b"not wasm").is_err());
    assert_eq!(loads(&host), (1, 1, 0));
    grew(&host, "a refused module");
    std::fs::write(&broken, b"").unwrap();
    let e = host.load("strict", plugins::STRICT).unwrap_err();
    assert!(matches!(e, LoadError::Compiler { .. }), "{e}");
    assert!(e.to_string().contains("compiler out of order"), "{e}");
    assert_eq!(loads(&host), (1, 1, 1));
    grew(&host, "a failed compiler");
    std::fs::remove_file(&broken).unwrap();
    host.load("strict", plugins::STRICT).unwrap();
    assert_eq!(loads(&host), (2, 1, 1));
    grew(&host, "a loaded module");
}

#[test]
fn a_compile_over_the_childs_memory_cap_fails_the_load_not_the_server() {
    // 1 MiB of address space is less than the child already maps: its
    // first new mapping fails, so the compile cannot finish.
    // SAFETY: `rewind compile-policy` calls `compile_child_main` and
    // nothing else.
    let child = unsafe { ChildCompiler::new(env!("CARGO_BIN_EXE_rewind"), ["compile-policy"]) }
        .memory_limit(Some(1 << 20));
    let config = PolicyHostConfig::default().compiler(PolicyCompiler::ChildProcess(child));
    let e = match PolicyHost::new(config) {
        Err(HostError::Load(e)) => e,
        Err(other) => panic!("expected a load error, got {other}"),
        Ok(_) => panic!("compiled within 1 MiB of address space"),
    };
    assert!(matches!(e, LoadError::Compiler { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(env!("CARGO_BIN_EXE_rewind")) && text.contains("failed ("),
        "{text}"
    );
    // Whether the child ran out in an allocation (a message) or growing
    // its stack (a signal, with the cap named), the error says memory.
    assert!(
        text.contains("memory") || text.contains("capped at 1048576 bytes"),
        "{text}"
    );
    // The same module compiles under the default cap.
    PolicyHost::new(child_config()).unwrap();
}
