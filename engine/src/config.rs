//! Engine configuration: every bound on memory is a number here.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::id::TagKey;
use crate::storage::{PoolShape, Retention, ROOMY_FRAMES, UNIT_WORDS};

/// How much the engine may hold, and for how long.
///
/// Memory is bounded by these numbers whatever the traffic (invariant 5 of
/// `docs/invariants.md`): all sessions' events live in one pool of
/// `global_bytes`; each session keeps at least its newest `session_events`
/// events or `session_bytes` bytes (and at most one segment more); a
/// session's bookkeeping (a few hundred bytes) is bounded by the session
/// caps. A session that holds no events holds no pool memory.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Events each session retains: once the segments after its oldest
    /// one hold this many, the oldest is released.
    pub session_events: u64,
    /// Bytes of segment memory each session retains, in the same sense.
    pub session_bytes: u64,
    /// How far behind the writers a reader that holds its place
    /// ([`Replay::hold`](crate::Replay::hold); `rewind serve`'s open
    /// streams do) may fall before retention releases events it has not
    /// read: past `session_events`/`session_bytes`, a session keeps its
    /// oldest segment while such a reader still has to read it and the
    /// session holds at most this many bytes of segments. So a connected
    /// client that reads a burst more slowly than a tool writes it loses
    /// nothing, while a session nobody reads keeps only its retention.
    /// At least `session_bytes` (a smaller value holds nothing back).
    pub reader_hold_bytes: u64,
    /// The pool: memory for every session's events together, allocated
    /// once (lazily committed by the OS).
    pub global_bytes: u64,
    /// Largest segment of a session's ordinary growth (a power of two,
    /// 1 KiB to 64 MiB). A session's first segment is 512 bytes; each next
    /// one doubles up to this — or, while a segment this size would hold
    /// fewer than four of the events being appended, up to the size that
    /// holds four, within a quarter of `session_bytes` (and only when
    /// `session_events` is 16 or more).
    pub max_segment_bytes: usize,
    /// Largest single event. Larger events get a segment of their own
    /// class; the pool must be able to hold one.
    pub max_event_bytes: usize,
    /// Most sessions live at once; opening more is refused
    /// ([`OpenError::TooManySessions`](crate::OpenError)).
    pub max_sessions: usize,
    /// Most sessions live at once for one principal (when the embedding
    /// supplies principals).
    pub max_sessions_per_principal: usize,
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
    /// Must be `None` with a `data_dir`, whose boot counter mints epochs.
    pub boot_epoch: Option<u64>,
    /// This engine's node number in a cluster (1..=65535), written into
    /// every event id it mints (id format 2), so a cursor names the node
    /// that appended its event. 0 (the default): a single engine, ids in
    /// format 1. A cursor minted by another node is foreign to this
    /// engine's sessions (the cluster layer classifies it against the
    /// shared tier instead).
    pub node: u16,
    /// Where the pool and the session journal live. `None` (the default):
    /// on the heap, gone with the process. With a directory, the pool is a
    /// memory-mapped file and sessions survive a restart or a crash
    /// (`docs/durability.md`).
    pub data_dir: Option<PathBuf>,
    /// When a durable pool's writes are forced to the device. Ignored
    /// without a `data_dir`.
    pub sync: SyncPolicy,
}

/// When a durable pool's writes are forced to the device (`msync`,
/// `fdatasync`). Whatever the policy, an `append` that returned survives a
/// crash of the process (its bytes are in the kernel's page cache); the
/// policy decides what survives a crash of the machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyncPolicy {
    /// Never forced: the kernel writes dirty pages back when it likes
    /// (typically within 30 s). A power loss can lose recent events.
    #[default]
    None,
    /// Forced by a background thread every this many milliseconds: a power
    /// loss loses at most about that much.
    EveryMs(u64),
    /// Forced before every `append` returns: a power loss loses only
    /// appends that had not returned. Costs a device flush per event.
    EveryAppend,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            session_events: 1024,
            session_bytes: 32 * 1024,
            reader_hold_bytes: 256 * 1024,
            global_bytes: 1 << 30,
            max_segment_bytes: 8 * 1024,
            max_event_bytes: (32 << 20) - 1024,
            max_sessions: 250_000,
            max_sessions_per_principal: 10_000,
            idle_ttl: Duration::from_secs(30 * 60),
            max_resume_age: None,
            tag_key: None,
            boot_epoch: None,
            node: 0,
            data_dir: None,
            sync: SyncPolicy::None,
        }
    }
}

/// A configuration the engine refuses, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A retention setting is zero.
    ZeroRetention {
        /// `session_events` or `session_bytes`.
        setting: &'static str,
    },
    /// `max_segment_bytes` is not a power of two between 1 KiB and 64 MiB.
    SegmentSize {
        /// The configured value.
        max_segment_bytes: usize,
    },
    /// `global_bytes` cannot hold one event of `max_event_bytes`.
    PoolTooSmall {
        /// The configured pool.
        global_bytes: u64,
        /// What one largest event needs.
        needs: u64,
    },
    /// A session cap is zero.
    ZeroCap {
        /// `max_sessions` or `max_sessions_per_principal`.
        setting: &'static str,
    },
    /// `idle_ttl` is zero.
    ZeroTtl,
    /// `sync = EveryMs(0)`.
    ZeroSyncInterval,
    /// `boot_epoch` is set together with `data_dir`: the data directory's
    /// boot counter mints epochs.
    BootEpochWithDataDir,
    /// The data directory cannot be used.
    DataDir(crate::durable::DataDirError),
    /// The operating system would not map a pool of `global_bytes`.
    PoolMemory {
        /// The configured pool.
        global_bytes: u64,
        /// What the operating system said.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroRetention { setting } => {
                write!(f, "{setting} must be at least 1")
            }
            ConfigError::SegmentSize { max_segment_bytes } => write!(
                f,
                "max_segment_bytes = {max_segment_bytes} must be a power of two from 1024 to {}",
                MAX_SEGMENT
            ),
            ConfigError::PoolTooSmall {
                global_bytes,
                needs,
            } => write!(
                f,
                "global_bytes = {global_bytes} cannot hold one event of max_event_bytes \
                 (a segment of {needs} bytes); raise global_bytes or lower max_event_bytes"
            ),
            ConfigError::ZeroCap { setting } => write!(f, "{setting} must be at least 1"),
            ConfigError::ZeroTtl => f.write_str("idle_ttl must be greater than zero"),
            ConfigError::ZeroSyncInterval => f.write_str(
                "sync = every 0 ms is not an interval; use every_append, or at least 1 ms",
            ),
            ConfigError::BootEpochWithDataDir => f.write_str(
                "boot_epoch cannot be set with data_dir: the data directory's boot counter \
                 mints epochs",
            ),
            ConfigError::DataDir(e) => write!(f, "data_dir: {e}"),
            ConfigError::PoolMemory {
                global_bytes,
                reason,
            } => write!(
                f,
                "global_bytes = {global_bytes}: the operating system will not map a pool \
                 that large ({reason}); lower global_bytes"
            ),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::DataDir(e) => Some(e),
            _ => None,
        }
    }
}

const UNIT_BYTES: usize = UNIT_WORDS * 8;
const MAX_SEGMENT: usize = 64 << 20;

/// The class of segments of `bytes` (rounded up to a power of two units).
fn class_of(bytes: usize) -> u8 {
    let units = bytes.div_ceil(UNIT_BYTES).next_power_of_two();
    units.trailing_zeros() as u8
}

/// The largest class whose segments are at most `bytes` (class 0 below a
/// unit).
fn class_at_most(bytes: usize) -> u8 {
    (bytes / UNIT_BYTES).checked_ilog2().map_or(0, |c| c as u8)
}

impl Config {
    /// Checks every setting; the engine refuses to start on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.session_events == 0 {
            return Err(ConfigError::ZeroRetention {
                setting: "session_events",
            });
        }
        if self.session_bytes == 0 {
            return Err(ConfigError::ZeroRetention {
                setting: "session_bytes",
            });
        }
        let seg = self.max_segment_bytes;
        if !seg.is_power_of_two() || !(2 * UNIT_BYTES..=MAX_SEGMENT).contains(&seg) {
            return Err(ConfigError::SegmentSize {
                max_segment_bytes: seg,
            });
        }
        let shape = self.pool_shape();
        let event_class = self.event_class();
        if shape.top_class < event_class || shape.units < 1 << event_class {
            return Err(ConfigError::PoolTooSmall {
                global_bytes: self.global_bytes,
                needs: (UNIT_BYTES as u64) << event_class,
            });
        }
        if self.max_sessions == 0 {
            return Err(ConfigError::ZeroCap {
                setting: "max_sessions",
            });
        }
        if self.max_sessions_per_principal == 0 {
            return Err(ConfigError::ZeroCap {
                setting: "max_sessions_per_principal",
            });
        }
        if self.idle_ttl.is_zero() {
            return Err(ConfigError::ZeroTtl);
        }
        if self.sync == SyncPolicy::EveryMs(0) {
            return Err(ConfigError::ZeroSyncInterval);
        }
        if self.data_dir.is_some() && self.boot_epoch.is_some() {
            return Err(ConfigError::BootEpochWithDataDir);
        }
        Ok(())
    }

    /// The class that holds one event of `max_event_bytes` (header, frame
    /// and table entry included).
    fn event_class(&self) -> u8 {
        // Header (64), frame header (24), table entry (8), padding (8).
        class_of(self.max_event_bytes.max(1) + 104)
    }

    pub(crate) fn pool_shape(&self) -> PoolShape {
        let top = self
            .event_class()
            .max(class_of(self.max_segment_bytes.min(MAX_SEGMENT)));
        PoolShape::for_budget(self.global_bytes, UNIT_WORDS, top)
    }

    pub(crate) fn retention(&self) -> Retention {
        let grow_class = class_of(self.max_segment_bytes.min(MAX_SEGMENT));
        // Large events' segments: at most a quarter of the bytes the
        // session keeps, as docs/storage.md advises for `max_segment_bytes`
        // (the window then holds at most about a quarter more bytes than
        // its retention), and none for sessions that keep fewer than 16
        // events, of which a segment of four to seven would be a large
        // part.
        let quarter = usize::try_from(self.session_bytes / 4).unwrap_or(usize::MAX);
        let roomy_class = if self.session_events >= 4 * u64::from(ROOMY_FRAMES) {
            class_at_most(quarter.min(MAX_SEGMENT)).max(grow_class)
        } else {
            grow_class
        };
        Retention {
            max_events: self.session_events,
            max_bytes: self.session_bytes,
            first_class: 0,
            grow_class,
            roomy_class,
            hold_bytes: self.reader_hold_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_grow_past_max_segment_bytes_only_within_a_quarter_of_the_retention() {
        // The defaults keep 32 KiB: a quarter is the 8 KiB growth limit.
        let k = Config::default().retention();
        assert_eq!(
            (k.grow_class, k.roomy_class),
            (class_of(8 << 10), k.grow_class)
        );
        // A session that keeps 1 MiB: segments of up to 256 KiB for events
        // too large for four to fit in 8 KiB.
        let mut c = Config {
            session_bytes: 1 << 20,
            ..Config::default()
        };
        assert_eq!(c.retention().roomy_class, class_of(256 << 10));
        // Rounded down: 100 KiB keeps segments at or below 25 KiB.
        c.session_bytes = 100 << 10;
        assert_eq!(c.retention().roomy_class, class_of(16 << 10));
        // Too few events kept for four per segment to be a quarter.
        c.session_bytes = 1 << 20;
        c.session_events = 15;
        assert_eq!(c.retention().roomy_class, c.retention().grow_class);
        // Never below the growth limit, never past the largest segment.
        c.session_events = 1024;
        c.max_segment_bytes = 64 << 10;
        c.session_bytes = 64 << 10;
        assert_eq!(c.retention().roomy_class, class_of(64 << 10));
        c.session_bytes = u64::MAX;
        assert_eq!(c.retention().roomy_class, class_of(MAX_SEGMENT));
    }
}
