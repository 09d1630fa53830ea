//! Hostile fixture: answers verdict code 99, which no verdict has.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, ResumeFacts};

/// The code this fixture answers.
pub const CODE: u32 = 99;

rewind_policy! {
    /// Always answers [`CODE`].
    pub fn decide(_facts: &ResumeFacts) -> u32 {
        CODE
    }
}
