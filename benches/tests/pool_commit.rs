//! The segment pool commits what its sessions hold, whatever allocator the
//! embedding installs: a 1 GiB pool under mimalloc (a common global
//! allocator for servers) must not cost the process its budget, or any
//! large part of it, before sessions fill it.
//!
//! Linux only: resident memory is read from `/proc/self/statm`.

#![cfg(target_os = "linux")]

use rewind_engine::{Config, Engine};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MIB: u64 = 1 << 20;

/// Resident bytes of this process.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm's second field is the resident page count");
    // 4 KiB pages: the only size `statm` counts in on x86-64 and aarch64
    // Linux with the default configuration.
    pages * 4096
}

#[test]
fn a_one_gib_pool_commits_what_its_sessions_hold_under_mimalloc() {
    let before = resident();
    let mut config = Config::default();
    config.global_bytes = 1 << 30;
    let engine = Engine::new(config).expect("default config with a 1 GiB pool");
    let created = resident().saturating_sub(before);
    // 2,000 sessions with one 300-byte event each: about 2 MiB of segments.
    let event = [b'x'; 300];
    let sessions: Vec<_> = (0..2_000)
        .map(|_| {
            let s = engine.open(None).expect("room for 2,000 sessions");
            s.append(1, &event).expect("room for one event");
            s
        })
        .collect();
    let filled = resident().saturating_sub(before);
    eprintln!(
        "1 GiB pool: {:.1} MiB resident once created, {:.1} MiB with {} sessions of one event ({:.1} MiB held)",
        created as f64 / MIB as f64,
        filled as f64 / MIB as f64,
        sessions.len(),
        engine.metrics().bytes_held as f64 / MIB as f64,
    );
    assert!(
        created <= 8 * MIB,
        "creating a 1 GiB pool made {created} bytes resident"
    );
    assert!(
        filled <= 32 * MIB,
        "2,000 one-event sessions made {filled} bytes resident"
    );
}
