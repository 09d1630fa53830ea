//! The resume-policy ABI shared by the Rewind host and its WebAssembly guests.
//!
//! A resume policy is a pure function from [`ResumeFacts`] (what the host
//! found out about a reconnect: is the session live, what does the cursor
//! mean to it) to a [`Verdict`] code. The host computes the facts *and* the
//! set of verdicts that are safe for them ([`ResumeFacts::allowed`]); the
//! policy only picks one. A verdict outside the safe set is replaced by the
//! host's default, so a policy can make decisions stricter, never looser.
//!
//! This crate is `no_std` and allocation-free so it builds both for the host
//! and for `wasm32-unknown-unknown` guests.
//!
//! # Wire layout
//!
//! [`ResumeFacts`] is `#[repr(C)]`, 72 bytes, with every field naturally
//! aligned and padding spelled out, so it is `bytemuck::Pod` and the host can
//! copy it into guest memory as plain bytes. Enumerations travel as `u32`
//! codes; the Rust enums are `#[non_exhaustive]` wrappers whose `from_code`
//! returns `None` for codes this version does not know.
//!
//! # Guest exports (ABI version 3)
//!
//! | export | signature | meaning |
//! |---|---|---|
//! | `memory` | memory | the guest's linear memory |
//! | `rewind_abi_version` | `() -> i32` | must return [`ABI_VERSION`] |
//! | `rewind_facts_ptr` | `() -> i32` | address of a 72-byte, 8-aligned buffer the host writes facts into |
//! | `rewind_decide` | `() -> i32` | reads the facts buffer, returns a [`Verdict`] code |
//!
//! A guest module imports nothing.
//!
//! # Writing a policy
//!
//! Wrap one function in [`rewind_policy!`]; the [`guest`] module has a
//! complete crate, and the README a step-by-step guide.
#![no_std]

use bytemuck::{Pod, Zeroable};

pub mod guest;

/// Version of the layout of [`ResumeFacts`], of the fact codes and of the
/// guest exports.
///
/// - 1: the first version.
/// - 2: adds [`SessionFact::Restored`] (same layout). A version-1 module
///   would read code 6 as an unknown fact and answer for it conservatively
///   (404 on a session that is in fact live): the host refuses version-1
///   modules with a message naming both versions; rebuilding against this
///   SDK is all a plugin needs.
/// - 3: adds [`SessionFact::Remote`] and [`SessionFact::OwnerLost`] (same
///   layout), the facts of a node of a cluster serving a session another
///   node owns. Modules of versions 1 and 2 are refused the same way.
pub const ABI_VERSION: u32 = 3;

/// Name of the linear-memory export the host writes facts into.
pub const EXPORT_MEMORY: &str = "memory";
/// Name of the export returning [`ABI_VERSION`].
pub const EXPORT_ABI_VERSION: &str = "rewind_abi_version";
/// Name of the export returning the address of the facts buffer.
pub const EXPORT_FACTS_PTR: &str = "rewind_facts_ptr";
/// Name of the export that decides.
pub const EXPORT_DECIDE: &str = "rewind_decide";

/// `u64` field value meaning "unknown / not applicable".
pub const UNKNOWN: u64 = u64::MAX;

/// What the host knows about the session a reconnect presented.
#[repr(u32)]
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionFact {
    /// No session id was presented (e.g. a GET without `Mcp-Session-Id`).
    Absent = 0,
    /// The session is live and bound to the presented principal (if any).
    Live = 1,
    /// The id names no live session: never existed, closed, expired or evicted.
    Unknown = 2,
    /// The session id is unknown and the cursor was minted by an earlier
    /// incarnation of this server (its epoch predates this boot).
    PreviousBoot = 3,
    /// The session is live but bound to a different principal.
    WrongPrincipal = 4,
    /// The presented session id is not syntactically a session id.
    Malformed = 5,
    /// The session is live and bound to the presented principal (if any),
    /// and it was restored from the server's data directory when the server
    /// started: it lived in an earlier process, and its epoch, principal
    /// binding and retained events were recovered and proven (every event a
    /// replay delivers passed its checksum). The cursor facts mean what
    /// they mean for [`Live`](SessionFact::Live); the default verdicts are
    /// the same.
    Restored = 6,
    /// The session is live and bound to the presented principal (if any),
    /// and another live node of the cluster owns it: this node serves the
    /// request from the shared tier (Redis), where the owner writes every
    /// event it appends. The cursor facts mean what they mean for
    /// [`Live`](SessionFact::Live), checked against the session's record
    /// and the events the shared tier holds; the default verdicts are the
    /// same.
    Remote = 7,
    /// The session is bound to the presented principal (if any), but the
    /// node that owned it is gone (its heartbeat expired) and no node has
    /// taken it over yet. Its events in the shared tier are intact up to
    /// the last one the owner wrote there; the cursor facts are checked
    /// against them, and the default verdicts are those of
    /// [`Live`](SessionFact::Live). A stricter policy may answer
    /// [`Verdict::Gone`] so the client starts a new session.
    OwnerLost = 8,
}

/// What the presented `Last-Event-ID` means to the presented session.
#[repr(u32)]
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CursorFact {
    /// No cursor was presented.
    Absent = 0,
    /// The cursor does not parse as an event id.
    Malformed = 1,
    /// The cursor was issued by another session (tenant boundary).
    Foreign = 2,
    /// The cursor names this session but an earlier epoch (incarnation).
    OlderEpoch = 3,
    /// The cursor is in the current epoch but beyond the high-water mark,
    /// or names an epoch newer than the session's: forged or from the future.
    Future = 4,
    /// Current epoch, but events after the cursor are no longer retained.
    BeforeWindow = 5,
    /// Current epoch and inside the retained window: a true continuation.
    InWindow = 6,
    /// The cursor parsed, but the session is not live so its meaning
    /// could not be checked.
    Unchecked = 7,
}

/// A resume decision.
#[repr(u32)]
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Replay the cursor's stream after the cursor, then continue live.
    Resume = 0,
    /// A fresh stream with no replay and no signal.
    Fresh = 1,
    /// A fresh stream whose first event is a `reset` signal.
    FreshReset = 2,
    /// A fresh stream whose first event is a `gap` signal.
    FreshGap = 3,
    /// Reject as a bad request (HTTP 400).
    BadRequest = 4,
    /// Reject as a conflict (HTTP 409): foreign, forged or future cursor.
    Conflict = 5,
    /// The session is gone; the client must start over (HTTP 404).
    Gone = 6,
}

impl SessionFact {
    /// Every variant, in code order.
    pub const ALL: [SessionFact; 9] = [
        SessionFact::Absent,
        SessionFact::Live,
        SessionFact::Unknown,
        SessionFact::PreviousBoot,
        SessionFact::WrongPrincipal,
        SessionFact::Malformed,
        SessionFact::Restored,
        SessionFact::Remote,
        SessionFact::OwnerLost,
    ];

    /// The variant with wire code `code`, if this version knows it.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::Absent),
            1 => Some(Self::Live),
            2 => Some(Self::Unknown),
            3 => Some(Self::PreviousBoot),
            4 => Some(Self::WrongPrincipal),
            5 => Some(Self::Malformed),
            6 => Some(Self::Restored),
            7 => Some(Self::Remote),
            8 => Some(Self::OwnerLost),
            _ => None,
        }
    }

    /// The wire code.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// Whether the session is live for the presenter ([`Live`],
    /// [`Restored`], [`Remote`] or [`OwnerLost`]): the facts under which
    /// its cursor is checked.
    ///
    /// [`Live`]: SessionFact::Live
    /// [`Restored`]: SessionFact::Restored
    /// [`Remote`]: SessionFact::Remote
    /// [`OwnerLost`]: SessionFact::OwnerLost
    pub const fn is_live(self) -> bool {
        matches!(
            self,
            SessionFact::Live
                | SessionFact::Restored
                | SessionFact::Remote
                | SessionFact::OwnerLost
        )
    }
}

impl CursorFact {
    /// Every variant, in code order.
    pub const ALL: [CursorFact; 8] = [
        CursorFact::Absent,
        CursorFact::Malformed,
        CursorFact::Foreign,
        CursorFact::OlderEpoch,
        CursorFact::Future,
        CursorFact::BeforeWindow,
        CursorFact::InWindow,
        CursorFact::Unchecked,
    ];

    /// The variant with wire code `code`, if this version knows it.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::Absent),
            1 => Some(Self::Malformed),
            2 => Some(Self::Foreign),
            3 => Some(Self::OlderEpoch),
            4 => Some(Self::Future),
            5 => Some(Self::BeforeWindow),
            6 => Some(Self::InWindow),
            7 => Some(Self::Unchecked),
            _ => None,
        }
    }

    /// The wire code.
    pub const fn code(self) -> u32 {
        self as u32
    }
}

impl Verdict {
    /// Every variant, in code order.
    pub const ALL: [Verdict; 7] = [
        Verdict::Resume,
        Verdict::Fresh,
        Verdict::FreshReset,
        Verdict::FreshGap,
        Verdict::BadRequest,
        Verdict::Conflict,
        Verdict::Gone,
    ];

    /// The variant with wire code `code`, if this version knows it.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::Resume),
            1 => Some(Self::Fresh),
            2 => Some(Self::FreshReset),
            3 => Some(Self::FreshGap),
            4 => Some(Self::BadRequest),
            5 => Some(Self::Conflict),
            6 => Some(Self::Gone),
            _ => None,
        }
    }

    /// The wire code.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// This verdict's bit in a [`VerdictSet`].
    pub const fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// Whether this verdict delivers no event at all (a rejection).
    pub const fn is_rejection(self) -> bool {
        matches!(self, Self::BadRequest | Self::Conflict | Self::Gone)
    }
}

/// A set of verdicts, as a bit mask over verdict codes.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Pod, Zeroable)]
pub struct VerdictSet(pub u32);

impl VerdictSet {
    /// The empty set.
    pub const EMPTY: VerdictSet = VerdictSet(0);
    /// The three rejections, safe for any facts.
    pub const REJECTIONS: VerdictSet =
        VerdictSet(Verdict::BadRequest.bit() | Verdict::Conflict.bit() | Verdict::Gone.bit());
    /// Every verdict this ABI version defines.
    pub const ALL: VerdictSet = VerdictSet((1 << 7) - 1);

    /// The set with `v` added.
    pub const fn with(self, v: Verdict) -> VerdictSet {
        VerdictSet(self.0 | v.bit())
    }

    /// The set with `v` removed.
    pub const fn without(self, v: Verdict) -> VerdictSet {
        VerdictSet(self.0 & !v.bit())
    }

    /// Whether `v` is in the set.
    ///
    /// This is *the* safe-set check: the host's clamp, its WebAssembly
    /// runner and its validation of candidate policies all come here (via
    /// [`admit`](Self::admit) for raw codes), so there is one rule for what
    /// a policy may answer.
    pub const fn contains(self, v: Verdict) -> bool {
        self.0 & v.bit() != 0
    }

    /// The verdict a policy's raw answer `code` names, if this ABI version
    /// knows it and the set [`contains`](Self::contains) it; `None` means
    /// the answer must be replaced by the facts' default.
    ///
    /// ```
    /// use rewind_policy_sdk::{Verdict, VerdictSet};
    /// let set = VerdictSet::REJECTIONS;
    /// assert_eq!(set.admit(Verdict::Gone.code()), Some(Verdict::Gone));
    /// assert_eq!(set.admit(Verdict::Resume.code()), None);
    /// // A bit beyond the known verdicts admits nothing: the code is unknown.
    /// assert_eq!(VerdictSet(u32::MAX).admit(7), None);
    /// ```
    pub const fn admit(self, code: u32) -> Option<Verdict> {
        match Verdict::from_code(code) {
            Some(v) if self.contains(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the raw code `code` names a verdict in the set (see
    /// [`admit`](Self::admit)).
    pub const fn contains_code(self, code: u32) -> bool {
        self.admit(code).is_some()
    }

    /// The verdicts in the set, in code order.
    pub fn iter(self) -> impl Iterator<Item = Verdict> {
        Verdict::ALL.into_iter().filter(move |v| self.contains(*v))
    }
}

/// Everything a policy may base a resume decision on.
///
/// Written by the host, read by the policy. Field by field:
///
/// - `abi_version`: always [`ABI_VERSION`] for this layout.
/// - `session`: a [`SessionFact`] code.
/// - `cursor`: a [`CursorFact`] code.
/// - `allowed`: the [`VerdictSet`] the host will accept for these facts.
///   Anything else is replaced by `default_verdict`.
/// - `default_verdict`: the [`Verdict`] code of the decision table
///   for these facts; always a member of `allowed`.
/// - `_pad0`: zero; keeps the `u64` fields 8-aligned.
/// - `cursor_seq`: the sequence number the cursor names, or [`UNKNOWN`].
/// - `high_water`: the session's highest sequence number handed out so far
///   (0 before the first append), or [`UNKNOWN`] when the session is not live.
/// - `oldest_retained`: the oldest sequence number still held by the session's
///   ring, or [`UNKNOWN`].
/// - `cursor_age_ms`: milliseconds since the cursor's event was appended
///   (since the stream opened, for a priming cursor), or [`UNKNOWN`] when the
///   host cannot tell (e.g. the cursor's event has been overwritten).
/// - `idle_ms`: milliseconds since the session last saw an append or resume,
///   or [`UNKNOWN`].
/// - `max_resume_age_ms`: operator setting carried to the policy: the oldest
///   disconnect a strict policy should still resume; 0 means "not set".
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ResumeFacts {
    pub abi_version: u32,
    pub session: u32,
    pub cursor: u32,
    pub allowed: VerdictSet,
    pub default_verdict: u32,
    pub _pad0: u32,
    pub cursor_seq: u64,
    pub high_water: u64,
    pub oldest_retained: u64,
    pub cursor_age_ms: u64,
    pub idle_ms: u64,
    pub max_resume_age_ms: u64,
}

/// Size in bytes of [`ResumeFacts`] on the wire.
pub const FACTS_SIZE: usize = core::mem::size_of::<ResumeFacts>();
const _: () = assert!(FACTS_SIZE == 72);
const _: () = assert!(core::mem::align_of::<ResumeFacts>() == 8);

impl ResumeFacts {
    /// Facts with the given session and cursor facts and every number unknown.
    /// `allowed` and `default_verdict` are left empty / `Gone`; the host fills
    /// them with [`ResumeFacts::with_safe_set`].
    pub const fn new(session: SessionFact, cursor: CursorFact) -> ResumeFacts {
        ResumeFacts {
            abi_version: ABI_VERSION,
            session: session as u32,
            cursor: cursor as u32,
            allowed: VerdictSet::EMPTY,
            default_verdict: Verdict::Gone as u32,
            _pad0: 0,
            cursor_seq: UNKNOWN,
            high_water: UNKNOWN,
            oldest_retained: UNKNOWN,
            cursor_age_ms: UNKNOWN,
            idle_ms: UNKNOWN,
            max_resume_age_ms: 0,
        }
    }

    /// The session fact, if its code is known to this version.
    pub const fn session_fact(&self) -> Option<SessionFact> {
        SessionFact::from_code(self.session)
    }

    /// The cursor fact, if its code is known to this version.
    pub const fn cursor_fact(&self) -> Option<CursorFact> {
        CursorFact::from_code(self.cursor)
    }

    /// The default verdict, if its code is known to this version.
    pub const fn default(&self) -> Verdict {
        match Verdict::from_code(self.default_verdict) {
            Some(v) => v,
            None => Verdict::Gone,
        }
    }

    /// These facts with `allowed` and `default_verdict` filled in from the
    /// decision table (see [`safe_set`] and [`default_verdict`]).
    pub const fn with_safe_set(mut self) -> ResumeFacts {
        self.fill_safe_set();
        self
    }

    /// [`with_safe_set`](ResumeFacts::with_safe_set) in place.
    #[inline]
    pub const fn fill_safe_set(&mut self) {
        let (s, c) = (self.session_fact(), self.cursor_fact());
        self.allowed = safe_set(s, c);
        self.default_verdict = default_verdict(s, c) as u32;
    }
}

/// The decision table: the default verdict for the facts (the table is
/// written out in `docs/decision-table.md` of the Rewind repository).
///
/// Unknown codes (`None`) get the most conservative answer for their side.
pub const fn default_verdict(session: Option<SessionFact>, cursor: Option<CursorFact>) -> Verdict {
    match session {
        Some(
            SessionFact::Live
            | SessionFact::Restored
            | SessionFact::Remote
            | SessionFact::OwnerLost,
        ) => match cursor {
            Some(CursorFact::Absent) => Verdict::Fresh,
            Some(CursorFact::Malformed) => Verdict::BadRequest,
            Some(CursorFact::Foreign) => Verdict::Conflict,
            Some(CursorFact::OlderEpoch) => Verdict::FreshReset,
            Some(CursorFact::Future) => Verdict::Conflict,
            Some(CursorFact::BeforeWindow) => Verdict::FreshGap,
            Some(CursorFact::InWindow) => Verdict::Resume,
            // A live session always gets a checked cursor; anything else is
            // a host bug or a newer fact: refuse.
            Some(CursorFact::Unchecked) | None => Verdict::Conflict,
        },
        Some(SessionFact::WrongPrincipal) => Verdict::Conflict,
        Some(SessionFact::Absent) => Verdict::BadRequest,
        // A presented id that is not an id names no session: 404, so that
        // MCP clients (which start over only on 404) are not stuck.
        Some(SessionFact::Malformed)
        | Some(SessionFact::Unknown)
        | Some(SessionFact::PreviousBoot)
        | None => Verdict::Gone,
    }
}

/// The verdicts that are safe for the facts: a policy may pick any of them.
///
/// - Replay ([`Verdict::Resume`]) only for a live session and a cursor
///   inside its current window.
/// - A fresh stream (with or without signal) only on a live session the
///   presenter owns; on a session that is not live, only [`Verdict::Fresh`],
///   which tells the embedding to start a new session (never to read one).
/// - Rejections always.
pub const fn safe_set(session: Option<SessionFact>, cursor: Option<CursorFact>) -> VerdictSet {
    let fresh = VerdictSet::REJECTIONS
        .with(Verdict::Fresh)
        .with(Verdict::FreshReset)
        .with(Verdict::FreshGap);
    match session {
        Some(
            SessionFact::Live
            | SessionFact::Restored
            | SessionFact::Remote
            | SessionFact::OwnerLost,
        ) => match cursor {
            Some(CursorFact::InWindow) => fresh.with(Verdict::Resume),
            Some(CursorFact::Unchecked) | None => VerdictSet::REJECTIONS,
            Some(_) => fresh,
        },
        Some(SessionFact::Absent)
        | Some(SessionFact::Unknown)
        | Some(SessionFact::PreviousBoot)
        | Some(SessionFact::Malformed) => VerdictSet::REJECTIONS.with(Verdict::Fresh),
        Some(SessionFact::WrongPrincipal) | None => VerdictSet::REJECTIONS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_always_in_safe_set() {
        for s in SessionFact::ALL {
            for c in CursorFact::ALL {
                let f = ResumeFacts::new(s, c).with_safe_set();
                assert!(f.allowed.contains(f.default()), "{s:?} {c:?}");
            }
        }
    }

    #[test]
    fn resume_only_for_live_in_window() {
        for s in SessionFact::ALL {
            for c in CursorFact::ALL {
                let f = ResumeFacts::new(s, c).with_safe_set();
                let ok = s.is_live() && c == CursorFact::InWindow;
                assert_eq!(f.allowed.contains(Verdict::Resume), ok, "{s:?} {c:?}");
            }
        }
    }

    #[test]
    fn wrong_principal_gets_no_stream() {
        for c in CursorFact::ALL {
            let f = ResumeFacts::new(SessionFact::WrongPrincipal, c).with_safe_set();
            assert_eq!(f.allowed, VerdictSet::REJECTIONS);
        }
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for v in Verdict::ALL {
            assert_eq!(Verdict::from_code(v.code()), Some(v));
        }
        for s in SessionFact::ALL {
            assert_eq!(SessionFact::from_code(s.code()), Some(s));
        }
        for c in CursorFact::ALL {
            assert_eq!(CursorFact::from_code(c.code()), Some(c));
        }
        assert_eq!(Verdict::from_code(7), None);
        assert_eq!(SessionFact::from_code(99), None);
        assert_eq!(CursorFact::from_code(u32::MAX), None);
        assert!(!VerdictSet::ALL.contains_code(7));
        assert!(!VerdictSet::ALL.contains_code(u32::MAX));
    }

    #[test]
    fn admit_agrees_with_contains_for_every_code_and_set() {
        // Every set of the known verdicts, plus one with stray high bits.
        let sets = (0..=VerdictSet::ALL.0)
            .map(VerdictSet)
            .chain([VerdictSet(u32::MAX)]);
        for set in sets {
            for code in (0..40).chain([u32::MAX]) {
                let expected = Verdict::from_code(code).filter(|v| set.contains(*v));
                assert_eq!(set.admit(code), expected, "{set:?} {code}");
                assert_eq!(set.contains_code(code), expected.is_some());
            }
            let listed: u32 = set.iter().map(Verdict::bit).sum();
            assert_eq!(listed, set.0 & VerdictSet::ALL.0, "{set:?}");
        }
    }

    #[test]
    fn facts_are_plain_bytes() {
        let f = ResumeFacts::new(SessionFact::Live, CursorFact::InWindow).with_safe_set();
        let bytes = bytemuck::bytes_of(&f);
        assert_eq!(bytes.len(), FACTS_SIZE);
        let back: ResumeFacts = bytemuck::pod_read_unaligned(bytes);
        assert_eq!(back, f);
    }
}
