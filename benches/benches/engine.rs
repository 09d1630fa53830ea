//! Engine benches: append, replay after a cursor, resume decision, payload
//! copy bandwidth — Rewind beside today's stores, in the same groups.
//!
//! `cargo bench -p rewind-benches --bench engine`; numbers and how to read
//! them are in `BENCHMARKS.md`. Under `cargo test --benches` every bench runs
//! once on 500 sessions instead of 100 000.

use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::{Bencher, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use rewind_benches::bodies::{self, CursorWalk};
use rewind_benches::scale::{selected, Scale};
use rewind_benches::stores::BASELINE_EVENTS_PER_SESSION;
use rewind_benches::{
    payload, AppendStore, BroadcastPerSession, FloorStore, GoStyleStore, ReplayStore,
    RewindPerEventStore, RewindSingleWriterStore, RewindStore, ScanSortStore, SharedMutexStore,
};

/// Payload of the append, replay and resume groups.
const EVENT_BYTES: usize = 100;
/// Events a replay returns.
const REPLAYED: usize = 64;
/// Payload of the copy-bandwidth group.
const LARGE_EVENT_BYTES: usize = 4096;

fn main() {
    let scale = Scale::from_env();
    let mut c = Criterion::default()
        .warm_up_time(scale.warm_up())
        .measurement_time(scale.measurement())
        .sample_size(20)
        // Plots and 100k bootstrap resamples cost more than the measuring.
        .nresamples(20_000)
        .without_plots()
        .configure_from_args();
    append(&mut c);
    replay_and_resume(&mut c, &scale);
    copy(&mut c);
    c.final_summary();
}

fn append(c: &mut Criterion) {
    if !selected("append") {
        return;
    }
    let p = payload(EVENT_BYTES);
    let p = &p[..];
    let rewind = || RewindStore::new(64);
    let single_writer = || RewindSingleWriterStore(RewindStore::new(64));
    let mut g = c.benchmark_group("append");

    g.throughput(Throughput::Elements(2));
    let v = "2t_distinct";
    append_bench::<FloorStore>(&mut g, v, |b| {
        bodies::append_parallel(b, FloorStore::default, 2, p)
    });
    append_bench::<RewindStore>(&mut g, v, |b| bodies::append_parallel(b, rewind, 2, p));
    append_bench::<RewindSingleWriterStore>(&mut g, v, |b| {
        bodies::append_parallel(b, single_writer, 2, p)
    });
    append_bench::<SharedMutexStore>(&mut g, v, |b| {
        bodies::append_parallel(b, SharedMutexStore::default, 2, p)
    });
    append_bench::<GoStyleStore>(&mut g, v, |b| {
        bodies::append_parallel(b, GoStyleStore::default, 2, p)
    });
    append_bench::<BroadcastPerSession>(&mut g, v, |b| {
        bodies::append_parallel(b, BroadcastPerSession::default, 2, p)
    });
    append_bench::<ScanSortStore>(&mut g, v, |b| {
        bodies::append_parallel(b, ScanSortStore::default, 2, p)
    });

    // The control for `2t_distinct`: each thread on a store of its own,
    // so nothing is shared but the machine. Rewind's `2t_distinct` at its
    // `2t_own_store` time means its sessions do not slow each other; what
    // is left of the gap to `1t` is the host's.
    let v = "2t_own_store";
    append_bench::<FloorStore>(&mut g, v, |b| {
        bodies::append_parallel_own_store(b, FloorStore::default, 2, p)
    });
    append_bench::<RewindStore>(&mut g, v, |b| {
        bodies::append_parallel_own_store(b, rewind, 2, p)
    });
    append_bench::<RewindSingleWriterStore>(&mut g, v, |b| {
        bodies::append_parallel_own_store(b, single_writer, 2, p)
    });

    let v = "2t_same_session";
    append_bench::<RewindStore>(&mut g, v, |b| bodies::append_same_session(b, rewind, p));
    append_bench::<SharedMutexStore>(&mut g, v, |b| {
        bodies::append_same_session(b, SharedMutexStore::default, p)
    });
    append_bench::<GoStyleStore>(&mut g, v, |b| {
        bodies::append_same_session(b, GoStyleStore::default, p)
    });
    append_bench::<BroadcastPerSession>(&mut g, v, |b| {
        bodies::append_same_session(b, BroadcastPerSession::default, p)
    });
    append_bench::<ScanSortStore>(&mut g, v, |b| {
        bodies::append_same_session(b, ScanSortStore::default, p)
    });

    g.throughput(Throughput::Elements(1));
    let v = "1t";
    append_bench::<FloorStore>(&mut g, v, |b| {
        bodies::append_parallel(b, FloorStore::default, 1, p)
    });
    append_bench::<RewindStore>(&mut g, v, |b| bodies::append_parallel(b, rewind, 1, p));
    append_bench::<RewindSingleWriterStore>(&mut g, v, |b| {
        bodies::append_parallel(b, single_writer, 1, p)
    });
    append_bench::<SharedMutexStore>(&mut g, v, |b| {
        bodies::append_parallel(b, SharedMutexStore::default, 1, p)
    });
    append_bench::<GoStyleStore>(&mut g, v, |b| {
        bodies::append_parallel(b, GoStyleStore::default, 1, p)
    });
    append_bench::<BroadcastPerSession>(&mut g, v, |b| {
        bodies::append_parallel(b, BroadcastPerSession::default, 1, p)
    });
    append_bench::<ScanSortStore>(&mut g, v, |b| {
        bodies::append_parallel(b, ScanSortStore::default, 1, p)
    });
    g.finish();
}

/// One append bench, then how many cores its writer threads kept busy (on a
/// shared 2-core machine, a lock-free store below ~1.9 did not get both).
fn append_bench<S: AppendStore>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    variant: &str,
    body: impl FnMut(&mut Bencher<'_, WallTime>),
) {
    g.bench_function(BenchmarkId::new(variant, S::NAME), body);
    if let Some(cores) = bodies::take_writer_cpu() {
        eprintln!(
            "append/{variant}/{}: writer threads kept {cores:.2} cores busy",
            S::NAME
        );
    }
}

/// What to run on one store in the replay and resume groups.
struct Plan {
    /// Also measure replay while another thread appends.
    contended: bool,
    /// Also measure the resume decision.
    resume: bool,
    /// Samples per bench (the scan-and-sort store is ~1000× slower).
    samples: usize,
}

fn replay_and_resume(c: &mut Criterion, scale: &Scale) {
    let full = Plan {
        contended: true,
        resume: true,
        samples: 20,
    };
    // Rewind: 64-slot rings, 8 KiB of payload per session.
    replay_store(c, scale, RewindStore::new(64), &full);
    // The same engine read one event per call: what batching saves.
    replay_store(
        c,
        scale,
        RewindPerEventStore(RewindStore::new(64)),
        &Plan {
            contended: false,
            resume: false,
            ..full
        },
    );
    replay_store(
        c,
        scale,
        SharedMutexStore::new(BASELINE_EVENTS_PER_SESSION),
        &full,
    );
    // A budget the benches never reach: Go's purge sweeps every stream.
    replay_store(c, scale, GoStyleStore::new(usize::MAX), &full);
    // No cursor to resume from.
    replay_store(
        c,
        scale,
        BroadcastPerSession::new(REPLAYED),
        &Plan {
            resume: false,
            ..full
        },
    );
    // Unbounded and never cleaned: a background writer would grow it without
    // limit, and it needs no help to be slow.
    replay_store(
        c,
        scale,
        ScanSortStore::default(),
        &Plan {
            contended: false,
            resume: true,
            samples: 10,
        },
    );
}

fn replay_store<S: ReplayStore>(c: &mut Criterion, scale: &Scale, store: S, plan: &Plan) {
    let name = S::NAME;
    let wanted = |group: &str, variant: &str| selected(&format!("{group}/{variant}/{name}"));
    let contended =
        plan.contended && (wanted("contended", "writer") || wanted("contended", "reader"));
    let resume = plan.resume
        && (wanted("resume_decision", "scattered")
            || wanted("resume_decision", "same_session")
            || wanted("resume_decision", "newest"));
    if !(wanted("replay", "scattered") || wanted("replay", "same_session") || contended || resume) {
        return;
    }
    let p = payload(EVENT_BYTES);
    let p = &p[..];
    let started = Instant::now();
    let cursors = bodies::populate(&store, scale.sessions, REPLAYED + 1, p);
    eprintln!(
        "{name}: {} sessions × {} events built in {:.1?}",
        scale.sessions,
        REPLAYED + 1,
        started.elapsed()
    );
    bodies::check_replay(&store, &cursors, p, REPLAYED);
    // `scattered`: each iteration resumes another session (cold caches, as a
    // reconnect storm would); `same_session`: one session over and over
    // (hot caches: the CPU cost alone).
    let mut scattered = CursorWalk::new(cursors.len());
    let mut same = CursorWalk::new(1);
    let one = &cursors[..1];

    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Elements(REPLAYED as u64))
        .sample_size(plan.samples);
    g.bench_function(BenchmarkId::new("scattered", name), |b| {
        bodies::replay(b, &store, &cursors, &mut scattered, p)
    });
    g.bench_function(BenchmarkId::new("same_session", name), |b| {
        bodies::replay(b, &store, one, &mut same, p)
    });
    g.finish();
    if contended {
        // Both sides of one shared store at once: the writer's appends while
        // a reader replays, and the reader's replays while a writer appends.
        let mut g = c.benchmark_group("contended");
        g.sample_size(plan.samples);
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("writer", name), |b| {
            bodies::append_while_replaying(b, &store, &cursors, p)
        });
        eprintln!(
            "contended/writer/{name}: the reader replayed {:.0} times/s meanwhile",
            bodies::take_background_rate()
        );
        g.throughput(Throughput::Elements(REPLAYED as u64));
        g.bench_function(BenchmarkId::new("reader", name), |b| {
            bodies::replay_while_appending(b, &store, &cursors, &mut scattered, p)
        });
        eprintln!(
            "contended/reader/{name}: the writer appended {:.2} M events/s meanwhile",
            bodies::take_background_rate() / 1e6
        );
        g.finish();
    }

    if resume {
        let mut g = c.benchmark_group("resume_decision");
        g.throughput(Throughput::Elements(1))
            .sample_size(plan.samples);
        g.bench_function(BenchmarkId::new("scattered", name), |b| {
            bodies::resume(b, &store, &cursors, &mut scattered)
        });
        g.bench_function(BenchmarkId::new("same_session", name), |b| {
            bodies::resume(b, &store, one, &mut same)
        });
        // A client that dropped just now: its cursor is the session's
        // next-to-newest event, in the segment still being written.
        let newest = [bodies::populate_newest(&store, REPLAYED + 1, p)];
        assert!(
            store.resume_first(&newest[0], &mut Vec::new()),
            "{name}: a resume from the next-to-newest event delivered nothing"
        );
        let mut walk = CursorWalk::new(1);
        g.bench_function(BenchmarkId::new("newest", name), |b| {
            bodies::resume(b, &store, &newest, &mut walk)
        });
        g.finish();
    }
    let started = Instant::now();
    drop(store);
    eprintln!("{name}: dropped in {:.1?}", started.elapsed());
}

fn copy(c: &mut Criterion) {
    if !selected("copy_4k") {
        return;
    }
    let p = payload(LARGE_EVENT_BYTES);
    let p = &p[..];
    let mut g = c.benchmark_group("copy_4k");
    g.throughput(Throughput::Bytes((REPLAYED * LARGE_EVENT_BYTES) as u64));

    let source = p.repeat(REPLAYED);
    g.bench_function("memcpy", |b| {
        bodies::memcpy_events(b, &source, LARGE_EVENT_BYTES)
    });

    // The default configuration: segments grow to 8 KiB, and past it to
    // hold four events of this size (32 KiB here), within a quarter of the
    // session's retention. (Capped at 8 KiB, each segment held one 4 KiB
    // event and every event was a segment boundary: about 25 % longer per
    // event, 30 % batched; run AN.)
    let rewind = RewindStore::new(64);
    copy_store(&mut g, &rewind, p);
    // One event per call into one reused buffer, as the memcpy floor and
    // the SSE writer copy: the destination stays in L1 instead of growing
    // to a 256 KiB batch.
    copy_store(&mut g, &RewindPerEventStore(RewindStore::new(64)), p);
    copy_store(
        &mut g,
        &SharedMutexStore::new(BASELINE_EVENTS_PER_SESSION),
        p,
    );
    g.finish();
}

fn copy_store<S: ReplayStore>(g: &mut BenchmarkGroup<'_, WallTime>, store: &S, p: &[u8]) {
    let cursors = bodies::populate(store, 1, REPLAYED + 1, p);
    bodies::check_replay(store, &cursors, p, REPLAYED);
    let mut walk = CursorWalk::new(1);
    g.bench_function(S::NAME, |b| {
        bodies::replay(b, store, &cursors, &mut walk, p)
    });
}
