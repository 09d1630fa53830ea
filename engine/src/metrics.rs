//! Engine counters, readable at any time without a lock.
//!
//! Nothing is counted per append: the number of events appended is derived
//! from the sessions' sequence numbers when a snapshot is taken (live
//! sessions' high-water marks plus what ended sessions had reached), and
//! pool use from the pool's free counter. What is counted — replayed events
//! (added per batch by each reader), refusals, session ends, verdicts — goes
//! into *per-thread* counters: each thread that counts gets its own line of
//! counters (the `thread_local` crate's `ThreadLocal`, one per engine), and
//! only that thread ever writes it, so an increment is a plain load and
//! store — no locked instruction, no line shared with another core. A
//! snapshot sums every thread's line. Totals are exact once writers are
//! quiet; a snapshot taken during traffic is a consistent-enough sum of
//! monotone counters (each line is read once).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use rewind_policy_sdk::Verdict;
use thread_local::ThreadLocal;

use crate::policy::PolicyFault;

/// One counter of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Counter {
    AppendsRefused,
    EventsReplayed,
    ReplayedBytes,
    ReaderGaps,
    SessionsOpened,
    SessionsRefused,
    SessionsClosed,
    SessionsExpired,
    SessionsEvicted,
    /// Events of ended sessions: their high-water marks, added at the end.
    EndedAppends,
    // One per verdict, in verdict-code order.
    VerdictResume,
    VerdictFresh,
    VerdictFreshReset,
    VerdictFreshGap,
    VerdictBadRequest,
    VerdictConflict,
    VerdictGone,
    // One per policy fault, in `PolicyFault::ALL` order, reached by
    // `Counter::fault` (so only the first and last are named in code).
    FaultOutOfSet,
    #[expect(dead_code, reason = "counted through `Counter::fault`")]
    FaultTrap,
    #[expect(dead_code, reason = "counted through `Counter::fault`")]
    FaultOutOfFuel,
    #[expect(dead_code, reason = "counted through `Counter::fault`")]
    FaultTimeout,
    FaultUnavailable,
}

const COUNTERS: usize = Counter::FaultUnavailable as usize + 1;

impl Counter {
    fn verdict(v: Verdict) -> Counter {
        match v {
            Verdict::Resume => Counter::VerdictResume,
            Verdict::Fresh => Counter::VerdictFresh,
            Verdict::FreshReset => Counter::VerdictFreshReset,
            Verdict::FreshGap => Counter::VerdictFreshGap,
            Verdict::BadRequest => Counter::VerdictBadRequest,
            Verdict::Conflict => Counter::VerdictConflict,
            _ => Counter::VerdictGone,
        }
    }

    /// The fault counters follow [`PolicyFault::index`] from
    /// `FaultOutOfSet` on (a test holds the two orders together).
    fn fault(f: PolicyFault) -> usize {
        Counter::FaultOutOfSet as usize + f.index()
    }
}

/// One thread's counters. Written only by that thread; read by snapshots.
type Line = CachePadded<[AtomicU64; COUNTERS]>;

#[derive(Debug)]
pub(crate) struct Metrics {
    /// Names this instance in each thread's [`LAST_LINE`]: unique in the
    /// process, never reused.
    id: u64,
    lines: ThreadLocal<Line>,
    /// Number of live sessions. Changed on open and end.
    pub(crate) sessions_live: AtomicU64,
}

/// Adds `n` to a counter only the calling thread writes.
#[inline]
fn bump(c: &AtomicU64, n: u64) {
    // Relaxed load and store, not an RMW: no other thread writes this
    // counter, so nothing can come between them; snapshots only need each
    // increment to land eventually.
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Source of [`Metrics::id`]; 0 is never handed out.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

std::thread_local! {
    /// The calling thread's line of the engine it counted for last, and that
    /// engine's [`Metrics::id`]. `ThreadLocal::get` finds a thread's line
    /// through four dependent loads (the thread's id, the bucket, the
    /// entry, its flag); at the end of a hot resume, where nothing else is
    /// left to overlap them, they were 7 % of its time. With one engine per
    /// process — the usual case — this is one thread-local load and a
    /// compare.
    static LAST_LINE: Cell<(u64, *const Line)> = const { Cell::new((0, std::ptr::null())) };
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        Metrics {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            lines: ThreadLocal::new(),
            sessions_live: AtomicU64::new(0),
        }
    }

    /// The calling thread's counters.
    #[inline]
    fn mine(&self) -> &Line {
        let (id, line) = LAST_LINE.get();
        if id == self.id {
            // SAFETY: `line` was stored below by this thread, from
            // `self.lines.get_or` of the `Metrics` whose `id` it is. Ids are
            // never reused, so that `Metrics` is `self`, alive for the
            // returned borrow. `ThreadLocal` never moves or frees an entry
            // before it is dropped itself (buckets are allocated once and
            // kept), so the pointer still points at this thread's line.
            return unsafe { &*line };
        }
        self.mine_slow()
    }

    #[cold]
    fn mine_slow(&self) -> &Line {
        let line = self
            .lines
            .get_or(|| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))));
        LAST_LINE.set((self.id, std::ptr::from_ref(line)));
        line
    }

    #[inline]
    pub(crate) fn add(&self, c: Counter, n: u64) {
        bump(&self.mine()[c as usize], n);
    }

    /// Adds `a` to counter `ca` and `b` to counter `cb`, with one lookup of
    /// the thread's counters (a reader's batch of events and bytes).
    #[inline]
    pub(crate) fn add_pair(&self, ca: Counter, a: u64, cb: Counter, b: u64) {
        let line = self.mine();
        bump(&line[ca as usize], a);
        bump(&line[cb as usize], b);
    }

    #[inline]
    pub(crate) fn verdict(&self, v: Verdict, fault: Option<PolicyFault>) {
        let line = self.mine();
        bump(&line[Counter::verdict(v) as usize], 1);
        if let Some(f) = fault {
            bump(&line[Counter::fault(f)], 1);
        }
    }

    fn sum(&self, c: Counter) -> u64 {
        self.sum_at(c as usize)
    }

    fn sum_at(&self, i: usize) -> u64 {
        self.lines
            .iter()
            .map(|line| line[i].load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add)
    }

    /// A snapshot; `live_appends` is the sum of the live sessions'
    /// high-water marks, `pool` what the pool counts itself.
    pub(crate) fn snapshot(&self, live_appends: u64, pool: PoolReading) -> MetricsSnapshot {
        let verdicts: [u64; 7] = std::array::from_fn(|i| {
            self.sum(Counter::verdict(
                Verdict::from_code(i as u32).expect("dense codes"),
            ))
        });
        MetricsSnapshot {
            appends: live_appends + self.sum(Counter::EndedAppends),
            appends_refused: self.sum(Counter::AppendsRefused),
            events_replayed: self.sum(Counter::EventsReplayed),
            replayed_bytes: self.sum(Counter::ReplayedBytes),
            reader_gaps: self.sum(Counter::ReaderGaps),
            sessions_opened: self.sum(Counter::SessionsOpened),
            sessions_refused: self.sum(Counter::SessionsRefused),
            sessions_closed: self.sum(Counter::SessionsClosed),
            sessions_expired: self.sum(Counter::SessionsExpired),
            sessions_evicted: self.sum(Counter::SessionsEvicted),
            sessions_live: self.sessions_live.load(Ordering::Relaxed),
            appends_stalled: pool.append_stalls,
            pool_bytes: pool.capacity_bytes,
            bytes_held: pool.capacity_bytes.saturating_sub(pool.free_bytes),
            bytes_released: pool.released_bytes,
            resumes: verdicts.iter().sum(),
            verdicts,
            policy_faults: std::array::from_fn(|i| {
                self.sum_at(Counter::fault(PolicyFault::ALL[i]))
            }),
        }
    }
}

/// What the segment pool counts itself, read for a snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PoolReading {
    pub(crate) capacity_bytes: u64,
    pub(crate) free_bytes: u64,
    pub(crate) released_bytes: u64,
    pub(crate) append_stalls: u64,
}

/// A point-in-time reading of the engine's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Events appended (derived from sessions' sequence numbers).
    pub appends: u64,
    /// Appends refused (payload too large, session ended, pool exhausted).
    pub appends_refused: u64,
    /// Appends that waited for another writer of the same session before
    /// they could store their event: that writer was descheduled in the
    /// middle of an event, which keeps the session's oldest segments from
    /// being released, and the session already held twice its retention.
    /// The wait ends when that writer runs again; a steady rise means
    /// writers are starved of CPU.
    pub appends_stalled: u64,
    /// Events handed to readers (replayed or live).
    pub events_replayed: u64,
    /// Payload bytes handed to readers.
    pub replayed_bytes: u64,
    /// Times a reader found that events it had not read yet were released
    /// (each is one `gap` for that reader, however many events it spans).
    pub reader_gaps: u64,
    /// Sessions opened.
    pub sessions_opened: u64,
    /// Sessions refused by a session cap.
    pub sessions_refused: u64,
    /// Sessions closed explicitly.
    pub sessions_closed: u64,
    /// Sessions ended by the idle TTL.
    pub sessions_expired: u64,
    /// Sessions evicted to stay inside the pool.
    pub sessions_evicted: u64,
    /// Sessions live now.
    pub sessions_live: u64,
    /// Bytes of the segment pool (the global budget, less per-unit words).
    pub pool_bytes: u64,
    /// Bytes of pool segments held by sessions now.
    pub bytes_held: u64,
    /// Bytes of free pool segments whose memory was given back to the
    /// operating system because they stayed free for a whole sweep interval
    /// (see [`Engine::sweep`](crate::Engine::sweep)), parts of the pool no
    /// session ever used included: not resident until reused. The rest of
    /// the free memory (`pool_bytes - bytes_held - bytes_released`) may be.
    pub bytes_released: u64,
    /// Resume decisions made.
    pub resumes: u64,
    /// Resume decisions by verdict, indexed by verdict code.
    pub verdicts: [u64; 7],
    /// Policy answers replaced by the safe default, indexed like
    /// [`PolicyFault::ALL`].
    pub policy_faults: [u64; 5],
}

impl MetricsSnapshot {
    /// Decisions that ended in `v`.
    pub fn verdict_count(&self, v: Verdict) -> u64 {
        self.verdicts.get(v.code() as usize).copied().unwrap_or(0)
    }

    /// Policy answers replaced because of `f`.
    pub fn fault_count(&self, f: PolicyFault) -> u64 {
        self.policy_faults.get(f.index()).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_threads_counts_are_summed() {
        let m = std::sync::Arc::new(Metrics::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.add(Counter::AppendsRefused, 1);
                    }
                    m.verdict(Verdict::Conflict, Some(PolicyFault::OutOfSet));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = m.snapshot(
            7,
            PoolReading {
                capacity_bytes: 100,
                free_bytes: 40,
                released_bytes: 16,
                append_stalls: 3,
            },
        );
        assert_eq!(s.appends_refused, 4000);
        assert_eq!(s.appends, 7);
        assert_eq!(s.bytes_held, 60);
        assert_eq!(s.bytes_released, 16);
        assert_eq!(s.appends_stalled, 3);
        assert_eq!(s.resumes, 4);
        assert_eq!(s.verdict_count(Verdict::Conflict), 4);
        assert_eq!(s.verdict_count(Verdict::Resume), 0);
        assert_eq!(s.fault_count(PolicyFault::OutOfSet), 4);
    }

    #[test]
    fn engines_counting_in_turn_on_the_same_threads_keep_their_own_counts() {
        // Each thread remembers the line of the engine it counted for last;
        // counting for another engine, and for an engine created where a
        // dropped one was, must land in that engine's own line.
        let a = std::sync::Arc::new(Metrics::new());
        let b = std::sync::Arc::new(Metrics::new());
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (a, b) = (a.clone(), b.clone());
                std::thread::spawn(move || {
                    for i in 0..500 {
                        a.add(Counter::AppendsRefused, 1);
                        if i % 3 == 0 {
                            b.add(Counter::AppendsRefused, 2);
                        }
                        a.add_pair(Counter::EventsReplayed, 1, Counter::ReplayedBytes, 10);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for _ in 0..3 {
            let dropped = Metrics::new();
            dropped.add(Counter::AppendsRefused, 5);
            drop(dropped);
            let fresh = Metrics::new();
            fresh.add(Counter::AppendsRefused, 1);
            let s = fresh.snapshot(0, PoolReading::default());
            assert_eq!(s.appends_refused, 1, "a new engine starts from zero");
        }
        let sa = a.snapshot(0, PoolReading::default());
        let sb = b.snapshot(0, PoolReading::default());
        assert_eq!(sa.appends_refused, 1500);
        assert_eq!(sa.events_replayed, 1500);
        assert_eq!(sb.appends_refused, 3 * 167 * 2);
        assert_eq!(sb.events_replayed, 0);
    }

    #[test]
    fn fault_counters_are_the_last_ones_in_policy_fault_order() {
        assert_eq!(
            Counter::fault(PolicyFault::ALL[PolicyFault::ALL.len() - 1]),
            Counter::FaultUnavailable as usize
        );
        assert_eq!(
            COUNTERS,
            Counter::FaultOutOfSet as usize + PolicyFault::ALL.len()
        );
        for (i, f) in PolicyFault::ALL.iter().enumerate() {
            let m = Metrics::new();
            m.verdict(Verdict::Gone, Some(*f));
            let s = m.snapshot(0, PoolReading::default());
            for (j, g) in PolicyFault::ALL.iter().enumerate() {
                assert_eq!(
                    s.fault_count(*g),
                    u64::from(i == j),
                    "{f:?} counted as {g:?}"
                );
            }
        }
    }
}
