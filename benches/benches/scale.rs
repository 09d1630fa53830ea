//! The engine at scale: how cost grows with the number of sessions.
//!
//! Not a criterion group: each figure needs a population of sessions built
//! once (up to a million), then measured in one pass. Printed as a table:
//!
//! - **idle bytes per session**: heap bytes an open session holds with
//!   nothing retained, by a counting allocator (everything: a session with
//!   no events holds no pool memory);
//! - **append / replay at N sessions** (10k, 100k; 1M with
//!   `REWIND_SCALE_1M=1`): one 300-byte event appended to a random session,
//!   and one replay (resume position → first event copied out) of a random
//!   session, in ns per operation, so the growth from 10k to 1M is the
//!   figure;
//! - **reconnect storm**: every session of a 100k population resumes at
//!   once through the WebAssembly default policy (`Engine::resume`: lookup,
//!   facts, sandboxed decision, first replayed event), on every core:
//!   decisions per second and the p50/p99/p999 of one resume.
//!
//! Sizes: `REWIND_SCALE_SESSIONS=10000,100000` (the list of populations),
//! `REWIND_SCALE_STORM=100000`, `REWIND_SCALE_SESSION_EVENTS=8` (events
//! each session keeps). The pool is sized for the population (8 KiB
//! per session). Under `cargo test --benches` (no `--bench`) every size is
//! tiny so CI runs the whole body in well under a second.
//!
//! Run: `cargo bench -p rewind-benches --bench scale`.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rewind_benches::alloc::{live_bytes, Counting};
use rewind_benches::payload;
use rewind_engine::policy::wasm::PolicyHost;
use rewind_engine::{Config, Engine, EventId, ResumeAction, ResumeRequest, SessionHandle};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Size of every event (a progress notification).
const EVENT_BYTES: usize = 300;

#[derive(Debug, Clone)]
struct Sizes {
    populations: Vec<usize>,
    storm: usize,
    ops: usize,
    session_events: u64,
    full: bool,
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl Sizes {
    fn from_env() -> Sizes {
        let args: Vec<String> = std::env::args().collect();
        let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
        let mut populations: Vec<usize> = std::env::var("REWIND_SCALE_SESSIONS")
            .ok()
            .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
            .unwrap_or_else(|| {
                if full {
                    vec![10_000, 100_000]
                } else {
                    vec![1_000, 4_000]
                }
            });
        if full && std::env::var("REWIND_SCALE_1M").is_ok_and(|v| v == "1") {
            populations.push(1_000_000);
        }
        Sizes {
            populations,
            storm: env_usize("REWIND_SCALE_STORM").unwrap_or(if full { 100_000 } else { 2_000 }),
            ops: if full { 1_000_000 } else { 20_000 },
            session_events: env_usize("REWIND_SCALE_SESSION_EVENTS").unwrap_or(8) as u64,
            full,
        }
    }

    /// The pool for `sessions`: 8 KiB each, at least 64 MiB.
    fn pool_bytes(sessions: usize) -> u64 {
        (8192 * sessions as u64).max(64 << 20)
    }

    fn engine(&self, sessions: usize, policy: Option<Arc<PolicyHost>>) -> Engine {
        let mut config = Config::default();
        config.session_events = self.session_events;
        config.max_sessions = sessions.max(1) * 2;
        // Retention by events only (a byte floor of 4 KiB instead of the
        // default 256 KiB, which random appends would otherwise fill until
        // the pool evicts), and room for every session's window without
        // eviction: an evicted session would end the measurement.
        config.session_bytes = 4 * 1024;
        config.global_bytes = Sizes::pool_bytes(sessions);
        config.max_event_bytes = 60 * 1024;
        match policy {
            Some(p) => Engine::with_policy(config, p).expect("valid config"),
            None => Engine::new(config).expect("valid config"),
        }
    }
}

/// A population of sessions, each holding one event on its stream.
struct Population {
    engine: Engine,
    handles: Vec<SessionHandle>,
    streams: Vec<u32>,
    /// Per session: its id, and the cursor before its event (the priming
    /// position a client resumes from).
    cursors: Vec<(String, EventId)>,
    /// Heap bytes the engine allocated for the population, plus its pool.
    engine_bytes: isize,
}

fn populate(sizes: &Sizes, n: usize, policy: Option<Arc<PolicyHost>>) -> Population {
    let before = live_bytes();
    let engine = sizes.engine(n, policy);
    let event = payload(EVENT_BYTES);
    let mut handles = Vec::with_capacity(n);
    let mut streams = Vec::with_capacity(n);
    let mut cursors = Vec::with_capacity(n);
    for _ in 0..n {
        let h = engine.open(None).expect("room for the session");
        let s = h.new_stream().expect("a stream");
        let at = h.cursor_now(s);
        h.append(s, &event).expect("append");
        cursors.push((h.id().to_string(), at));
        streams.push(s);
        handles.push(h);
    }
    // The heap the engine allocated, plus its pool's mapping in full (the
    // pool is mapped from the OS, outside the counting allocator).
    let engine_bytes = live_bytes() - before + Sizes::pool_bytes(n) as isize;
    Population {
        engine,
        handles,
        streams,
        cursors,
        engine_bytes,
    }
}

/// Heap bytes per idle session (opened, nothing appended, handle dropped).
fn idle_bytes(sizes: &Sizes) -> f64 {
    let n = if sizes.full { 100_000 } else { 5_000 };
    let engine = sizes.engine(n, None);
    let warm: Vec<_> = (0..64).map(|_| engine.open(None).expect("open")).collect();
    drop(warm);
    let before = live_bytes();
    let mut ids = Vec::with_capacity(n);
    let ids_bytes = (n * std::mem::size_of::<rewind_engine::SessionId>()) as isize;
    for _ in 0..n {
        ids.push(engine.open(None).expect("open").id());
    }
    let total = (live_bytes() - before - ids_bytes) as f64 / n as f64;
    black_box(&ids);
    total
}

fn ns_per(d: Duration, ops: usize) -> f64 {
    d.as_nanos() as f64 / ops as f64
}

/// ns per append and per replay at population `n`.
fn append_replay(sizes: &Sizes, n: usize) -> (f64, f64, f64) {
    let pop = populate(sizes, n, None);
    let event = payload(EVENT_BYTES);
    let mut rng = fastrand::Rng::with_seed(7);
    let picks: Vec<usize> = (0..sizes.ops).map(|_| rng.usize(..n)).collect();
    let t = Instant::now();
    for &i in &picks {
        black_box(
            pop.handles[i]
                .append(pop.streams[i], &event)
                .expect("append"),
        );
    }
    let append = ns_per(t.elapsed(), picks.len());
    // The appends may have released old segments: give every session a
    // fresh cursor before one last event (setup, not timed).
    let cursors: Vec<EventId> = pop
        .handles
        .iter()
        .zip(&pop.streams)
        .map(|(h, &s)| {
            let at = h.cursor_now(s);
            h.append(s, &event).expect("append");
            at
        })
        .collect();
    let mut buf = Vec::with_capacity(EVENT_BYTES);
    let t = Instant::now();
    for &i in &picks {
        let mut r = pop.handles[i]
            .subscribe_from(pop.streams[i], cursors[i])
            .expect("cursor in window");
        black_box(r.next_into(&mut buf).expect("readable"));
    }
    let replay = ns_per(t.elapsed(), picks.len());
    (append, replay, pop.engine_bytes as f64 / n as f64)
}

struct StormResult {
    decisions_per_s: f64,
    p50_ns: u64,
    p99_ns: u64,
    p999_ns: u64,
    replayed: usize,
}

/// Every session resumes at once through the WASM default policy, on every
/// core.
fn storm(sizes: &Sizes) -> StormResult {
    let host = Arc::new(PolicyHost::with_default_policy().expect("default policy"));
    let pop = Arc::new(populate(sizes, sizes.storm, Some(host)));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let pop = Arc::clone(&pop);
            let next = Arc::clone(&next);
            std::thread::spawn(move || {
                let mut h =
                    Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("bounds");
                let mut buf = Vec::with_capacity(EVENT_BYTES);
                let mut replayed = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((sid, at)) = pop.cursors.get(i) else {
                        break;
                    };
                    let cursor = at.to_string();
                    let t = Instant::now();
                    let decision = pop.engine.resume(ResumeRequest {
                        session_id: Some(sid),
                        last_event_id: Some(&cursor),
                        principal: None,
                    });
                    if let ResumeAction::Replay(mut r) = decision.action {
                        if matches!(r.next_into(&mut buf), Ok(Some(_))) {
                            replayed += 1;
                        }
                    }
                    let _ = h.record(t.elapsed().as_nanos() as u64);
                }
                (h, replayed)
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("bounds");
    let mut replayed = 0;
    for w in workers {
        let (h, r) = w.join().expect("storm thread");
        all.add(h).expect("same bounds");
        replayed += r;
    }
    let elapsed = started.elapsed();
    StormResult {
        decisions_per_s: pop.cursors.len() as f64 / elapsed.as_secs_f64(),
        p50_ns: all.value_at_quantile(0.5),
        p99_ns: all.value_at_quantile(0.99),
        p999_ns: all.value_at_quantile(0.999),
        replayed,
    }
}

fn main() {
    let sizes = Sizes::from_env();
    println!(
        "engine at scale ({}; {} events kept per session, {EVENT_BYTES}-byte events)",
        if sizes.full {
            "full run"
        } else {
            "test mode: tiny sizes"
        },
        sizes.session_events
    );
    let idle = idle_bytes(&sizes);
    println!("idle session: {idle:.0} heap bytes in all (no pool memory until its first event)");
    println!(
        "{:>10}  {:>12}  {:>12}  {:>16}",
        "sessions", "append ns", "replay ns", "engine B/session"
    );
    let mut first: Option<(f64, f64)> = None;
    for &n in &sizes.populations {
        let (a, r, bytes) = append_replay(&sizes, n);
        let growth = first.map_or(String::new(), |(a0, r0)| {
            format!(
                "  (×{:.2} append, ×{:.2} replay vs the first row)",
                a / a0,
                r / r0
            )
        });
        first.get_or_insert((a, r));
        println!("{n:>10}  {a:>12.1}  {r:>12.1}  {bytes:>16.0}{growth}");
    }
    let s = storm(&sizes);
    println!(
        "reconnect storm: {} sessions resume at once through the wasm default policy: {:.0} decisions/s, \
         one resume p50 {} ns, p99 {} ns, p999 {} ns; {} replayed their event",
        sizes.storm, s.decisions_per_s, s.p50_ns, s.p99_ns, s.p999_ns, s.replayed
    );
    assert_eq!(
        s.replayed, sizes.storm,
        "every resume replays its session's event"
    );
}
