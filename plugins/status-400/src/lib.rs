//! An operator example: the default table, but `400 Bad Request` wherever
//! the table says `409 Conflict`.
//!
//! Some clients treat 409 as "try again" and reconnect in a tight loop with
//! the same foreign or forged cursor; a 400 makes them give up on the
//! cursor. The affected rows:
//!
//! | presented session | cursor | default table | this policy |
//! |---|---|---|---|
//! | live | owner is another session | `Conflict` (409) | `BadRequest` (400) |
//! | live | current epoch, beyond the high-water mark | `Conflict` (409) | `BadRequest` (400) |
//! | live | unchecked / unknown code | `Conflict` (409) | `BadRequest` (400) |
//! | live, other principal | any | `Conflict` (409) | `BadRequest` (400) |
//!
//! Every other row answers as the default. `BadRequest` is a rejection,
//! which the host allows for any facts, so the policy stays inside the safe
//! set.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};

rewind_policy! {
    /// The host's default answer, with 409 turned into 400.
    pub fn decide(facts: &ResumeFacts) -> Verdict {
        match facts.default() {
            Verdict::Conflict => Verdict::BadRequest,
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewind_policy_sdk::{CursorFact, SessionFact};

    #[test]
    fn conflicts_become_bad_requests_and_nothing_else_changes() {
        for s in SessionFact::ALL {
            for c in CursorFact::ALL {
                let f = ResumeFacts::new(s, c).with_safe_set();
                let v = decide(&f);
                assert!(f.allowed.contains(v), "{s:?} {c:?}");
                if f.default() == Verdict::Conflict {
                    assert_eq!(v, Verdict::BadRequest, "{s:?} {c:?}");
                } else {
                    assert_eq!(v, f.default(), "{s:?} {c:?}");
                }
            }
        }
        let foreign = ResumeFacts::new(SessionFact::Live, CursorFact::Foreign).with_safe_set();
        assert_eq!(rewind_decide_native(&foreign), Verdict::BadRequest.code());
    }
}
