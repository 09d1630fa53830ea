//! The only path to atomics, fences and spin hints for the ring protocol.
//!
//! Under `cfg(loom)` these are loom's model-checked versions, so the loom
//! tests see every atomic access of the ring protocol; otherwise they are
//! `std`'s. The ring never names `std::sync::atomic` directly. (Counters,
//! flags and timestamps elsewhere in the engine order nothing between
//! threads beyond what their comments say and are not compiled under loom.)

#[cfg(loom)]
#[allow(
    unused_imports,
    reason = "the shim offers the full set; not every build uses each"
)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
#[allow(
    unused_imports,
    reason = "the shim offers the full set; not every build uses each"
)]
pub(crate) use loom::sync::Arc;

#[cfg(not(loom))]
#[allow(
    unused_imports,
    reason = "the shim offers the full set; not every build uses each"
)]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
#[allow(
    unused_imports,
    reason = "the shim offers the full set; not every build uses each"
)]
pub(crate) use std::sync::Arc;

/// Called inside a spin loop that waits for another thread's progress.
/// Under loom this yields so the model can schedule the thread we wait on.
#[inline]
pub(crate) fn spin_wait() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
