//! Call-time containment: hostile plugins forced live (bypassing
//! validation) cost only their own decisions, which fall back to the
//! facts' default with the right fault counted. And validation refuses
//! each of them before they could go live.
#![cfg(feature = "wasm")]

use std::time::{Duration, Instant};

use rewind_engine::policy::wasm::{plugins, vectors, PolicyHost, PolicyHostConfig, SwapError};
use rewind_engine::policy::{clamp, Policy, PolicyFault};
use rewind_policy_sdk::{CursorFact, ResumeFacts, SessionFact, Verdict};

fn config() -> PolicyHostConfig {
    // Small validation sets keep debug-build tests quick; no automatic
    // rollback so a hostile generation stays live while we watch it.
    PolicyHostConfig::default()
        .validation(256, 1)
        .auto_rollback(None)
}

/// A host whose live generation is `wasm`, forced in without validation.
fn forced(wasm: &[u8], config: PolicyHostConfig) -> (PolicyHost, u64) {
    let host = PolicyHost::new(config).unwrap();
    let module = host.load("fixture", wasm).unwrap();
    let generation = host.swap_unvalidated(&module).unwrap();
    (host, generation)
}

fn facts() -> ResumeFacts {
    ResumeFacts::new(SessionFact::Live, CursorFact::InWindow).with_safe_set()
}

/// Decides `n` times and checks every answer is the fallback for `fault`.
fn assert_contained(host: &PolicyHost, generation: u64, fault: PolicyFault, n: u64) {
    let facts = facts();
    for _ in 0..n {
        let answer = host.decide(&facts);
        assert_eq!(answer.generation, generation);
        assert_eq!(answer.fault, Some(fault));
        assert_eq!(answer.code, facts.default().code());
        assert_eq!(clamp(&facts, answer), (Verdict::Resume, Some(fault)));
    }
    let stats = host.stats(generation).unwrap();
    assert_eq!(stats.of(fault), n, "{stats:?}");
    assert_eq!(
        stats.faults() + stats.out_of_set,
        n,
        "only {fault} counted: {stats:?}"
    );
    assert_eq!(
        host.live_generation(),
        generation,
        "no automatic rollback configured"
    );
}

#[test]
fn an_infinite_loop_runs_out_of_fuel() {
    let (host, generation) = forced(plugins::fixtures::LOOP, config());
    let start = Instant::now();
    assert_contained(&host, generation, PolicyFault::OutOfFuel, 3);
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn an_infinite_loop_with_unlimited_fuel_hits_the_deadline() {
    let config = config()
        .fuel_per_decision(u64::MAX)
        .deadline(Duration::from_millis(1), 20);
    let (host, generation) = forced(plugins::fixtures::LOOP, config);
    let start = Instant::now();
    assert_contained(&host, generation, PolicyFault::Timeout, 2);
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(2 * 19), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn a_trap_falls_back_and_the_instance_is_recreated() {
    let (host, generation) = forced(plugins::fixtures::TRAP, config());
    assert_contained(&host, generation, PolicyFault::Trap, 4);
    // One instance per faulted decision: none is called after it trapped.
    assert_eq!(host.stats(generation).unwrap().instantiations, 4);
}

#[test]
fn a_memory_growth_bomb_traps_at_the_cap() {
    let (host, generation) = forced(plugins::fixtures::MEMORY_BOMB, config());
    assert_contained(&host, generation, PolicyFault::Trap, 3);
}

#[test]
fn deep_recursion_overflows_into_a_trap() {
    let (host, generation) = forced(plugins::fixtures::DEEP_RECURSION, config());
    assert_contained(&host, generation, PolicyFault::Trap, 3);
}

#[test]
fn an_out_of_range_code_is_out_of_set() {
    let (host, generation) = forced(plugins::fixtures::OUT_OF_RANGE, config());
    assert_contained(&host, generation, PolicyFault::OutOfSet, 3);
    // The instance is healthy; only its answer was refused.
    assert_eq!(host.stats(generation).unwrap().instantiations, 1);
}

#[test]
fn resume_for_everything_is_clamped_wherever_resume_is_not_allowed() {
    let (host, generation) = forced(plugins::fixtures::RESUME_ALL, config());
    let mut clamped = 0;
    for facts in vectors::decision_table()
        .into_iter()
        .chain(vectors::RandomFacts::new(3).take(2_000))
    {
        let answer = host.decide(&facts);
        assert_eq!(answer.generation, generation);
        if facts.allowed.contains(Verdict::Resume) {
            assert_eq!((answer.code, answer.fault), (Verdict::Resume.code(), None));
        } else {
            clamped += 1;
            assert_eq!(answer.fault, Some(PolicyFault::OutOfSet), "{facts:?}");
            assert_eq!(answer.code, facts.default().code());
            assert_ne!(answer.code, Verdict::Resume.code());
        }
    }
    assert!(clamped > 1_000);
    assert_eq!(host.stats(generation).unwrap().out_of_set, clamped);
}

#[test]
fn validation_refuses_every_hostile_fixture_and_leaves_the_live_policy_alone() {
    let host = PolicyHost::new(config()).unwrap();
    let cases = [
        ("loop", plugins::fixtures::LOOP, PolicyFault::OutOfFuel),
        ("trap", plugins::fixtures::TRAP, PolicyFault::Trap),
        (
            "memory-bomb",
            plugins::fixtures::MEMORY_BOMB,
            PolicyFault::Trap,
        ),
        (
            "deep-recursion",
            plugins::fixtures::DEEP_RECURSION,
            PolicyFault::Trap,
        ),
        (
            "out-of-range",
            plugins::fixtures::OUT_OF_RANGE,
            PolicyFault::OutOfSet,
        ),
        (
            "resume-all",
            plugins::fixtures::RESUME_ALL,
            PolicyFault::OutOfSet,
        ),
    ];
    for (name, wasm, fault) in cases {
        let module = host.load(name, wasm).unwrap();
        match host.swap(&module) {
            Err(SwapError::Validation(report)) => {
                assert!(!report.passed());
                assert!(report.failed > 0);
                assert!(!report.failures.is_empty());
                assert!(
                    report.failures.iter().all(|f| f.fault == fault),
                    "{name}: {report}"
                );
                let text = report.to_string();
                assert!(text.contains(name) && text.contains("session="), "{text}");
            }
            other => panic!("{name}: expected a validation refusal, got {other:?}"),
        }
        assert_eq!(host.live_generation(), 1, "{name}");
        assert_eq!(host.live_name(), "default");
    }
    // The live policy still answers normally.
    let answer = host.decide(&facts());
    assert_eq!(
        (answer.code, answer.fault, answer.generation),
        (Verdict::Resume.code(), None, 1)
    );
}

#[test]
fn the_empty_fixture_and_the_real_plugins_pass_validation() {
    let host = PolicyHost::new(config()).unwrap();
    for (name, wasm) in [
        ("empty", plugins::fixtures::EMPTY),
        ("strict", plugins::STRICT),
        ("status-400", plugins::STATUS_400),
        ("default", plugins::DEFAULT),
    ] {
        let module = host.load(name, wasm).unwrap();
        let report = host.validate(&module);
        assert!(report.passed(), "{report}");
        assert_eq!(report.cases_run, report.cases_planned);
    }
}

#[test]
fn a_hostile_generation_costs_only_its_own_decisions() {
    // After the faulty generation is replaced, decisions are clean again on
    // the same thread (its faulted instance is gone, not reused).
    let (host, generation) = forced(plugins::fixtures::TRAP, config());
    assert_contained(&host, generation, PolicyFault::Trap, 2);
    let strict = host.load("strict", plugins::STRICT).unwrap();
    let next = host.swap(&strict).unwrap();
    let answer = host.decide(&facts());
    assert_eq!((answer.generation, answer.fault), (next, None));
}
