//! One MCP client session of the load: `initialize`, tool calls checked as
//! they stream, cuts and resumes, adversarial probes, `DELETE`.
//!
//! A session behaves like a real MCP client over HTTP/1.1 keep-alive: its
//! JSON-RPC ids count from 1 (so every session sends the same ids, and a
//! server that keys streams by request id alone mixes them up), it sends
//! `MCP-Protocol-Version` after initialising, and when a call's stream ends
//! before the result it resumes with `GET`, `Mcp-Session-Id` and the last
//! event id it saw (priming ids included), as the MCP spec says.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};

use crate::args::Expect;
use crate::gate::Gate;
use crate::http::{names, Answer, Conn, EventReader, HttpError, Nodes, Timeouts};
use crate::mcp::{self, Message, Tag};
use crate::record::{lock, Counters, ErrorRecord, Record, Violation, Where};
use crate::sse::SseEvent;
use crate::verify::{origin_of, shorten, CallCheck, Finding, Observed, Origin, ViolationKind};

/// Resumes one call may take before its result counts as lost.
const MAX_RESUMES: u32 = 5;
/// How long a stream may stay open after the result before the generator
/// closes the connection to move on.
const LINGER: Duration = Duration::from_millis(250);
/// Longest `retry:` hint honoured before an unplanned resume.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(1);
/// Most bytes of an error body kept as evidence.
const BODY_EVIDENCE: usize = 400;

/// What every session of a run shares.
#[derive(Debug)]
pub struct RunContext {
    /// Where requests go.
    pub nodes: Nodes,
    /// Every wait's bound.
    pub timeouts: Timeouts,
    /// This run's number, in every tag.
    pub run_id: u32,
    /// What the run records.
    pub record: Record,
    /// The cursors sessions publish for the probes of others.
    pub board: CursorBoard,
    /// How long a probe reads a 200 answer.
    pub probe_window: Duration,
    /// Extra arguments of every `progress_stream` call (`--tool-args`).
    pub tool_args: serde_json::Map<String, serde_json::Value>,
    expect: Expect,
    /// Whether the server follows Rewind's decision table (decided by
    /// `--expect`, or by the first `serverInfo` seen).
    strict: AtomicBool,
    server: Mutex<Option<(String, String)>>,
}

impl RunContext {
    /// A context for `sessions` sessions.
    pub fn new(
        nodes: Nodes,
        timeouts: Timeouts,
        run_id: u32,
        delays: usize,
        sessions: u32,
        probe_window: Duration,
        expect: Expect,
    ) -> RunContext {
        RunContext {
            nodes,
            timeouts,
            run_id,
            record: Record::new(delays),
            board: CursorBoard::new(sessions as usize),
            probe_window,
            tool_args: serde_json::Map::new(),
            expect,
            strict: AtomicBool::new(expect == Expect::Table),
            server: Mutex::new(None),
        }
    }

    /// Whether probe answers are held to the decision table.
    pub fn strict(&self) -> bool {
        self.strict.load(Ordering::Relaxed)
    }

    /// The server's `serverInfo` (name, version), once a session saw it.
    pub fn server(&self) -> Option<(String, String)> {
        lock(&self.server).clone()
    }

    fn saw_server(&self, info: &(String, String)) {
        let mut g = lock(&self.server);
        if g.is_none() {
            *g = Some(info.clone());
            if self.expect == Expect::Auto && info.0.to_ascii_lowercase().starts_with("rewind") {
                self.strict.store(true, Ordering::Relaxed);
            }
        }
    }

    fn counters(&self) -> &Counters {
        &self.record.counters
    }
}

/// A cursor a session published for others to misuse.
#[derive(Debug, Clone)]
pub struct Published {
    /// The publishing session's index.
    pub session: u32,
    /// Its `Mcp-Session-Id`.
    pub session_id: String,
    /// A cursor it was sent.
    pub cursor: String,
}

/// The latest cursor of each session.
#[derive(Debug)]
pub struct CursorBoard {
    slots: Vec<Mutex<Option<Published>>>,
}

impl CursorBoard {
    fn new(n: usize) -> CursorBoard {
        CursorBoard {
            slots: (0..n).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Publishes `p` as its session's latest cursor.
    pub fn publish(&self, p: Published) {
        if let Some(slot) = self.slots.get(p.session as usize) {
            *lock(slot) = Some(p);
        }
    }

    /// A cursor of some session other than `me`, if any was published.
    pub fn pick_other(&self, me: u32, rng: &mut fastrand::Rng) -> Option<Published> {
        let n = self.slots.len();
        if n < 2 {
            return None;
        }
        let start = rng.usize(..n);
        (0..n)
            .map(|k| (start + k) % n)
            .filter(|&i| i != me as usize)
            .find_map(|i| lock(&self.slots[i]).clone())
    }
}

/// How a call is cut, if it is.
#[derive(Debug, Clone)]
pub enum Cut {
    /// Read the call to its end.
    Never,
    /// Close the connection after `events` progress notifications, wait
    /// `delay`, resume; latencies go to resume slot `slot`.
    After {
        /// Notifications before the cut.
        events: u64,
        /// Pause before the resume.
        delay: Duration,
        /// The resume-latency slot (the delay's index).
        slot: usize,
    },
    /// A storm: after `events` notifications wait for the gate to cut,
    /// then for it to resume.
    Storm {
        /// Notifications before the cut.
        events: u64,
        /// The storm's gate.
        gate: Arc<Gate>,
        /// The round.
        round: u64,
    },
}

/// One `progress_stream` call.
#[derive(Debug, Clone)]
pub struct CallPlan {
    /// Notifications.
    pub count: u32,
    /// Milliseconds between them.
    pub interval_ms: u64,
    /// Whether and how it is cut.
    pub cut: Cut,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// The result arrived.
    Completed,
    /// A `reset` signal ended it.
    Reset,
    /// No result: a violation or an error says why.
    Failed,
}

/// The kinds of adversarial probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// The prober's live session with another session's cursor.
    Foreign,
    /// The prober's live session with its own cursor moved past anything sent.
    Future,
    /// The prober's live session with a cursor that is no cursor.
    Malformed,
    /// The prober's session re-initialised, with a cursor of the incarnation before.
    Stale,
    /// A session ended with `DELETE`, with its own cursor.
    Dead,
}

impl ProbeKind {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Foreign => "foreign",
            ProbeKind::Future => "future",
            ProbeKind::Malformed => "malformed",
            ProbeKind::Stale => "stale",
            ProbeKind::Dead => "dead",
        }
    }

    /// What Rewind's decision table answers.
    pub fn table_answer(self) -> &'static str {
        match self {
            ProbeKind::Foreign => "409 (cursor of another session)",
            ProbeKind::Future => "409 (cursor beyond anything sent)",
            ProbeKind::Malformed => "400 (malformed cursor)",
            ProbeKind::Stale => "200 with a first `reset` event (cursor of an earlier incarnation)",
            ProbeKind::Dead => "404 (session ended)",
        }
    }

    fn table_status(self) -> u16 {
        match self {
            ProbeKind::Foreign | ProbeKind::Future => 409,
            ProbeKind::Malformed => 400,
            ProbeKind::Stale => 200,
            ProbeKind::Dead => 404,
        }
    }
}

/// Why a session could not be set up.
#[derive(Debug)]
pub struct SetupError(pub String);

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What ended one HTTP response of a call.
enum LegEnd {
    /// The body ended.
    Ended,
    /// The generator cut it as planned.
    Cut,
    /// Still open after the result.
    LeftOpen,
    /// A `reset` signal.
    Reset,
    /// The wire failed.
    Failed(HttpError),
}

/// One MCP session.
#[derive(Debug)]
pub struct Client {
    run: Arc<RunContext>,
    /// Index in the run.
    pub index: u32,
    conns: Vec<Option<Conn>>,
    /// This session's number among the run's fresh `initialize`s (where
    /// sticky routing sends its requests).
    routed_as: usize,
    /// `Mcp-Session-Id`, once initialised.
    pub session_id: Option<String>,
    protocol: Option<String>,
    next_id: u64,
    next_call: u32,
    /// First call number of the current incarnation (calls before it
    /// belong to an earlier one).
    incarnation_first_call: u32,
    /// The last cursor any call of this incarnation was sent.
    pub last_cursor: Option<String>,
    findings: Vec<Finding>,
}

impl Client {
    /// A session that has not initialised yet.
    pub fn new(run: Arc<RunContext>, index: u32) -> Client {
        let n = run.nodes.len();
        Client {
            run,
            index,
            conns: (0..n).map(|_| None).collect(),
            routed_as: 0,
            session_id: None,
            protocol: None,
            next_id: 1,
            next_call: 0,
            incarnation_first_call: 0,
            last_cursor: None,
            findings: Vec::new(),
        }
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn take_tag(&mut self) -> Tag {
        let call = self.next_call;
        self.next_call += 1;
        Tag {
            run: self.run.run_id,
            session: self.index,
            call,
        }
    }

    fn error(&self, doing: &str, e: &HttpError) {
        self.run.record.error(
            e.kind(),
            ErrorRecord {
                session: self.index,
                doing: doing.to_owned(),
                error: e.to_string(),
            },
        );
    }

    fn violation(&self, f: Finding, leg: &str, cursor: Option<&str>, call: Option<Tag>) {
        self.run.record.violation(Violation::new(
            f,
            &Where {
                session: self.index,
                session_id: self.session_id.as_deref().unwrap_or("-"),
                call: call.map(|t| t.to_string()),
                leg,
                cursor,
            },
        ));
    }

    fn flush_findings(&mut self, leg: &str, cursor: Option<&str>, call: Tag) {
        let findings = std::mem::take(&mut self.findings);
        for f in findings {
            self.violation(f, leg, cursor, Some(call));
        }
    }

    /// Closes every connection (a client crash, or a cut).
    pub fn drop_connections(&mut self) {
        for c in &mut self.conns {
            *c = None;
        }
    }

    async fn send(
        &mut self,
        method: Method,
        body: Option<String>,
        cursor: Option<&str>,
        session: Option<&str>,
    ) -> Result<(usize, Answer), HttpError> {
        let node = self.run.nodes.pick(self.routed_as);
        let req = {
            let mut headers: Vec<(&str, &str)> = Vec::with_capacity(3);
            if let Some(s) = session.or(self.session_id.as_deref()) {
                headers.push((names::SESSION_ID, s));
            }
            if let Some(v) = &self.protocol {
                headers.push((names::PROTOCOL_VERSION, v));
            }
            if let Some(c) = cursor {
                headers.push((names::LAST_EVENT_ID, c));
            }
            crate::http::request(self.run.nodes.get(node), method, &headers, body)
        };
        let timeouts = self.run.timeouts;
        let slot = &mut self.conns[node];
        if slot.as_ref().is_some_and(|c| !c.is_usable()) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(Conn::connect(self.run.nodes.get(node), &timeouts).await?);
        }
        let conn = slot.as_mut().expect("connected above");
        match conn.send(req, &timeouts).await {
            Ok(a) => Ok((node, a)),
            Err(e) => {
                *slot = None;
                Err(e)
            }
        }
    }

    /// `initialize` (id 1 for a new session), then `notifications/initialized`.
    /// With `reinitialize`, the request names the current session (Rewind
    /// starts a new incarnation under the same id).
    pub async fn open(&mut self) -> Result<(), SetupError> {
        self.initialize(None).await
    }

    async fn initialize(&mut self, same_session: Option<String>) -> Result<(), SetupError> {
        let id = self.take_id();
        let fail = |what: String| SetupError(what);
        if same_session.is_none() {
            self.session_id = None;
            self.protocol = None;
            self.routed_as = self.run.nodes.open_session();
        }
        let (node, answer) = self
            .send(
                Method::POST,
                Some(mcp::initialize(id)),
                None,
                same_session.as_deref(),
            )
            .await
            .map_err(|e| fail(format!("initialize: {e}")))?;
        let status = answer.status;
        let session_id = answer.header(names::SESSION_ID).map(str::to_owned);
        let timeouts = self.run.timeouts;
        if !status.is_success() {
            let body = answer
                .text(BODY_EVIDENCE, &timeouts)
                .await
                .unwrap_or_default();
            return Err(fail(format!(
                "initialize answered {status}: {}",
                body.trim()
            )));
        }
        let mut result = None;
        if answer.is_event_stream() {
            let mut reader = answer.events(&timeouts);
            loop {
                let wait = if result.is_some() {
                    LINGER
                } else {
                    timeouts.idle
                };
                match reader.next_within(wait).await {
                    Ok(Some(ev)) if ev.carries_data() => {
                        if let Ok(Message::Result {
                            id: Some(rid),
                            server,
                            protocol_version,
                            ..
                        }) = Message::parse(&ev.data)
                        {
                            if rid.is_number(id) {
                                result = Some((server, protocol_version.map(|v| v.into_owned())));
                            }
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) if result.is_some() => {
                        self.conns[node] = None;
                        break;
                    }
                    Err(e) => {
                        self.conns[node] = None;
                        return Err(fail(format!("initialize stream: {e}")));
                    }
                }
            }
        } else {
            let body = answer
                .text(1 << 20, &timeouts)
                .await
                .map_err(|e| fail(format!("initialize body: {e}")))?;
            if let Ok(Message::Result {
                id: Some(rid),
                server,
                protocol_version,
                ..
            }) = Message::parse(&body)
            {
                if rid.is_number(id) {
                    result = Some((server, protocol_version.map(|v| v.into_owned())));
                }
            }
        }
        let Some((server, version)) = result else {
            return Err(fail("initialize: no result for request 1".to_owned()));
        };
        let Some(session_id) = session_id else {
            return Err(fail(
                "initialize: no Mcp-Session-Id header (a stateless server cannot resume)".into(),
            ));
        };
        if let Some(info) = &server {
            self.run.saw_server(info);
        }
        self.session_id = Some(session_id);
        self.protocol = Some(version.unwrap_or_else(|| mcp::PROTOCOL_VERSION.to_owned()));
        self.incarnation_first_call = self.next_call;
        self.last_cursor = None;
        let (_, answer) = self
            .send(Method::POST, Some(mcp::initialized()), None, None)
            .await
            .map_err(|e| fail(format!("notifications/initialized: {e}")))?;
        let status = answer.status;
        let _ = answer.text(BODY_EVIDENCE, &timeouts).await;
        if !status.is_success() {
            return Err(fail(format!("notifications/initialized answered {status}")));
        }
        Counters::add(&self.run.counters().sessions_opened, 1);
        Ok(())
    }

    /// `DELETE` the session; returns the status.
    pub async fn delete(&mut self) -> Result<StatusCode, HttpError> {
        let (_, answer) = self.send(Method::DELETE, None, None, None).await?;
        let status = answer.status;
        let _ = answer.text(BODY_EVIDENCE, &self.run.timeouts).await;
        Counters::add(&self.run.counters().sessions_deleted, 1);
        Ok(status)
    }

    /// Runs one call to its end, checking every event.
    pub async fn call(&mut self, plan: &CallPlan) -> CallEnd {
        let counters = &self.run.counters();
        Counters::add(&counters.calls_started, 1);
        let id = self.take_id();
        let tag = self.take_tag();
        let mut check = CallCheck::new(tag, id, plan.count);
        let body =
            mcp::call_progress_stream(id, tag, plan.count, plan.interval_ms, &self.run.tool_args);
        let started = Instant::now();
        let end = self.run_call(plan, &mut check, body).await;
        let counters = &self.run.counters();
        match end {
            CallEnd::Completed => {
                Counters::add(&counters.calls_completed, 1);
                if matches!(plan.cut, Cut::Never) {
                    lock(&self.run.record.call_latency).record(started.elapsed());
                }
            }
            CallEnd::Reset => Counters::add(&counters.calls_reset, 1),
            CallEnd::Failed => Counters::add(&counters.calls_failed, 1),
        }
        end
    }

    async fn run_call(&mut self, plan: &CallPlan, check: &mut CallCheck, body: String) -> CallEnd {
        let tag = check.tag();
        let timeouts = self.run.timeouts;
        let mut storm = StormReport::new(&plan.cut);
        let (mut node, answer) = match self.send(Method::POST, Some(body), None, None).await {
            Ok(x) => x,
            Err(e) => {
                self.error("tools/call POST", &e);
                return CallEnd::Failed;
            }
        };
        let mut leg = "POST".to_owned();
        let mut presented: Option<String> = None;
        let mut reader = match self.call_stream(answer, check, &leg, None).await {
            Ok(Some(r)) => r,
            Ok(None) => return self.settle_without_stream(check, node),
            Err(end) => return end,
        };
        let mut cursor: Option<String> = None;
        let mut retry_hint: Option<Duration> = None;
        let mut cut_armed = !matches!(plan.cut, Cut::Never);
        let mut resumes = 0u32;
        // (when the resume was sent, its latency slot, whether planned)
        let mut timing: Option<(Instant, usize, bool)> = None;
        let mut storm_first: Option<Instant> = None;
        loop {
            let end = self
                .read_leg(
                    &mut reader,
                    check,
                    &leg,
                    presented.as_deref(),
                    &mut cursor,
                    &mut retry_hint,
                    cut_armed.then(|| cut_events(&plan.cut)),
                    &mut timing,
                    &mut storm_first,
                )
                .await;
            if let Some(c) = &cursor {
                self.last_cursor = Some(c.clone());
                if check.delivered() > 0 {
                    self.run.board.publish(Published {
                        session: self.index,
                        session_id: self.session_id.clone().unwrap_or_default(),
                        cursor: c.clone(),
                    });
                }
            }
            drop(reader);
            let mut planned_delay = None;
            match end {
                LegEnd::Ended if check.has_result() => {
                    storm.complete(storm_first);
                    return CallEnd::Completed;
                }
                LegEnd::LeftOpen => {
                    self.conns[node] = None;
                    Counters::add(&self.run.counters().streams_left_open, 1);
                    storm.complete(storm_first);
                    return CallEnd::Completed;
                }
                LegEnd::Reset => {
                    self.conns[node] = None;
                    Counters::add(&self.run.counters().resets, 1);
                    return CallEnd::Reset;
                }
                LegEnd::Failed(_) if check.has_result() => {
                    self.conns[node] = None;
                    storm.complete(storm_first);
                    return CallEnd::Completed;
                }
                LegEnd::Cut => {
                    cut_armed = false;
                    match &plan.cut {
                        Cut::After { delay, slot, .. } => {
                            self.conns[node] = None;
                            tokio::time::sleep(*delay).await;
                            planned_delay = Some(*slot);
                        }
                        Cut::Storm { gate, round, .. } => {
                            storm.readied = true;
                            gate.ready(*round);
                            gate.wait_cut(*round, timeouts.headers).await;
                            self.conns[node] = None;
                            gate.cut_done(*round);
                            gate.wait_resume(*round, timeouts.headers).await;
                            planned_delay = Some(0);
                        }
                        Cut::Never => {}
                    }
                }
                LegEnd::Ended => {
                    // The server ended the stream before the result: resume,
                    // after its `retry` hint (bounded), as the spec says.
                    Counters::add(&self.run.counters().resumes_unplanned, 1);
                    if let Some(r) = retry_hint {
                        tokio::time::sleep(r.min(MAX_RETRY_WAIT)).await;
                    }
                }
                LegEnd::Failed(e) => {
                    self.conns[node] = None;
                    self.error(&format!("call {tag}: {leg}"), &e);
                    Counters::add(&self.run.counters().resumes_unplanned, 1);
                }
            }
            if resumes >= MAX_RESUMES {
                let why = format!("still no result after {MAX_RESUMES} resumes");
                let f = check.missing_result(&why);
                self.violation(f, &leg, presented.as_deref(), Some(tag));
                return CallEnd::Failed;
            }
            let Some(c) = cursor.clone() else {
                let f = check.missing_result(
                    "the stream ended before the server sent any event id: nothing to resume from",
                );
                self.violation(f, &leg, None, Some(tag));
                return CallEnd::Failed;
            };
            resumes += 1;
            Counters::add(&self.run.counters().resumes, 1);
            let (n, answer) = match self.send(Method::GET, None, Some(&c), None).await {
                Ok(x) => x,
                Err(e) => {
                    self.error(&format!("call {tag}: GET resume {resumes}"), &e);
                    let f = check.missing_result(&format!("the resume failed: {e}"));
                    self.violation(f, &format!("GET resume {resumes}"), Some(&c), Some(tag));
                    return CallEnd::Failed;
                }
            };
            node = n;
            let slot = planned_delay.unwrap_or(usize::MAX);
            if let Some(slot) = planned_delay {
                if let Some(l) = self.run.record.resume.get(slot) {
                    lock(l).headers.record(answer.headers_after);
                }
            }
            timing = Some((answer.started, slot, planned_delay.is_some()));
            leg = format!("GET resume {resumes}");
            presented = Some(c);
            reader = match self
                .call_stream(answer, check, &leg, presented.as_deref())
                .await
            {
                Ok(Some(r)) => r,
                Ok(None) => return self.settle_without_stream(check, node),
                Err(end) => {
                    return end;
                }
            };
        }
    }

    /// Turns a call's answer into its event stream; a JSON answer is checked
    /// whole (`Ok(None)`), a refusal ends the call.
    async fn call_stream(
        &mut self,
        answer: Answer,
        check: &mut CallCheck,
        leg: &str,
        cursor: Option<&str>,
    ) -> Result<Option<EventReader>, CallEnd> {
        let timeouts = self.run.timeouts;
        let tag = check.tag();
        let status = answer.status;
        if status == StatusCode::OK && answer.is_event_stream() {
            return Ok(Some(answer.events(&timeouts)));
        }
        let json = answer.is_json();
        let body = match answer.text(1 << 20, &timeouts).await {
            Ok(b) => b,
            Err(e) => {
                self.error(&format!("call {tag}: {leg} body"), &e);
                return Err(CallEnd::Failed);
            }
        };
        if status == StatusCode::OK && json {
            let ev = SseEvent {
                data: body,
                has_data: true,
                ..SseEvent::default()
            };
            check.observe(&ev, &mut self.findings);
            self.flush_findings(leg, cursor, tag);
            return Ok(None);
        }
        let why = format!("{leg} answered {status}: {}", shorten(body.trim()));
        if cursor.is_some() {
            let f = check.missing_result(&why);
            self.violation(f, leg, cursor, Some(tag));
        } else {
            self.run.record.error(
                &format!("status_{}", status.as_u16()),
                ErrorRecord {
                    session: self.index,
                    doing: format!("call {tag}: {leg}"),
                    error: why,
                },
            );
        }
        Err(CallEnd::Failed)
    }

    fn settle_without_stream(&mut self, check: &CallCheck, _node: usize) -> CallEnd {
        if check.has_result() {
            CallEnd::Completed
        } else {
            let f = check.missing_result("a JSON answer without the result");
            self.violation(f, "POST", None, Some(check.tag()));
            CallEnd::Failed
        }
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the per-call state threaded through each leg; a struct would only rename it"
    )]
    async fn read_leg(
        &mut self,
        reader: &mut EventReader,
        check: &mut CallCheck,
        leg: &str,
        presented: Option<&str>,
        cursor: &mut Option<String>,
        retry_hint: &mut Option<Duration>,
        cut_after: Option<u64>,
        timing: &mut Option<(Instant, usize, bool)>,
        storm_first: &mut Option<Instant>,
    ) -> LegEnd {
        let tag = check.tag();
        let idle = self.run.timeouts.idle;
        let mut events = 0u64;
        let mut checked = 0u64;
        let end = loop {
            let wait = if check.has_result() { LINGER } else { idle };
            let ev = match reader.next_within(wait).await {
                Ok(Some(ev)) => ev,
                Ok(None) => break LegEnd::Ended,
                Err(HttpError::IdleTimeout) if check.has_result() => break LegEnd::LeftOpen,
                Err(e) => break LegEnd::Failed(e),
            };
            if let Some(id) = &ev.id {
                *cursor = Some(id.clone());
            }
            if let Some(ms) = ev.retry {
                *retry_hint = Some(Duration::from_millis(ms));
            }
            if ev.carries_data() {
                checked += 1;
                if let Some((sent, slot, planned)) = timing.take() {
                    if planned {
                        let now = Instant::now();
                        storm_first.get_or_insert(now);
                        if let Some(l) = self.run.record.resume.get(slot) {
                            lock(l).first_event.record(now - sent);
                        }
                    }
                }
            }
            let observed = check.observe(&ev, &mut self.findings);
            if !self.findings.is_empty() {
                self.flush_findings(leg, presented, tag);
            }
            match observed {
                Observed::Progress => {
                    events += 1;
                    if events.is_multiple_of(64) {
                        Counters::add(&self.run.counters().events, 64);
                    }
                    if cut_after.is_some_and(|k| check.delivered() >= k) {
                        break LegEnd::Cut;
                    }
                }
                Observed::Gap => Counters::add(&self.run.counters().gaps, 1),
                Observed::Reset => break LegEnd::Reset,
                Observed::Result | Observed::Nothing | Observed::Violation => {}
            }
        };
        let counters = self.run.counters();
        Counters::add(&counters.events, events % 64);
        Counters::add(&counters.events_checked, checked);
        end
    }

    /// Sends probe `kind`: `GET` with `session_id` and `cursor`, then checks
    /// the answer (see [`ProbeKind::table_answer`]).
    pub async fn probe(&mut self, kind: ProbeKind, session_id: &str, cursor: &str) {
        Counters::add(&self.run.counters().probes, 1);
        let leg = format!("probe {}", kind.name());
        let name = kind.name();
        let timeouts = self.run.timeouts;
        let (node, answer) = match self
            .send(Method::GET, None, Some(cursor), Some(session_id))
            .await
        {
            Ok(x) => x,
            Err(e) => {
                self.error(&leg, &e);
                self.run.record.probe(name, |t| t.errors += 1);
                return;
            }
        };
        let status = answer.status.as_u16();
        let strict = self.run.strict();
        if status != 200 || !answer.is_event_stream() {
            let body = answer
                .text(BODY_EVIDENCE, &timeouts)
                .await
                .unwrap_or_default();
            self.run
                .record
                .probe(name, |t| *t.answers.entry(status).or_default() += 1);
            if strict && status != kind.table_status() {
                self.unexpected(
                    kind,
                    &leg,
                    cursor,
                    format!("{status} {}", shorten(body.trim())),
                );
            }
            return;
        }
        let mut reader = answer.events(&timeouts);
        let deadline = tokio::time::Instant::now() + self.run.probe_window;
        let me = Tag {
            run: self.run.run_id,
            session: self.index,
            call: u32::MAX,
        };
        let (mut own, mut foreign, mut first_kind) = (0u64, 0u64, None::<String>);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let ev = match reader.next_within(left).await {
                Ok(Some(ev)) => ev,
                _ => break,
            };
            if ev.carries_data() && first_kind.is_none() {
                first_kind = Some(ev.kind().to_owned());
            }
            if !ev.carries_data() || ev.kind() != "message" {
                continue;
            }
            let Ok(message) = Message::parse(&ev.data) else {
                continue;
            };
            let finding = |kind, expected: String| Finding {
                kind,
                event_id: ev.id.clone(),
                arrived: shorten(&ev.data),
                expected,
            };
            match origin_of(me, &message) {
                Origin::OtherSession(t) => {
                    foreign += 1;
                    let f = finding(
                        ViolationKind::ForeignSession,
                        format!(
                            "no event of another session (this one is session {}'s, call {t})",
                            t.session
                        ),
                    );
                    self.violation(f, &leg, Some(cursor), None);
                }
                Origin::OtherCall(t) if t.call < self.incarnation_first_call => {
                    foreign += 1;
                    let f = finding(
                        ViolationKind::StaleIncarnation,
                        format!(
                            "no event of the incarnation before (call {t} precedes this one's first call {})",
                            self.incarnation_first_call
                        ),
                    );
                    self.violation(f, &leg, Some(cursor), None);
                }
                Origin::OtherCall(_) | Origin::ThisCall => own += 1,
                Origin::Unknown => {}
            }
        }
        drop(reader);
        self.conns[node] = None;
        let signalled = matches!(first_kind.as_deref(), Some("reset" | "gap"));
        self.run.record.probe(name, |t| {
            *t.answers.entry(status).or_default() += 1;
            t.own_events += own;
            t.foreign_events += foreign;
            t.signalled += u64::from(signalled);
        });
        if strict {
            let ok = match kind {
                ProbeKind::Stale => first_kind.as_deref() == Some("reset"),
                _ => false,
            };
            if !ok {
                self.unexpected(
                    kind,
                    &leg,
                    cursor,
                    format!(
                        "200 with {} (first event: {})",
                        if own + foreign > 0 {
                            "events"
                        } else {
                            "a stream"
                        },
                        first_kind.as_deref().unwrap_or("none")
                    ),
                );
            }
        }
    }

    fn unexpected(&self, kind: ProbeKind, leg: &str, cursor: &str, arrived: String) {
        let f = Finding {
            kind: ViolationKind::UnexpectedAnswer,
            event_id: None,
            arrived,
            expected: kind.table_answer().to_owned(),
        };
        self.violation(f, leg, Some(cursor), None);
    }

    /// Re-initialises the session under its own id. Returns whether the
    /// server kept the id (a new incarnation of the same session); if it
    /// handed out another id, the client now uses that one.
    pub async fn reinitialize(&mut self) -> Result<bool, SetupError> {
        let old = self.session_id.clone();
        self.initialize(old.clone()).await?;
        Ok(self.session_id == old)
    }

    /// Closes the connections and ends use of this session without
    /// `DELETE`, as a client that goes away would.
    pub fn abandon(&mut self) {
        self.drop_connections();
        Counters::add(&self.run.counters().sessions_abandoned, 1);
    }
}

/// Tells a storm's gate how the call went, whichever way it returns.
struct StormReport<'a> {
    gate: Option<(&'a Gate, u64)>,
    readied: bool,
    completed: Option<Option<Instant>>,
}

impl<'a> StormReport<'a> {
    fn new(cut: &'a Cut) -> StormReport<'a> {
        StormReport {
            gate: match cut {
                Cut::Storm { gate, round, .. } => Some((gate, *round)),
                _ => None,
            },
            readied: false,
            completed: None,
        }
    }

    fn complete(&mut self, first: Option<Instant>) {
        self.completed = Some(first);
    }
}

impl Drop for StormReport<'_> {
    fn drop(&mut self) {
        let Some((gate, round)) = self.gate else {
            return;
        };
        match (self.readied, self.completed) {
            (true, Some(first)) => gate.done(round, first, Instant::now()),
            (readied, _) => gate.drop_out(round, readied),
        }
    }
}

fn cut_events(cut: &Cut) -> u64 {
    match cut {
        Cut::Never => u64::MAX,
        Cut::After { events, .. } | Cut::Storm { events, .. } => *events,
    }
}

/// `cursor` moved past anything the server sent: its last run of digits
/// (hexadecimal when `hex`) increased by 2^24.
pub fn future_cursor(cursor: &str, hex: bool) -> String {
    let is_digit = |b: u8| {
        if hex {
            b.is_ascii_hexdigit()
        } else {
            b.is_ascii_digit()
        }
    };
    let bytes = cursor.as_bytes();
    let Some(end) = bytes.iter().rposition(|&b| is_digit(b)).map(|i| i + 1) else {
        return format!("{cursor}-16777216");
    };
    let start = bytes[..end]
        .iter()
        .rposition(|&b| !is_digit(b))
        .map_or(0, |i| i + 1);
    let digits = &cursor[start..end];
    let bumped = if hex {
        u128::from_str_radix(digits, 16)
            .map(|v| format!("{:x}", v.saturating_add(1 << 24)))
            .unwrap_or_else(|_| "ffffffffffffffff".to_owned())
    } else {
        digits
            .parse::<u128>()
            .map(|v| v.saturating_add(1 << 24).to_string())
            .unwrap_or_else(|_| "99999999999999999999".to_owned())
    };
    format!("{}{bumped}{}", &cursor[..start], &cursor[end..])
}

/// A cursor no server issues.
pub const MALFORMED_CURSOR: &str = "not a cursor%";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_future_cursor_moves_only_the_last_number() {
        assert_eq!(
            future_cursor("9f3a0c12b4e5d6f7-5f1e2d3c4b5a6-2-1a", true),
            "9f3a0c12b4e5d6f7-5f1e2d3c4b5a6-2-100001a"
        );
        assert_eq!(future_cursor("5/3", false), "5/16777219");
        assert_eq!(future_cursor("abc_", false), "abc_-16777216");
    }
}
