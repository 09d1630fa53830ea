//! A counting global allocator, for measuring what the engine allocates.
//!
//! A bench or test binary installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: rewind_benches::alloc::Counting = rewind_benches::alloc::Counting;
//! ```
//!
//! and reads [`live_bytes`] before and after the work it measures. Every
//! allocation of the process counts (the engine's segment pool is one zeroed
//! allocation, so it counts in full: an upper bound on what the operating
//! system commits for it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Forwards to the system allocator and keeps a running total of the bytes
/// live through it.
#[derive(Debug)]
pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// Bytes currently allocated through [`Counting`] (allocations made before
/// it was installed do not count, and freeing them is not subtracted).
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; the only addition is a relaxed counter update.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator (that is, from `System`)
        // with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: `ptr` came from this allocator with `layout`; the caller
        // guarantees `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
