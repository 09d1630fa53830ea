//! A strict resume policy: any doubt is a rejection.
//!
//! It replays only a cursor that is provably a recent continuation, and
//! sends a client that lost continuity back to the start (`Gone`, 404: an
//! MCP client re-initialises) instead of papering over the hole with a
//! `reset` or `gap` stream.
//!
//! | presented session | cursor | default table | strict |
//! |---|---|---|---|
//! | live | none | `Fresh` | `Fresh` |
//! | live | malformed | `BadRequest` | `BadRequest` |
//! | live | foreign | `Conflict` | `Conflict` |
//! | live | older epoch | `FreshReset` | `Gone` |
//! | live | future | `Conflict` | `Conflict` |
//! | live | before the window | `FreshGap` | `Gone` |
//! | live | in window, age known and ≤ `max_resume_age_ms` (or that is 0 = not set), sequence numbers consistent | `Resume` | `Resume` |
//! | live | in window, `cursor_age_ms` unknown | `Resume` | `Gone` |
//! | live | in window, `cursor_age_ms` > `max_resume_age_ms` (when set) | `Resume` | `Gone` |
//! | live | in window, `cursor_seq` unknown or beyond `high_water` | `Resume` | `Conflict` |
//! | live | unchecked / unknown code | `Conflict` | `Conflict` |
//! | owner node lost (cluster) | any | as live | `Gone` |
//! | live, other principal | any | `Conflict` | `Conflict` |
//! | none | any | `BadRequest` | `BadRequest` |
//! | malformed id / unknown / previous boot / unknown code | any | `Gone` | `Gone` |
//!
//! Every answer is a rejection except `Fresh` for a live session without a
//! cursor and `Resume` for the first "in window" row, so it is inside the
//! host's safe set for every fact.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, CursorFact, ResumeFacts, SessionFact, Verdict, UNKNOWN};

rewind_policy! {
    /// The strict table above.
    pub fn decide(facts: &ResumeFacts) -> Verdict {
        match facts.session_fact() {
            // A session whose owner node is gone: start over rather than
            // resume from the shared tier.
            Some(SessionFact::OwnerLost) => Verdict::Gone,
            Some(SessionFact::Live | SessionFact::Restored | SessionFact::Remote) => match facts.cursor_fact() {
                Some(CursorFact::Absent) => Verdict::Fresh,
                Some(CursorFact::Malformed) => Verdict::BadRequest,
                Some(CursorFact::OlderEpoch) | Some(CursorFact::BeforeWindow) => Verdict::Gone,
                Some(CursorFact::InWindow) => in_window(facts),
                Some(CursorFact::Foreign)
                | Some(CursorFact::Future)
                | Some(CursorFact::Unchecked) => Verdict::Conflict,
                // A code this ABI version does not know.
                Some(_) | None => Verdict::Conflict,
            },
            Some(SessionFact::WrongPrincipal) => Verdict::Conflict,
            Some(SessionFact::Absent) => Verdict::BadRequest,
            Some(SessionFact::Malformed) => Verdict::Gone,
            Some(SessionFact::Unknown) | Some(SessionFact::PreviousBoot) => Verdict::Gone,
            // A code this ABI version does not know.
            Some(_) | None => Verdict::Gone,
        }
    }
}

/// A cursor the host found inside the window: resume only when its numbers
/// agree with that and it is young enough.
fn in_window(facts: &ResumeFacts) -> Verdict {
    let seq_known = facts.cursor_seq != UNKNOWN;
    let seq_beyond_high_water = facts.high_water != UNKNOWN && facts.cursor_seq > facts.high_water;
    if !seq_known || seq_beyond_high_water {
        return Verdict::Conflict;
    }
    if facts.cursor_age_ms == UNKNOWN {
        return Verdict::Gone;
    }
    let limit = facts.max_resume_age_ms;
    if limit != 0 && facts.cursor_age_ms > limit {
        return Verdict::Gone;
    }
    Verdict::Resume
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resumable() -> ResumeFacts {
        let mut f = ResumeFacts::new(SessionFact::Live, CursorFact::InWindow).with_safe_set();
        f.cursor_seq = 10;
        f.high_water = 12;
        f.oldest_retained = 3;
        f.cursor_age_ms = 500;
        f
    }

    #[test]
    fn resumes_a_young_consistent_cursor() {
        assert_eq!(decide(&resumable()), Verdict::Resume);
        let mut f = resumable();
        f.max_resume_age_ms = 500;
        assert_eq!(decide(&f), Verdict::Resume);
    }

    #[test]
    fn never_resumes_past_the_configured_age() {
        let mut f = resumable();
        f.max_resume_age_ms = 499;
        assert_eq!(decide(&f), Verdict::Gone);
    }

    #[test]
    fn never_resumes_an_unknown_age() {
        let mut f = resumable();
        f.cursor_age_ms = UNKNOWN;
        assert_eq!(decide(&f), Verdict::Gone);
        f.max_resume_age_ms = 1_000;
        assert_eq!(decide(&f), Verdict::Gone);
    }

    #[test]
    fn refuses_inconsistent_sequence_numbers() {
        let mut f = resumable();
        f.cursor_seq = 13;
        assert_eq!(decide(&f), Verdict::Conflict);
        f.cursor_seq = UNKNOWN;
        assert_eq!(decide(&f), Verdict::Conflict);
    }

    #[test]
    fn lost_continuity_is_gone() {
        for c in [CursorFact::OlderEpoch, CursorFact::BeforeWindow] {
            let f = ResumeFacts::new(SessionFact::Live, c).with_safe_set();
            assert_eq!(decide(&f), Verdict::Gone, "{c:?}");
        }
    }

    #[test]
    fn always_inside_the_safe_set_and_never_looser_than_the_table() {
        for s in 0..10u32 {
            for c in 0..12u32 {
                let mut f = resumable();
                f.session = s;
                f.cursor = c;
                for age in [0, 500, UNKNOWN] {
                    f.cursor_age_ms = age;
                    let f = f.with_safe_set();
                    let v = decide(&f);
                    assert!(f.allowed.contains(v), "{s} {c} {v:?}");
                    if v == Verdict::Resume {
                        assert_eq!(f.default(), Verdict::Resume);
                    }
                    assert_eq!(rewind_decide_native(&f), v.code());
                }
            }
        }
    }
}
