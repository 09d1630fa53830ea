//! Per-session replay ring. (Stub: the real implementation replaces this file.)

use std::fmt;

/// Sizes of one session's ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of event slots; a power of two, at least 2.
    pub slots: usize,
    /// Payload arena size in bytes; a power of two, at least 64.
    pub arena_bytes: usize,
}

/// Why an append was refused. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendError {
    /// The payload is larger than the ring's arena can ever hold.
    TooLarge { len: usize, max: usize },
}

impl fmt::Display for AppendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppendError::TooLarge { len, max } => {
                write!(f, "event payload of {len} bytes exceeds the ring's limit of {max} bytes")
            }
        }
    }
}

impl std::error::Error for AppendError {}

/// Metadata of an event read from a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventMeta {
    pub seq: u64,
    pub stream: u32,
    pub appended_ms: u64,
    pub len: usize,
}

/// What reading one sequence number found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRead {
    /// The event, whose payload was copied into the caller's buffer.
    Event(EventMeta),
    /// The event belongs to another stream; its payload was not copied.
    OtherStream(EventMeta),
    /// Not published yet: either not claimed (beyond the high-water mark) or
    /// claimed by a writer that has not finished.
    Pending,
    /// Overwritten (the ring or the arena lapped it) or lost before publish.
    Overwritten,
}

/// A bounded multi-producer ring of events with a payload arena.
#[derive(Debug)]
pub struct SessionRing {
    config: RingConfig,
}

impl SessionRing {
    /// A ring with the given sizes. Panics if a size is not a power of two.
    pub fn new(config: RingConfig) -> SessionRing {
        SessionRing { config }
    }

    /// The sizes this ring was made with.
    pub fn config(&self) -> RingConfig {
        self.config
    }

    /// Appends an event; returns its sequence number (the first is 1).
    pub fn append(&self, stream: u32, appended_ms: u64, payload: &[u8]) -> Result<u64, AppendError> {
        let _ = (stream, appended_ms, payload);
        unimplemented!("ring stub")
    }

    /// The highest sequence number claimed so far (0 before the first append).
    pub fn high_water(&self) -> u64 {
        0
    }

    /// Reads `seq`; copies the payload into `buf` (cleared first) if the event
    /// is on `stream` (or `stream` is `None`).
    pub fn read(&self, seq: u64, stream: Option<u32>, buf: &mut Vec<u8>) -> SlotRead {
        let _ = (seq, stream, buf);
        SlotRead::Pending
    }

    /// Bytes of memory this ring holds (slots + arena), fixed at creation.
    pub fn memory_bytes(&self) -> usize {
        self.config.slots * 40 + self.config.arena_bytes
    }
}
