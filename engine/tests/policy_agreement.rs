//! The wasm builds of the real plugins answer exactly what their reference
//! answers: the default plugin agrees with `default_verdict` and
//! `NativePolicy` on every row and on 100k random facts; strict and
//! status-400 agree with their own native builds.
#![cfg(feature = "wasm")]

use rewind_engine::policy::wasm::{plugins, vectors, PolicyHost, PolicyHostConfig};
use rewind_engine::policy::{clamp, NativePolicy, Policy};
use rewind_policy_sdk::{default_verdict, ResumeFacts};

const RANDOM_FACTS: usize = 100_000;

fn host_with(name: &str, wasm: &[u8]) -> PolicyHost {
    let config = PolicyHostConfig::default().validation(256, 2);
    PolicyHost::with_policy(config, name, wasm).unwrap()
}

fn all_facts(seed: u64) -> impl Iterator<Item = ResumeFacts> {
    vectors::decision_table()
        .into_iter()
        .chain(vectors::RandomFacts::new(seed).take(RANDOM_FACTS))
}

#[test]
fn the_default_plugin_agrees_with_the_reference_on_every_row() {
    let host = PolicyHost::with_default_policy().unwrap();
    let rows = vectors::decision_table();
    // 9 session facts × 8 cursor facts (policy ABI 3).
    assert_eq!(rows.len(), 72);
    for facts in rows {
        let wasm = host.decide(&facts);
        let native = NativePolicy.decide(&facts);
        let reference = default_verdict(facts.session_fact(), facts.cursor_fact());
        assert_eq!(wasm.fault, None, "{facts:?}");
        assert_eq!(wasm.code, reference.code(), "{facts:?}");
        assert_eq!(wasm.code, native.code, "{facts:?}");
        assert_eq!(clamp(&facts, wasm), (reference, None));
    }
}

#[test]
fn the_default_plugin_agrees_with_the_reference_on_100k_random_facts() {
    let host = PolicyHost::with_default_policy().unwrap();
    let mut unknown_codes = 0;
    for facts in vectors::RandomFacts::new(0xD1CE).take(RANDOM_FACTS) {
        unknown_codes +=
            usize::from(facts.session_fact().is_none() || facts.cursor_fact().is_none());
        let wasm = host.decide(&facts);
        assert_eq!(wasm.fault, None, "{facts:?}");
        assert_eq!(wasm.code, NativePolicy.decide(&facts).code, "{facts:?}");
        assert_eq!(
            wasm.code,
            default_verdict(facts.session_fact(), facts.cursor_fact()).code()
        );
    }
    assert!(
        unknown_codes > 1_000,
        "the vectors exercise unknown codes too"
    );
    let stats = host.stats(1).unwrap();
    assert_eq!(stats.faults() + stats.out_of_set, 0);
    assert_eq!(
        stats.instantiations, 1,
        "one instance serves every decision on this thread"
    );
}

#[test]
fn the_strict_plugin_agrees_with_its_native_build() {
    let host = host_with("strict", plugins::STRICT);
    for facts in all_facts(0x57) {
        let wasm = host.decide(&facts);
        assert_eq!(wasm.fault, None, "{facts:?}");
        assert_eq!(
            wasm.code,
            rewind_plugin_strict::rewind_decide_native(&facts),
            "{facts:?}"
        );
    }
}

#[test]
fn the_status_400_plugin_agrees_with_its_native_build() {
    let host = host_with("status-400", plugins::STATUS_400);
    for facts in all_facts(0x400) {
        let wasm = host.decide(&facts);
        assert_eq!(wasm.fault, None, "{facts:?}");
        assert_eq!(
            wasm.code,
            rewind_plugin_status_400::rewind_decide_native(&facts),
            "{facts:?}"
        );
    }
}

#[test]
fn the_default_plugin_agrees_with_its_native_build() {
    let host = host_with("default", plugins::DEFAULT);
    for facts in all_facts(0xDEF) {
        assert_eq!(
            host.decide(&facts).code,
            rewind_plugin_default::rewind_decide_native(&facts)
        );
    }
}
