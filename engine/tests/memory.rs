//! Bookkeeping per idle session, measured with a counting allocator.
//!
//! The budget: at most 256 bytes per idle session beyond its ring.
//! "Its ring" is what `SessionRing::memory_bytes` reports (slots, chunk
//! table, arena) plus the ring's own struct; everything else an open session
//! allocates — its record, `Arc` header, principal, registry entry, table
//! growth — counts as bookkeeping.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use rewind_engine::ring::{RingConfig, SessionRing};
use rewind_engine::{Config, Engine};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn idle_session_bookkeeping_is_at_most_256_bytes() {
    let ring = RingConfig {
        slots: 2,
        arena_bytes: 64,
    };
    let mut config = Config::default();
    config.ring_slots = ring.slots;
    config.session_bytes = ring.arena_bytes;
    let engine = Engine::new(config).unwrap();
    let warm: Vec<_> = (0..64).map(|_| engine.open(None).unwrap()).collect();
    drop(warm);

    const N: isize = 20_000;
    let before = LIVE.load(Ordering::Relaxed);
    let mut ids = Vec::with_capacity(N as usize);
    let ids_bytes = N * std::mem::size_of::<rewind_engine::SessionId>() as isize;
    for _ in 0..N {
        ids.push(engine.open(None).unwrap().id()); // the handle is dropped: idle
    }
    let total = LIVE.load(Ordering::Relaxed) - before - ids_bytes;
    let ring_bytes =
        SessionRing::memory_bytes_for(ring) as isize + std::mem::size_of::<SessionRing>() as isize;
    let per_session = total / N - ring_bytes;
    eprintln!("{per_session} bytes of bookkeeping per idle session (ring: {ring_bytes})");
    assert!(per_session <= 256, "{per_session} bytes per idle session");
    assert_eq!(engine.metrics().sessions_live, N as u64 + 64);
    assert!(engine.session(ids[0]).is_some());
}
