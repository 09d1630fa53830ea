//! The only path to atomics, fences and spin hints in the engine.
//!
//! Under `cfg(loom)` these are loom's model-checked versions, so the loom
//! tests see every atomic access of the ring protocol; otherwise they are
//! `std`'s. Code outside this module never names `std::sync::atomic`
//! directly.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
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
