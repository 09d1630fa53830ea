//! Hostile fixture: `rewind_decide` never returns.
//!
//! The host must stop it with the per-call fuel budget (deterministic) or,
//! with unlimited fuel, the epoch deadline (wall clock).
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};

rewind_policy! {
    /// Spins forever.
    pub fn decide(facts: &ResumeFacts) -> Verdict {
        let mut n = facts.cursor_seq;
        loop {
            n = core::hint::black_box(n.wrapping_add(1));
        }
    }
}
