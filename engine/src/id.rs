//! Session ids and event ids: minting, formatting, and the one parser.
//!
//! A [`SessionId`] is 128 random bits written as 32 lowercase hex digits. It
//! is the credential a client presents (`Mcp-Session-Id`), so it is minted
//! from the operating system's random source and never derived from a
//! counter.
//!
//! An [`EventId`] names everything a cursor must be checked against
//! (invariant 1 in `docs/invariants.md`):
//!
//! ```text
//! 9f3a0c12b4e5d6f7-5f1e2d3c4b5a6-2-1a            format 1 (node 0)
//! └──── owner tag ┘ └── epoch ──┘ │ └ sequence
//!                                 └ stream
//! 9f3a0c12b4e5d6f7-3-5f1e2d3c4b5a6-2-1a          format 2 (node 3)
//!                  └ node
//! ```
//!
//! - the owner *tag*: a keyed SipHash of the session id (16 hex digits,
//!   always), so an id does not reveal the session id it belongs to, yet the
//!   engine can tell in one comparison whether a cursor was issued by the
//!   session that presents it;
//! - the session's *epoch* (its incarnation, never reused);
//! - the *stream* within the session (the GET stream, one per POST request);
//! - the *sequence* number within the session.
//!
//! The format is versioned by its field count. Format 1 (four fields) is a
//! single engine's id, its node implicitly 0. Format 2 (five fields) adds
//! the minting *node* (1 to 4 hex digits, never 0) after the tag, for
//! engines that share sessions across machines. The numeric fields are
//! lowercase hex without leading zeros, so every id has exactly one
//! spelling: the parser accepts exactly what [`EventId`]'s `Display`
//! produces and rejects everything else with a typed [`EventIdError`]. The
//! longest id is 64 bytes of visible ASCII; parsing allocates nothing: one
//! pass finds the separators, then each field is converted eight digits at
//! a time (SWAR: validate and convert a word of ASCII with a few integer
//! operations instead of a branch per byte). Input the fast path does not
//! accept is re-parsed byte by byte for a precise error.

use std::fmt;

use siphasher::sip::SipHasher13;

/// Length in bytes of a formatted [`SessionId`].
pub const SESSION_ID_LEN: usize = 32;

/// Longest formatted [`EventId`], in bytes: 16 + 4 + 16 + 8 + 16 hex digits
/// and four separators (format 2).
pub const EVENT_ID_MAX_LEN: usize = 64;

/// Longest input [`EventId::parse`] looks at; longer input is rejected before
/// any other check (the design allows ids up to 64 bytes).
pub const EVENT_ID_INPUT_LIMIT: usize = 64;

/// A session id: 128 random bits, 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId {
    bits: u128,
}

/// Why a presented session id is not a session id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionIdError {
    /// The id is empty.
    Empty,
    /// The id is not 32 bytes long.
    WrongLength {
        /// The length presented.
        len: usize,
    },
    /// The byte at `at` is not a lowercase hex digit.
    InvalidByte {
        /// Offset of the first bad byte.
        at: usize,
    },
}

impl fmt::Display for SessionIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionIdError::Empty => f.write_str("session id is empty"),
            SessionIdError::WrongLength { len } => {
                write!(
                    f,
                    "session id is {len} bytes long; expected {SESSION_ID_LEN}"
                )
            }
            SessionIdError::InvalidByte { at } => {
                write!(f, "session id byte {at} is not a lowercase hex digit")
            }
        }
    }
}

impl std::error::Error for SessionIdError {}

impl SessionId {
    /// Mints a fresh id from the operating system's random source.
    ///
    /// # Panics
    ///
    /// If the operating system has no random source (the engine cannot mint
    /// unguessable ids without one, and must not fall back to a guessable
    /// one).
    pub fn generate() -> SessionId {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the OS random source is unavailable");
        SessionId {
            bits: u128::from_le_bytes(bytes),
        }
    }

    /// Parses a presented id (e.g. an `Mcp-Session-Id` header value).
    pub fn parse(s: &str) -> Result<SessionId, SessionIdError> {
        let bytes = s.as_bytes();
        if bytes.is_empty() {
            return Err(SessionIdError::Empty);
        }
        if bytes.len() != SESSION_ID_LEN {
            return Err(SessionIdError::WrongLength { len: bytes.len() });
        }
        let digits: &[u8; SESSION_ID_LEN] = bytes.try_into().expect("length checked above");
        match hex_128(digits) {
            Some(bits) => Ok(SessionId { bits }),
            None => Err(invalid_byte(bytes)),
        }
    }

    /// The id as a number; the registry's key.
    pub(crate) fn bits(self) -> u128 {
        self.bits
    }

    /// The id formatted into a stack buffer.
    pub fn to_buf(self) -> IdBuf {
        let mut buf = IdBuf::new();
        buf.push_hex_fixed(self.bits, SESSION_ID_LEN);
        buf
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_buf())
    }
}

impl fmt::Debug for SessionId {
    /// Debug output does not print the credential: only its first 4 digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({}…)", &self.to_buf()[..4])
    }
}

/// The key that turns session ids into owner tags.
///
/// Random per engine by default. An operator who wants cursors to stay
/// attributable across restarts (file-backed storage) configures a fixed key.
#[derive(Clone, Copy)]
pub struct TagKey {
    key: [u8; 16],
}

impl TagKey {
    /// A key from the operating system's random source.
    pub fn random() -> TagKey {
        let mut key = [0u8; 16];
        getrandom::fill(&mut key).expect("the OS random source is unavailable");
        TagKey { key }
    }

    /// A fixed key.
    pub const fn from_bytes(key: [u8; 16]) -> TagKey {
        TagKey { key }
    }

    /// The owner tag of `session`.
    pub fn tag(&self, session: SessionId) -> u64 {
        use std::hash::Hasher;
        let mut h = SipHasher13::new_with_key(&self.key);
        h.write_u128(session.bits);
        h.finish()
    }
}

impl fmt::Debug for TagKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TagKey(..)")
    }
}

/// A session-scoped, epoch-tagged event id (a cursor, once a client sends it
/// back as `Last-Event-ID`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EventId {
    /// Keyed tag of the owner session's id.
    pub tag: u64,
    /// The node that minted the id; 0 for a single engine (format 1).
    pub node: u16,
    /// Epoch (incarnation) of the owner session.
    pub epoch: u64,
    /// Stream within the session.
    pub stream: u32,
    /// Sequence number within the session; 0 means "before the first event".
    pub seq: u64,
}

/// One of the fields of an [`EventId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdField {
    /// The owner tag.
    Tag,
    /// The node (format 2).
    Node,
    /// The epoch.
    Epoch,
    /// The stream.
    Stream,
    /// The sequence number.
    Seq,
}

impl IdField {
    const FORMAT_1: [IdField; 4] = [IdField::Tag, IdField::Epoch, IdField::Stream, IdField::Seq];
    const FORMAT_2: [IdField; 5] = [
        IdField::Tag,
        IdField::Node,
        IdField::Epoch,
        IdField::Stream,
        IdField::Seq,
    ];

    const fn max_digits(self) -> usize {
        match self {
            IdField::Tag | IdField::Epoch | IdField::Seq => 16,
            IdField::Stream => 8,
            IdField::Node => 4,
        }
    }
}

impl fmt::Display for IdField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdField::Tag => "owner tag",
            IdField::Node => "node",
            IdField::Epoch => "epoch",
            IdField::Stream => "stream",
            IdField::Seq => "sequence",
        })
    }
}

/// Why a presented `Last-Event-ID` is not an event id of this engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventIdError {
    /// The id is empty.
    Empty,
    /// The id is longer than [`EVENT_ID_INPUT_LIMIT`] bytes.
    TooLong {
        /// The length presented.
        len: usize,
    },
    /// The byte at `at` is outside visible ASCII (0x21–0x7E).
    NotVisibleAscii {
        /// Offset of the first bad byte.
        at: usize,
    },
    /// The byte at `at` is visible ASCII but neither a lowercase hex digit
    /// nor the `-` separator.
    UnexpectedByte {
        /// Offset of the first bad byte.
        at: usize,
    },
    /// The id does not have four (format 1) or five (format 2)
    /// `-`-separated fields.
    FieldCount,
    /// A field is empty, too long, or has a leading zero (every id has
    /// exactly one spelling); the tag must be exactly 16 digits, a node
    /// field must not be 0 (node 0 is written in format 1).
    BadField {
        /// The offending field.
        field: IdField,
    },
}

impl fmt::Display for EventIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventIdError::Empty => f.write_str("event id is empty"),
            EventIdError::TooLong { len } => {
                write!(
                    f,
                    "event id is {len} bytes long; the limit is {EVENT_ID_INPUT_LIMIT}"
                )
            }
            EventIdError::NotVisibleAscii { at } => {
                write!(f, "event id byte {at} is not visible ASCII")
            }
            EventIdError::UnexpectedByte { at } => {
                write!(
                    f,
                    "event id byte {at} is neither a lowercase hex digit nor '-'"
                )
            }
            EventIdError::FieldCount => {
                f.write_str("event id does not have four or five '-'-separated fields")
            }
            EventIdError::BadField { field } => {
                write!(
                    f,
                    "event id {field} field is empty, too long or not in canonical form"
                )
            }
        }
    }
}

impl std::error::Error for EventIdError {}

impl EventId {
    /// Parses a presented cursor. Allocates nothing; accepts exactly the
    /// spellings `Display` produces.
    #[inline]
    pub fn parse(s: &str) -> Result<EventId, EventIdError> {
        parse_fast(s.as_bytes())
            .ok_or(())
            .or_else(|()| parse_exact(s.as_bytes()))
    }

    /// [`EventId::parse`] as a call, for a caller that inlines its own fast
    /// path (a session's own cursors) and keeps the general parser, which
    /// would make that caller too large to inline, out of line.
    #[inline(never)]
    pub(crate) fn parse_outlined(s: &str) -> Result<EventId, EventIdError> {
        EventId::parse(s)
    }

    /// The id formatted into a stack buffer.
    pub fn to_buf(&self) -> IdBuf {
        let mut buf = IdBuf::new();
        buf.push_hex_fixed(u128::from(self.tag), 16);
        buf.push_byte(b'-');
        if self.node != 0 {
            buf.push_hex(u64::from(self.node));
            buf.push_byte(b'-');
        }
        buf.push_hex(self.epoch);
        buf.push_byte(b'-');
        buf.push_hex(u64::from(self.stream));
        buf.push_byte(b'-');
        buf.push_hex(self.seq);
        buf
    }
}

/// The fixed beginning of every event id one session incarnation mints:
/// its owner tag, node (format 2) and epoch, each with the separator after
/// it, exactly as [`EventId`]'s `Display` writes them.
///
/// A cursor presented to that session and beginning with these bytes is
/// one of its own ids, so only the stream and sequence after them need
/// parsing (the two short fields; the tag and epoch are two thirds of the
/// digits). Any other input goes through [`EventId::parse`], whose answer
/// [`IdPrefix::parse`] never contradicts: it accepts an input iff
/// `EventId::parse` accepts it with this tag, node and epoch.
#[derive(Clone, Copy)]
pub(crate) struct IdPrefix {
    bytes: [u8; ID_PREFIX_MAX_LEN],
    len: u8,
}

/// Longest [`IdPrefix`]: a 16-digit tag, a 4-digit node, a 16-digit epoch
/// and their three separators.
const ID_PREFIX_MAX_LEN: usize = 16 + 1 + 4 + 1 + 16 + 1;

impl IdPrefix {
    /// The prefix of ids with this tag, node and epoch.
    pub(crate) fn new(tag: u64, node: u16, epoch: u64) -> IdPrefix {
        let mut buf = IdBuf::new();
        buf.push_hex_fixed(u128::from(tag), 16);
        buf.push_byte(b'-');
        if node != 0 {
            buf.push_hex(u64::from(node));
            buf.push_byte(b'-');
        }
        buf.push_hex(epoch);
        buf.push_byte(b'-');
        let len = usize::from(buf.len);
        let mut bytes = [0; ID_PREFIX_MAX_LEN];
        bytes[..len].copy_from_slice(&buf.bytes[..len]);
        IdPrefix {
            bytes,
            len: buf.len,
        }
    }

    /// The stream and sequence of `s` if `s` is an id with this prefix;
    /// `None` for anything else (which may still be a valid id of another
    /// incarnation, session or node: ask [`EventId::parse`]).
    #[inline(always)]
    pub(crate) fn parse(&self, s: &str) -> Option<(u32, u64)> {
        let b = s.as_bytes();
        let len = usize::from(self.len);
        if b.get(..len)? != &self.bytes[..len] {
            return None;
        }
        // The stream is 1 to 8 digits, then a separator.
        let stream_to = len
            + b.get(len..(len + 9).min(b.len()))?
                .iter()
                .position(|&c| c == b'-')?;
        // `field` validates every byte of both fields as a hex digit (so
        // no further separator), their lengths and canonical spelling; both
        // end past the 16-digit tag, as it requires.
        let stream = field(b, len, stream_to, 8)?;
        let seq = field(b, stream_to + 1, b.len(), 16)?;
        Some((stream as u32, seq))
    }
}

/// The fast path: finds the separators, converts each field with SWAR.
/// `None` for anything it does not accept (then [`parse_exact`] says why).
///
/// The separators are found with one branch-free pass that builds a bit
/// mask of the `-` bytes (the input is at most 64 bytes), and every field
/// is read as the word ending at its last digit, the bytes before the field
/// masked to `'0'`: no per-byte branch and no copy.
#[inline]
fn parse_fast(b: &[u8]) -> Option<EventId> {
    if b.len() > EVENT_ID_INPUT_LIMIT || b.len() < 22 {
        return None;
    }
    let dashes = dash_mask(b);
    // The tag is exactly 16 digits, then a separator.
    if dashes & 0x1_ffff != 1 << 16 {
        return None;
    }
    let tag = hex_word(&b[..8])? << 32 | hex_word(&b[8..16])?;
    let mut rest = dashes & !(1 << 16);
    let mut next_sep = || {
        let at = rest.trailing_zeros() as usize;
        rest &= rest.wrapping_sub(1);
        at
    };
    let (node, epoch_from) = match (dashes.count_ones(), 17) {
        (3, from) => (0, from),
        (4, from) => {
            let to = next_sep();
            let node = field(b, from, to, 4)?;
            if node == 0 {
                return None;
            }
            (node as u16, to + 1)
        }
        _ => return None,
    };
    let epoch_to = next_sep();
    let stream_to = next_sep();
    Some(EventId {
        tag,
        node,
        epoch: field(b, epoch_from, epoch_to, 16)?,
        stream: field(b, epoch_to + 1, stream_to, 8)? as u32,
        seq: field(b, stream_to + 1, b.len(), 16)?,
    })
}

/// Bit `i` set iff `b[i] == b'-'`, eight bytes at a time. `b` is at most
/// 64 bytes long.
#[inline]
fn dash_mask(b: &[u8]) -> u64 {
    const _: () = assert!(EVENT_ID_INPUT_LIMIT <= 64);
    let mut mask = 0;
    let mut chunks = b.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let word: [u8; 8] = chunk.try_into().expect("chunks_exact");
        mask |= dashes_in(u64::from_le_bytes(word)) << at;
        at += 8;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        // Zero padding is no '-'.
        mask |= dashes_in(crate::words::tail_word(b, rest)) << at;
    }
    mask
}

/// Bit `i` set iff byte `i` of `x` is `-` (exact: no false positives).
#[inline]
fn dashes_in(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let y = x ^ 0x2d2d_2d2d_2d2d_2d2d;
    // High bit of a byte set iff that byte of `y` is zero (no carries
    // between bytes: each sum stays below 0x100).
    let zero = !(((y & LOW7) + LOW7) | y | LOW7);
    // Gather the eight high bits into one byte.
    ((zero >> 7).wrapping_mul(0x0102_0408_1020_4080)) >> 56
}

/// The canonical field `b[from..to]` of at most `max` digits (no leading
/// zero unless it is exactly "0"). Every field follows the 16-digit tag, so
/// `to >= 18` and the words read below stay inside `b`.
#[inline(always)]
fn field(b: &[u8], from: usize, to: usize, max: usize) -> Option<u64> {
    let n = to.checked_sub(from)?;
    if n == 0 || n > max || (n > 1 && b[from] == b'0') || to < 16 {
        return None;
    }
    let low = word_ending_at(b, to, n.min(8))?;
    if n <= 8 {
        return Some(low);
    }
    Some(word_ending_at(b, to - 8, n - 8)? << 32 | low)
}

/// The value of the `digits` (1 to 8) hex digits ending at `b[end - 1]`:
/// the eight bytes ending there, those before the digits replaced by '0'.
#[inline(always)]
fn word_ending_at(b: &[u8], end: usize, digits: usize) -> Option<u64> {
    let word: [u8; 8] = b.get(end - 8..end)?.try_into().ok()?;
    let x = u64::from_le_bytes(word);
    // Little-endian: the bytes before the field are the low ones.
    let keep = u64::MAX << (8 * (8 - digits));
    hex_swar((x & keep) | (0x3030_3030_3030_3030 & !keep))
}

/// Eight lowercase hex digits to their value, or `None` if any byte is not
/// one: validate and convert the word at once (SWAR).
#[inline]
fn hex_word(digits: &[u8]) -> Option<u64> {
    hex_swar(u64::from_le_bytes(digits.try_into().ok()?))
}

/// [`hex_word`] of eight ASCII bytes packed little-endian.
#[inline]
fn hex_swar(x: u64) -> Option<u64> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Letters 'a'..'f' have bit 6 set, digits do not: value = low nibble,
    // plus 9 for letters. No byte can carry into the next (max 15 + 9).
    let letter = (x & (0x40 * ONES)) >> 6;
    let value = (x & (0x0f * ONES)) + letter * 9;
    // Re-spell the values and compare: only valid digits survive the trip
    // ('g' gives 16, ':' gives 'a', 'A' gives 'a', non-ASCII never matches).
    let is_letter = ((value + 0x76 * ONES) & (0x80 * ONES)) >> 7;
    let spelled = value + 0x30 * ONES + is_letter * 0x27;
    if value & (0xf0 * ONES) != 0 || spelled != x {
        return None;
    }
    // Gather the eight nibbles, first digit most significant.
    let v = (value << 4 | value >> 8) & 0x00ff_00ff_00ff_00ff;
    let v = (v << 8 | v >> 16) & 0x0000_ffff_0000_ffff;
    Some((v << 16 | v >> 32) & 0xffff_ffff)
}

/// Where the first byte that is not a lowercase hex digit is. Out of line:
/// inlined, the compiler starts this search before the valid id's branch.
#[cold]
#[inline(never)]
fn invalid_byte(bytes: &[u8]) -> SessionIdError {
    let at = bytes
        .iter()
        .position(|&b| hex_value(b).is_none())
        .unwrap_or(0);
    SessionIdError::InvalidByte { at }
}

/// Thirty-two lowercase hex digits to their value, first digit most
/// significant, or `None` if any byte is not one.
///
/// On x86-64 sixteen digits at a time in SSE2 (part of every x86-64 CPU):
/// validate and convert each byte, then pack the nibble pairs. A whole
/// [`SessionId::parse`] then runs about 70 instructions, where the four
/// words through [`hex_swar`] took about 165 (callgrind, per hot resume).
/// Every request that presents a session id pays this.
#[inline]
fn hex_128(digits: &[u8; SESSION_ID_LEN]) -> Option<u128> {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: SSE2 is part of the x86-64 baseline: every CPU this
        // build runs on has it (the compiler assumes so everywhere).
        unsafe { sse2::hex_128(digits) }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        hex_128_swar(digits)
    }
}

/// [`hex_128`] a word at a time: the portable path, and the reference the
/// SSE2 path is tested against.
#[cfg_attr(
    all(target_arch = "x86_64", not(miri)),
    allow(dead_code, reason = "the tests compare the SSE2 path with it")
)]
fn hex_128_swar(digits: &[u8; SESSION_ID_LEN]) -> Option<u128> {
    let mut bits = 0u128;
    for word in digits.chunks_exact(8) {
        bits = bits << 32 | u128::from(hex_word(word)?);
    }
    Some(bits)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_add_epi8, _mm_and_si128, _mm_cmplt_epi8, _mm_cvtsi128_si64, _mm_movemask_epi8,
        _mm_or_si128, _mm_packus_epi16, _mm_set1_epi16, _mm_set1_epi8, _mm_set_epi64x,
        _mm_slli_epi16, _mm_srli_epi16, _mm_srli_si128, _mm_sub_epi8, _mm_xor_si128,
    };

    use super::SESSION_ID_LEN;

    /// [`super::hex_128`] sixteen digits at a time.
    #[target_feature(enable = "sse2")]
    #[inline]
    pub(super) fn hex_128(digits: &[u8; SESSION_ID_LEN]) -> Option<u128> {
        let word = |i: usize| {
            let bytes: [u8; 8] = digits[8 * i..8 * i + 8].try_into().expect("8 bytes");
            i64::from_le_bytes(bytes)
        };
        let (high, high_valid) = decode(_mm_set_epi64x(word(1), word(0)));
        let (low, low_valid) = decode(_mm_set_epi64x(word(3), word(2)));
        if high_valid & low_valid != 0xffff {
            return None;
        }
        // Sixteen bytes, most significant first.
        let packed = _mm_packus_epi16(pairs(high), pairs(low));
        let first = _mm_cvtsi128_si64(packed) as u64;
        let second = _mm_cvtsi128_si64(_mm_srli_si128::<8>(packed)) as u64;
        Some(u128::from(first.swap_bytes()) << 64 | u128::from(second.swap_bytes()))
    }

    /// Per byte of `v`: its digit value (0..16), and in the mask a set bit
    /// for each byte that is a lowercase hex digit.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn decode(v: __m128i) -> (__m128i, i32) {
        let digit = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
        let letter = _mm_sub_epi8(v, _mm_set1_epi8(b'a' as i8));
        let is_digit = below(digit, 10);
        let is_letter = below(letter, 6);
        let value = _mm_or_si128(
            _mm_and_si128(digit, is_digit),
            _mm_and_si128(_mm_add_epi8(letter, _mm_set1_epi8(10)), is_letter),
        );
        (value, _mm_movemask_epi8(_mm_or_si128(is_digit, is_letter)))
    }

    /// Per byte, all ones where `x < n` unsigned: a signed compare of both
    /// sides with the top bit flipped.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn below(x: __m128i, n: i8) -> __m128i {
        _mm_cmplt_epi8(
            _mm_xor_si128(x, _mm_set1_epi8(i8::MIN)),
            _mm_set1_epi8(n ^ i8::MIN),
        )
    }

    /// Each 16-bit lane holds two digit values, the first in its low
    /// byte: makes that byte `first << 4 | second` and clears the other.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn pairs(value: __m128i) -> __m128i {
        _mm_and_si128(
            _mm_or_si128(_mm_slli_epi16::<4>(value), _mm_srli_epi16::<8>(value)),
            _mm_set1_epi16(0x00ff),
        )
    }
}

/// The byte-by-byte parser: the reference for what is accepted, and the
/// source of precise errors.
fn parse_exact(bytes: &[u8]) -> Result<EventId, EventIdError> {
    if bytes.is_empty() {
        return Err(EventIdError::Empty);
    }
    if bytes.len() > EVENT_ID_INPUT_LIMIT {
        return Err(EventIdError::TooLong { len: bytes.len() });
    }
    let fields = bytes.iter().filter(|&&b| b == b'-').count() + 1;
    let order: &[IdField] = if fields == 5 {
        &IdField::FORMAT_2
    } else {
        &IdField::FORMAT_1
    };
    let mut values = [0u64; 5];
    let mut field = 0usize;
    let mut digits = 0usize;
    let mut leading_zero = false;
    for (at, &b) in bytes.iter().enumerate() {
        if !(0x21..=0x7e).contains(&b) {
            return Err(EventIdError::NotVisibleAscii { at });
        }
        if b == b'-' {
            check_field(order[field], digits, leading_zero, values[field])?;
            field += 1;
            if field == order.len() {
                return Err(EventIdError::FieldCount);
            }
            digits = 0;
            continue;
        }
        let digit = hex_value(b).ok_or(EventIdError::UnexpectedByte { at })?;
        let which = order[field];
        if digits == which.max_digits() {
            return Err(EventIdError::BadField { field: which });
        }
        if digits == 0 {
            leading_zero = digit == 0;
        }
        values[field] = values[field] << 4 | u64::from(digit);
        digits += 1;
    }
    if field != order.len() - 1 {
        return Err(EventIdError::FieldCount);
    }
    check_field(IdField::Seq, digits, leading_zero, values[field])?;
    let (node, rest) = if order.len() == 5 {
        // Bounded to 4 digits above, so it fits.
        (values[1] as u16, &values[2..5])
    } else {
        (0, &values[1..4])
    };
    Ok(EventId {
        tag: values[0],
        node,
        epoch: rest[0],
        // Bounded to 8 digits above, so it fits.
        stream: rest[1] as u32,
        seq: rest[2],
    })
}

fn check_field(
    field: IdField,
    digits: usize,
    leading_zero: bool,
    value: u64,
) -> Result<(), EventIdError> {
    let ok = match field {
        IdField::Tag => digits == 16,
        // Node 0 is spelled in format 1, never as a node field.
        IdField::Node => digits >= 1 && !leading_zero && value != 0,
        // "0" is the one spelling of zero; "00", "01" are not canonical.
        _ => digits >= 1 && !(leading_zero && digits > 1),
    };
    if ok {
        Ok(())
    } else {
        Err(EventIdError::BadField { field })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_buf())
    }
}

/// A formatted id on the stack: derefs to `&str`.
#[derive(Clone, Copy)]
pub struct IdBuf {
    bytes: [u8; 64],
    len: u8,
}

impl IdBuf {
    const fn new() -> IdBuf {
        IdBuf {
            bytes: [0; 64],
            len: 0,
        }
    }

    fn push_byte(&mut self, b: u8) {
        self.bytes[usize::from(self.len)] = b;
        self.len += 1;
    }

    fn push_hex_fixed(&mut self, value: u128, digits: usize) {
        for i in (0..digits).rev() {
            self.push_byte(HEX[((value >> (4 * i)) & 0xf) as usize]);
        }
    }

    fn push_hex(&mut self, value: u64) {
        let digits = if value == 0 {
            1
        } else {
            (64 - value.leading_zeros() as usize).div_ceil(4)
        };
        self.push_hex_fixed(u128::from(value), digits);
    }
}

impl std::ops::Deref for IdBuf {
    type Target = str;

    fn deref(&self) -> &str {
        // Only ASCII hex digits and '-' are ever pushed.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).expect("ids are ASCII")
    }
}

impl fmt::Debug for IdBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl fmt::Display for IdBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[inline]
fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(tag: u64, epoch: u64, stream: u32, seq: u64) -> EventId {
        EventId {
            tag,
            node: 0,
            epoch,
            stream,
            seq,
        }
    }

    #[test]
    fn formats_canonically() {
        let e = id(0x9f3a_0c12_b4e5_d6f7, 0x5f1e2d3c4b5a6, 2, 0x1a);
        assert_eq!(e.to_string(), "9f3a0c12b4e5d6f7-5f1e2d3c4b5a6-2-1a");
        assert_eq!(id(0, 0, 0, 0).to_string(), "0000000000000000-0-0-0");
        let max = EventId {
            node: u16::MAX,
            ..id(u64::MAX, u64::MAX, u32::MAX, u64::MAX)
        }
        .to_string();
        assert_eq!(max.len(), EVENT_ID_MAX_LEN);
        let noded = EventId {
            node: 3,
            ..id(0x9f3a_0c12_b4e5_d6f7, 0x5f1e2d3c4b5a6, 2, 0x1a)
        };
        assert_eq!(noded.to_string(), "9f3a0c12b4e5d6f7-3-5f1e2d3c4b5a6-2-1a");
        assert_eq!(EventId::parse(&noded.to_string()), Ok(noded));
    }

    #[test]
    fn dash_masks_mark_exactly_the_dashes() {
        for len in 0..=64 {
            for seed in 0..40u64 {
                let b: Vec<u8> = (0..len)
                    .map(|i| {
                        let r = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (i % 60)) as u8;
                        [b'-', b'0', b'a', 0x2c, 0x2e, 0xad, r][(r as usize + i) % 7]
                    })
                    .collect();
                let want = b
                    .iter()
                    .enumerate()
                    .fold(0u64, |m, (i, &c)| m | u64::from(c == b'-') << i);
                assert_eq!(dash_mask(&b), want, "{b:?}");
            }
        }
    }

    #[test]
    fn hex_words_accept_exactly_lowercase_hex() {
        assert_eq!(hex_word(b"0123abcf"), Some(0x0123_abcf));
        assert_eq!(hex_word(b"ffffffff"), Some(0xffff_ffff));
        assert_eq!(hex_word(b"00000000"), Some(0));
        for bad in 0..=255u8 {
            let ok = bad.is_ascii_digit() || (b'a'..=b'f').contains(&bad);
            for at in 0..8 {
                let mut w = *b"12345678";
                w[at] = bad;
                assert_eq!(hex_word(&w).is_some(), ok, "byte {bad:#x} at {at}");
            }
        }
    }

    #[test]
    fn rejects_each_kind_of_bad_input_with_its_error() {
        use EventIdError::*;
        let cases: &[(&str, EventIdError)] = &[
            ("", Empty),
            (&"a".repeat(65), TooLong { len: 65 }),
            ("0000000000000000-1-2-3 ", NotVisibleAscii { at: 22 }),
            ("0000000000000000-1-2-é", NotVisibleAscii { at: 21 }),
            ("0000000000000000-1-2-\n", NotVisibleAscii { at: 21 }),
            ("0000000000000000-1-2-A", UnexpectedByte { at: 21 }),
            ("0000000000000000_1-2-3", UnexpectedByte { at: 16 }),
            ("0000000000000000-1-2", FieldCount),
            ("0000000000000000-1-2-3-4-5", FieldCount),
            (
                "0000000000000000-0-1-2-3",
                BadField {
                    field: IdField::Node,
                },
            ),
            (
                "0000000000000000-01-1-2-3",
                BadField {
                    field: IdField::Node,
                },
            ),
            (
                "0000000000000000-12345-1-2-3",
                BadField {
                    field: IdField::Node,
                },
            ),
            (
                "000000000000000-1-2-3",
                BadField {
                    field: IdField::Tag,
                },
            ),
            (
                "00000000000000000-1-2-3",
                BadField {
                    field: IdField::Tag,
                },
            ),
            (
                "0000000000000000--2-3",
                BadField {
                    field: IdField::Epoch,
                },
            ),
            (
                "0000000000000000-01-2-3",
                BadField {
                    field: IdField::Epoch,
                },
            ),
            (
                "0000000000000000-1-123456789-3",
                BadField {
                    field: IdField::Stream,
                },
            ),
            (
                "0000000000000000-1-2-",
                BadField {
                    field: IdField::Seq,
                },
            ),
            (
                "0000000000000000-1-2-00",
                BadField {
                    field: IdField::Seq,
                },
            ),
            (
                "0000000000000000-1-2-10000000000000000",
                BadField {
                    field: IdField::Seq,
                },
            ),
            ("evt-4471", UnexpectedByte { at: 1 }),
            ("0000000000000000-1-2-3\0", NotVisibleAscii { at: 22 }),
            ("4471", FieldCount),
            ("0", FieldCount),
        ];
        for (input, want) in cases {
            assert_eq!(EventId::parse(input), Err(*want), "{input:?}");
        }
    }

    #[test]
    fn session_ids_are_unique_and_round_trip() {
        let a = SessionId::generate();
        let b = SessionId::generate();
        assert_ne!(a, b);
        let s = a.to_string();
        assert_eq!(s.len(), SESSION_ID_LEN);
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(SessionId::parse(&s), Ok(a));
        assert!(
            !format!("{a:?}").contains(&s),
            "Debug must not print the credential"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "miri runs the word-at-a-time decoder only")]
    fn both_session_id_decoders_agree_on_every_byte_at_every_position() {
        let id = SessionId::generate().to_string();
        for at in 0..SESSION_ID_LEN {
            for byte in 0..=u8::MAX {
                let mut digits = [0u8; SESSION_ID_LEN];
                digits.copy_from_slice(id.as_bytes());
                digits[at] = byte;
                let want = hex_128_swar(&digits);
                assert_eq!(hex_128(&digits), want, "byte {byte:#x} at {at}");
                assert_eq!(want.is_some(), hex_value(byte).is_some());
            }
        }
    }

    #[test]
    fn session_id_errors() {
        assert_eq!(SessionId::parse(""), Err(SessionIdError::Empty));
        assert_eq!(
            SessionId::parse("abc"),
            Err(SessionIdError::WrongLength { len: 3 })
        );
        let upper = "A".repeat(32);
        assert_eq!(
            SessionId::parse(&upper),
            Err(SessionIdError::InvalidByte { at: 0 })
        );
        let mut s = "0".repeat(31);
        s.push('é');
        assert!(SessionId::parse(&s).is_err());
    }

    #[test]
    fn tags_depend_on_key_and_session() {
        let (a, b) = (SessionId::generate(), SessionId::generate());
        let k1 = TagKey::from_bytes([1; 16]);
        let k2 = TagKey::from_bytes([2; 16]);
        assert_eq!(k1.tag(a), k1.tag(a));
        assert_ne!(k1.tag(a), k1.tag(b));
        assert_ne!(k1.tag(a), k2.tag(a));
    }

    /// Under Miri: fewer cases, and no failure file (finding it asks for
    /// the working directory, which Miri's isolation refuses).
    fn cases() -> ProptestConfig {
        let mut config = ProptestConfig::with_cases(if cfg!(miri) { 16 } else { 2048 });
        if cfg!(miri) {
            config.failure_persistence = None;
        }
        config
    }

    proptest! {
        #![proptest_config(cases())]

        #[test]
        fn event_ids_round_trip(tag: u64, node: u16, epoch: u64, stream: u32, seq: u64) {
            let e = EventId { node, ..id(tag, epoch, stream, seq) };
            let s = e.to_string();
            prop_assert!(s.len() <= EVENT_ID_MAX_LEN);
            prop_assert!(s.bytes().all(|b| (0x21..=0x7e).contains(&b)));
            prop_assert_eq!(EventId::parse(&s), Ok(e));
        }

        #[test]
        fn parser_accepts_only_canonical_spellings(input in "[0-9a-f-]{0,70}|\\PC{0,70}") {
            // Whatever parses must print back to exactly the input.
            if let Ok(e) = EventId::parse(&input) {
                prop_assert_eq!(&e.to_string(), &input);
            }
            // The fast path accepts exactly what the reference accepts.
            let fast = parse_fast(input.as_bytes());
            prop_assert_eq!(fast, parse_exact(input.as_bytes()).ok());
        }

        #[test]
        fn a_prefix_parses_exactly_its_own_ids_as_the_full_parser_does(
            tag: u64,
            node in prop_oneof![Just(0u16), any::<u16>()],
            epoch in prop_oneof![0u64..20, any::<u64>()],
            stream in prop_oneof![0u32..20, any::<u32>()],
            seq in prop_oneof![0u64..20, any::<u64>()],
            other_epoch in prop_oneof![0u64..20, any::<u64>()],
            cut: usize,
            at: usize,
            byte: u8,
            tail in "[0-9a-f-]{0,20}",
        ) {
            let prefix = IdPrefix::new(tag, node, epoch);
            let own = EventId { tag, node, epoch, stream, seq };
            let text = own.to_string();
            prop_assert_eq!(prefix.parse(&text), Some((stream, seq)));
            // Every other input: the prefix accepts it only if the full
            // parser reads it as an id with this tag, node and epoch, and
            // then with the same stream and sequence.
            let mut near = text.clone().into_bytes();
            let at = at % near.len();
            near[at] = byte;
            let cut = cut % (text.len() + 1);
            let other = EventId { epoch: other_epoch, ..own }.to_string();
            for input in [
                String::from_utf8_lossy(&near).into_owned(),
                text[..cut].to_string(),
                format!("{text}{tail}"),
                format!("{}{tail}", &text[..cut]),
                other,
            ] {
                let full = EventId::parse(&input)
                    .ok()
                    .filter(|e| (e.tag, e.node, e.epoch) == (tag, node, epoch))
                    .map(|e| (e.stream, e.seq));
                prop_assert_eq!(prefix.parse(&input), full, "input {:?}", input);
            }
        }

        #[test]
        fn near_misses_of_real_ids_agree(tag: u64, epoch: u64, stream: u32, seq: u64, at: usize, byte: u8) {
            let mut s = id(tag, epoch, stream, seq).to_string().into_bytes();
            let at = at % s.len();
            s[at] = byte;
            if let Ok(input) = std::str::from_utf8(&s) {
                prop_assert_eq!(parse_fast(&s), parse_exact(&s).ok());
                if let Ok(e) = EventId::parse(input) {
                    prop_assert_eq!(e.to_string(), input);
                }
            }
        }

        #[test]
        fn session_ids_round_trip(bits: u128) {
            let s = SessionId { bits };
            prop_assert_eq!(SessionId::parse(&s.to_string()), Ok(s));
        }

        #[test]
        fn both_session_id_decoders_agree_on_any_bytes(
            bits: u128,
            changes in proptest::collection::vec((0..SESSION_ID_LEN, any::<u8>()), 0..3),
        ) {
            // Valid ids with up to two bytes replaced: near misses of every
            // kind ('/', ':', '`', 'g', 'A', 0x80 and up) as well as ids.
            let mut digits = [0u8; SESSION_ID_LEN];
            digits.copy_from_slice(SessionId { bits }.to_string().as_bytes());
            for (at, byte) in changes {
                digits[at] = byte;
            }
            let want = hex_128_swar(&digits);
            prop_assert_eq!(hex_128(&digits), want);
            let valid = digits.iter().all(|&b| hex_value(b).is_some());
            prop_assert_eq!(want.is_some(), valid);
        }
    }
}
