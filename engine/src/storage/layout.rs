//! Where everything lives in the pool's words, and how the packed words are
//! encoded. Pure functions and `Pod` structs: no atomics, no protocol.
//!
//! # Units, segments, classes
//!
//! The pool is cut into *units* of `unit_words` words (512 bytes by
//! default). A segment of class `c` covers `2^c` consecutive units and
//! starts at a unit index that is a multiple of `2^c` (buddy alignment). A
//! segment is named by the index of its first unit, a `u32`.
//!
//! # Per-unit words
//!
//! Beside the data area the pool keeps two words per unit, outside every
//! segment, so they never become payload bytes of another segment:
//!
//! - the **stamp**: changes on every allocation and every release of the
//!   segment starting at that unit (odd while owned, even while free), and
//!   when the unit disappears into a merged segment. Stamps only grow, so a
//!   `(unit, stamp)` pair names one allocation forever;
//! - the **state**: the segment's claim word while it is open for appends,
//!   its successor once it is sealed. Every write to it is a CAS that
//!   includes generation bits of the stamp, so a writer that slept through
//!   a release and reuse can never change the new owner's state.
//!
//! # Segment layout
//!
//! ```text
//! word 0                8                                       end
//! ┌──────────────────┬────────┬────────┬─────┬───────┬─────────┬───┬───┐
//! │ SegmentHeader    │ frame 0│ frame 1│ ... │ (free)│ table   │ 1 │ 0 │
//! │ (8 words)        │        │        │     │       │ entries ...   │
//! └──────────────────┴────────┴────────┴─────┴───────┴─────────┴───┴───┘
//! ```
//!
//! Frames grow from the header upward, back to back; the *table* grows from
//! the segment's end downward, one word per frame: `table[i]` (the `i`-th
//! word from the end) holds `gen32 << 32 | offset` of frame `i`, so a cursor
//! is found in O(1) once its segment is known. A frame is
//!
//! ```text
//! MARK  gen32 << 32 | len        written last (Release): the completion mark
//! META  stream << 32 | check     check: CRC-32 of the payload in durable pools, else 0
//! TIME  appended_ms              the engine clock at append
//! payload words, the last one zero-padded
//! ```
//!
//! `gen32` is the low half of the segment's (odd) stamp, so it is never 0
//! and a mark left by an earlier owner of the same bytes never matches.

use bytemuck::{Pod, Zeroable};

/// Words of the in-band segment header.
pub(crate) const HEADER_WORDS: usize = 8;
/// Words of a frame's header (mark, meta, time).
pub(crate) const FRAME_HEADER_WORDS: usize = 3;
/// Bytes in a word.
pub(crate) const WORD_BYTES: usize = 8;

/// The in-band header of an owned segment. Written once by the allocating
/// writer before the segment is published; read by readers and recovery,
/// validated by the segment's stamp.
///
/// `check` binds the header to the allocation that wrote it: the CRC-32 of
/// words 1..=6 and the stamp's low half. Readers of a live pool need no
/// check (the stamp tells them the header is the current owner's);
/// recovery does: a flipped bit must not renumber or re-link a session, and
/// a unit that was allocated (stamp made odd) but whose header was not yet
/// written when the process died still holds an earlier owner's header,
/// which the new stamp does not verify.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct SegmentHeader {
    /// Free-list link while the segment is free; 0 while owned.
    pub(crate) link: u64,
    /// Owner tag of the session (the keyed hash in its event ids).
    pub(crate) owner_tag: u64,
    /// Epoch of the owning session incarnation; unique per engine.
    pub(crate) owner_epoch: u64,
    /// Sequence number of the segment's first frame.
    pub(crate) first_seq: u64,
    /// The previous segment of the session: [`SegRef::pack`].
    pub(crate) prev: u64,
    /// `class` in the low byte.
    pub(crate) info: u64,
    /// Engine-clock milliseconds when the segment was opened.
    pub(crate) opened_ms: u64,
    /// [`SegmentHeader::check_for`] the stamp of the allocation that wrote
    /// it, in the low 32 bits; 0 in a heap pool, which nothing recovers
    /// (`Pool::header_checks`).
    pub(crate) check: u64,
}

const _: () = assert!(std::mem::size_of::<SegmentHeader>() == HEADER_WORDS * WORD_BYTES);

impl SegmentHeader {
    pub(crate) fn to_words(self) -> [u64; HEADER_WORDS] {
        bytemuck::cast(self)
    }

    pub(crate) fn from_words(words: [u64; HEADER_WORDS]) -> SegmentHeader {
        bytemuck::cast(words)
    }

    pub(crate) fn class(&self) -> u8 {
        self.info as u8
    }

    /// The check of this header for the allocation with `stamp`: CRC-32 of
    /// words 1..=6 (not the free-list link, not the check) and the stamp.
    pub(crate) fn check_for(&self, stamp: u32) -> u64 {
        let words = self.to_words();
        let mut h = crc32fast::Hasher::new();
        h.update(bytemuck::cast_slice(&words[1..HEADER_WORDS - 1]));
        h.update(&stamp.to_le_bytes());
        u64::from(h.finalize())
    }

    /// This header with its check set for `stamp`.
    pub(crate) fn checked(mut self, stamp: u32) -> SegmentHeader {
        self.check = self.check_for(stamp);
        self
    }

    /// Whether the header was written whole, for the allocation `stamp`.
    pub(crate) fn verifies(&self, stamp: u32) -> bool {
        self.check == self.check_for(stamp)
    }
}

/// One allocation of a segment: its first unit and the stamp it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegRef {
    pub(crate) unit: u32,
    /// The low half of the unit's stamp: all that state words, marks and
    /// table entries keep, and what a reader compares.
    pub(crate) stamp: u32,
}

impl SegRef {
    /// Packed into one word: `(unit + 1) << 32 | low 32 bits of the stamp`.
    /// 0 means "none".
    pub(crate) fn pack(self) -> u64 {
        (u64::from(self.unit) + 1) << 32 | u64::from(self.stamp)
    }

    /// The unit and the stamp's low half of a packed reference; `None` for 0
    /// or the session-closed marker.
    pub(crate) fn unpack(word: u64) -> Option<SegRef> {
        if word == 0 || word == CLOSED {
            return None;
        }
        Some(SegRef {
            unit: ((word >> 32) - 1) as u32,
            stamp: word as u32,
        })
    }
}

/// A session's `head`/`oldest` word once the session has ended.
pub(crate) const CLOSED: u64 = u64::MAX;

/// The state word of a segment, decoded.
///
/// ```text
/// open:          gen:20 | 0 | 0 | count:16 | used:26
/// sealed → next: gen:20 | 1 | 0 | 0:6 | count + 1 : 10 | next unit + 1 : 32
/// sealed, last:  gen:20 | 1 | 1 | count:16 | used:26
/// ```
///
/// `gen` is bits 1..21 of the stamp; `used` counts frame bytes (the header
/// and table excluded). A sealed segment keeps its final count beside its
/// successor when the count is below [`SEALED_COUNT_LIMIT`] (0 there: not
/// kept — larger counts, and words written before the count was kept), so
/// a reader placing a cursor inside it need not load the successor's
/// header to learn where it ends. "Sealed, last" is how a segment ends when its
/// session ends: no successor, but the final count is kept for recovery and
/// deferred release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Accepting claims.
    Open {
        /// Frames claimed.
        count: u32,
        /// Frame bytes claimed.
        used: u32,
    },
    /// Full; the session continues in `next`.
    Next {
        /// The successor's first unit.
        next: u32,
        /// Frames claimed, if the word keeps them (below
        /// [`SEALED_COUNT_LIMIT`]); else the successor's first sequence
        /// number tells.
        count: Option<u32>,
    },
    /// The session ended with this segment open; `count` frames were
    /// claimed.
    Last {
        /// Frames claimed.
        count: u32,
        /// Frame bytes claimed.
        used: u32,
    },
}

const USED_BITS: u32 = 26;
const COUNT_BITS: u32 = 16;
const LAST_BIT: u64 = 1 << (USED_BITS + COUNT_BITS);
const SEALED_BIT: u64 = LAST_BIT << 1;
const GEN_SHIFT: u32 = USED_BITS + COUNT_BITS + 2;
const SEALED_COUNT_SHIFT: u32 = 32;
const SEALED_COUNT_BITS: u32 = 10;
/// A sealed segment's state word keeps its count when below this.
pub(crate) const SEALED_COUNT_LIMIT: u32 = (1 << SEALED_COUNT_BITS) - 1;
/// Generation bits kept in a state word.
pub(crate) const GEN_BITS: u32 = 64 - GEN_SHIFT;
/// Largest frame-bytes count an open state can hold: segments are at most
/// this big.
pub(crate) const MAX_USED: u32 = (1 << USED_BITS) - 1;
/// Most frames one segment can hold.
pub(crate) const MAX_COUNT: u32 = (1 << COUNT_BITS) - 1;

/// The generation bits of `stamp` as kept in state words.
pub(crate) fn state_gen(stamp: u32) -> u64 {
    u64::from(stamp >> 1) & ((1 << GEN_BITS) - 1)
}

impl State {
    /// The state word for `self` in the allocation with `stamp`. Always
    /// inlined: every append stores one, and its callers' variant is known
    /// at compile time (an out-of-line copy matched on it per append).
    #[inline(always)]
    pub(crate) fn encode(self, stamp: u32) -> u64 {
        let gen = state_gen(stamp) << GEN_SHIFT;
        match self {
            State::Open { count, used } => gen | u64::from(count) << USED_BITS | u64::from(used),
            State::Next { next, count } => {
                let kept = count
                    .filter(|&c| c < SEALED_COUNT_LIMIT)
                    .map_or(0, |c| c + 1);
                gen | SEALED_BIT | u64::from(kept) << SEALED_COUNT_SHIFT | (u64::from(next) + 1)
            }
            State::Last { count, used } => {
                gen | SEALED_BIT | LAST_BIT | u64::from(count) << USED_BITS | u64::from(used)
            }
        }
    }

    /// Decodes `word` if it belongs to the allocation with `stamp`.
    #[inline(always)]
    pub(crate) fn decode(word: u64, stamp: u32) -> Option<State> {
        if word >> GEN_SHIFT != state_gen(stamp) {
            return None;
        }
        let count = ((word >> USED_BITS) & u64::from(MAX_COUNT)) as u32;
        let used = (word & u64::from(MAX_USED)) as u32;
        Some(if word & SEALED_BIT == 0 {
            State::Open { count, used }
        } else if word & LAST_BIT != 0 {
            State::Last { count, used }
        } else {
            State::Next {
                next: ((word & 0xffff_ffff) - 1) as u32,
                count: match (word >> SEALED_COUNT_SHIFT) as u32 & SEALED_COUNT_LIMIT {
                    0 => None,
                    kept => Some(kept - 1),
                },
            }
        })
    }
}

/// A frame's completion mark for the allocation with `stamp`.
pub(crate) fn mark(stamp: u32, len: u32) -> u64 {
    u64::from(stamp) << 32 | u64::from(len)
}

/// The payload length a mark announces, if it is a mark of `stamp`'s
/// allocation.
pub(crate) fn mark_len(word: u64, stamp: u32) -> Option<u32> {
    (word >> 32 == u64::from(stamp)).then_some(word as u32)
}

/// A table entry for a frame at word `offset` of the allocation `stamp`.
pub(crate) fn table_entry(stamp: u32, offset: u32) -> u64 {
    u64::from(stamp) << 32 | u64::from(offset)
}

/// The frame offset a table entry holds, if it belongs to `stamp`.
pub(crate) fn table_offset(word: u64, stamp: u32) -> Option<u32> {
    (word >> 32 == u64::from(stamp)).then_some(word as u32)
}

/// The stream of the frames recovery writes in place of lost ones, which
/// no append may name (`u32::MAX`, the engine's "no stream"): readers of a
/// real stream pass over them.
pub(crate) const RESERVED_STREAM: u32 = u32::MAX;

/// The time word of a *gap marker*: a frame on [`RESERVED_STREAM`] that
/// stands where recovery found a damaged frame (one that had its mark, so
/// its `append` may have returned and its event may have been delivered).
/// Every reader that reaches it reports a gap at its number, whatever
/// stream it reads (the damaged frame's stream is not known for sure), so
/// the loss is always told. Placeholders (unfinished frames, never
/// acknowledged) carry the segment's opening time instead, which is never
/// this value.
pub(crate) const GAP_MS: u64 = u64::MAX;

/// Whether a frame with this meta word and time word is a gap marker.
#[inline]
pub(crate) fn is_gap_marker(meta_word: u64, ms: u64) -> bool {
    (meta_word >> 32) as u32 == RESERVED_STREAM && ms == GAP_MS
}

/// What a durable pool's frame check (the low half of its meta word)
/// covers, by the pool file's format: from format 5 the session that
/// appended it, its stream id and its payload; in format 4 the stream id
/// and the payload, so a damaged stream id cannot move an event to another
/// stream; in files of formats 2 and 3 (which keep their format) the
/// payload alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameCheck {
    /// The CRC-32 of the payload (formats 2 and 3).
    Payload,
    /// The CRC-32 of the payload XOR a hash of the stream id (format 4
    /// on). The hash, `(stream + 1) × 0x9E37_79B1` (wrapping), is a
    /// bijection of `u32`: any change of the stream id alone changes the
    /// check. A durable append costs what it did with the payload-only
    /// check; a CRC fed the id and then the payload cost 3–4 ns more
    /// (BENCHMARKS.md, run AP).
    StreamAndPayload,
    /// [`FrameCheck::StreamAndPayload`] XOR a hash of the appending
    /// session's owner tag and epoch (format 5): a frame that recovery
    /// finds in a segment of another session — words a unit kept from an
    /// earlier allocation, after a machine crash brought back an older
    /// stamp — fails its check, and becomes a told gap instead of another
    /// session's event.
    OwnerStreamAndPayload,
}

impl FrameCheck {
    /// The check a file of format `version` gives its frames.
    pub(crate) fn for_version(version: u32) -> FrameCheck {
        if version >= 5 {
            FrameCheck::OwnerStreamAndPayload
        } else if version == 4 {
            FrameCheck::StreamAndPayload
        } else {
            FrameCheck::Payload
        }
    }

    /// The check of a frame the session of owner tag `tag` and epoch
    /// `epoch` appended to `stream`, holding `payload`. Inlined into the
    /// durable append, which knows its variant's branch best.
    #[inline]
    pub(crate) fn of(self, owner: (u64, u64), stream: u32, payload: &[u8]) -> u32 {
        match self {
            FrameCheck::Payload => crc32fast::hash(payload),
            FrameCheck::StreamAndPayload => crc32fast::hash(payload) ^ stream_hash(stream),
            FrameCheck::OwnerStreamAndPayload => {
                crc32fast::hash(payload) ^ stream_hash(stream) ^ owner_hash(owner)
            }
        }
    }

    /// Which session a frame's `check` binds it to, as the 32-bit hash of
    /// its owner that [`FrameCheck::of`] folds in (format 5 only: older
    /// checks do not cover the session). The three parts of a format-5
    /// check are XORed, so the payload's and the stream's parts come off
    /// and leave the owner's, to look up among the owners' hashes.
    pub(crate) fn owner_hash_in(self, check: u32, stream: u32, payload: &[u8]) -> Option<u32> {
        (self == FrameCheck::OwnerStreamAndPayload)
            .then(|| check ^ crc32fast::hash(payload) ^ stream_hash(stream))
    }
}

fn stream_hash(stream: u32) -> u32 {
    stream.wrapping_add(1).wrapping_mul(0x9E37_79B1)
}

/// The owner folded to 32 bits by a multiply whose high half mixes every
/// bit of tag and epoch.
pub(crate) fn owner_hash((tag, epoch): (u64, u64)) -> u32 {
    let o = (tag ^ epoch.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (o >> 32) as u32
}

/// `stream << 32 | check`.
pub(crate) fn meta(stream: u32, check: u32) -> u64 {
    u64::from(stream) << 32 | u64::from(check)
}

/// Words a frame with a `len`-byte payload occupies.
pub(crate) const fn frame_words(len: usize) -> usize {
    FRAME_HEADER_WORDS + len.div_ceil(WORD_BYTES)
}

/// Whether a segment of `segment_words` with `count` frames of `used`
/// bytes has room for one more frame of `frame_bytes` (plus its table
/// entry).
pub(crate) fn fits(segment_words: usize, count: u32, used: u32, frame_bytes: usize) -> bool {
    let need =
        HEADER_WORDS * WORD_BYTES + used as usize + frame_bytes + (count as usize + 1) * WORD_BYTES;
    need <= segment_words * WORD_BYTES
        && count < MAX_COUNT
        && used as usize + frame_bytes <= MAX_USED as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_format_5_frame_check_binds_the_session_the_stream_and_the_payload() {
        let check = FrameCheck::for_version(5);
        assert_eq!(check, FrameCheck::OwnerStreamAndPayload);
        let of = |owner, stream, payload: &[u8]| check.of(owner, stream, payload);
        let base = of((0xa, 1), 3, b"payload");
        // Another tag, another epoch (the same session id's next
        // incarnation), another stream, another byte: another check.
        assert_ne!(of((0xb, 1), 3, b"payload"), base);
        assert_ne!(of((0xa, 2), 3, b"payload"), base);
        assert_ne!(of((0xa, 1), 4, b"payload"), base);
        assert_ne!(of((0xa, 1), 3, b"paylaod"), base);
        // Tag and epoch are not interchangeable.
        assert_ne!(of((1, 0xa), 3, b"payload"), base);
        // Format 4 ignores the owner; formats 2 and 3 the stream too.
        let v4 = FrameCheck::for_version(4);
        assert_eq!(v4.of((0xa, 1), 3, b"p"), v4.of((0xb, 9), 3, b"p"));
        let v3 = FrameCheck::for_version(3);
        assert_eq!(v3.of((0xa, 1), 3, b"p"), v3.of((0xb, 9), 4, b"p"));
        assert_eq!(FrameCheck::for_version(2), v3);
    }

    #[test]
    fn the_owner_hash_comes_off_a_format_5_check_and_only_off_one() {
        let check = FrameCheck::OwnerStreamAndPayload;
        let (owner, stream, payload) = ((0xa5a5_0001, 7), 3, &b"payload"[..]);
        let c = check.of(owner, stream, payload);
        // Files already written keep verifying: the value is the one the
        // format defines (payload CRC, stream hash and owner hash XORed).
        let o = (owner.0 ^ owner.1.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let want = crc32fast::hash(payload) ^ 4u32.wrapping_mul(0x9E37_79B1) ^ (o >> 32) as u32;
        assert_eq!(c, want);
        assert_eq!(
            check.owner_hash_in(c, stream, payload),
            Some(owner_hash(owner))
        );
        // Another stream or payload leaves another hash (no owner's).
        assert_ne!(
            check.owner_hash_in(c, stream + 1, payload),
            Some(owner_hash(owner))
        );
        assert_ne!(
            check.owner_hash_in(c, stream, b"paylaod"),
            Some(owner_hash(owner))
        );
        for older in [FrameCheck::StreamAndPayload, FrameCheck::Payload] {
            let c = older.of(owner, stream, payload);
            assert_eq!(older.owner_hash_in(c, stream, payload), None);
        }
    }

    #[test]
    fn states_round_trip_and_belong_to_their_allocation() {
        let stamp = 0x1234_5677;
        for s in [
            State::Open { count: 0, used: 0 },
            State::Open {
                count: MAX_COUNT,
                used: MAX_USED,
            },
            State::Next {
                next: 0,
                count: None,
            },
            State::Next {
                next: u32::MAX - 1,
                count: Some(0),
            },
            State::Next {
                next: 7,
                count: Some(SEALED_COUNT_LIMIT - 1),
            },
            State::Last { count: 7, used: 99 },
        ] {
            assert_eq!(State::decode(s.encode(stamp), stamp), Some(s));
            assert_eq!(State::decode(s.encode(stamp), stamp + 2), None);
        }
        // A count too large to keep is left to the successor's header.
        for count in [SEALED_COUNT_LIMIT, MAX_COUNT] {
            let word = State::Next {
                next: 3,
                count: Some(count),
            }
            .encode(stamp);
            assert_eq!(
                State::decode(word, stamp),
                Some(State::Next {
                    next: 3,
                    count: None
                })
            );
        }
    }

    #[test]
    fn marks_and_entries_name_their_allocation() {
        let stamp = 0xabc_0001;
        assert_eq!(mark_len(mark(stamp, 17), stamp), Some(17));
        assert_eq!(mark_len(mark(stamp, 17), stamp + 2), None);
        assert_eq!(mark_len(0, stamp), None, "zeroed memory is never a mark");
        assert_eq!(table_offset(table_entry(stamp, 40), stamp), Some(40));
        assert_eq!(table_offset(table_entry(stamp, 40), stamp + 2), None);
    }

    #[test]
    fn seg_refs_pack_with_none_distinct() {
        let r = SegRef { unit: 0, stamp: 3 };
        assert_ne!(r.pack(), 0);
        assert_eq!(SegRef::unpack(r.pack()), Some(r));
        assert_eq!(SegRef::unpack(0), None);
        assert_eq!(SegRef::unpack(CLOSED), None);
    }

    #[test]
    fn fit_accounts_for_header_frames_and_table() {
        // 64 words = 512 bytes: header 64, one 3-word frame + 8 table.
        assert!(fits(64, 0, 0, 440));
        assert!(!fits(64, 0, 0, 448));
        assert!(fits(64, 1, 24, 408));
        assert!(!fits(64, 1, 24, 416));
    }
}
