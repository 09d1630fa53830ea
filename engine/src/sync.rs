//! The only path to atomics, fences and spin hints for the storage protocols.
//!
//! Under `cfg(loom)` these are loom's model-checked versions, so the loom
//! tests see every atomic access of the storage protocols; otherwise they are
//! `std`'s. The storage layer never names `std::sync::atomic` directly. (Counters,
//! flags and timestamps elsewhere in the engine order nothing between
//! threads beyond what their comments say and are not compiled under loom.)

#[cfg(loom)]
#[allow(
    unused_imports,
    reason = "the shim offers the full set; not every build uses each"
)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
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
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
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

/// Waits for another thread's progress with exponential backoff: a few
/// spins, then yielding the core (on 2 cores a writer waiting for a
/// descheduled writer would otherwise spin its whole time slice).
#[derive(Debug)]
pub(crate) struct Spin {
    #[cfg(not(loom))]
    backoff: crossbeam_utils::Backoff,
}

impl Spin {
    pub(crate) fn new() -> Spin {
        Spin {
            #[cfg(not(loom))]
            backoff: crossbeam_utils::Backoff::new(),
        }
    }

    /// Waits a little longer than last time.
    pub(crate) fn snooze(&self) {
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        self.backoff.snooze();
    }
}
