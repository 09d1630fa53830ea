//! Engine memory, measured with a counting allocator: every byte the engine
//! allocates counts, plus the segment pool in full (the pool is one
//! anonymous mapping of the configured size, outside the allocator; its
//! whole size is added, an upper bound on what the operating system
//! commits for it — `pool_commit.rs` checks what it does commit).
//!
//! - an idle session (nothing retained) costs at most 512 bytes in all;
//! - 100 000 sessions holding one 300-byte event each (as after an MCP
//!   `initialize`) fit in 128 MiB of engine memory;
//!   1 000 000 sessions against 1.28 GiB, an ignored test (`cargo test
//!   --release -p rewind-benches --test memory -- --ignored`);
//! - opening ten times what the pool holds never grows memory beyond the
//!   pool plus the session cap's bookkeeping.
//!
//! The tests run one after another (they share the counter). They live in
//! the benches crate, beside the scale bench, because both use its counting
//! allocator (`rewind_benches::alloc`).

use std::sync::Mutex;

use rewind_benches::alloc::{live_bytes, Counting};
use rewind_engine::{AppendError, Config, Engine, OpenError};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[global_allocator]
static ALLOC: Counting = Counting;

const MIB: f64 = 1024.0 * 1024.0;

fn config(global_bytes: u64, max_sessions: usize) -> Config {
    let mut c = Config::default();
    c.global_bytes = global_bytes;
    c.max_sessions = max_sessions;
    c.max_event_bytes = 60 * 1024;
    c
}

#[test]
fn an_idle_session_costs_at_most_512_bytes_in_all() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let engine = Engine::new(config(1 << 20, 100_000)).unwrap();
    let warm: Vec<_> = (0..64).map(|_| engine.open(None).unwrap()).collect();
    drop(warm);
    const N: isize = 20_000;
    let mut ids = Vec::with_capacity(N as usize);
    let before = live_bytes();
    for _ in 0..N {
        ids.push(engine.open(None).unwrap().id()); // the handle is dropped: idle
    }
    let ids_bytes = (ids.capacity() * std::mem::size_of::<rewind_engine::SessionId>()) as isize;
    let per_session = (live_bytes() - before - ids_bytes) / N;
    eprintln!("{per_session} bytes per idle session, storage included");
    assert!(per_session <= 512, "{per_session} bytes per idle session");
    assert_eq!(
        engine.metrics().bytes_held,
        0,
        "an idle session holds no segment"
    );
    assert!(engine.session(ids[0]).is_some());
}

/// Engine memory for `n` sessions holding one 300-byte event each.
fn sessions_with_one_event(n: usize, pool_bytes: u64) -> f64 {
    let before = live_bytes();
    let engine = Engine::new(config(pool_bytes, n)).unwrap();
    let event = [b'x'; 300];
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let s = engine.open(None).unwrap();
        s.append(1, &event).unwrap();
        ids.push(s.id());
    }
    let ids_bytes = (ids.capacity() * std::mem::size_of::<rewind_engine::SessionId>()) as isize;
    // The pool's mapping, all of it.
    let total = (live_bytes() - before - ids_bytes) as f64 + pool_bytes as f64;
    let m = engine.metrics();
    assert_eq!(m.sessions_live, n as u64);
    assert_eq!(m.sessions_evicted, 0, "every session kept its event");
    assert_eq!(m.appends, n as u64);
    eprintln!(
        "{n} sessions with one 300-byte event: {:.1} MiB of engine memory \
         ({:.1} MiB pool, {:.1} MiB held in segments, {:.0} bytes per session)",
        total / MIB,
        pool_bytes as f64 / MIB,
        m.bytes_held as f64 / MIB,
        total / n as f64
    );
    total
}

#[test]
fn a_hundred_thousand_sessions_with_one_event_fit_in_128_mib() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    // 512-byte segments for 100k sessions, plus a little room.
    let total = sessions_with_one_event(100_000, 52 << 20);
    assert!(total <= 128.0 * MIB, "{:.1} MiB", total / MIB);
}

#[test]
#[ignore = "a million sessions: run with --ignored, in release (about a minute)"]
fn a_million_sessions_with_one_event_fit_in_1_28_gib() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let total = sessions_with_one_event(1_000_000, 520 << 20);
    assert!(total <= 1.28 * 1024.0 * MIB, "{:.1} MiB", total / MIB);
}

#[test]
fn opening_ten_times_what_fits_stays_within_the_pool_and_the_caps() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let pool = 4u64 << 20; // ~8k sessions' first segments
    let cap = 10_000;
    let before = live_bytes();
    let engine = Engine::new(config(pool, cap)).unwrap();
    let mut high = 0isize;
    let (mut refused, mut ended) = (0, 0);
    for i in 0..100_000u32 {
        match engine.open(None) {
            Ok(s) => match s.append(0, &[i as u8; 300]) {
                Ok(_) => {}
                Err(AppendError::SessionEnded) => ended += 1,
                Err(e) => panic!("{e}"),
            },
            Err(OpenError::TooManySessions { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        if i % 1000 == 0 {
            engine.sweep();
        }
        // The heap the engine holds, plus its pool's mapping in full.
        high = high.max(live_bytes() - before + pool as isize);
    }
    let m = engine.metrics();
    let bound = pool as isize + cap as isize * 512 + (1 << 20);
    eprintln!(
        "100k opens: high water {:.1} MiB (bound {:.1}), evicted {}, refused {refused}, ended {ended}",
        high as f64 / MIB,
        bound as f64 / MIB,
        m.sessions_evicted
    );
    assert!(m.sessions_evicted > 50_000, "{m:?}");
    assert!(high <= bound, "{high} > {bound}");
    assert!(m.bytes_held <= m.pool_bytes);
}
