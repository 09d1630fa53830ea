//! Hostile fixture: `rewind_decide` executes `unreachable`, a trap.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};

rewind_policy! {
    /// Traps on every call.
    pub fn decide(_facts: &ResumeFacts) -> Verdict {
        trap()
    }
}

#[cfg(target_arch = "wasm32")]
fn trap() -> ! {
    core::arch::wasm32::unreachable()
}

#[cfg(not(target_arch = "wasm32"))]
fn trap() -> ! {
    unreachable!("the trap fixture traps")
}
