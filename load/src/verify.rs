//! Checking each call as its events arrive.
//!
//! A [`CallCheck`] follows one `progress_stream` call across every HTTP
//! response that delivers it (the POST, then each resume). It expects
//! progress values `1..=count` exactly once and in order, then the result
//! exactly once; a `gap` signal allows values to be skipped from then on (the
//! server said it lost them), a `reset` ends the call (the server said the
//! stream is gone). Anything else is a [`Finding`]: a value twice, a value
//! skipped without a signal, a value late, an event or result of another
//! call or session (told by the [`Tag`] in its token and text), content the
//! tool did not write, no result.

use std::fmt;

use serde::Serialize;

use crate::mcp::{Message, Scalar, Tag};
use crate::sse::SseEvent;

/// The kinds of violation, as counted in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// A progress value delivered a second time.
    Duplicate,
    /// A progress value skipped with no `gap` or `reset` announced.
    Missing,
    /// A progress value arriving after a later one.
    OutOfOrder,
    /// An event or result produced for another session.
    ForeignSession,
    /// An event or result produced for another call of the same session.
    OtherCall,
    /// An event of an earlier incarnation of the session (before a
    /// re-initialisation) delivered to the new one.
    StaleIncarnation,
    /// The result delivered a second time.
    DuplicateResult,
    /// No result, though every stream of the call ended or was refused.
    MissingResult,
    /// A JSON-RPC error, or a failed tool result, for a valid call.
    ErrorResult,
    /// Content the tool does not write (wrong text, wrong id, bad JSON).
    Corrupt,
    /// An HTTP answer that contradicts the decision table (only checked
    /// against servers that follow it).
    UnexpectedAnswer,
}

impl ViolationKind {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::Duplicate => "duplicate",
            ViolationKind::Missing => "missing",
            ViolationKind::OutOfOrder => "out_of_order",
            ViolationKind::ForeignSession => "foreign_session",
            ViolationKind::OtherCall => "other_call",
            ViolationKind::StaleIncarnation => "stale_incarnation",
            ViolationKind::DuplicateResult => "duplicate_result",
            ViolationKind::MissingResult => "missing_result",
            ViolationKind::ErrorResult => "error_result",
            ViolationKind::Corrupt => "corrupt",
            ViolationKind::UnexpectedAnswer => "unexpected_answer",
        }
    }
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One thing that should not have happened, with what showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What kind of violation.
    pub kind: ViolationKind,
    /// The `id:` of the event that showed it, if it had one.
    pub event_id: Option<String>,
    /// What arrived (the event's data, shortened).
    pub arrived: String,
    /// What the verifier expected instead.
    pub expected: String,
}

/// Longest piece of an event kept as evidence.
const EVIDENCE_CHARS: usize = 300;

/// `s` cut to a length that fits a report line.
pub fn shorten(s: &str) -> String {
    if s.chars().count() <= EVIDENCE_CHARS {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(EVIDENCE_CHARS).collect();
    out.push('…');
    out
}

/// Whose event a tag names, seen from session `me` in run `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This call.
    ThisCall,
    /// Another call of this session.
    OtherCall(Tag),
    /// Another session (or another run).
    OtherSession(Tag),
    /// Nothing that names a session of this run.
    Unknown,
}

/// Where `tag` comes from, for call `me`.
pub fn origin(me: Tag, tag: Option<Tag>) -> Origin {
    match tag {
        None => Origin::Unknown,
        Some(t) if t.run != me.run || t.session != me.session => Origin::OtherSession(t),
        Some(t) if t.call != me.call => Origin::OtherCall(t),
        Some(_) => Origin::ThisCall,
    }
}

/// The tags an event carries: its progress token, and the label at the
/// start of its progress message or result text.
pub fn tags_of(message: &Message<'_>) -> [Option<Tag>; 2] {
    let first_word = |s: &str| s.split(' ').next().and_then(Tag::parse);
    match message {
        Message::Progress { token, message, .. } => [
            token.as_ref().and_then(Scalar::as_str).and_then(Tag::parse),
            message.as_deref().and_then(first_word),
        ],
        Message::Result { text, .. } => [text.as_deref().and_then(first_word), None],
        _ => [None, None],
    }
}

/// Whose event `message` is, for call `me`: the farthest origin any of its
/// tags names (a token of ours with another session's text is foreign).
pub fn origin_of(me: Tag, message: &Message<'_>) -> Origin {
    let mut worst = Origin::Unknown;
    for tag in tags_of(message) {
        match (origin(me, tag), worst) {
            (o @ Origin::OtherSession(_), _) => return o,
            (o @ Origin::OtherCall(_), _) => worst = o,
            (Origin::ThisCall, Origin::Unknown) => worst = Origin::ThisCall,
            _ => {}
        }
    }
    worst
}

/// What an event was to the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// A priming event, a `retry` hint, or a message that is not the call's
    /// business (logging, pings): nothing to check.
    Nothing,
    /// One of the call's progress notifications, in order.
    Progress,
    /// The call's result.
    Result,
    /// A `gap` signal: values may be missing from here on.
    Gap,
    /// A `reset` signal: the stream is gone, the call ends here.
    Reset,
    /// A violation (recorded in the findings).
    Violation,
}

/// The state of one call.
#[derive(Debug)]
pub struct CallCheck {
    tag: Tag,
    request_id: u64,
    count: u64,
    /// Highest progress value delivered so far.
    last: u64,
    /// Which values were delivered (bit `v`), to tell a duplicate from a
    /// late arrival.
    seen: Vec<u64>,
    gap_announced: bool,
    results: u32,
    delivered: u64,
}

impl CallCheck {
    /// A call with JSON-RPC id `request_id`, tagged `tag`, expecting
    /// `count` progress notifications.
    pub fn new(tag: Tag, request_id: u64, count: u32) -> CallCheck {
        let count = u64::from(count);
        CallCheck {
            tag,
            request_id,
            count,
            last: 0,
            seen: vec![0; (count as usize + 1).div_ceil(64)],
            gap_announced: false,
            results: 0,
            delivered: 0,
        }
    }

    /// The call's tag.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// Whether the result arrived.
    pub fn has_result(&self) -> bool {
        self.results > 0
    }

    /// Progress notifications delivered in order so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Highest progress value delivered so far.
    pub fn last_progress(&self) -> u64 {
        self.last
    }

    /// Whether a `gap` was announced for this call.
    pub fn gap_announced(&self) -> bool {
        self.gap_announced
    }

    fn was_seen(&self, v: u64) -> bool {
        self.seen[(v / 64) as usize] & (1 << (v % 64)) != 0
    }

    fn mark_seen(&mut self, v: u64) {
        self.seen[(v / 64) as usize] |= 1 << (v % 64);
    }

    /// Checks one event of the call's stream, recording what is wrong in
    /// `findings`.
    pub fn observe(&mut self, event: &SseEvent, findings: &mut Vec<Finding>) -> Observed {
        let finding = |kind, arrived: &str, expected: String| Finding {
            kind,
            event_id: event.id.clone(),
            arrived: shorten(arrived),
            expected,
        };
        match event.kind() {
            "gap" => {
                self.gap_announced = true;
                return Observed::Gap;
            }
            "reset" => return Observed::Reset,
            _ => {}
        }
        if !event.carries_data() {
            return Observed::Nothing;
        }
        let message = match Message::parse(&event.data) {
            Ok(m) => m,
            Err(why) => {
                findings.push(finding(
                    ViolationKind::Corrupt,
                    &event.data,
                    format!("a JSON-RPC message ({why})"),
                ));
                return Observed::Violation;
            }
        };
        match origin_of(self.tag, &message) {
            Origin::OtherSession(t) => {
                findings.push(finding(
                    ViolationKind::ForeignSession,
                    &event.data,
                    format!(
                        "only events of session {} call {} (this event is session {}'s call {}{})",
                        self.tag.session,
                        self.tag,
                        t.session,
                        t,
                        if t.run != self.tag.run {
                            ", of another run"
                        } else {
                            ""
                        }
                    ),
                ));
                return Observed::Violation;
            }
            Origin::OtherCall(t) => {
                findings.push(finding(
                    ViolationKind::OtherCall,
                    &event.data,
                    format!("only events of call {} (this is call {t})", self.tag),
                ));
                return Observed::Violation;
            }
            Origin::ThisCall | Origin::Unknown => {}
        }
        match message {
            Message::Progress {
                progress, message, ..
            } => {
                let v = match progress {
                    Some(p) if p >= 1.0 && p.fract() == 0.0 && p <= self.count as f64 => p as u64,
                    _ => {
                        findings.push(finding(
                            ViolationKind::Corrupt,
                            &event.data,
                            format!("a progress value in 1..={}", self.count),
                        ));
                        return Observed::Violation;
                    }
                };
                let want_message = self.tag.progress_message(v, self.count);
                if message.as_deref() != Some(want_message.as_str()) {
                    findings.push(finding(
                        ViolationKind::Corrupt,
                        &event.data,
                        format!("message {want_message:?}"),
                    ));
                    return Observed::Violation;
                }
                if self.was_seen(v) {
                    findings.push(finding(
                        ViolationKind::Duplicate,
                        &event.data,
                        format!(
                            "progress {} next (progress {v} was already delivered)",
                            self.last + 1
                        ),
                    ));
                    return Observed::Violation;
                }
                if v < self.last {
                    self.mark_seen(v);
                    findings.push(finding(
                        ViolationKind::OutOfOrder,
                        &event.data,
                        format!(
                            "progress {} next; {v} came after {}",
                            self.last + 1,
                            self.last
                        ),
                    ));
                    return Observed::Violation;
                }
                let skipped = v - self.last - 1;
                self.mark_seen(v);
                self.last = v;
                self.delivered += 1;
                if skipped > 0 && !self.gap_announced {
                    findings.push(finding(
                        ViolationKind::Missing,
                        &event.data,
                        format!(
                            "progress {} next: {skipped} value(s) skipped without a gap signal",
                            v - skipped
                        ),
                    ));
                    return Observed::Violation;
                }
                Observed::Progress
            }
            Message::Result {
                id, text, is_error, ..
            } => {
                let id_ok = id.as_ref().is_some_and(|i| i.is_number(self.request_id));
                let want_text = self.tag.result_text(self.count);
                self.results += 1;
                if self.results > 1 {
                    findings.push(finding(
                        ViolationKind::DuplicateResult,
                        &event.data,
                        "the result once (it was already delivered)".to_owned(),
                    ));
                    return Observed::Violation;
                }
                if is_error {
                    findings.push(finding(
                        ViolationKind::ErrorResult,
                        &event.data,
                        format!("result text {want_text:?}"),
                    ));
                    return Observed::Violation;
                }
                if !id_ok || text.as_deref() != Some(want_text.as_str()) {
                    findings.push(finding(
                        ViolationKind::Corrupt,
                        &event.data,
                        format!("response to id {} with text {want_text:?}", self.request_id),
                    ));
                    return Observed::Violation;
                }
                self.check_complete(event, findings);
                Observed::Result
            }
            Message::Error { id, .. } => {
                if id.as_ref().is_some_and(|i| i.is_number(self.request_id)) {
                    self.results += 1;
                }
                findings.push(finding(
                    ViolationKind::ErrorResult,
                    &event.data,
                    format!("result of call {}", self.tag),
                ));
                Observed::Violation
            }
            Message::Notification { .. } | Message::Request { .. } => Observed::Nothing,
        }
    }

    /// Records the values missing when the result arrives.
    fn check_complete(&mut self, event: &SseEvent, findings: &mut Vec<Finding>) {
        if self.gap_announced {
            return;
        }
        let missing: Vec<u64> = (1..=self.count).filter(|&v| !self.was_seen(v)).collect();
        if let Some(&first) = missing.first() {
            findings.push(Finding {
                kind: ViolationKind::Missing,
                event_id: event.id.clone(),
                arrived: shorten(&event.data),
                expected: format!(
                    "progress 1..={} before the result; {} missing, the first is {first}",
                    self.count,
                    missing.len()
                ),
            });
        }
    }

    /// The finding for a call that ends without its result, `why` saying
    /// how it ended.
    pub fn missing_result(&self, why: &str) -> Finding {
        Finding {
            kind: ViolationKind::MissingResult,
            event_id: None,
            arrived: shorten(why),
            expected: format!(
                "the result of call {} (after progress {} of {})",
                self.tag, self.last, self.count
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: u32 = 0xabc;

    fn tag(session: u32, call: u32) -> Tag {
        Tag {
            run: RUN,
            session,
            call,
        }
    }

    fn progress(t: Tag, v: u64, count: u64, id: &str) -> SseEvent {
        SseEvent {
            id: Some(id.to_owned()),
            event: None,
            data: serde_json::json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {
                    "progressToken": t.to_string(),
                    "progress": v,
                    "total": count,
                    "message": t.progress_message(v, count),
                },
            })
            .to_string(),
            has_data: true,
            retry: None,
        }
    }

    fn result(t: Tag, request_id: u64, count: u64) -> SseEvent {
        SseEvent {
            id: Some("r".to_owned()),
            event: None,
            data: serde_json::json!({
                "jsonrpc": "2.0",
                "id": request_id,
                "result": { "content": [{ "type": "text", "text": t.result_text(count) }] },
            })
            .to_string(),
            has_data: true,
            retry: None,
        }
    }

    fn signal(kind: &str) -> SseEvent {
        SseEvent {
            id: None,
            event: Some(kind.to_owned()),
            data: r#"{"reason":"test"}"#.to_owned(),
            has_data: true,
            retry: None,
        }
    }

    /// Feeds `events` and returns the kinds of violation found.
    fn run(check: &mut CallCheck, events: &[SseEvent]) -> Vec<ViolationKind> {
        let mut findings = Vec::new();
        for e in events {
            check.observe(e, &mut findings);
        }
        findings.into_iter().map(|f| f.kind).collect()
    }

    #[test]
    fn a_complete_call_in_order_passes() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 3);
        let priming = SseEvent {
            id: Some("p".into()),
            has_data: true,
            ..SseEvent::default()
        };
        let mut events = vec![priming];
        events.extend((1..=3).map(|v| progress(me, v, 3, &v.to_string())));
        events.push(result(me, 2, 3));
        assert_eq!(run(&mut c, &events), vec![]);
        assert!(c.has_result());
        assert_eq!(c.delivered(), 3);
    }

    #[test]
    fn a_duplicated_event_is_flagged() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 3);
        let events = [
            progress(me, 1, 3, "a"),
            progress(me, 2, 3, "b"),
            // A resume that replays from the cursor's own event.
            progress(me, 2, 3, "b"),
            progress(me, 3, 3, "c"),
            result(me, 2, 3),
        ];
        assert_eq!(run(&mut c, &events), vec![ViolationKind::Duplicate]);
    }

    #[test]
    fn an_event_of_another_session_is_flagged_even_with_our_request_id() {
        let me = tag(1, 2);
        let other = tag(9, 2);
        let mut c = CallCheck::new(me, 2, 2);
        let events = [
            progress(me, 1, 2, "a"),
            progress(other, 2, 2, "x"),
            result(other, 2, 2),
        ];
        let kinds = run(&mut c, &events);
        assert_eq!(
            kinds,
            vec![ViolationKind::ForeignSession, ViolationKind::ForeignSession]
        );
        assert!(!c.has_result(), "a foreign result is not ours");
    }

    #[test]
    fn a_foreign_label_under_our_token_is_still_foreign() {
        let me = tag(1, 2);
        let mut e = progress(me, 1, 1, "a");
        e.data = e.data.replace(
            &me.progress_message(1, 1),
            &tag(5, 2).progress_message(1, 1),
        );
        let mut c = CallCheck::new(me, 2, 1);
        assert_eq!(run(&mut c, &[e]), vec![ViolationKind::ForeignSession]);
    }

    #[test]
    fn a_missing_event_is_flagged_when_it_is_skipped_and_at_the_result() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 3);
        let events = [progress(me, 1, 3, "a"), progress(me, 3, 3, "c")];
        assert_eq!(run(&mut c, &events), vec![ViolationKind::Missing]);
        // Missing at the end (nothing skipped in between).
        let mut c = CallCheck::new(me, 2, 3);
        let events = [
            progress(me, 1, 3, "a"),
            progress(me, 2, 3, "b"),
            result(me, 2, 3),
        ];
        assert_eq!(run(&mut c, &events), vec![ViolationKind::Missing]);
    }

    #[test]
    fn a_gap_signal_makes_skipped_events_acceptable() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 5);
        let events = [
            progress(me, 1, 5, "a"),
            signal("gap"),
            progress(me, 4, 5, "d"),
            progress(me, 5, 5, "e"),
            result(me, 2, 5),
        ];
        assert_eq!(run(&mut c, &events), vec![]);
        assert!(c.gap_announced());
        assert!(c.has_result());
    }

    #[test]
    fn a_gap_does_not_excuse_a_duplicate() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 5);
        let events = [
            progress(me, 1, 5, "a"),
            signal("gap"),
            progress(me, 1, 5, "a"),
        ];
        assert_eq!(run(&mut c, &events), vec![ViolationKind::Duplicate]);
    }

    #[test]
    fn a_reset_ends_the_call_without_a_violation() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 5);
        let mut findings = Vec::new();
        assert_eq!(c.observe(&signal("reset"), &mut findings), Observed::Reset);
        assert!(findings.is_empty());
    }

    #[test]
    fn late_values_wrong_content_and_second_results_are_flagged() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 3);
        let mut bad = progress(me, 2, 3, "b");
        bad.data = bad.data.replace("step 2/3", "step two");
        let events = [
            progress(me, 1, 3, "a"),
            signal("gap"),
            progress(me, 3, 3, "c"),
            progress(me, 2, 3, "b"),
            bad,
            result(me, 2, 3),
            result(me, 2, 3),
            progress(tag(1, 1), 1, 3, "old"),
        ];
        assert_eq!(
            run(&mut c, &events),
            vec![
                ViolationKind::OutOfOrder,
                ViolationKind::Corrupt,
                ViolationKind::DuplicateResult,
                ViolationKind::OtherCall,
            ]
        );
    }

    #[test]
    fn a_result_with_another_id_or_an_error_is_flagged() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 1);
        let events = [progress(me, 1, 1, "a"), result(me, 3, 1)];
        assert_eq!(run(&mut c, &events), vec![ViolationKind::Corrupt]);
        let mut c = CallCheck::new(me, 2, 1);
        let err = SseEvent {
            data: r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"no"}}"#.into(),
            has_data: true,
            ..SseEvent::default()
        };
        assert_eq!(run(&mut c, &[err]), vec![ViolationKind::ErrorResult]);
    }

    #[test]
    fn logging_and_pings_on_the_stream_are_not_the_calls_business() {
        let me = tag(1, 2);
        let mut c = CallCheck::new(me, 2, 1);
        let log = SseEvent {
            data: r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#.into(),
            has_data: true,
            ..SseEvent::default()
        };
        let mut findings = Vec::new();
        assert_eq!(c.observe(&log, &mut findings), Observed::Nothing);
        assert!(findings.is_empty());
        assert_eq!(
            c.missing_result("stream ended").kind,
            ViolationKind::MissingResult
        );
    }
}
