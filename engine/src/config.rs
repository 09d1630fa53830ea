//! Engine configuration: every bound on memory is a number here.

use std::fmt;
use std::time::Duration;

use crate::id::TagKey;
use crate::ring::RingConfig;

/// How much the engine may hold, and for how long.
///
/// Memory is bounded by these numbers whatever the traffic (invariant 5):
/// each live session holds exactly one ring of `ring_slots` slots and
/// `session_bytes` payload bytes, and the sum over live sessions never
/// exceeds `global_bytes` (the least recently active sessions are evicted
/// to make room, and opening fails when nothing can be evicted).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Events each session retains (a power of two, ≥ 2).
    pub ring_slots: usize,
    /// Payload bytes each session retains (a power of two, ≥ 64); also
    /// bounds the size of one event.
    pub session_bytes: usize,
    /// Ring memory all live sessions together may hold.
    pub global_bytes: u64,
    /// A session with no append, resume or touch for this long ends.
    pub idle_ttl: Duration,
    /// Carried to the policy as `max_resume_age_ms` (strict policies refuse
    /// to resume across an older disconnect). `None`: not set.
    pub max_resume_age: Option<Duration>,
    /// Key for owner tags. `None`: random per engine.
    pub tag_key: Option<TagKey>,
    /// First epoch of this engine. `None`: the wall clock in microseconds,
    /// which is larger than every epoch an earlier process handed out as
    /// long as it opened fewer than a million sessions a second on average.
    pub boot_epoch: Option<u64>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            ring_slots: 1024,
            session_bytes: 256 * 1024,
            global_bytes: 1 << 30,
            idle_ttl: Duration::from_secs(30 * 60),
            max_resume_age: None,
            tag_key: None,
            boot_epoch: None,
        }
    }
}

/// A configuration the engine refuses, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `ring_slots` or `session_bytes` is not an accepted ring size.
    Ring {
        /// What is wrong, from the ring's own check.
        reason: String,
    },
    /// `global_bytes` cannot hold even one session.
    GlobalBudgetTooSmall {
        /// The configured budget.
        global_bytes: u64,
        /// What one session's ring needs.
        per_session: u64,
    },
    /// `idle_ttl` is zero.
    ZeroTtl,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Ring { reason } => write!(f, "ring_slots/session_bytes: {reason}"),
            ConfigError::GlobalBudgetTooSmall {
                global_bytes,
                per_session,
            } => write!(
                f,
                "global_bytes = {global_bytes} cannot hold one session ring of {per_session} bytes"
            ),
            ConfigError::ZeroTtl => f.write_str("idle_ttl must be greater than zero"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// The ring sizes of one session.
    pub fn ring(&self) -> RingConfig {
        RingConfig {
            slots: self.ring_slots,
            arena_bytes: self.session_bytes,
        }
    }

    /// Checks every setting; the engine refuses to start on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.ring().validate().map_err(|e| ConfigError::Ring {
            reason: e.to_string(),
        })?;
        let per_session = crate::ring::SessionRing::memory_bytes_for(self.ring()) as u64;
        if self.global_bytes < per_session {
            return Err(ConfigError::GlobalBudgetTooSmall {
                global_bytes: self.global_bytes,
                per_session,
            });
        }
        if self.idle_ttl.is_zero() {
            return Err(ConfigError::ZeroTtl);
        }
        Ok(())
    }
}
