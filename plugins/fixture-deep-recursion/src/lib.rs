//! Hostile fixture: `rewind_decide` recurses without bound until the stack
//! overflows (the host's `max_wasm_stack`, or the guest's own shadow stack).
#![cfg_attr(target_arch = "wasm32", no_std)]

use core::hint::black_box;
use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};

rewind_policy! {
    /// Recurses `u64::MAX` deep.
    pub fn decide(facts: &ResumeFacts) -> Verdict {
        if depth(black_box(u64::MAX)) == facts.cursor_seq {
            Verdict::Gone
        } else {
            facts.default()
        }
    }
}

/// Not a tail call: the result goes through `black_box` before the addition,
/// so the compiler cannot turn the recursion into a loop.
fn depth(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        black_box(depth(black_box(n - 1))).wrapping_add(1)
    }
}
