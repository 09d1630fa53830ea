//! Resume policies: the trait the engine asks, and the native reference.
//!
//! A policy sees [`ResumeFacts`] and answers a verdict code. The engine then
//! clamps the answer to `facts.allowed` (invariant 6 in `docs/invariants.md`): a code
//! outside the safe set, or one this ABI version does not know, is replaced by
//! `facts.default_verdict` and counted as [`PolicyFault::OutOfSet`]. So a
//! policy can only make decisions stricter, never looser.

use std::fmt;

pub use rewind_policy_sdk::{CursorFact, ResumeFacts, SessionFact, Verdict, VerdictSet, UNKNOWN};

#[cfg(feature = "wasm")]
pub mod wasm;

/// Why a policy's answer was not used as given.
///
/// Every per-fault counter in the crate (the engine's metrics, each policy
/// generation's statistics) is an array indexed by [`PolicyFault::index`],
/// so the mapping from fault to counter is written once, here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PolicyFault {
    /// The answer was not in the facts' safe set (or not a verdict at all).
    OutOfSet = 0,
    /// The plugin trapped (including stack overflow and memory faults).
    Trap = 1,
    /// The plugin ran out of its per-call fuel budget.
    OutOfFuel = 2,
    /// The plugin hit the wall-clock (epoch) deadline.
    Timeout = 3,
    /// The plugin could not be instantiated or called.
    Unavailable = 4,
}

impl PolicyFault {
    /// How many kinds of fault there are: the length of a per-fault
    /// counter array.
    pub const COUNT: usize = 5;

    /// Every variant, in [`index`](Self::index) order.
    pub const ALL: [PolicyFault; PolicyFault::COUNT] = [
        PolicyFault::OutOfSet,
        PolicyFault::Trap,
        PolicyFault::OutOfFuel,
        PolicyFault::Timeout,
        PolicyFault::Unavailable,
    ];

    /// This fault's slot in a per-fault counter array (`0..COUNT`), and
    /// its position in [`ALL`](Self::ALL).
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether the policy itself misbehaved: it trapped, ran out of a
    /// budget or could not run. [`OutOfSet`](Self::OutOfSet) is the one
    /// fault that is not: the policy answered, and only its answer was
    /// replaced. Malfunctions are what count towards rolling a policy back.
    #[inline]
    pub const fn is_malfunction(self) -> bool {
        !matches!(self, PolicyFault::OutOfSet)
    }

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

/// The decision table (`docs/decision-table.md`), in Rust: the reference every plugin is
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
    fn fault_indices_are_dense_and_follow_all() {
        for (i, fault) in PolicyFault::ALL.into_iter().enumerate() {
            assert_eq!(fault.index(), i, "{fault}");
        }
        let answered: Vec<_> = PolicyFault::ALL
            .into_iter()
            .filter(|f| !f.is_malfunction())
            .collect();
        assert_eq!(answered, [PolicyFault::OutOfSet]);
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
