//! One MCP session: the engine session that stores its events, the rmcp
//! service that speaks the protocol for it, and the routing table that says
//! which SSE stream each outgoing message belongs to.
//!
//! # Routing
//!
//! Every POST that carries requests gets its own stream id from the engine
//! ([`SessionHandle::new_stream`]); the requests it carried are registered
//! against that stream (by request id and by progress token) and the stream
//! is *open* while any of them awaits its response. An outgoing message goes
//! to exactly one stream:
//!
//! | message | stream |
//! |---|---|
//! | response / error to request X | X's stream (then X is done) |
//! | `notifications/progress` with X's progress token | X's stream |
//! | `notifications/cancelled` for X | X's stream |
//! | server request sent from X's handler (rmcp's `OriginatingRequestId`) | X's stream |
//! | any notification tagged [`RelatedRequest`]`(X)` | X's stream |
//! | anything else, or X already done | the standalone stream 0 |
//!
//! This mirrors rmcp's `LocalSessionManager` (`resolve_outbound_channel`),
//! plus the [`RelatedRequest`] tag for logging during a request, which rmcp
//! has no way to associate. Once X is done its stream receives nothing more,
//! so a reader of a stream that is no longer open ends when it has caught up.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use rewind_engine::{
    Attachment, CallGuard, EndReason, EventId, Replay, ReplayError, SessionHandle,
};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, GetExtensions, GetMeta, InitializeRequestParams,
    JsonRpcNotification, ProgressToken, RequestId, ServerJsonRpcMessage, ServerNotification,
    ServerResult,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The standalone stream of every session (the `GET` stream).
pub(crate) const STANDALONE: u32 = 0;

/// Tags an outgoing notification as belonging to request `0`: put it in the
/// notification's `extensions` and the transport sends it on that request's
/// stream (while the request is in flight), not on the standalone stream.
///
/// ```no_run
/// # use rmcp::model::*;
/// # use rewind_server::mcp::RelatedRequest;
/// # async fn f(ctx: rmcp::service::RequestContext<rmcp::RoleServer>) {
/// #[allow(deprecated, reason = "logging is deprecated by SEP-2577 but still in 2025-11-25")]
/// let mut n = LoggingMessageNotification::new(LoggingMessageNotificationParam::new(
///     LoggingLevel::Info,
///     serde_json::json!("working"),
/// ));
/// n.extensions.insert(RelatedRequest(ctx.id.clone()));
/// #[allow(deprecated, reason = "as above")]
/// let _ = ctx.peer.send_notification(ServerNotification::LoggingMessageNotification(n)).await;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelatedRequest(pub RequestId);

/// The SSE stream a request arrived on, handed to its handler in the
/// request's extensions (extract it in a tool with
/// `rmcp::handler::server::tool::Extension<SseStream>`).
#[derive(Clone)]
pub struct SseStream {
    session: Arc<McpSession>,
    stream: u32,
}

impl fmt::Debug for SseStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseStream")
            .field("session", &self.session.handle.id())
            .field("stream", &self.stream)
            .finish()
    }
}

impl SseStream {
    /// The engine's stream id.
    pub fn id(&self) -> u32 {
        self.stream
    }

    /// Ends the HTTP responses currently delivering this stream, without
    /// ending the stream: everything sent on it later is still stored, and
    /// a client that reconnects with `GET` + `Last-Event-ID` receives it
    /// (SEP-1699 polling; the `test_reconnection` tool of the conformance
    /// suite).
    pub fn close(&self) {
        self.session.kick(self.stream);
    }

    /// Stores `notification` in the session now, on the stream rmcp's own
    /// outgoing path would store it on (a progress notification on its
    /// request's stream, one tagged [`RelatedRequest`] on that request's),
    /// and returns: the fast path for a handler that streams many
    /// notifications.
    ///
    /// `ctx.peer.send_notification(..).await` hands the message to rmcp's
    /// service loop and waits until that loop has passed it to the
    /// transport: two task wake-ups per message, which bound one request's
    /// stream to a few thousand notifications a second however idle the
    /// server is. This call serializes and appends in the caller's task;
    /// readers are woken as for any other append, and the request's
    /// response (sent by rmcp when the handler returns) comes after every
    /// notification stored this way.
    ///
    /// Ordering: messages stored through this call are in the order of the
    /// calls, and before the response. A message sent through `ctx.peer`
    /// is stored when rmcp's loop gets to it, which may be after a later
    /// call here: within one request, use one path or the other for
    /// messages whose relative order matters.
    ///
    /// Pacing: nothing here waits for readers. A handler that stores more
    /// than the session retains before its client reads them makes the
    /// live response report a `gap`, as any producer faster than its reader
    /// would; a long burst should also yield now and then
    /// (`tokio::task::yield_now`) so its worker thread serves others.
    ///
    /// ```no_run
    /// # use rmcp::model::*;
    /// # use rewind_server::mcp::SseStream;
    /// # fn f(ctx: rmcp::service::RequestContext<rmcp::RoleServer>) {
    /// let sink = ctx.extensions.get::<SseStream>().expect("served by rewind");
    /// if let Some(token) = ctx.meta.get_progress_token() {
    ///     for i in 1..=100u32 {
    ///         sink.notify_progress(ProgressNotificationParam::new(token.clone(), f64::from(i)));
    ///     }
    /// }
    /// # }
    /// ```
    pub fn send_notification(&self, notification: ServerNotification) {
        self.session
            .deliver(&ServerJsonRpcMessage::notification(notification));
    }

    /// [`send_notification`](Self::send_notification) of one
    /// `notifications/progress`.
    pub fn notify_progress(&self, params: rmcp::model::ProgressNotificationParam) {
        self.send_notification(ServerNotification::ProgressNotification(
            rmcp::model::ProgressNotification::new(params),
        ));
    }
}

/// A request awaiting its response.
#[derive(Debug)]
struct Pending {
    /// Where its response goes.
    stream: u32,
    /// Where everything else it causes goes (progress, logs, server
    /// requests): its own stream, or the standalone stream when its POST is
    /// answered with one JSON body that cannot carry them.
    side: u32,
    progress: Option<ProgressToken>,
    /// The session's highest sequence number when the request arrived:
    /// its answer comes after it (see [`answer_unfinished`]).
    after_seq: u64,
    /// Keeps the engine from evicting the session while the request runs
    /// (a tool still streaming to a client that is between connections).
    _call: CallGuard,
}

/// Which stream each in-flight request (and its progress token) belongs to,
/// and how many responses each open stream still owes.
#[derive(Debug, Default)]
struct Routes {
    requests: HashMap<RequestId, Pending>,
    progress: HashMap<ProgressToken, u32>,
    open: HashMap<u32, usize>,
}

impl Routes {
    fn stream_of(&self, id: &RequestId) -> Option<u32> {
        self.requests.get(id).map(|p| p.stream)
    }

    fn side_stream_of(&self, id: &RequestId) -> Option<u32> {
        self.requests.get(id).map(|p| p.side)
    }

    /// Where `msg` goes, and the request it completes (if any).
    fn route(&self, msg: &ServerJsonRpcMessage) -> (u32, Option<RequestId>) {
        use rmcp::model::JsonRpcMessage as M;
        match msg {
            M::Response(r) => match self.stream_of(&r.id) {
                Some(s) => (s, Some(r.id.clone())),
                None => (STANDALONE, None),
            },
            M::Error(e) => match e
                .id
                .as_ref()
                .and_then(|id| self.stream_of(id).map(|s| (s, id)))
            {
                Some((s, id)) => (s, Some(id.clone())),
                None => (STANDALONE, None),
            },
            M::Request(r) => {
                let origin = r
                    .request
                    .extensions()
                    .get::<rmcp::service::OriginatingRequestId>()
                    .and_then(|o| self.side_stream_of(&o.0));
                (origin.unwrap_or(STANDALONE), None)
            }
            M::Notification(JsonRpcNotification { notification, .. }) => {
                (self.notification_stream(notification), None)
            }
        }
    }

    fn notification_stream(&self, n: &ServerNotification) -> u32 {
        if let Some(RelatedRequest(id)) = n.extensions().get::<RelatedRequest>() {
            if let Some(s) = self.side_stream_of(id) {
                return s;
            }
        }
        match n {
            ServerNotification::ProgressNotification(p) => self
                .progress
                .get(&p.params.progress_token)
                .copied()
                .unwrap_or(STANDALONE),
            ServerNotification::CancelledNotification(c) => c
                .params
                .request_id
                .as_ref()
                .and_then(|id| self.side_stream_of(id))
                .unwrap_or(STANDALONE),
            _ => STANDALONE,
        }
    }

    /// Request `id` is answered (or cancelled). Returns whether it was in
    /// flight, and its stream if that closed with it.
    fn complete(&mut self, id: &RequestId) -> (bool, Option<u32>) {
        let Some(p) = self.requests.remove(id) else {
            return (false, None);
        };
        if let Some(token) = p.progress {
            self.progress.remove(&token);
        }
        match self.open.get_mut(&p.stream) {
            Some(n) if *n > 1 => {
                *n -= 1;
                (true, None)
            }
            Some(_) => {
                self.open.remove(&p.stream);
                (true, Some(p.stream))
            }
            None => (true, None),
        }
    }
}

impl Attachment for McpSession {
    fn ended(&self, why: EndReason) {
        tracing::debug!(
            session = format_args!("{:016x}", self.tag()),
            ?why,
            "MCP session ended"
        );
        self.service_ct.cancel();
        if let Some(r) = &self.replica {
            r.control(u64::MAX, crate::cluster::replicate::Control::End);
        }
        let kicks: Vec<_> = lock(&self.kicks).drain().map(|(_, t)| t).collect();
        for t in kicks {
            t.cancel();
        }
        self.stream_closed.notify(usize::MAX);
    }
}

/// Why a POST's requests could not be registered.
#[derive(Debug)]
pub(crate) enum RegisterError {
    /// A request with this id is already in flight in the session.
    DuplicateId(RequestId),
}

/// A message on its way from the HTTP handlers to a session's rmcp
/// service. Boxed because a bounded Tokio channel allocates its first block
/// of 32 slots when it is created: with the message inline (some 350
/// bytes) that is about 11 KiB per session, idle or not; boxed it is 256
/// bytes, for one small allocation per message, next to the JSON parse it
/// follows.
pub(crate) type Inbound = Box<ClientJsonRpcMessage>;

/// One live MCP session.
///
/// The engine session keeps it as its [`Attachment`] (weakly: the rmcp
/// service's transport holds it strongly while the service runs), so the
/// engine's session table is the only one: a lookup by id is an engine
/// lookup, and however the engine session ends (closed, expired, evicted)
/// [`Attachment::ended`] stops the service and ends its responses.
pub(crate) struct McpSession {
    pub(crate) handle: SessionHandle,
    pub(crate) principal: Option<String>,
    inbound: mpsc::Sender<Inbound>,
    routes: Mutex<Routes>,
    /// Fires whenever a stream stops being open without an append (a
    /// cancelled request), so readers waiting on it re-check.
    stream_closed: event_listener::Event,
    /// Per stream, the token that ends the HTTP responses serving it now.
    kicks: Mutex<HashMap<u32, CancellationToken>>,
    /// The last standalone-stream event handed to a connection (see
    /// [`McpSession::standalone_replay`]). Held while a standalone reader
    /// reads, so handing over to a new `GET` never sends an event twice.
    standalone_delivered: Mutex<Option<EventId>>,
    /// Stops the session's rmcp service.
    pub(crate) service_ct: CancellationToken,
    /// The `initialize` request in flight (its id and parameters), until
    /// its answer is stored: then the parameters, with the negotiated
    /// protocol version, go into the data directory
    /// ([`SessionHandle::store_init`]) so a restart can rebuild the session.
    init_pending: Mutex<Option<(RequestId, InitializeRequestParams)>>,
    /// The stored `initialize` parameters, once stored; with a data
    /// directory, the blob is stored again with the requests in flight
    /// whenever a request starts or ends (see [`McpSession::persist`]).
    init_params: Mutex<Option<InitializeRequestParams>>,
    /// The engine keeps a data directory (else nothing is stored).
    durable: bool,
    /// In cluster mode: what of the session is copied to Redis.
    replica: Option<Arc<crate::cluster::SessionReplica>>,
}

/// The version of the blob [`encode_init`] writes.
const INIT_BLOB_VERSION: u32 = 1;

thread_local! {
    /// The buffer [`McpSession::deliver`] serialises into on this thread.
    static PAYLOAD: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Above this capacity the buffer is freed after use rather than kept.
const PAYLOAD_KEEP: usize = 16 * 1024;

/// What a session stores with its engine session
/// ([`SessionHandle::store_init`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct InitBlob {
    rewind_init: u32,
    /// The client's `initialize` parameters, `protocolVersion` being the
    /// negotiated one (as rmcp keeps them as the session's peer info).
    pub(crate) params: InitializeRequestParams,
    /// The requests in flight: their stream, their id, and the session's
    /// highest sequence number when they arrived.
    #[serde(default)]
    pub(crate) inflight: Vec<(u32, RequestId, u64)>,
}

/// The blob a session stores with the engine once its `initialize` is
/// answered, and again whenever its requests in flight change.
fn encode_init(
    params: &InitializeRequestParams,
    inflight: Vec<(u32, &RequestId, u64)>,
) -> Option<Vec<u8>> {
    /// [`InitBlob`] by reference (the same JSON), so storing it again on
    /// every request copies nothing but the bytes.
    #[derive(serde::Serialize)]
    struct Ref<'a> {
        rewind_init: u32,
        params: &'a InitializeRequestParams,
        inflight: Vec<(u32, &'a RequestId, u64)>,
    }
    serde_json::to_vec(&Ref {
        rewind_init: INIT_BLOB_VERSION,
        params,
        inflight,
    })
    .ok()
}

/// What a restored session stored before the restart; `None` for a blob
/// of another version or that does not parse.
pub(crate) fn decode_init(blob: &[u8]) -> Option<InitBlob> {
    let b: InitBlob = serde_json::from_slice(blob).ok()?;
    (b.rewind_init == INIT_BLOB_VERSION).then_some(b)
}

/// Whether `payload` (a stored outgoing message) is the response to `id`.
pub(crate) fn answers(payload: &[u8], id: &RequestId) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        id: Option<RequestId>,
        method: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(payload)
        .is_ok_and(|p| p.method.is_none() && p.id.as_ref() == Some(id))
}

/// The message a request in flight on a cluster node that died gets on
/// its stream from the node that takes the session over.
pub(crate) const TAKEOVER_MESSAGE: &str =
    "the node serving this request died while it was running; it was not completed";

/// The message a request in flight when the server died gets on its
/// stream after the restart.
pub(crate) const RESTART_MESSAGE: &str =
    "the server restarted while this request was running; it was not completed";

/// For each request the restored session had in flight (as its last
/// stored blob says), appends an error response on its stream unless the
/// stream already holds its answer (the process died between storing the
/// answer and noting it), so a client resuming that stream gets the
/// events stored before the restart, then that explicit answer, then the
/// end. Nothing is appended when events after the request's arrival were
/// released meanwhile (an answer among them cannot be ruled out): that
/// stream just ends. Returns how many requests were answered so.
pub(crate) fn answer_unfinished(
    handle: &SessionHandle,
    inflight: &[(u32, RequestId, u64)],
) -> usize {
    #[derive(serde::Deserialize)]
    struct Probe {
        id: Option<RequestId>,
        method: Option<serde::de::IgnoredAny>,
    }
    let mut answered = 0;
    let mut buf = Vec::new();
    for (stream, id, after_seq) in inflight {
        let mut replay = handle.subscribe_from_start(*stream);
        let mut provable = true;
        let mut found = false;
        let mut gaps = 0;
        loop {
            match replay.next_into(&mut buf) {
                Ok(Some(_)) => {
                    let answers = serde_json::from_slice::<Probe>(&buf)
                        .is_ok_and(|p| p.method.is_none() && p.id.as_ref() == Some(id));
                    if answers {
                        found = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(ReplayError::Lagged { .. }) => {
                    gaps += 1;
                    if replay.skip_gap() > after_seq + 1 || gaps > 2 {
                        provable = false;
                        break;
                    }
                }
                Err(_ended) => return answered,
            }
        }
        if found || !provable {
            continue;
        }
        let err = ServerJsonRpcMessage::error(
            rmcp::ErrorData::internal_error(RESTART_MESSAGE, None),
            Some(id.clone()),
        );
        let appended = serde_json::to_vec(&err)
            .ok()
            .is_some_and(|p| handle.append(*stream, &p).is_ok());
        if appended {
            answered += 1;
        }
    }
    answered
}

impl fmt::Debug for McpSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpSession")
            .field("session", &self.handle.id())
            .field("open_streams", &lock(&self.routes).open.len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain maps behind, still
    // consistent enough to route by.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl McpSession {
    pub(crate) fn new(
        handle: SessionHandle,
        principal: Option<String>,
        inbound: mpsc::Sender<Inbound>,
        service_ct: CancellationToken,
        durable: bool,
        replica: Option<Arc<crate::cluster::SessionReplica>>,
    ) -> McpSession {
        McpSession {
            handle,
            principal,
            inbound,
            routes: Mutex::new(Routes::default()),
            stream_closed: event_listener::Event::new(),
            kicks: Mutex::new(HashMap::new()),
            standalone_delivered: Mutex::new(None),
            service_ct,
            init_pending: Mutex::new(None),
            init_params: Mutex::new(None),
            durable,
            replica,
        }
    }

    /// The MCP session of an engine session restored from the data
    /// directory, or (with a `replica`) taken over from a cluster node
    /// that died. Nothing is in flight (requests of the earlier process
    /// are not re-run, so every request stream of before the restart is
    /// closed: a resume replays what it stored, then ends). A `GET` without
    /// `Last-Event-ID` starts after the standalone events stored before the
    /// restart: whether they reached a connection then is unknown, and a
    /// client that wants them resumes from its own cursor, so none is
    /// delivered twice.
    pub(crate) fn restored(
        handle: SessionHandle,
        principal: Option<String>,
        inbound: mpsc::Sender<Inbound>,
        service_ct: CancellationToken,
        params: InitializeRequestParams,
        had_inflight: bool,
        replica: Option<Arc<crate::cluster::SessionReplica>>,
    ) -> McpSession {
        let before = handle.cursor_now(STANDALONE);
        let durable = replica.is_none();
        let s = McpSession::new(handle, principal, inbound, service_ct, durable, replica);
        *lock(&s.standalone_delivered) = Some(before);
        *lock(&s.init_params) = Some(params);
        if had_inflight {
            // Nothing is in flight any more (each got its answer).
            s.persist(&lock(&s.routes), None);
        }
        s
    }

    /// Stores the session's blob again: its `initialize` parameters and
    /// the requests in flight in `routes` (but `except`), so that after a
    /// crash each of them gets an explicit answer ([`answer_unfinished`]).
    /// Called with the routes locked, so blobs are stored in the order the
    /// routes changed. Nothing for a heap engine, or before `initialize`
    /// is answered.
    fn persist(&self, routes: &Routes, except: Option<&RequestId>) {
        if !self.durable && self.replica.is_none() {
            return;
        }
        let params = lock(&self.init_params);
        let Some(params) = params.as_ref() else {
            return;
        };
        let inflight = routes
            .requests
            .iter()
            .filter(|(id, _)| Some(*id) != except)
            .map(|(id, p)| (p.stream, id, p.after_seq))
            .collect();
        let blob = encode_init(params, inflight);
        if let (Some(r), Some(blob)) = (&self.replica, &blob) {
            // In the session's record, for the node that takes the session
            // over if this one dies.
            r.control(0, crate::cluster::replicate::Control::Init(blob.clone()));
        }
        if !self.durable {
            return;
        }
        let stored = match blob {
            Some(blob) => self.handle.store_init(&blob),
            None => Err(std::io::Error::other(
                "cannot serialise the initialize parameters",
            )),
        };
        if let Err(e) = stored {
            tracing::warn!(
                session = format_args!("{:016x}", self.tag()),
                error = %e,
                "session state not stored; a restart may not rebuild it"
            );
        }
    }

    /// Registers the requests of one POST on `stream` (their responses) and
    /// `side` (whatever else they cause; `stream` too unless the POST is
    /// answered with a JSON body), and tags each with its [`SseStream`] and
    /// the HTTP request's `parts` (as rmcp's own transport does, so tools
    /// can take `Extension<http::request::Parts>`). All or nothing.
    pub(crate) fn register(
        self: &Arc<Self>,
        stream: u32,
        side: u32,
        parts: &http::request::Parts,
        msgs: &mut [ClientJsonRpcMessage],
    ) -> Result<(), RegisterError> {
        let mut routes = lock(&self.routes);
        let mut seen = std::collections::HashSet::new();
        for m in msgs.iter() {
            if let ClientJsonRpcMessage::Request(r) = m {
                if routes.requests.contains_key(&r.id) || !seen.insert(r.id.clone()) {
                    return Err(RegisterError::DuplicateId(r.id.clone()));
                }
            }
        }
        let mut count = 0;
        for m in msgs.iter_mut() {
            if let ClientJsonRpcMessage::Request(r) = m {
                if let ClientRequest::InitializeRequest(init) = &r.request {
                    *lock(&self.init_pending) = Some((r.id.clone(), init.params.clone()));
                }
                let progress = r.request.get_meta().get_progress_token();
                if let Some(token) = &progress {
                    routes.progress.insert(token.clone(), side);
                }
                routes.requests.insert(
                    r.id.clone(),
                    Pending {
                        stream,
                        side,
                        progress,
                        after_seq: self.handle.high_water(),
                        _call: self.handle.begin_call(),
                    },
                );
                let extensions = r.request.extensions_mut();
                extensions.insert(SseStream {
                    session: self.clone(),
                    stream,
                });
                extensions.insert(parts.clone());
                count += 1;
            }
        }
        // Notifications carry the request's parts too (rmcp does the same).
        for m in msgs.iter_mut() {
            if let ClientJsonRpcMessage::Notification(n) = m {
                n.notification.extensions_mut().insert(parts.clone());
            }
        }
        if count > 0 {
            routes.open.insert(stream, count);
            // Before the requests reach the service, so any answer they get
            // comes after the note that they are in flight.
            self.persist(&routes, None);
        }
        Ok(())
    }

    /// The session's owner tag: the first field of its event ids, so it is
    /// public already; logs name sessions by it, never by their id.
    pub(crate) fn tag(&self) -> u64 {
        self.handle.cursor_now(STANDALONE).tag
    }

    /// Whether `stream` still owes responses (stream 0 is always open).
    pub(crate) fn is_open(&self, stream: u32) -> bool {
        stream == STANDALONE || lock(&self.routes).open.contains_key(&stream)
    }

    /// A listener that fires when some stream closes without an append.
    pub(crate) fn listen_closed(&self) -> event_listener::EventListener {
        self.stream_closed.listen()
    }

    /// Forgets request `id` (the client cancelled it; rmcp drops the
    /// response of a cancelled request), closing its stream if it was the
    /// last one pending there.
    pub(crate) fn cancel(&self, id: &RequestId) {
        if let Some(stream) = self.complete(id) {
            self.closed(stream, None);
        }
    }

    /// Request stream `stream` closed (its answers are in, the last one
    /// at or before `after_seq`, or before now if `None`): readers waiting on it re-check, and in
    /// cluster mode, readers on other nodes learn it from Redis.
    fn closed(&self, stream: u32, after_seq: Option<u64>) {
        self.stream_closed.notify(usize::MAX);
        if let Some(r) = &self.replica {
            let after_seq = after_seq.unwrap_or_else(|| self.handle.high_water());
            r.control(after_seq, crate::cluster::replicate::Control::Close(stream));
        }
    }

    /// Something was appended: in cluster mode, copy it to Redis.
    fn appended(&self) {
        if let Some(r) = &self.replica {
            r.kick();
        }
    }

    /// Request `id` is done: forgotten by the routes and, with a data
    /// directory, by the stored blob. Returns its stream if that closed.
    fn complete(&self, id: &RequestId) -> Option<u32> {
        let mut routes = lock(&self.routes);
        let (known, closed) = routes.complete(id);
        if known {
            self.persist(&routes, None);
        }
        closed
    }

    /// Hands `msgs` to the rmcp service, in order.
    pub(crate) async fn forward(&self, msgs: Vec<ClientJsonRpcMessage>) -> Result<(), ()> {
        for m in msgs {
            self.inbound.send(Box::new(m)).await.map_err(|_| ())?;
        }
        Ok(())
    }

    /// Stores one outgoing message on the one stream it belongs to.
    pub(crate) fn deliver(&self, msg: &ServerJsonRpcMessage) {
        let (stream, completes) = lock(&self.routes).route(msg);
        if completes.is_some() {
            self.store_init_on_answer(msg);
        }
        // The message's bytes, in a buffer this thread keeps (the event
        // copies them; a progress notification then allocates nothing).
        let appended = PAYLOAD.with_borrow_mut(|buf| {
            buf.clear();
            let appended = match super::encode::encode(msg, buf) {
                Ok(()) => Some(self.handle.append(stream, buf)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot serialise an outgoing MCP message");
                    None
                }
            };
            if buf.capacity() > PAYLOAD_KEEP {
                // A large result: give its buffer back.
                *buf = Vec::new();
            }
            appended
        });
        let Some(appended) = appended else {
            return;
        };
        // The last event this message appended (for the close entry of a
        // cluster replica).
        let mut last_seq = None;
        match appended {
            Ok(id) => {
                last_seq = Some(id.seq);
                self.appended();
            }
            Err(rewind_engine::AppendError::TooLarge { len, max }) => {
                tracing::warn!(
                    len,
                    max,
                    stream,
                    "outgoing MCP message exceeds the event size limit"
                );
                // A request must not hang because its answer is too big.
                if let Some(id) = &completes {
                    let err = ServerJsonRpcMessage::error(
                        rmcp::ErrorData::internal_error(
                            format!("response of {len} bytes exceeds the limit of {max} bytes"),
                            None,
                        ),
                        Some(id.clone()),
                    );
                    if let Some(appended) = serde_json::to_vec(&err)
                        .ok()
                        .and_then(|p| self.handle.append(stream, &p).ok())
                    {
                        last_seq = Some(appended.seq);
                        self.appended();
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, stream, "outgoing MCP message dropped"),
        }
        if let Some(id) = completes {
            if let Some(stream) = self.complete(&id) {
                self.closed(stream, last_seq);
            }
        }
    }

    /// If `msg` answers the session's `initialize`, stores its parameters
    /// with the negotiated version — before the answer is appended, so a
    /// client that has its session id has a session a restart rebuilds.
    fn store_init_on_answer(&self, msg: &ServerJsonRpcMessage) {
        let rmcp::model::JsonRpcMessage::Response(r) = msg else {
            return;
        };
        let ServerResult::InitializeResult(result) = &r.result else {
            return;
        };
        let mut pending = lock(&self.init_pending);
        if pending.as_ref().is_none_or(|(id, _)| *id != r.id) {
            return;
        }
        let Some((_, mut params)) = pending.take() else {
            return;
        };
        drop(pending);
        params.protocol_version = result.protocol_version.clone();
        *lock(&self.init_params) = Some(params);
        // `initialize` itself is answered right after this: not in flight.
        self.persist(&lock(&self.routes), Some(&r.id));
    }

    /// The token that ends the responses serving `stream` now.
    pub(crate) fn kick_token(&self, stream: u32) -> CancellationToken {
        lock(&self.kicks).entry(stream).or_default().clone()
    }

    /// Ends the responses serving `stream` now (a newer connection takes
    /// over, or a tool asked for an early close).
    pub(crate) fn close_readers(&self, stream: u32) {
        self.kick(stream);
    }

    fn kick(&self, stream: u32) {
        if let Some(t) = lock(&self.kicks).remove(&stream) {
            t.cancel();
        }
    }

    /// A reader for a `GET` without `Last-Event-ID` (the standalone stream):
    /// it starts right after the last standalone event an earlier response
    /// handed to its connection, or at the session's first event if none
    /// did. Messages sent while no `GET` was open (resource updates,
    /// list changes, server requests outside any call) are stored on the
    /// standalone stream and delivered here, each once; responses already
    /// serving the stream end first (newest connection wins).
    pub(crate) fn standalone_replay(&self) -> Replay {
        let delivered = lock(&self.standalone_delivered);
        self.kick(STANDALONE);
        delivered
            .and_then(|after| self.handle.subscribe_from(STANDALONE, after))
            .unwrap_or_else(|| self.handle.subscribe_from_start(STANDALONE))
    }

    /// Reads the next event of `replay` like [`Replay::next_into`]; on the
    /// standalone stream, only while `kick` has not fired, and remembering
    /// what was handed over for the next [`standalone_replay`](Self::standalone_replay).
    pub(crate) fn next_into(
        &self,
        replay: &mut Replay,
        kick: &CancellationToken,
        buf: &mut Vec<u8>,
    ) -> Result<Option<EventId>, ReplayError> {
        if replay.stream() != STANDALONE {
            return replay.next_into(buf);
        }
        let mut delivered = lock(&self.standalone_delivered);
        if kick.is_cancelled() {
            return Ok(None);
        }
        let next = replay.next_into(buf);
        if let Ok(Some(id)) = next {
            if delivered.is_none_or(|d| d.seq < id.seq) {
                *delivered = Some(id);
            }
        }
        next
    }

    /// Forgets the kick token of `stream` once it is no longer open: its
    /// remaining readers end by themselves when they catch up, so nothing
    /// needs to reach them any more.
    pub(crate) fn forget_kick(&self, stream: u32) {
        if !self.is_open(stream) {
            lock(&self.kicks).remove(&stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_init, encode_init, InitializeRequestParams, RequestId};

    fn params() -> InitializeRequestParams {
        serde_json::from_value(serde_json::json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"sampling": {}},
            "clientInfo": {"name": "c", "version": "1"}
        }))
        .unwrap()
    }

    #[test]
    fn the_stored_blob_gives_back_the_parameters_and_the_requests_in_flight() {
        let (a, b) = (RequestId::Number(7), RequestId::String("x".into()));
        let blob = encode_init(&params(), vec![(3, &a, 10), (4, &b, 12)]).unwrap();
        let back = decode_init(&blob).unwrap();
        assert_eq!(
            serde_json::to_value(&back.params).unwrap(),
            serde_json::to_value(params()).unwrap()
        );
        assert_eq!(back.inflight, [(3, a, 10), (4, b, 12)]);
    }

    #[test]
    fn a_blob_of_another_version_or_shape_is_not_used() {
        let other = serde_json::json!({"rewind_init": 2, "params": params()});
        assert!(decode_init(other.to_string().as_bytes()).is_none());
        assert!(decode_init(b"{\"init\":1}").is_none());
        assert!(decode_init(b"").is_none());
        // Without the list (nothing in flight), it still reads.
        let bare = serde_json::json!({"rewind_init": 1, "params": params()});
        assert!(decode_init(bare.to_string().as_bytes())
            .unwrap()
            .inflight
            .is_empty());
    }
}
