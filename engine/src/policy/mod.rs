//! Resume policies: the trait the engine asks, and the native reference.
//!
//! A policy sees [`ResumeFacts`] and answers a verdict code. The engine then
//! clamps the answer to `facts.allowed` (invariant 6 of the design): a code
//! outside the safe set, or one this ABI version does not know, is replaced by
//! `facts.default_verdict` and counted as [`PolicyFault::OutOfSet`]. So a
//! policy can only make decisions stricter, never looser.

use std::fmt;

pub use rewind_policy_sdk::{CursorFact, ResumeFacts, SessionFact, Verdict, VerdictSet};

#[cfg(feature = "wasm")]
pub mod wasm;

/// Why a policy's answer was not used as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PolicyFault {
    /// The answer was not in the facts' safe set (or not a verdict at all).
    OutOfSet,
    /// The plugin trapped (including stack overflow and memory faults).
    Trap,
    /// The plugin ran out of its per-call fuel budget.
    OutOfFuel,
    /// The plugin hit the wall-clock (epoch) deadline.
    Timeout,
    /// The plugin could not be instantiated or called.
    Unavailable,
}

impl PolicyFault {
    /// Every variant, for metrics.
    pub const ALL: [PolicyFault; 5] = [
        PolicyFault::OutOfSet,
        PolicyFault::Trap,
        PolicyFault::OutOfFuel,
        PolicyFault::Timeout,
        PolicyFault::Unavailable,
    ];

    /// A short stable name, for metrics labels and logs.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyFault::OutOfSet => "out_of_set",
            PolicyFault::Trap => "trap",
            PolicyFault::OutOfFuel => "out_of_fuel",
            PolicyFault::Timeout => "timeout",
            PolicyFault::Unavailable => "unavailable",
        }
    }
}

impl fmt::Display for PolicyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy's raw answer, before the engine clamps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyAnswer {
    /// The verdict code the policy returned (or the fallback the policy host
    /// substituted after a fault).
    pub code: u32,
    /// The policy generation that produced the answer (0 for the native
    /// policy; a hot-swappable host numbers each module it publishes).
    pub generation: u64,
    /// Set when the policy host already fell back (trap, timeout, ...).
    pub fault: Option<PolicyFault>,
}

/// Decides resumes. Implementations must be cheap and must not block: the
/// engine calls `decide` on every reconnect, from any thread.
pub trait Policy: Send + Sync + fmt::Debug {
    /// Picks a verdict for `facts`. May return any code; the engine clamps.
    fn decide(&self, facts: &ResumeFacts) -> PolicyAnswer;

    /// A short human-readable name ("native-default", "wasm:strict#3").
    fn name(&self) -> String;
}

/// The design's decision table, in Rust: the reference every plugin is
/// tested against.
#[derive(Debug, Default, Clone, Copy)]
pub struct NativePolicy;

impl Policy for NativePolicy {
    #[inline]
    fn decide(&self, facts: &ResumeFacts) -> PolicyAnswer {
        PolicyAnswer {
            code: rewind_policy_sdk::default_verdict(facts.session_fact(), facts.cursor_fact())
                .code(),
            generation: 0,
            fault: None,
        }
    }

    fn name(&self) -> String {
        "native-default".to_owned()
    }
}

/// Clamps a policy's answer to the facts' safe set.
///
/// Returns the verdict to act on and the fault, if the answer was replaced.
/// The check is [`VerdictSet::admit`], the same one the WebAssembly host
/// applies to a plugin's answer and validation applies to a candidate's.
#[inline]
pub fn clamp(facts: &ResumeFacts, answer: PolicyAnswer) -> (Verdict, Option<PolicyFault>) {
    match facts.allowed.admit(answer.code) {
        Some(v) => (v, answer.fault),
        None => (
            facts.default(),
            Some(answer.fault.unwrap_or(PolicyFault::OutOfSet)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_replaces_out_of_set_and_unknown_codes() {
        let facts = ResumeFacts::new(SessionFact::Live, CursorFact::Foreign).with_safe_set();
        let resume = PolicyAnswer {
            code: Verdict::Resume.code(),
            generation: 1,
            fault: None,
        };
        assert_eq!(
            clamp(&facts, resume),
            (Verdict::Conflict, Some(PolicyFault::OutOfSet))
        );
        let junk = PolicyAnswer {
            code: 999,
            generation: 1,
            fault: None,
        };
        assert_eq!(
            clamp(&facts, junk),
            (Verdict::Conflict, Some(PolicyFault::OutOfSet))
        );
        let stricter = PolicyAnswer {
            code: Verdict::BadRequest.code(),
            generation: 1,
            fault: None,
        };
        assert_eq!(clamp(&facts, stricter), (Verdict::BadRequest, None));
    }

    #[test]
    fn clamp_keeps_a_host_fault_on_a_replaced_answer() {
        let facts = ResumeFacts::new(SessionFact::Live, CursorFact::InWindow).with_safe_set();
        let trapped = PolicyAnswer {
            code: facts.default().code(),
            generation: 2,
            fault: Some(PolicyFault::Trap),
        };
        assert_eq!(
            clamp(&facts, trapped),
            (Verdict::Resume, Some(PolicyFault::Trap))
        );
        let junk = PolicyAnswer {
            code: 42,
            ..trapped
        };
        assert_eq!(
            clamp(&facts, junk),
            (Verdict::Resume, Some(PolicyFault::Trap))
        );
    }

    #[test]
    fn native_policy_answers_the_default_for_every_row() {
        for s in SessionFact::ALL {
            for c in CursorFact::ALL {
                let facts = ResumeFacts::new(s, c).with_safe_set();
                let answer = NativePolicy.decide(&facts);
                assert_eq!(clamp(&facts, answer), (facts.default(), None));
            }
        }
    }
}
