//! Ring sizes, their validation, and the word layout derived from them.

use std::fmt;

use super::slot::SLOT_WORDS;

/// Sizes of one session's ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of event slots; a power of two, at least 2.
    pub slots: usize,
    /// Payload arena size in bytes; a power of two, at least 64.
    pub arena_bytes: usize,
}

/// Why a [`RingConfig`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingConfigError {
    /// `slots` is not a power of two.
    SlotsNotPowerOfTwo {
        /// The refused value.
        slots: usize,
    },
    /// `slots` is a power of two but smaller than [`RingConfig::MIN_SLOTS`].
    TooFewSlots {
        /// The refused value.
        slots: usize,
        /// The smallest accepted value.
        min: usize,
    },
    /// `arena_bytes` is not a power of two.
    ArenaNotPowerOfTwo {
        /// The refused value.
        arena_bytes: usize,
    },
    /// `arena_bytes` is a power of two but smaller than
    /// [`RingConfig::MIN_ARENA_BYTES`].
    ArenaTooSmall {
        /// The refused value.
        arena_bytes: usize,
        /// The smallest accepted value.
        min: usize,
    },
    /// The ring's memory (slots + chunk table + arena) does not fit in one
    /// allocation on this platform.
    TooLarge {
        /// The refused slot count.
        slots: usize,
        /// The refused arena size.
        arena_bytes: usize,
    },
}

impl fmt::Display for RingConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RingConfigError::SlotsNotPowerOfTwo { slots } => {
                write!(f, "ring slots must be a power of two, got {slots}")
            }
            RingConfigError::TooFewSlots { slots, min } => {
                write!(f, "ring slots must be at least {min}, got {slots}")
            }
            RingConfigError::ArenaNotPowerOfTwo { arena_bytes } => {
                write!(
                    f,
                    "ring arena bytes must be a power of two, got {arena_bytes}"
                )
            }
            RingConfigError::ArenaTooSmall { arena_bytes, min } => {
                write!(
                    f,
                    "ring arena bytes must be at least {min}, got {arena_bytes}"
                )
            }
            RingConfigError::TooLarge { slots, arena_bytes } => write!(
                f,
                "a ring of {slots} slots and {arena_bytes} arena bytes does not fit in memory"
            ),
        }
    }
}

impl std::error::Error for RingConfigError {}

impl RingConfig {
    /// The smallest accepted [`slots`](RingConfig::slots).
    pub const MIN_SLOTS: usize = 2;
    /// The smallest accepted [`arena_bytes`](RingConfig::arena_bytes).
    pub const MIN_ARENA_BYTES: usize = 64;

    /// Checks the sizes without building a ring.
    pub fn validate(&self) -> Result<(), RingConfigError> {
        Layout::new(*self).map(drop)
    }
}

/// Bytes per arena / slot word.
pub(super) const WORD_BYTES: usize = 8;

/// The arena is split into this many ownership chunks (fewer if the arena is
/// smaller than this many words); see "Arena chunks" in the module docs.
const MAX_CHUNKS: usize = 16;

/// Everything `append` and `read` need to address the single word
/// allocation, computed once from a valid [`RingConfig`].
///
/// Word layout: `[slot 0 .. slot n) [chunk 0 .. chunk c) [arena words)`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// `slots - 1`; slot of `seq` is `seq & slot_mask`.
    pub(super) slot_mask: u64,
    /// `log2(chunk count)`.
    pub(super) chunk_count_shift: u32,
    /// `chunk count - 1`.
    pub(super) chunk_mask: u64,
    /// `log2(bytes per chunk)`; at least 3 (one word).
    pub(super) chunk_shift: u32,
    /// `arena words - 1`.
    pub(super) arena_word_mask: u64,
    /// Arena size in bytes (a power of two).
    pub(super) arena_bytes: u64,
    /// Largest payload `append` accepts.
    pub(super) max_payload: usize,
    /// Word index of chunk 0.
    pub(super) chunks_base: usize,
    /// Word index of arena word 0.
    pub(super) arena_base: usize,
    /// Length of the word allocation.
    pub(super) total_words: usize,
}

impl Layout {
    pub(super) fn new(config: RingConfig) -> Result<Layout, RingConfigError> {
        let RingConfig { slots, arena_bytes } = config;
        if !slots.is_power_of_two() {
            return Err(RingConfigError::SlotsNotPowerOfTwo { slots });
        }
        if slots < RingConfig::MIN_SLOTS {
            return Err(RingConfigError::TooFewSlots {
                slots,
                min: RingConfig::MIN_SLOTS,
            });
        }
        if !arena_bytes.is_power_of_two() {
            return Err(RingConfigError::ArenaNotPowerOfTwo { arena_bytes });
        }
        if arena_bytes < RingConfig::MIN_ARENA_BYTES {
            return Err(RingConfigError::ArenaTooSmall {
                arena_bytes,
                min: RingConfig::MIN_ARENA_BYTES,
            });
        }
        let too_large = RingConfigError::TooLarge { slots, arena_bytes };
        let arena_words = arena_bytes / WORD_BYTES;
        let chunks = arena_words.min(MAX_CHUNKS);
        let chunk_bytes = arena_bytes / chunks;
        let chunks_base = slots.checked_mul(SLOT_WORDS).ok_or(too_large)?;
        let arena_base = chunks_base.checked_add(chunks).ok_or(too_large)?;
        let total_words = arena_base.checked_add(arena_words).ok_or(too_large)?;
        if total_words > isize::MAX as usize / WORD_BYTES {
            return Err(too_large);
        }
        // A payload may touch at most `chunks` consecutive chunk positions, or
        // its writer would need the same physical chunk at two laps at once.
        // Offsets are word aligned, so the worst case starts on the last word
        // of a chunk: 8 + (chunks - 1) * chunk_bytes bytes. `len` must also
        // stay below the `LOST_LEN` sentinel of the slot header.
        let max_payload = (arena_bytes - chunk_bytes + WORD_BYTES).min(u32::MAX as usize & !7);
        Ok(Layout {
            slot_mask: slots as u64 - 1,
            chunk_count_shift: chunks.trailing_zeros(),
            chunk_mask: chunks as u64 - 1,
            chunk_shift: chunk_bytes.trailing_zeros(),
            arena_word_mask: arena_words as u64 - 1,
            arena_bytes: arena_bytes as u64,
            max_payload,
            chunks_base,
            arena_base,
            total_words,
        })
    }

    /// Bytes of the word allocation.
    pub(super) fn memory_bytes(&self) -> usize {
        self.total_words * WORD_BYTES
    }
}
