//! Resume: from presented headers to facts, a verdict, and what to send.
//!
//! 1. **Facts.** The presented session id is looked up (never the cursor:
//!    the engine has no index from cursors to events). The cursor is parsed
//!    and classified against *that* session: owner tag, epoch, high-water
//!    mark, retained window. The result is a [`ResumeFacts`] with the safe
//!    verdict set and the decision table's default filled in.
//! 2. **Decision.** The engine's [`Policy`](crate::policy::Policy) picks a
//!    verdict; [`clamp`] replaces anything outside the safe set by the
//!    default (invariant 6).
//! 3. **Action.** Only a `Resume` verdict yields a reader positioned after
//!    the cursor, and it reads the presented session's own window, on the
//!    cursor's stream (invariant 2); the reader carries the session, so the
//!    embedding needs no second lookup. A fresh stream carries the session
//!    handle and, for `reset`/`gap`, the signal to send first.

use std::fmt;
use std::sync::Arc;

use rewind_policy_sdk::{CursorFact, ResumeFacts, SessionFact, Verdict, UNKNOWN};

use crate::engine::Engine;
use crate::handle::SessionHandle;
use crate::id::{EventId, SessionId};
use crate::policy::{clamp, PolicyFault};
use crate::replay::Replay;
use crate::session::Session;
use crate::shared::Shared;
use crate::storage::Cursor;

/// What a reconnecting client presented.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResumeRequest<'a> {
    /// The session id header (`Mcp-Session-Id`), if any.
    pub session_id: Option<&'a str>,
    /// The `Last-Event-ID` header, if any.
    pub last_event_id: Option<&'a str>,
    /// The authenticated principal the embedding server vouches for, if any.
    pub principal: Option<&'a str>,
}

/// The engine's answer to a reconnect.
#[derive(Debug)]
pub struct ResumeDecision {
    /// The facts the policy saw.
    pub facts: ResumeFacts,
    /// The verdict acted on (after clamping).
    pub verdict: Verdict,
    /// The policy generation that decided.
    pub generation: u64,
    /// Set when the policy's own answer was replaced by the safe default.
    pub fault: Option<PolicyFault>,
    /// What to send.
    pub action: ResumeAction,
}

/// The policy's verdict on facts the embedding supplied
/// ([`Engine::decide`]).
#[derive(Debug, Clone, Copy)]
pub struct Decided {
    /// The facts the policy saw (safe set filled in).
    pub facts: ResumeFacts,
    /// The verdict to act on (after clamping).
    pub verdict: Verdict,
    /// The policy generation that decided.
    pub generation: u64,
    /// Set when the policy's own answer was replaced by the safe default.
    pub fault: Option<PolicyFault>,
}

impl Decided {
    /// Why, in the words [`Engine::resume`] gives for the same facts (safe
    /// to show the client: never names another session).
    pub fn reason(&self) -> &'static str {
        reason(&self.facts)
    }
}

/// What to send to the client.
#[derive(Debug)]
pub enum ResumeAction {
    /// Replay the cursor's stream after the cursor, then keep reading live.
    /// [`Replay::session`] is the presented session.
    Replay(Replay),
    /// Start a fresh stream. `session` is the live session the stream
    /// belongs to, or `None` when there is none (the embedding must open a
    /// new session, never read an old one). `signal`, if any, goes first.
    Fresh {
        /// The presented session, if it is live and the presenter's.
        session: Option<SessionHandle>,
        /// The `reset`/`gap` signal to send as the first event.
        signal: Option<Signal>,
    },
    /// Refuse; nothing is delivered.
    Reject(Rejection),
}

/// A refused reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// [`Verdict::BadRequest`], [`Verdict::Conflict`] or [`Verdict::Gone`].
    pub verdict: Verdict,
    /// Why, for the response body and logs. Never names another session.
    pub reason: &'static str,
}

impl Rejection {
    /// The HTTP status of the decision table (`docs/decision-table.md`): 400, 409 or 404.
    pub fn http_status(&self) -> u16 {
        match self.verdict {
            Verdict::BadRequest => 400,
            Verdict::Conflict => 409,
            _ => 404,
        }
    }
}

/// Which signal opens a fresh stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKind {
    /// The cursor is from an earlier incarnation of the session.
    Reset,
    /// Events after the cursor are no longer retained.
    Gap,
}

impl SignalKind {
    /// The SSE `event:` name.
    pub fn event_name(self) -> &'static str {
        match self {
            SignalKind::Reset => "reset",
            SignalKind::Gap => "gap",
        }
    }
}

/// The first event of a fresh stream that replaces a resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal {
    /// `reset` or `gap`.
    pub kind: SignalKind,
    /// Why, in a few words.
    pub reason: &'static str,
    /// The client's cursor, re-formatted (never echoed raw).
    pub cursor: Option<EventId>,
    /// The oldest event the session still holds, if any.
    pub oldest: Option<EventId>,
}

impl Signal {
    /// The signal a reader sends when events after its position were
    /// released while it streamed (a [`ReplayError::Lagged`]): the same
    /// `gap` a resume from that position would get.
    ///
    /// [`ReplayError::Lagged`]: crate::ReplayError::Lagged
    pub fn lagged(after: EventId, oldest: Option<EventId>) -> Signal {
        Signal {
            kind: SignalKind::Gap,
            reason: GAP_REASON,
            cursor: Some(after),
            oldest,
        }
    }

    /// The SSE `data:` body: a small JSON object, `reason` always, then
    /// `cursor` (the client's position) and `oldest` (the oldest event
    /// still held) when known.
    pub fn to_json(&self) -> String {
        let mut out = format!("{{\"reason\":\"{}\"", self.reason);
        // Ids are hex digits and '-', so they need no escaping.
        if let Some(c) = self.cursor {
            out.push_str(&format!(",\"cursor\":\"{c}\""));
        }
        if let Some(o) = self.oldest {
            out.push_str(&format!(",\"oldest\":\"{o}\""));
        }
        out.push('}');
        out
    }
}

/// Why a `gap` is sent: the same words for a resume before the window and a
/// reader overtaken while it streamed.
const GAP_REASON: &str = "events after Last-Event-ID are no longer retained";

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.event_name(), self.to_json())
    }
}

/// What classifying a request looked up, beside the facts it filled in.
struct Found {
    session: Option<Arc<Session>>,
    cursor: Option<EventId>,
    /// A reader's position after the cursor, placed where the window holds
    /// it when classifying found it (so the replay starts there instead of
    /// walking the chain again). The window writes it here, in the
    /// caller's frame, and it is copied once, into the reader: returned
    /// through the placement and `Found` instead, it was copied twice right
    /// after the window's narrow stores, and each copy waited for them to
    /// drain (BENCHMARKS.md, run AS).
    placed: Cursor,
}

impl Default for Found {
    fn default() -> Found {
        Found {
            session: None,
            cursor: None,
            placed: Cursor::after(0),
        }
    }
}

impl Engine {
    /// Decides a reconnect and returns what to send. Never panics on any
    /// input; never returns a reader of a session other than the presented
    /// one.
    //
    // Inlined into its caller, with the own-cursor parse inlined into it:
    // the parsed id then stays in registers instead of being returned
    // through memory and copied in wider loads than it was stored with,
    // which stalls the load until the stores drain (BENCHMARKS.md, run AL).
    #[inline(always)]
    pub fn resume(&self, req: ResumeRequest<'_>) -> ResumeDecision {
        let mut facts = ResumeFacts::new(SessionFact::Absent, CursorFact::Absent);
        let mut found = Found::default();
        self.shared.classify(req, &mut facts, &mut found);
        let (verdict, generation, fault) = self.shared.verdict_on(&facts);
        let action = self.shared.act(found, &facts, verdict);
        ResumeDecision {
            facts,
            verdict,
            generation,
            fault,
            action,
        }
    }

    /// Decides on facts the embedding established itself, for a session
    /// this engine does not hold: a cluster node serving a session another
    /// node owns classifies the cursor against the shared tier and asks
    /// the same policy, under the same safe set, as for a local session.
    /// The safe set and default verdict are (re)computed here from the
    /// session and cursor facts, and `max_resume_age_ms` is filled from
    /// the configuration when 0; whatever the policy answers is clamped to
    /// the safe set and counted like [`Engine::resume`]'s verdicts.
    pub fn decide(&self, facts: ResumeFacts) -> Decided {
        let mut facts = facts;
        if facts.max_resume_age_ms == 0 {
            facts.max_resume_age_ms = self.shared.max_resume_age_ms;
        }
        self.shared.judge(facts.with_safe_set())
    }

    /// The facts the engine would hand the policy for `req`, without
    /// deciding. For tests, tooling and policy authors.
    pub fn facts(&self, req: ResumeRequest<'_>) -> ResumeFacts {
        let mut facts = ResumeFacts::new(SessionFact::Absent, CursorFact::Absent);
        self.shared.classify(req, &mut facts, &mut Found::default());
        facts
    }
}

impl Shared {
    /// The policy's verdict on `facts` (safe set filled in), clamped to
    /// the safe set and counted.
    #[inline(always)]
    fn judge(&self, facts: ResumeFacts) -> Decided {
        let (verdict, generation, fault) = self.verdict_on(&facts);
        Decided {
            facts,
            verdict,
            generation,
            fault,
        }
    }

    /// [`Shared::judge`] without moving the facts: the verdict, the
    /// generation that decided, and the fault if the answer was replaced.
    #[inline(always)]
    fn verdict_on(&self, facts: &ResumeFacts) -> (Verdict, u64, Option<PolicyFault>) {
        let answer = self.policy.decide(facts);
        let (verdict, fault) = clamp(facts, answer);
        self.metrics.verdict(verdict, fault);
        (verdict, answer.generation, fault)
    }

    /// Fills `facts` for `req` (safe set included), and `found` with what
    /// was looked up on the way.
    #[inline(always)]
    fn classify(&self, req: ResumeRequest<'_>, facts: &mut ResumeFacts, found: &mut Found) {
        let now = self.now_ms();
        let id = req.session_id.map(SessionId::parse);
        let live = match id {
            Some(Ok(id)) => self.live(id, now),
            _ => None,
        };
        // A live session recognises its own cursors by their first bytes;
        // anything else is parsed in full.
        let cursor = match (req.last_event_id, &live) {
            (None, _) => None,
            (Some(raw), Some(s)) => Some(s.parse_cursor(raw)),
            (Some(raw), None) => Some(EventId::parse_outlined(raw)),
        };
        let parsed = cursor.and_then(Result::ok);
        found.cursor = parsed;
        let session_fact = match (id, live) {
            (None, _) => SessionFact::Absent,
            (Some(Err(_)), _) => SessionFact::Malformed,
            (Some(Ok(_)), Some(s)) if s.principal_matches(req.principal) => {
                let fact = if s.restored.is_some() {
                    SessionFact::Restored
                } else {
                    SessionFact::Live
                };
                found.session = Some(s);
                fact
            }
            (Some(Ok(_)), Some(_)) => SessionFact::WrongPrincipal,
            (Some(Ok(_)), None) if parsed.is_some_and(|c| c.epoch < self.boot_epoch) => {
                SessionFact::PreviousBoot
            }
            (Some(Ok(_)), None) => SessionFact::Unknown,
        };
        *facts = ResumeFacts::new(session_fact, CursorFact::Absent);
        facts.max_resume_age_ms = self.max_resume_age_ms;
        let cursor_fact = match (cursor, &found.session) {
            (None, _) => CursorFact::Absent,
            (Some(Err(_)), _) => CursorFact::Malformed,
            (Some(Ok(_)), None) => CursorFact::Unchecked,
            (Some(Ok(e)), Some(s)) => classify_cursor(self, s, e, now, facts, &mut found.placed),
        };
        if let Some(s) = &found.session {
            s.touch(now);
        }
        facts.cursor = cursor_fact.code();
        facts.fill_safe_set();
    }

    #[inline(always)]
    fn act(self: &Arc<Self>, c: Found, facts: &ResumeFacts, verdict: Verdict) -> ResumeAction {
        let live = facts.session_fact().is_some_and(SessionFact::is_live);
        let handle = |s: &Option<Arc<Session>>| {
            s.as_ref().filter(|_| live).map(|s| SessionHandle {
                session: s.clone(),
                shared: self.clone(),
            })
        };
        let signal = |kind: SignalKind| {
            let s = c.session.as_ref()?;
            let oldest = (facts.oldest_retained != UNKNOWN
                && facts.oldest_retained <= facts.high_water)
                .then(|| s.event_id(c.cursor.map_or(0, |e| e.stream), facts.oldest_retained));
            Some(Signal {
                kind,
                reason: reason(facts),
                cursor: c.cursor,
                oldest,
            })
        };
        match verdict {
            Verdict::Resume => match (c.session, c.cursor) {
                // The clamp admits Resume only for a live session and an
                // in-window cursor, so both are present. The session's Arc
                // moves into the reader.
                (Some(session), Some(cur)) => {
                    let handle = SessionHandle {
                        session,
                        shared: self.clone(),
                    };
                    ResumeAction::Replay(if c.placed.seq == cur.seq + 1 {
                        Replay::at(handle, cur.stream, c.placed)
                    } else {
                        Replay::new(handle, cur.stream, cur.seq)
                    })
                }
                _ => unreachable!("Resume outside the safe set"),
            },
            Verdict::Fresh => ResumeAction::Fresh {
                session: handle(&c.session),
                signal: None,
            },
            Verdict::FreshReset => ResumeAction::Fresh {
                signal: signal(SignalKind::Reset),
                session: handle(&c.session),
            },
            Verdict::FreshGap => ResumeAction::Fresh {
                signal: signal(SignalKind::Gap),
                session: handle(&c.session),
            },
            v => ResumeAction::Reject(Rejection {
                verdict: v,
                reason: reason(facts),
            }),
        }
    }
}

/// Classifies a well-formed cursor against the live session that presents
/// it, filling the numeric facts on the way.
#[inline(always)]
fn classify_cursor(
    shared: &Shared,
    s: &Session,
    c: EventId,
    now: u64,
    facts: &mut ResumeFacts,
    placed: &mut Cursor,
) -> CursorFact {
    let mine = c.tag == s.tag && c.node == s.node && c.epoch == s.epoch;
    let w = s
        .window
        .place(&shared.pool, s.owner(), mine.then_some(c.seq), placed);
    facts.high_water = w.high_water;
    facts.oldest_retained = w.oldest;
    facts.idle_ms = now.saturating_sub(s.last_active_ms.load(std::sync::atomic::Ordering::Relaxed));
    if c.tag != s.tag || c.node != s.node {
        return CursorFact::Foreign;
    }
    if c.epoch < s.epoch {
        return CursorFact::OlderEpoch;
    }
    if c.epoch > s.epoch || c.seq > w.high_water {
        return CursorFact::Future;
    }
    facts.cursor_seq = c.seq;
    facts.cursor_age_ms = if c.seq == 0 {
        now.saturating_sub(s.opened_ms)
    } else {
        w.appended_ms.map_or(UNKNOWN, |ms| now.saturating_sub(ms))
    };
    // In window iff the first event after the cursor is still held (or
    // not appended yet).
    if c.seq + 1 >= w.oldest {
        CursorFact::InWindow
    } else {
        CursorFact::BeforeWindow
    }
}

/// A short reason for the facts, safe to show the client.
fn reason(facts: &ResumeFacts) -> &'static str {
    match (facts.session_fact(), facts.cursor_fact()) {
        (Some(SessionFact::Absent), _) => "no session id presented",
        (Some(SessionFact::Malformed), _) => "malformed session id",
        (Some(SessionFact::Unknown), _) => "session not found",
        (Some(SessionFact::PreviousBoot), _) => "session belongs to a previous server incarnation",
        (Some(SessionFact::WrongPrincipal), _) => "session is bound to another principal",
        (Some(SessionFact::OwnerLost), Some(CursorFact::Absent)) => {
            "the node that owned this session is gone"
        }
        (_, Some(CursorFact::Absent)) => "no cursor",
        (_, Some(CursorFact::Malformed)) => "malformed Last-Event-ID",
        (_, Some(CursorFact::Foreign)) => "Last-Event-ID was not issued by this session",
        (_, Some(CursorFact::OlderEpoch)) => {
            "Last-Event-ID is from an earlier incarnation of this session"
        }
        (_, Some(CursorFact::Future)) => "Last-Event-ID is beyond anything this session issued",
        (_, Some(CursorFact::BeforeWindow)) => GAP_REASON,
        (_, Some(CursorFact::InWindow)) => "resumable",
        _ => "refused by policy",
    }
}
