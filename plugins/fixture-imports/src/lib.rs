//! Hostile fixture: a policy that imports a host function
//! (`env.rewind_host_log`). The host links nothing, so it must refuse the
//! module at load.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};

rewind_policy! {
    /// Logs through the import, then answers the default.
    pub fn decide(facts: &ResumeFacts) -> Verdict {
        log(facts.session);
        facts.default()
    }
}

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn rewind_host_log(value: i32);
}

#[cfg(target_arch = "wasm32")]
fn log(value: u32) {
    // SAFETY: the import takes one i32 and returns nothing; a host that
    // instantiated this module supplied a function of that type.
    unsafe { rewind_host_log(value as i32) }
}

#[cfg(not(target_arch = "wasm32"))]
fn log(_value: u32) {}
