//! Benchmark fixture: the bare call floor.
//!
//! `rewind_decide` reads nothing and returns [`ANSWER`], a constant that is
//! in every safe set, so the host accepts it like any policy. Calling it
//! through the host measures everything but the policy itself: the facts
//! copy, fuel and deadline setup, and the wasm call.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::Verdict;

/// The constant answer (a rejection, allowed for all facts).
pub const ANSWER: Verdict = Verdict::Gone;

#[cfg(target_arch = "wasm32")]
mod exports {
    use rewind_policy_sdk::guest::FactsBuffer;

    static FACTS: FactsBuffer = FactsBuffer::new();

    #[unsafe(no_mangle)]
    extern "C" fn rewind_abi_version() -> i32 {
        rewind_policy_sdk::ABI_VERSION as i32
    }

    #[unsafe(no_mangle)]
    extern "C" fn rewind_facts_ptr() -> i32 {
        FACTS.address()
    }

    #[unsafe(no_mangle)]
    extern "C" fn rewind_decide() -> i32 {
        super::ANSWER.code() as i32
    }
}
