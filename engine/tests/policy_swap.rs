//! Hot swap under load, rollback on command, and automatic rollback.
#![cfg(feature = "wasm")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rewind_engine::policy::wasm::{
    plugins, vectors, AutoRollback, GenerationState, PolicyHost, PolicyHostConfig, RollbackError,
};
use rewind_engine::policy::{Policy, PolicyFault};
use rewind_policy_sdk::{CursorFact, ResumeFacts, SessionFact, Verdict};

/// What generation `g` answers in the swap test: odd generations run the
/// default plugin (generation 1 is the host's initial default), even ones
/// strict; the swapper alternates and checks the numbers it gets back.
fn expected(generation: u64, facts: &ResumeFacts) -> u32 {
    if generation % 2 == 1 {
        rewind_plugin_default::rewind_decide_native(facts)
    } else {
        rewind_plugin_strict::rewind_decide_native(facts)
    }
}

#[test]
fn swapping_100_times_a_second_under_load_loses_no_decision() {
    const DECIDERS: usize = 2;
    const RUN: Duration = Duration::from_millis(1_500);
    const SWAP_EVERY: Duration = Duration::from_millis(10);

    let config = PolicyHostConfig::default().validation(256, 9);
    let host = Arc::new(PolicyHost::new(config).unwrap());
    let default = host.load("default", plugins::DEFAULT).unwrap();
    let strict = host.load("strict", plugins::STRICT).unwrap();
    // Facts on which the two plugins disagree, so a decision attributed to
    // the wrong generation would show.
    let facts: Arc<Vec<ResumeFacts>> = Arc::new(
        vectors::decision_table()
            .into_iter()
            .chain(vectors::RandomFacts::new(42).take(4_096))
            .collect(),
    );
    assert!(facts.iter().any(|f| expected(1, f) != expected(2, f)));

    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(DECIDERS + 1));
    let deciders: Vec<_> = (0..DECIDERS)
        .map(|t| {
            let (host, facts, stop, start) =
                (host.clone(), facts.clone(), stop.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let (mut decisions, mut last_generation) = (0u64, 0u64);
                let mut per_parity = [0u64; 2];
                let mut i = t * 7;
                while !stop.load(Ordering::Relaxed) {
                    let facts = &facts[i % facts.len()];
                    let answer = host.decide(facts);
                    assert_eq!(answer.fault, None, "decision {decisions}: {facts:?}");
                    assert!(
                        answer.generation >= last_generation,
                        "generations went backwards"
                    );
                    assert_eq!(
                        answer.code,
                        expected(answer.generation, facts),
                        "generation {}",
                        answer.generation
                    );
                    if expected(1, facts) != expected(2, facts) {
                        per_parity[(answer.generation % 2) as usize] += 1;
                    }
                    last_generation = answer.generation;
                    decisions += 1;
                    i += 1;
                }
                (decisions, last_generation, per_parity)
            })
        })
        .collect();

    start.wait();
    let began = Instant::now();
    let mut swaps = 0u64;
    let mut worst_swap = Duration::ZERO;
    while began.elapsed() < RUN {
        let next = if swaps.is_multiple_of(2) {
            &strict
        } else {
            &default
        };
        let t = Instant::now();
        let generation = host.swap(next).unwrap();
        worst_swap = worst_swap.max(t.elapsed());
        swaps += 1;
        assert_eq!(generation, swaps + 1, "generation numbers are consecutive");
        assert_eq!(generation.is_multiple_of(2), next.name() == "strict");
        let due = began + SWAP_EVERY * swaps as u32;
        thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    stop.store(true, Ordering::Relaxed);
    let results: Vec<_> = deciders.into_iter().map(|d| d.join().unwrap()).collect();
    let elapsed = began.elapsed();

    let status = host.status();
    let rate = swaps as f64 / elapsed.as_secs_f64();
    eprintln!(
        "{swaps} swaps in {elapsed:?} ({rate:.0}/s, worst {worst_swap:?}); deciders: {results:?}"
    );
    assert!(rate >= 50.0, "swapped only {rate:.0} times a second");
    for (decisions, last_generation, per_parity) in &results {
        assert!(*decisions > 0);
        assert!(*last_generation > 1);
        assert!(
            per_parity[0] > 0 && per_parity[1] > 0,
            "saw both plugins: {per_parity:?}"
        );
    }
    assert_eq!(status.swaps, swaps);
    assert!(
        status
            .generations
            .iter()
            .all(|g| g.stats.faults() + g.stats.out_of_set == 0),
        "{status:?}"
    );
}

#[test]
fn rollback_on_command_restores_the_previous_generation() {
    let host = PolicyHost::with_default_policy().unwrap();
    let young = ResumeFacts {
        cursor_seq: 10,
        high_water: 20,
        cursor_age_ms: ResumeFacts::new(SessionFact::Live, CursorFact::InWindow).cursor_age_ms,
        ..ResumeFacts::new(SessionFact::Live, CursorFact::InWindow)
    }
    .with_safe_set();
    assert_eq!(host.decide(&young).code, Verdict::Resume.code());

    let strict = host.load("strict", plugins::STRICT).unwrap();
    assert_eq!(host.swap(&strict).unwrap(), 2);
    // Strict refuses a cursor of unknown age.
    assert_eq!(
        (host.decide(&young).code, host.decide(&young).generation),
        (Verdict::Gone.code(), 2)
    );

    assert_eq!(host.rollback(), Ok(1));
    let answer = host.decide(&young);
    assert_eq!(
        (answer.code, answer.generation, answer.fault),
        (Verdict::Resume.code(), 1, None)
    );
    assert_eq!(
        host.rollback(),
        Err(RollbackError::NothingToRollBackTo { current: 1 })
    );

    let status = host.status();
    assert_eq!(status.live.name, "default");
    assert_eq!(status.manual_rollbacks, 1);
    let states: Vec<_> = status
        .generations
        .iter()
        .map(|g| (g.stats.generation, g.state))
        .collect();
    assert_eq!(
        states,
        [(2, GenerationState::RolledBack), (1, GenerationState::Live)]
    );
    assert_eq!(host.name(), "wasm:default#1");
}

#[test]
fn a_generation_over_the_fault_rate_is_rolled_back_automatically() {
    let rule = AutoRollback {
        max_fault_rate: 0.5,
        min_decisions: 50,
    };
    let config = PolicyHostConfig::default()
        .validation(256, 3)
        .auto_rollback(Some(rule));
    let host = PolicyHost::new(config).unwrap();
    let strict = host.load("strict", plugins::STRICT).unwrap();
    assert_eq!(host.swap(&strict).unwrap(), 2);
    let trap = host.load("trap", plugins::fixtures::TRAP).unwrap();
    assert_eq!(host.swap_unvalidated(&trap).unwrap(), 3);

    let facts = ResumeFacts::new(SessionFact::Live, CursorFact::Foreign).with_safe_set();
    let mut faulty = 0;
    for _ in 0..200 {
        let answer = host.decide(&facts);
        assert_eq!(
            answer.code,
            Verdict::Conflict.code(),
            "the fallback is the default"
        );
        match answer.generation {
            3 => {
                assert_eq!(answer.fault, Some(PolicyFault::Trap));
                faulty += 1;
            }
            2 => assert_eq!(answer.fault, None),
            other => panic!("unexpected generation {other}"),
        }
    }
    assert_eq!(faulty, 50, "rolled back at the first judged decision");
    assert_eq!(
        host.live_generation(),
        2,
        "back on the last good generation"
    );
    let status = host.status();
    assert_eq!(status.automatic_rollbacks, 1);
    assert_eq!(status.generations[0].state, GenerationState::RolledBack);
    assert_eq!(status.generations[0].stats.traps, 50);
}

#[test]
fn out_of_set_answers_do_not_trigger_automatic_rollback() {
    let rule = AutoRollback {
        max_fault_rate: 0.5,
        min_decisions: 10,
    };
    let config = PolicyHostConfig::default()
        .validation(256, 3)
        .auto_rollback(Some(rule));
    let host = PolicyHost::new(config).unwrap();
    // Out-of-set answers are clamped, not faults that count toward rollback.
    let resume_all = host
        .load("resume-all", plugins::fixtures::RESUME_ALL)
        .unwrap();
    let generation = host.swap_unvalidated(&resume_all).unwrap();
    let foreign = ResumeFacts::new(SessionFact::Live, CursorFact::Foreign).with_safe_set();
    for _ in 0..100 {
        assert_eq!(host.decide(&foreign).fault, Some(PolicyFault::OutOfSet));
    }
    assert_eq!(host.live_generation(), generation);
}
