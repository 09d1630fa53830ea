//! Hostile fixture: answers `Resume` to everything, foreign cursors, dead
//! sessions and other principals included. The host must clamp every
//! answer where `Resume` is not in the safe set.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};

rewind_policy! {
    /// Always `Resume`.
    pub fn decide(_facts: &ResumeFacts) -> Verdict {
        Verdict::Resume
    }
}
