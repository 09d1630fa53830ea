//! MCP Streamable HTTP on the Rewind engine.
//!
//! # Architecture
//!
//! rmcp is used as the MCP *protocol* engine only: each MCP session runs one
//! rmcp service (`ServiceExt::serve_with_ct`) over an in-process transport
//! (`transport`). Everything HTTP — sessions, streams, event ids, priming,
//! resumption — is done here, on the engine, because rmcp's own HTTP
//! transport gets exactly those wrong (it resumes without checking the
//! presented session, primes every stream with id `"0"`, replays the
//! cursor's own event, loses results after an early close, and answers
//! every resume failure with an empty 200; see "What the SDKs in use today
//! get wrong" in `docs/problem.md`).
//!
//! - **Sessions.** `initialize` without `Mcp-Session-Id` opens an engine
//!   session (its id is the `Mcp-Session-Id`) and starts the service.
//!   Unknown or ended ids get 404, a missing id 400, `DELETE` ends the
//!   session (engine close + service stop) and answers 204. `initialize`
//!   that names a live session re-initialises it ([`Engine::reopen`]: same
//!   id, new epoch, new service), after which its old cursors get `reset`.
//! - **Restarts.** On an engine with a data directory the session
//!   survives the process: `initialize`'s parameters (and the requests in
//!   flight) are stored with the engine session, and [`RewindMcp::router`]
//!   rebuilds every restored session's service from them
//!   ([`RewindMcp::restore_sessions`]; no re-initialise), answering each
//!   request the dead process left unfinished with an error on its stream
//!   (`docs/durability.md`).
//! - **Streams.** Each POST that carries requests gets a fresh engine stream
//!   and answers `text/event-stream`: the priming event (id = the reader's
//!   position, empty data, `retry`), then every event of that stream,
//!   ending once the responses are delivered. POSTs with only
//!   notifications or responses get 202. Outgoing messages are routed to
//!   exactly one stream (by request id and progress token) and appended to the session's retained window before any
//!   response sees them. Every request (and notification) carries the
//!   HTTP request's `http::request::Parts` and its [`SseStream`] in its
//!   extensions, so tools take `Extension<http::request::Parts>` as with
//!   rmcp's own transport.
//! - **JSON answers.** A POST whose `Accept` lists `application/json` but
//!   not `text/event-stream` is answered with one JSON body (an array for a
//!   batch) once its responses are in; whatever else its requests cause
//!   (progress, logs, server requests) goes to the standalone stream, where
//!   the client's `GET` receives it. With [`McpOptions::json_response`], a
//!   client that takes both gets JSON when the first thing on the stream is
//!   the response, and SSE (priming event first) as soon as anything comes
//!   before it.
//! - **The standalone stream (stream 0).** Messages that belong to no
//!   request in flight (resource updates, list changes, server requests
//!   sent outside a call, and the side messages of JSON answers) are stored
//!   on stream 0 whether or not a `GET` is open. A `GET` without
//!   `Last-Event-ID` delivers, after its priming event, every stream-0
//!   event after the last one an earlier standalone response handed to its
//!   connection — from the session's first event if none did — and then
//!   live ones: what was sent before the first `GET` or between two `GET`s
//!   is delivered to the next one, each event once. A new `GET` ends the
//!   standalone response open before it, and takes over exactly where that
//!   one stopped. Events that fell out of the retained window meanwhile are
//!   announced with a `gap` event, never skipped silently. A `GET` with
//!   `Last-Event-ID` is a resume like any other and starts at its cursor.
//! - **Resumption.** Every `GET` is decided by [`Engine::resume`] with the
//!   *presented* session id and cursor; the answer maps one to one onto the
//!   design's decision table (200 replay, 200 with a first `reset`/`gap`
//!   event, 400, 404, 409). A new `GET` for a stream ends the responses
//!   already serving it (newest connection wins), so a message is never
//!   delivered on two connections at once.
//! - **Early close.** [`McpOptions::close_post_streams_after_priming`], or a
//!   tool calling [`SseStream::close`], ends the HTTP response while the
//!   stream stays open; whatever the tool sends afterwards is stored
//!   and a `GET` with the last id delivers it.
//! - **Stateless MCP (2026-07-28).** That revision removes protocol
//!   sessions: no `initialize` (clients use `server/discover`), no
//!   `Mcp-Session-Id`, no standalone `GET` stream, no SSE resumption (no
//!   event ids, no `Last-Event-ID`), and no requests from server to client;
//!   every request carries its protocol version and client capabilities in
//!   `_meta`. A POST whose `MCP-Protocol-Version` is 2026-07-28, or whose
//!   one request is `server/discover` or names 2026-07-28 in its `_meta`,
//!   is served by a fresh handler through rmcp's per-request path; its
//!   answer is one JSON body, or SSE without event ids when the handler
//!   sends notifications first. A request without the required `_meta`
//!   gets 400; `GET` and `DELETE` at that revision get 405; inbound
//!   `Mcp-Session-Id` and `Last-Event-ID` are ignored; an `initialize`
//!   always starts a session. **What Rewind adds there: nothing to
//!   resume** — the answer is not stored in the engine and a cut
//!   connection cancels the request (the client sends it again). What the
//!   endpoint still does for these requests: the `Host`/`Origin` checks,
//!   CORS, the body and header limits, `Parts` in the handler's
//!   extensions (an auth layer's principal reaches tools), the access log
//!   and the HTTP metrics.
//! - **HTTP hygiene.** `Host` checked against [`HostPolicy`] and `Origin`
//!   against [`OriginPolicy`] (403); CORS for the accepted origins when
//!   [`McpOptions::cors`] is on (preflights answered, `Mcp-Session-Id`
//!   exposed); `MCP-Protocol-Version` checked against 2025-03-26,
//!   2025-06-18, 2025-11-25 and 2026-07-28 (400; absent means 2025-03-26);
//!   JSON-RPC batches only for 2025-03-26 (400 otherwise); bodies over
//!   [`McpOptions::max_body_bytes`] get 413 and header blocks over
//!   [`McpOptions::max_header_bytes`] 431; a session presented by another
//!   principal gets the same answer from POST, GET and DELETE (the
//!   policy's, 409 by default); keep-alive comments; [`McpOptions::shutdown`]
//!   ends every stream and service.
//! - **Observability.** One access-log line per request at `info` (target
//!   `rewind::access`: method, status, session *tag* — the public first
//!   field of its event ids, never the session id —, stream, verdict,
//!   milliseconds to the response head), and the HTTP metrics of
//!   [`ServerMetrics`].
//!
//! A single message is one engine event of at most
//! `Config::max_event_bytes` (32 MiB − 1 KiB by default); a larger one is
//! answered with an internal error for its request, never truncated.

mod encode;
mod http;
mod options;
mod session;
pub(crate) mod sse;
mod stateless;
mod transport;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use rewind_engine::{Engine, SessionId};
use rmcp::{ServerHandler, ServiceExt};
use tokio_util::sync::CancellationToken;

use crate::metrics::ServerMetrics;

pub use options::{HostPolicy, HostWarning, McpOptions, OriginPolicy, PrincipalExtractor};
pub use session::{RelatedRequest, SseStream};

/// Internals exposed for the benchmarks only; not part of the API.
#[doc(hidden)]
pub mod bench_support {
    pub use super::sse::event_frame;
}

use session::McpSession;
use transport::SessionTransport;

/// The protocol revisions whose HTTP transport this endpoint speaks with
/// sessions (and resumption).
pub const SUPPORTED_PROTOCOL_VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];

/// The protocol revisions served statelessly: no session, nothing to resume
/// (see the module docs).
pub const STATELESS_PROTOCOL_VERSIONS: [&str; 1] = ["2026-07-28"];

/// Starts one session's rmcp service: with `None` it expects the
/// client's `initialize` first; with the client's (negotiated) `initialize`
/// parameters it serves a session restored from the data directory, whose
/// handshake happened in an earlier process.
type StartService = dyn Fn(
        SessionTransport,
        CancellationToken,
        Option<rmcp::model::InitializeRequestParams>,
    ) -> BoxFuture<'static, ()>
    + Send
    + Sync;

type ServeStateless = dyn Fn(
        rmcp::model::JsonRpcRequest<rmcp::model::ClientRequest>,
        rmcp::model::InitializeRequestParams,
        CancellationToken,
    ) -> tokio::sync::mpsc::Receiver<rmcp::model::ServerJsonRpcMessage>
    + Send
    + Sync;

/// An MCP endpoint whose SSE streams live in a Rewind [`Engine`].
///
/// Cheap to clone. Build it with [`RewindMcp::new`], serve
/// [`RewindMcp::router`].
#[derive(Clone)]
pub struct RewindMcp {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    metrics: Arc<ServerMetrics>,
    options: McpOptions,
    /// rmcp services running (one per live MCP session).
    services: AtomicUsize,
    start: Box<StartService>,
    stateless: Box<ServeStateless>,
    sweeper_started: AtomicBool,
    /// [`RewindMcp::restore_sessions`] ran.
    restored: AtomicBool,
}

impl fmt::Debug for RewindMcp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RewindMcp")
            .field("engine", &self.inner.engine)
            .field("options", &self.inner.options)
            .field("sessions", &self.sessions_live())
            .finish()
    }
}

impl RewindMcp {
    /// An endpoint that serves one `factory()` handler per MCP session.
    pub fn new<H, F>(
        engine: Engine,
        metrics: Arc<ServerMetrics>,
        options: McpOptions,
        factory: F,
    ) -> RewindMcp
    where
        H: ServerHandler,
        F: Fn() -> H + Send + Sync + 'static,
    {
        let factory = Arc::new(factory);
        let stateless = stateless::starter(Arc::clone(&factory));
        let start =
            move |transport: SessionTransport,
                  ct: CancellationToken,
                  restored: Option<rmcp::model::InitializeRequestParams>| {
                let handler = factory();
                Box::pin(async move {
                    match restored {
                        // The handshake happened before the restart: rmcp's
                        // state is its peer info, rebuilt from what it was.
                        Some(peer_info) => {
                            let running = rmcp::service::serve_directly_with_ct(
                                handler,
                                transport,
                                Some(peer_info),
                                ct,
                            );
                            let _ = running.waiting().await;
                        }
                        None => match handler.serve_with_ct(transport, ct).await {
                            Ok(running) => {
                                let _ = running.waiting().await;
                            }
                            Err(e) => tracing::debug!(error = %e, "MCP session did not initialise"),
                        },
                    }
                }) as BoxFuture<'static, ()>
            };
        RewindMcp {
            inner: Arc::new(Inner {
                engine,
                metrics,
                options,
                services: AtomicUsize::new(0),
                start: Box::new(start),
                stateless,
                sweeper_started: AtomicBool::new(false),
                restored: AtomicBool::new(false),
            }),
        }
    }

    /// The axum router serving [`McpOptions::path`] (`POST`, `GET`,
    /// `DELETE`; other methods get 405).
    ///
    /// Rebuilds the sessions restored from the data directory first
    /// ([`RewindMcp::restore_sessions`]) when called in a Tokio runtime.
    pub fn router(&self) -> axum::Router {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.restore_sessions();
            self.start_cluster();
        }
        http::router(self.clone())
    }

    /// In cluster mode, starts the node's tasks (heartbeat, replicator,
    /// forwarded requests). [`RewindMcp::router`] calls it, in a Tokio
    /// runtime; later calls do nothing.
    pub fn start_cluster(&self) {
        let Some(cluster) = &self.inner.options.cluster else {
            return;
        };
        // Weak: the cluster lives in the endpoint's options.
        let weak = Arc::downgrade(&self.inner);
        let handler = move |f: crate::cluster::Forwarded| -> BoxFuture<'static, crate::cluster::ForwardReply> {
            let inner = weak.upgrade();
            Box::pin(async move {
                match inner {
                    Some(inner) => http::serve_forwarded(RewindMcp { inner }, f).await,
                    None => crate::cluster::ForwardReply {
                        status: 503,
                        ..Default::default()
                    },
                }
            })
        };
        cluster.start(
            self.inner.engine.clone(),
            Arc::new(handler),
            self.inner.options.shutdown.clone(),
        );
    }

    /// The engine the streams live in.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The metrics this endpoint records into.
    pub fn metrics(&self) -> &Arc<ServerMetrics> {
        &self.inner.metrics
    }

    /// The options this endpoint runs with.
    pub fn options(&self) -> &McpOptions {
        &self.inner.options
    }

    /// MCP sessions with a running rmcp service.
    pub fn sessions_live(&self) -> usize {
        self.inner.services.load(Ordering::Relaxed)
    }

    /// Ends idle-expired engine sessions (their services stop as they
    /// end); returns how many ended. Runs every
    /// [`McpOptions::sweep_interval`] on its own.
    pub fn sweep(&self) -> usize {
        self.inner.engine.sweep()
    }

    /// Ends session `id`: its events are released, its streams end, its
    /// service stops. Returns whether it was live.
    pub fn end_session(&self, id: SessionId) -> bool {
        self.inner.engine.close(id)
    }

    /// The live MCP session `id` (also counts as activity for the engine
    /// TTL): the engine's session, and the MCP session attached to it.
    fn session(&self, id: SessionId) -> Option<Arc<McpSession>> {
        let handle = self.inner.engine.session(id)?;
        Self::mcp_session(&handle)
    }

    /// The MCP session of a live engine session.
    pub(crate) fn mcp_session(handle: &rewind_engine::SessionHandle) -> Option<Arc<McpSession>> {
        let s = handle.attachment::<McpSession>()?;
        (!s.handle.is_ended()).then_some(s)
    }

    /// Attaches a new MCP session to its engine session and starts its
    /// service. The service's transport holds the session; the engine
    /// holds it weakly and stops the service when the session ends.
    fn start_session(
        &self,
        session: Arc<McpSession>,
        transport: SessionTransport,
        restored: Option<rmcp::model::InitializeRequestParams>,
    ) {
        let weak: Weak<McpSession> = Arc::downgrade(&session);
        session.handle.attach(weak);
        let ct = session.service_ct.clone();
        let handle = session.handle.clone();
        drop(session);
        let run = (self.inner.start)(transport, ct, restored);
        self.inner.services.fetch_add(1, Ordering::Relaxed);
        let this = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            run.await;
            // The service is gone (stopped, or it failed to initialise): the
            // session cannot answer anything more. Only this incarnation
            // ends; a re-initialised session under the same id lives on.
            handle.close();
            if let Some(inner) = this.upgrade() {
                inner.services.fetch_sub(1, Ordering::Relaxed);
            }
        });
        self.start_sweeper();
    }

    /// Rebuilds the MCP session of every engine session restored from the
    /// data directory ([`Engine::restored_sessions`]), from the
    /// `initialize` parameters stored when it was opened: its rmcp service
    /// runs again with the peer info of the original handshake, so the
    /// client goes on without re-initialising. A restored engine session
    /// without stored parameters (the process died between opening it and
    /// answering `initialize`) or with unreadable ones is closed: its id
    /// answers 404 and the client initialises again. Runs once per
    /// endpoint (later calls return 0); [`RewindMcp::router`] calls it, in
    /// a Tokio runtime. Returns how many sessions were rebuilt.
    pub fn restore_sessions(&self) -> usize {
        if self.inner.restored.swap(true, Ordering::Relaxed) {
            return 0;
        }
        let mut rebuilt = 0;
        for handle in self.inner.engine.restored_sessions() {
            if handle.attachment::<McpSession>().is_some() {
                continue;
            }
            let Some(stored) = handle.stored_init().and_then(session::decode_init) else {
                tracing::info!(
                    session = format_args!("{:016x}", handle.cursor_now(session::STANDALONE).tag),
                    "restored session has no stored initialize parameters; closing it"
                );
                handle.close();
                continue;
            };
            let (tx, rx) = tokio::sync::mpsc::channel(self.inner.options.inbound_capacity.max(1));
            let ct = self.inner.options.shutdown.child_token();
            let principal = handle.principal().map(str::to_owned);
            let unfinished = session::answer_unfinished(&handle, &stored.inflight);
            if unfinished > 0 {
                tracing::info!(
                    session = format_args!("{:016x}", handle.cursor_now(session::STANDALONE).tag),
                    requests = unfinished,
                    "requests in flight at the restart answered with an error"
                );
            }
            let params = stored.params;
            let session = Arc::new(McpSession::restored(
                handle,
                principal,
                tx,
                ct,
                params.clone(),
                !stored.inflight.is_empty(),
                None,
            ));
            self.start_session(
                session.clone(),
                SessionTransport::new(session, rx),
                Some(params),
            );
            rebuilt += 1;
        }
        if rebuilt > 0 {
            tracing::info!(
                sessions = rebuilt,
                "MCP sessions rebuilt from the data directory"
            );
        }
        rebuilt
    }

    /// Takes session `id` over from its owner, which is gone (`record`
    /// is what Redis said of it): claims it in Redis, adopts it in this
    /// engine numbered after the events Redis holds (same tag, same epoch:
    /// a cursor that names an event Redis holds resumes across the
    /// takeover), answers each request the dead owner had in flight with
    /// an error on its stream (unless Redis holds its answer), and rebuilds
    /// its rmcp service from the stored `initialize` parameters. `None`
    /// when another node took it first, or it cannot be rebuilt (it never
    /// answered `initialize`: then it ends everywhere).
    pub(crate) async fn take_over(
        &self,
        id: SessionId,
        record: &crate::cluster::Record,
    ) -> Option<Arc<McpSession>> {
        let cluster = self.inner.options.cluster.as_ref()?;
        let claimed = match cluster.claim(id, record).await {
            Ok(Some(c)) => c,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "cluster: cannot take a session over");
                return None;
            }
        };
        let tag = format!("{:016x}", record.tag);
        let Some(stored) = claimed.init.as_deref().and_then(session::decode_init) else {
            tracing::info!(
                session = %tag,
                "cluster: a session whose owner died before answering initialize ends"
            );
            cluster.forget(id, record.epoch).await;
            return None;
        };
        let handle = match self.inner.engine.adopt(
            id,
            record.tag,
            record.epoch,
            record.principal.as_deref(),
            claimed.high_water,
        ) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(session = %tag, error = %e, "cluster: cannot adopt a session");
                return None;
            }
        };
        let replica = cluster.replica(&handle);
        let mut answered = 0;
        for (stream, request, after_seq) in &stored.inflight {
            if claimed.closed.contains(stream) {
                continue;
            }
            let has_answer = claimed.events.iter().any(|(ev, payload)| {
                ev.stream == *stream && ev.seq > *after_seq && session::answers(payload, request)
            });
            if !has_answer {
                let err = rmcp::model::ServerJsonRpcMessage::error(
                    rmcp::ErrorData::internal_error(session::TAKEOVER_MESSAGE, None),
                    Some(request.clone()),
                );
                if let Ok(p) = serde_json::to_vec(&err) {
                    if handle.append(*stream, &p).is_ok() {
                        answered += 1;
                    }
                }
            }
            replica.control(handle.high_water(), crate::cluster::Control::Close(*stream));
        }
        replica.kick();
        let (tx, rx) = tokio::sync::mpsc::channel(self.inner.options.inbound_capacity.max(1));
        let ct = self.inner.options.shutdown.child_token();
        let params = stored.params;
        let session = Arc::new(McpSession::restored(
            handle,
            record.principal.clone(),
            tx,
            ct,
            params.clone(),
            !stored.inflight.is_empty(),
            Some(replica),
        ));
        self.start_session(
            session.clone(),
            SessionTransport::new(session.clone(), rx),
            Some(params),
        );
        tracing::info!(
            session = %tag,
            from = record.owner,
            after_seq = claimed.high_water,
            requests_answered = answered,
            "cluster: took over a session whose node is gone"
        );
        Some(session)
    }

    fn start_sweeper(&self) {
        let Some(every) = self.inner.options.sweep_interval else {
            return;
        };
        if self.inner.sweeper_started.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let shutdown = self.inner.options.shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut heap = HeapTrim::default();
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.cancelled() => break,
                }
                let Some(inner) = weak.upgrade() else { break };
                let mcp = RewindMcp { inner };
                let live = mcp.sessions_live();
                let trim_heap = heap.due(live, std::time::Instant::now());
                // A sweep walks every session and may give pool pages
                // back (system calls): off the runtime's workers.
                let swept = tokio::task::spawn_blocking(move || {
                    mcp.sweep();
                    if trim_heap {
                        release_free_heap();
                    }
                });
                if swept.await.is_err() {
                    break;
                }
            }
        });
    }
}

/// When to hand the C allocator's free memory back to the operating
/// system: after the number of live sessions has fallen to half its peak
/// since the last time (a burst is over: the memory its sessions' services
/// and connections used is free, but glibc keeps free memory in its arenas
/// until asked), at most every ten seconds, and only once there were
/// sessions worth speaking of.
#[derive(Debug, Default)]
struct HeapTrim {
    peak: usize,
    last: Option<std::time::Instant>,
}

impl HeapTrim {
    const MIN_PEAK: usize = 64;
    const REST: Duration = Duration::from_secs(10);

    fn due(&mut self, live: usize, now: std::time::Instant) -> bool {
        self.peak = self.peak.max(live);
        let shrunk = self.peak >= Self::MIN_PEAK && live <= self.peak / 2;
        let rested = self
            .last
            .is_none_or(|t| now.duration_since(t) >= Self::REST);
        if shrunk && rested {
            self.peak = live;
            self.last = Some(now);
        }
        shrunk && rested
    }
}

/// Returns the free memory of glibc's heap arenas to the operating system
/// (`malloc_trim`); elsewhere a no-op.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointers and may be called from any
    // thread at any time: glibc takes each arena's lock while it trims.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The router of a [`RewindMcp`] endpoint: the few lines an rmcp server
/// needs to adopt Rewind (see the crate docs for a complete program).
pub fn router<H, F>(
    engine: Engine,
    metrics: Arc<ServerMetrics>,
    options: McpOptions,
    factory: F,
) -> axum::Router
where
    H: ServerHandler,
    F: Fn() -> H + Send + Sync + 'static,
{
    RewindMcp::new(engine, metrics, options, factory).router()
}

#[cfg(test)]
mod heap_trim_tests {
    use std::time::{Duration, Instant};

    use super::HeapTrim;

    #[test]
    fn the_heap_is_trimmed_once_a_burst_has_halved_and_not_more_than_every_ten_seconds() {
        let t0 = Instant::now();
        let mut h = HeapTrim::default();
        assert!(!h.due(10, t0), "too few sessions to bother");
        assert!(!h.due(0, t0));
        assert!(!h.due(200, t0));
        assert!(!h.due(101, t0), "not halved yet");
        assert!(h.due(100, t0), "halved");
        assert!(!h.due(0, t0 + Duration::from_secs(5)), "rested too little");
        assert!(h.due(0, t0 + Duration::from_secs(10)));
        assert!(
            !h.due(0, t0 + Duration::from_secs(30)),
            "nothing fell since"
        );
        assert!(!h.due(300, t0 + Duration::from_secs(31)));
        assert!(h.due(150, t0 + Duration::from_secs(32)));
    }
}
