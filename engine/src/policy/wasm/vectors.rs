//! Facts to run policies on: every row of the decision table
//! (`docs/decision-table.md`), and
//! an endless, seeded stream of random facts. Validation uses both; tests
//! and benchmarks use them to compare policies on the same inputs.

use rewind_policy_sdk::{CursorFact, ResumeFacts, SessionFact, UNKNOWN};

/// One fact set per (session fact × cursor fact) pair (56 rows), each with
/// numbers that fit the row, and `allowed`/`default_verdict` filled in.
pub fn decision_table() -> Vec<ResumeFacts> {
    let mut rows = Vec::with_capacity(SessionFact::ALL.len() * CursorFact::ALL.len());
    for session in SessionFact::ALL {
        for cursor in CursorFact::ALL {
            let mut facts = ResumeFacts::new(session, cursor);
            if session.is_live() || session == SessionFact::WrongPrincipal {
                facts.high_water = 120;
                facts.oldest_retained = 57;
                facts.idle_ms = 1_500;
            }
            facts.cursor_seq = match cursor {
                CursorFact::Absent | CursorFact::Malformed => UNKNOWN,
                CursorFact::Future => 4_000,
                CursorFact::BeforeWindow => 12,
                _ => 100,
            };
            facts.cursor_age_ms = match cursor {
                CursorFact::InWindow => 1_500,
                CursorFact::BeforeWindow | CursorFact::OlderEpoch => 90_000,
                _ => UNKNOWN,
            };
            rows.push(facts.with_safe_set());
        }
    }
    rows
}

/// Random facts from a seed: mostly known codes, sometimes codes this ABI
/// version does not know, and numbers that include the edge values
/// (`UNKNOWN`, 0, `u64::MAX - 1`). `allowed` and `default_verdict` are always
/// those the host would compute. The same seed gives the same facts.
///
/// ```
/// use rewind_engine::policy::wasm::vectors::RandomFacts;
/// let a: Vec<_> = RandomFacts::new(7).take(3).collect();
/// let b: Vec<_> = RandomFacts::new(7).take(3).collect();
/// assert_eq!(a, b);
/// ```
#[derive(Debug, Clone)]
pub struct RandomFacts {
    state: u64,
}

impl RandomFacts {
    /// A stream seeded with `seed` (any value, zero included).
    pub fn new(seed: u64) -> RandomFacts {
        // xorshift must not start at 0; mix the seed so nearby seeds differ.
        RandomFacts {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// xorshift64* (Marsaglia; Vigna's multiplier): plenty for test vectors.
    fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn code(&mut self, known: usize) -> u32 {
        if self.below(16) == 0 {
            // Unknown to this ABI version: just past the known ones, or wild.
            if self.below(2) == 0 {
                known as u32 + self.below(4) as u32
            } else {
                self.next_u64() as u32
            }
        } else {
            self.below(known as u64) as u32
        }
    }

    fn number(&mut self) -> u64 {
        match self.below(8) {
            0 => UNKNOWN,
            1 => 0,
            2 => u64::MAX - 1,
            3 => self.next_u64(),
            _ => self.below(100_000),
        }
    }
}

impl Iterator for RandomFacts {
    type Item = ResumeFacts;

    fn next(&mut self) -> Option<ResumeFacts> {
        let mut facts = ResumeFacts::new(SessionFact::Live, CursorFact::Absent);
        facts.session = self.code(SessionFact::ALL.len());
        facts.cursor = self.code(CursorFact::ALL.len());
        facts.cursor_seq = self.number();
        facts.high_water = self.number();
        facts.oldest_retained = self.number();
        facts.cursor_age_ms = self.number();
        facts.idle_ms = self.number();
        facts.max_resume_age_ms = if self.below(2) == 0 { 0 } else { self.number() };
        Some(facts.with_safe_set())
    }
}
