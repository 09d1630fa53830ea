//! Hostile fixture: `rewind_decide` grows its linear memory in a loop.
//!
//! The host's `StoreLimits` cap refuses the growth past its limit (and turns
//! the refusal into a trap), so the bomb never takes more than the cap.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};

rewind_policy! {
    /// Grows memory one 64 KiB page at a time, forever.
    pub fn decide(_facts: &ResumeFacts) -> Verdict {
        bomb()
    }
}

#[cfg(target_arch = "wasm32")]
fn bomb() -> ! {
    loop {
        core::hint::black_box(core::arch::wasm32::memory_grow::<0>(1));
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn bomb() -> ! {
    panic!("the memory bomb only goes off on wasm32")
}
