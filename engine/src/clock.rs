//! The engine clock: milliseconds since the engine started, read from a
//! coarse clock that a ticker thread refreshes every few milliseconds.
//!
//! Appends stamp every event with the time, so reading a clock per append
//! would be the dearest thing an append does (a vDSO call, and with
//! `coarsetime::Instant::now` a store into a process-wide line every core
//! writes). The ticker (`coarsetime`'s `Updater`, started once per process)
//! turns a reading into one relaxed load of a line that only the ticker
//! writes. Resolution: [`TICK_MS`] milliseconds, plenty for idle TTLs and
//! cursor ages.

use std::sync::OnceLock;

use coarsetime::{Instant, Updater};

/// How often the ticker refreshes the clock.
pub(crate) const TICK_MS: u64 = 5;

/// Whether the process-wide ticker runs (it fails only if a thread cannot
/// be spawned; then every reading asks the OS).
fn ticker_runs() -> bool {
    static TICKER: OnceLock<Option<Updater>> = OnceLock::new();
    TICKER
        .get_or_init(|| Updater::new(TICK_MS).start().ok())
        .is_some()
}

/// One engine's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    origin: u64,
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
            origin: Instant::now().as_ticks(),
            offset_ms,
            ticking,
        }
    }

    /// Milliseconds since the clock was made (never goes back by more than
    /// a tick, never below 0).
    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        let now = if self.ticking {
            Instant::recent()
        } else {
            Instant::now_without_cache_update()
        };
        coarsetime::Duration::from_ticks(now.as_ticks().saturating_sub(self.origin)).as_millis()
            + self.offset_ms
    }
}
