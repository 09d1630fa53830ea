//! Hostile fixture: a well-formed policy that declares ABI version 999.
//!
//! The host must refuse it at load: its idea of the facts layout is not the
//! host's.
#![cfg_attr(target_arch = "wasm32", no_std)]

/// The ABI version this fixture claims.
pub const CLAIMED_ABI_VERSION: i32 = 999;

#[cfg(target_arch = "wasm32")]
mod exports {
    use rewind_policy_sdk::guest::FactsBuffer;

    static FACTS: FactsBuffer = FactsBuffer::new();

    #[unsafe(no_mangle)]
    extern "C" fn rewind_abi_version() -> i32 {
        super::CLAIMED_ABI_VERSION
    }

    #[unsafe(no_mangle)]
    extern "C" fn rewind_facts_ptr() -> i32 {
        FACTS.address()
    }

    #[unsafe(no_mangle)]
    extern "C" fn rewind_decide() -> i32 {
        FACTS.read().default_verdict as i32
    }
}
