//! The default resume policy: the decision table of
//! `docs/decision-table.md`, written out.
//!
//! | presented session | cursor | verdict |
//! |---|---|---|
//! | live | none | `Fresh` (new stream, no replay) |
//! | live | malformed | `BadRequest` (400) |
//! | live | owner is another session | `Conflict` (409, tenant boundary) |
//! | live | older epoch of this session | `FreshReset` |
//! | live | current epoch, beyond the high-water mark | `Conflict` (forged/future) |
//! | live | current epoch, before the retained window | `FreshGap` |
//! | live | current epoch, in window | `Resume` |
//! | live | unchecked, or a code this ABI does not know | `Conflict` |
//! | live, other principal | any | `Conflict` |
//! | none | any | `BadRequest` (400) |
//! | malformed id / unknown / previous boot / a code this ABI does not know | any | `Gone` (404) |
//!
//! It answers exactly what [`rewind_policy_sdk::default_verdict`] answers;
//! the tests hold it to that on every row.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, CursorFact, ResumeFacts, SessionFact, Verdict};

rewind_policy! {
    /// The decision table.
    pub fn decide(facts: &ResumeFacts) -> Verdict {
        match facts.session_fact() {
            Some(
                SessionFact::Live
                | SessionFact::Restored
                | SessionFact::Remote
                | SessionFact::OwnerLost,
            ) => match facts.cursor_fact() {
                Some(CursorFact::Absent) => Verdict::Fresh,
                Some(CursorFact::Malformed) => Verdict::BadRequest,
                Some(CursorFact::Foreign) => Verdict::Conflict,
                Some(CursorFact::OlderEpoch) => Verdict::FreshReset,
                Some(CursorFact::Future) => Verdict::Conflict,
                Some(CursorFact::BeforeWindow) => Verdict::FreshGap,
                Some(CursorFact::InWindow) => Verdict::Resume,
                Some(CursorFact::Unchecked) => Verdict::Conflict,
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

#[cfg(test)]
mod tests {
    use super::*;
    use rewind_policy_sdk::default_verdict;

    fn all_codes() -> impl Iterator<Item = (u32, u32)> {
        (0..10u32).flat_map(|s| (0..12u32).map(move |c| (s, c)))
    }

    #[test]
    fn agrees_with_the_reference_table_on_every_row_and_unknown_codes() {
        for (s, c) in all_codes() {
            let mut facts = ResumeFacts::new(SessionFact::Live, CursorFact::Absent);
            facts.session = s;
            facts.cursor = c;
            let facts = facts.with_safe_set();
            let expected = default_verdict(facts.session_fact(), facts.cursor_fact());
            assert_eq!(decide(&facts), expected, "session {s} cursor {c}");
            assert_eq!(rewind_decide_native(&facts), expected.code());
        }
    }

    #[test]
    fn always_answers_inside_the_safe_set() {
        for (s, c) in all_codes() {
            let mut facts = ResumeFacts::new(SessionFact::Live, CursorFact::Absent);
            facts.session = s;
            facts.cursor = c;
            let facts = facts.with_safe_set();
            assert!(
                facts.allowed.contains(decide(&facts)),
                "session {s} cursor {c}"
            );
        }
    }

    #[test]
    fn table_rows() {
        let row = |s, c| decide(&ResumeFacts::new(s, c).with_safe_set());
        assert_eq!(row(SessionFact::Live, CursorFact::Absent), Verdict::Fresh);
        assert_eq!(
            row(SessionFact::Live, CursorFact::InWindow),
            Verdict::Resume
        );
        assert_eq!(
            row(SessionFact::Live, CursorFact::Foreign),
            Verdict::Conflict
        );
        assert_eq!(
            row(SessionFact::Live, CursorFact::OlderEpoch),
            Verdict::FreshReset
        );
        assert_eq!(
            row(SessionFact::Live, CursorFact::BeforeWindow),
            Verdict::FreshGap
        );
        assert_eq!(
            row(SessionFact::PreviousBoot, CursorFact::Unchecked),
            Verdict::Gone
        );
        assert_eq!(
            row(SessionFact::Absent, CursorFact::InWindow),
            Verdict::BadRequest
        );
    }
}
