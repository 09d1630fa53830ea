//! Durable pools beside the heap pool, in the same groups: append under each
//! sync policy, replay of a session's last 64 events, and recovery of a
//! data directory at start.
//!
//! `cargo bench -p rewind-benches --bench durable`. The data directories are
//! made under `target/` (set `REWIND_BENCH_DATA_DIR` to measure another
//! disk): `EveryAppend` costs what the device's flush costs, so a tmpfs
//! flatters it. Under `cargo test --benches` every bench runs once.

use std::path::{Path, PathBuf};
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use rewind_benches::payload;
use rewind_benches::scale::Scale;
use rewind_engine::{Config, Engine, SyncPolicy};

/// Payload of an appended event (a progress notification).
const EVENT_BYTES: usize = 100;
/// Events a replay returns.
const REPLAYED: usize = 64;

fn main() {
    let scale = Scale::from_env();
    let mut c = Criterion::default()
        .warm_up_time(scale.warm_up())
        .measurement_time(scale.measurement())
        .sample_size(20)
        .nresamples(20_000)
        .without_plots()
        .configure_from_args();
    let root = std::env::var_os("REWIND_BENCH_DATA_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&root).expect("bench data directory");
    append(&mut c, &root);
    replay(&mut c, &root);
    recovery(&mut c, &root);
    c.final_summary();
}

fn config(dir: Option<&Path>, sync: SyncPolicy) -> Config {
    let mut c = Config::default();
    c.global_bytes = 64 << 20;
    c.max_event_bytes = 1 << 20;
    c.data_dir = dir.map(Path::to_owned);
    c.sync = sync;
    c
}

/// Each variant: the pool it runs on, named as in the report.
fn variants() -> [(&'static str, bool, SyncPolicy); 4] {
    [
        ("heap", false, SyncPolicy::None),
        ("mmap_sync_none", true, SyncPolicy::None),
        ("mmap_sync_every_100ms", true, SyncPolicy::EveryMs(100)),
        ("mmap_sync_every_append", true, SyncPolicy::EveryAppend),
    ]
}

fn engine(
    root: &Path,
    name: &str,
    durable: bool,
    sync: SyncPolicy,
) -> (Engine, Option<tempdir::Dir>) {
    if !durable {
        return (Engine::new(config(None, sync)).expect("heap config"), None);
    }
    let dir = tempdir::Dir::new(root, name);
    let e = Engine::new(config(Some(dir.path()), sync)).expect("durable config");
    (e, Some(dir))
}

fn append(c: &mut Criterion, root: &Path) {
    let p = payload(EVENT_BYTES);
    let mut g = c.benchmark_group("durable_append");
    g.throughput(Throughput::Elements(1));
    for (name, durable, sync) in variants() {
        let (e, _dir) = engine(root, name, durable, sync);
        let s = e.open(None).expect("session");
        g.bench_function(BenchmarkId::new("1t", name), |b| {
            b.iter(|| s.append(0, &p).expect("append"))
        });
    }
    g.finish();
}

fn replay(c: &mut Criterion, root: &Path) {
    let p = payload(EVENT_BYTES);
    let mut g = c.benchmark_group("durable_replay");
    g.throughput(Throughput::Elements(REPLAYED as u64));
    for (name, durable, sync) in &variants()[..2] {
        let (e, _dir) = engine(root, name, *durable, *sync);
        let s = e.open(None).expect("session");
        let mut last = None;
        for _ in 0..1000 {
            last = Some(s.append(0, &p).expect("append"));
        }
        let from = last.expect("appended").seq - REPLAYED as u64;
        let cursor = s.cursor_now(0);
        let mut buf = Vec::with_capacity(EVENT_BYTES);
        g.bench_function(BenchmarkId::new("last_64", name), |b| {
            b.iter(|| {
                let mut r = s
                    .subscribe_from(
                        0,
                        rewind_engine::EventId {
                            seq: from,
                            ..cursor
                        },
                    )
                    .expect("own cursor");
                let mut n = 0;
                while r.next_into(&mut buf).expect("replay").is_some() {
                    n += 1;
                }
                assert_eq!(n, REPLAYED);
            })
        });
    }
    g.finish();
}

/// Opening a data directory holding 1000 sessions of 64 events each.
fn recovery(c: &mut Criterion, root: &Path) {
    let p = payload(EVENT_BYTES);
    let dir = tempdir::Dir::new(root, "recovery");
    {
        let e = Engine::new(config(Some(dir.path()), SyncPolicy::None)).expect("config");
        for _ in 0..1000 {
            let s = e.open(None).expect("session");
            for _ in 0..REPLAYED {
                s.append(0, &p).expect("append");
            }
        }
    }
    let mut g = c.benchmark_group("durable_recovery");
    g.throughput(Throughput::Elements(1000 * REPLAYED as u64));
    g.bench_function("1000_sessions_64_events", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let e = Engine::new(config(Some(dir.path()), SyncPolicy::None)).expect("reopen");
                total += started.elapsed();
                assert_eq!(e.recovery().expect("durable").sessions, 1000);
            }
            total
        })
    });
    g.finish();
}

/// Data directories removed when the bench is done with them.
mod tempdir {
    use std::path::{Path, PathBuf};

    pub(crate) struct Dir(PathBuf);

    impl Dir {
        pub(crate) fn new(root: &Path, name: &str) -> Dir {
            let path = root.join(format!("{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            Dir(path)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
