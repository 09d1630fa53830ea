//! Bench bodies shared by every implementation, and the data they run on.
//!
//! Each body is generic over [`AppendStore`]/[`ReplayStore`], so the same
//! loop measures Rewind and every baseline in the same group.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::Bencher;

use crate::{AppendStore, ReplayStore};

/// `threads` threads, each appending `payload` to a session of its own,
/// `iters` times each, on a fresh store from `make` (built and dropped
/// outside the timed region). One iteration = one event per thread, all
/// threads at once; the time is from the first thread's start to the last
/// thread's end.
pub fn append_parallel<S: AppendStore>(
    b: &mut Bencher<'_, WallTime>,
    make: impl Fn() -> S,
    threads: usize,
    payload: &[u8],
) {
    b.iter_custom(|iters| {
        let store = make();
        let writers = (0..threads).map(|_| (&store, store.open())).collect();
        run_writers(writers, iters, payload)
    });
}

/// [`append_parallel`] with a store of its own per thread: nothing of one
/// store is shared between the threads, so the time is what the machine
/// gives `threads` independent writers. Beside `append_parallel` on one
/// store it tells the store's cross-session sharing apart from the
/// machine's own scaling (on a shared host the second vCPU is not always
/// a whole core of its own).
pub fn append_parallel_own_store<S: AppendStore>(
    b: &mut Bencher<'_, WallTime>,
    make: impl Fn() -> S,
    threads: usize,
    payload: &[u8],
) {
    b.iter_custom(|iters| {
        let stores: Vec<S> = (0..threads).map(|_| make()).collect();
        let writers = stores.iter().map(|s| (s, s.open())).collect();
        run_writers(writers, iters, payload)
    });
}

/// Two threads appending to the *same* session (a tool's progress
/// notifications and its result come from different tasks).
pub fn append_same_session<S>(b: &mut Bencher<'_, WallTime>, make: impl Fn() -> S, payload: &[u8])
where
    S: AppendStore,
    S::Writer: Clone,
{
    b.iter_custom(|iters| {
        let store = make();
        let first = store.open();
        let writers = vec![(&store, first.clone()), (&store, first)];
        run_writers(writers, iters, payload)
    });
}

/// Wall time and on-CPU time of the writer threads, summed over every
/// [`append_parallel`]/[`append_same_session`] run since the last
/// [`take_writer_cpu`]: tells a lock-free store that got both cores apart
/// from one that shared a core with the machine's other work.
static WRITER_WALL_NS: AtomicU64 = AtomicU64::new(0);
static WRITER_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// How many cores the writer threads kept busy on average since the last
/// call (on-CPU time ÷ wall time; 2.0 = two threads never off a core), or
/// `None` where `/proc/thread-self/schedstat` is unavailable.
pub fn take_writer_cpu() -> Option<f64> {
    let wall = WRITER_WALL_NS.swap(0, Ordering::Relaxed);
    let cpu = WRITER_CPU_NS.swap(0, Ordering::Relaxed);
    (wall > 0 && cpu > 0).then(|| cpu as f64 / wall as f64)
}

/// Nanoseconds this thread has run on a CPU (Linux schedstat), if known.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

fn run_writers<S: AppendStore>(
    writers: Vec<(&S, S::Writer)>,
    iters: u64,
    payload: &[u8],
) -> Duration {
    let barrier = Barrier::new(writers.len());
    let spans: Vec<(Instant, Instant, u64)> = thread::scope(|s| {
        let handles: Vec<_> = writers
            .into_iter()
            .map(|(store, w)| {
                let barrier = &barrier;
                s.spawn(move || {
                    // Onto this thread's stack: left in the closure, it
                    // stays in the box the scope allocated on the spawning
                    // thread's heap, where two writers' state can share a
                    // cache line (BENCHMARKS.md, run AM).
                    let mut w = w;
                    barrier.wait();
                    let cpu_start = thread_cpu_ns();
                    let start = Instant::now();
                    for _ in 0..iters {
                        store.append(&mut w, black_box(payload));
                    }
                    let end = Instant::now();
                    let cpu = match (cpu_start, thread_cpu_ns()) {
                        (Some(a), Some(b)) => b.saturating_sub(a),
                        _ => 0,
                    };
                    (start, end, cpu)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread panicked"))
            .collect()
    });
    let start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one writer");
    let end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one writer");
    let wall = end - start;
    WRITER_WALL_NS.fetch_add(wall.as_nanos() as u64, Ordering::Relaxed);
    WRITER_CPU_NS.fetch_add(spans.iter().map(|s| s.2).sum(), Ordering::Relaxed);
    wall
}

/// Opens `sessions` sessions of `events` events each and returns, per
/// session, the cursor of its *first* event: a replay after it returns the
/// `events - 1` newest.
pub fn populate<S: ReplayStore>(
    store: &S,
    sessions: usize,
    events: usize,
    payload: &[u8],
) -> Vec<S::Cursor> {
    (0..sessions)
        .map(|_| {
            let mut w = store.open();
            let cursor = store.append_for_cursor(&mut w, payload);
            for _ in 1..events {
                store.append(&mut w, payload);
            }
            cursor
        })
        .collect()
}

/// Opens one more session with `events` events and returns the cursor of
/// its next-to-newest event: a resume from it delivers the newest.
pub fn populate_newest<S: ReplayStore>(store: &S, events: usize, payload: &[u8]) -> S::Cursor {
    assert!(events >= 2, "the cursor needs an event after it");
    let mut w = store.open();
    for _ in 2..events {
        store.append(&mut w, payload);
    }
    let cursor = store.append_for_cursor(&mut w, payload);
    store.append(&mut w, payload);
    cursor
}

/// Checks, before anything is measured, that a replay after the first
/// cursor returns `expected` events and a resume delivers one.
pub fn check_replay<S: ReplayStore>(
    store: &S,
    cursors: &[S::Cursor],
    payload: &[u8],
    expected: usize,
) {
    let mut buf = Vec::new();
    let n = store.replay_after(&cursors[0], &mut buf);
    assert_eq!(
        n,
        expected,
        "{}: a replay returned {n} events, expected {expected}",
        S::NAME
    );
    store.rearm(&cursors[0], payload);
    buf.clear();
    assert!(
        store.resume_first(&cursors[0], &mut buf),
        "{}: resume delivered nothing",
        S::NAME
    );
    assert_eq!(buf, payload, "{}: resumed payload differs", S::NAME);
    if store.needs_rearm() {
        // The resume consumed one event; start from a full receiver again.
        store.replay_after(&cursors[0], &mut buf);
        store.rearm(&cursors[0], payload);
    }
}

/// Visits cursors in a scattered order (a resume picks an arbitrary
/// session, whose data is usually not in cache), carrying on across calls.
#[derive(Debug)]
pub struct CursorWalk {
    next: usize,
    len: usize,
    stride: usize,
}

impl CursorWalk {
    /// A walk over `len` cursors.
    pub fn new(len: usize) -> CursorWalk {
        assert!(len > 0, "no cursors to walk");
        // A prime far larger than any session count here is coprime with it.
        CursorWalk {
            next: 0,
            len,
            stride: 1_000_003 % len.max(2),
        }
    }

    /// The index of the next cursor.
    #[inline]
    pub fn step(&mut self) -> usize {
        let at = self.next;
        self.next = (self.next + self.stride.max(1)) % self.len;
        at
    }
}

/// One iteration = one replay of everything after a cursor (the newest 64
/// events of one session among all of them), copying each payload out.
pub fn replay<S: ReplayStore>(
    b: &mut Bencher<'_, WallTime>,
    store: &S,
    cursors: &[S::Cursor],
    walk: &mut CursorWalk,
    payload: &[u8],
) {
    let mut buf = Vec::with_capacity(payload.len());
    b.iter_custom(|iters| {
        if store.needs_rearm() {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let c = &cursors[walk.step()];
                let start = Instant::now();
                black_box(store.replay_after(c, &mut buf));
                total += start.elapsed();
                store.rearm(c, payload);
            }
            total
        } else {
            let start = Instant::now();
            for _ in 0..iters {
                black_box(store.replay_after(&cursors[walk.step()], &mut buf));
            }
            start.elapsed()
        }
    });
}

/// One iteration = one resume decision: find the session, find the cursor's
/// position, deliver the first event after it.
pub fn resume<S: ReplayStore>(
    b: &mut Bencher<'_, WallTime>,
    store: &S,
    cursors: &[S::Cursor],
    walk: &mut CursorWalk,
) {
    let mut buf = Vec::new();
    b.iter_custom(|iters| {
        let start = Instant::now();
        for _ in 0..iters {
            black_box(store.resume_first(&cursors[walk.step()], &mut buf));
        }
        start.elapsed()
    });
}

/// The floor of a replay: the same payload bytes copied out with plain
/// `memcpy`, one event at a time, from one contiguous buffer.
pub fn memcpy_events(b: &mut Bencher<'_, WallTime>, source: &[u8], event_len: usize) {
    let mut buf = Vec::with_capacity(event_len);
    b.iter(|| {
        for event in source.chunks_exact(event_len) {
            crate::deliver(&mut buf, event);
        }
    });
}

/// Events a rotating writer appends to one session before closing it and
/// opening the next, so every store stays bounded however long it runs.
pub const ROTATE_EVERY: usize = 256;

/// The other side's rate in the last contended run (events or replays per
/// second), for the bench to print beside criterion's number.
static BACKGROUND_RATE: AtomicU64 = AtomicU64::new(0);

/// The rate of the background side in the last [`append_while_replaying`]
/// or [`replay_while_appending`] run.
pub fn take_background_rate() -> f64 {
    f64::from_bits(BACKGROUND_RATE.swap(0, Ordering::Relaxed))
}

fn record_rate(count: u64, elapsed: Duration) {
    let rate = count as f64 / elapsed.as_secs_f64().max(1e-9);
    BACKGROUND_RATE.store(rate.to_bits(), Ordering::Relaxed);
}

/// The writer's side of a shared store: one iteration = one append, by a
/// writer that rotates sessions every [`ROTATE_EVERY`] events, while
/// another thread replays scattered sessions of the same store as fast as
/// it can ([`take_background_rate`]: its replays/s).
pub fn append_while_replaying<S: ReplayStore>(
    b: &mut Bencher<'_, WallTime>,
    store: &S,
    cursors: &[S::Cursor],
    payload: &[u8],
) {
    b.iter_custom(|iters| {
        let stop = AtomicBool::new(false);
        let replays = AtomicU64::new(0);
        thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut walk = CursorWalk::new(cursors.len());
                let mut buf = Vec::new();
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    black_box(store.replay_after(&cursors[walk.step()], &mut buf));
                    replays.fetch_add(1, Ordering::Relaxed);
                }
                start.elapsed()
            });
            let start = Instant::now();
            let mut w = store.open();
            for i in 0..iters as usize {
                if i % ROTATE_EVERY == ROTATE_EVERY - 1 {
                    store.close(std::mem::replace(&mut w, store.open()));
                }
                store.append(&mut w, black_box(payload));
            }
            let elapsed = start.elapsed();
            store.close(w);
            stop.store(true, Ordering::Relaxed);
            let read_for = reader.join().expect("reader panicked");
            record_rate(replays.load(Ordering::Relaxed), read_for);
            elapsed
        })
    });
}

/// The reader's side of a shared store: one iteration = one replay of a
/// scattered session's newest events, while another thread appends to the
/// same store as fast as it can, rotating sessions every [`ROTATE_EVERY`]
/// events ([`take_background_rate`]: its events/s).
pub fn replay_while_appending<S: ReplayStore>(
    b: &mut Bencher<'_, WallTime>,
    store: &S,
    cursors: &[S::Cursor],
    walk: &mut CursorWalk,
    payload: &[u8],
) {
    let mut buf = Vec::with_capacity(payload.len());
    b.iter_custom(|iters| {
        let stop = AtomicBool::new(false);
        let appended = AtomicU64::new(0);
        thread::scope(|s| {
            let writer = s.spawn(|| {
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let mut w = store.open();
                    for _ in 0..ROTATE_EVERY {
                        store.append(&mut w, payload);
                    }
                    store.close(w);
                    appended.fetch_add(ROTATE_EVERY as u64, Ordering::Relaxed);
                }
                start.elapsed()
            });
            let start = Instant::now();
            for _ in 0..iters {
                black_box(store.replay_after(&cursors[walk.step()], &mut buf));
            }
            let elapsed = start.elapsed();
            stop.store(true, Ordering::Relaxed);
            let wrote_for = writer.join().expect("writer panicked");
            record_rate(appended.load(Ordering::Relaxed), wrote_for);
            elapsed
        })
    });
}
