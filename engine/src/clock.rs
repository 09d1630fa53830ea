//! The engine clock: milliseconds since the engine started, read from a
//! coarse clock that a ticker thread refreshes every few milliseconds.
//!
//! Appends stamp every event with the time, so reading a clock per append
//! would be the dearest thing an append does (a vDSO call). The ticker, one
//! thread per process started with the first engine, stores the monotonic
//! time in milliseconds into one word that only it writes; a reading is one
//! relaxed load of that word, inlined into the append. (The `coarsetime`
//! crate does the same with its `Updater`, but its reading is two calls
//! that cannot be inlined across crates without LTO: about 1 ns of a 16 ns
//! single-writer append, `append/1t/RewindSingleWriter`.) Resolution:
//! [`TICK_MS`] milliseconds, plenty for idle TTLs and cursor ages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often the ticker refreshes the clock.
pub(crate) const TICK_MS: u64 = 5;

/// The process's clock origin: every reading counts from it.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Milliseconds since [`origin`], read from the OS now.
fn process_ms() -> u64 {
    u64::try_from(origin().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// [`process_ms`] as the ticker last stored it.
static TICKED_MS: AtomicU64 = AtomicU64::new(0);

/// Whether the process-wide ticker runs (it fails only if a thread cannot
/// be spawned; then every reading asks the OS).
fn ticker_runs() -> bool {
    // The ticker runs for the life of the process, and Miri reports a
    // thread still running when a program ends as an error: under Miri
    // every reading asks the OS.
    if cfg!(miri) {
        return false;
    }
    static TICKER: OnceLock<bool> = OnceLock::new();
    *TICKER.get_or_init(|| {
        // Stored before the thread starts, so no reading is older than the
        // engine that made it.
        TICKED_MS.store(process_ms(), Ordering::Relaxed);
        std::thread::Builder::new()
            .name("rewind-clock".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_millis(TICK_MS));
                // Relaxed: a reading needs no other memory to be
                // consistent with it, only a recent value.
                TICKED_MS.store(process_ms(), Ordering::Relaxed);
            })
            .is_ok()
    })
}

/// One engine's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// [`process_ms`] when the clock was made.
    origin_ms: u64,
    /// Added to every reading: a durable engine's clock continues the
    /// previous boot's (it counts from its data directory's creation).
    offset_ms: u64,
    ticking: bool,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock::starting_at(0)
    }

    /// A clock whose first reading is `offset_ms`.
    pub(crate) fn starting_at(offset_ms: u64) -> Clock {
        let ticking = ticker_runs();
        Clock {
            origin_ms: if ticking {
                TICKED_MS.load(Ordering::Relaxed)
            } else {
                process_ms()
            },
            offset_ms,
            ticking,
        }
    }

    /// Milliseconds since the clock was made (behind the OS clock by at
    /// most a tick, never below 0, never going back).
    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        let now = if self.ticking {
            TICKED_MS.load(Ordering::Relaxed)
        } else {
            process_ms()
        };
        now.saturating_sub(self.origin_ms) + self.offset_ms
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{process_ms, Clock, TICK_MS};
    use std::time::{Duration, Instant};

    #[test]
    fn readings_follow_the_os_clock_and_never_go_back() {
        let clock = Clock::starting_at(1000);
        let started = Instant::now();
        let first = clock.now_ms();
        assert!(first >= 1000, "starts at its offset: {first}");
        // The OS clock on the same scale, read after the reading it bounds.
        let os_now = || process_ms().saturating_sub(clock.origin_ms) + 1000;
        let mut last = first;
        // Bounded: until the clock has moved a few ticks, or 10 s on a
        // machine too busy to run the ticker.
        while last - first < 3 * TICK_MS && started.elapsed() < Duration::from_secs(10) {
            let now = clock.now_ms();
            assert!(now >= last, "went back: {last} then {now}");
            // It may lag the OS clock (by a tick, or more while the ticker
            // waits for a core), never lead it. Exact, so it holds under
            // any scheduling, Miri's included.
            let os = os_now();
            assert!(now <= os, "leads the OS clock: {now} ms, OS {os} ms");
            last = now;
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(last - first >= 3 * TICK_MS, "the clock is not moving");
    }
}
