//! HTTP/1.1 keep-alive connections, one per session and node, on hyper's
//! low-level client.
//!
//! A session owns its connections the way a real MCP client does: requests
//! go one after another on a kept-alive connection, and cutting a stream
//! mid-response means closing the connection (HTTP/1.1 has no other way to
//! abandon a response), after which the next request connects again. That
//! is why this is hyper's `client::conn` rather than a pooled client: the
//! generator decides exactly when a connection exists. Every wait is
//! bounded: connecting, waiting for the response headers, and each wait for
//! the next body chunk.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Uri};

use crate::args::Route;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::sse::{SseEvent, SseParser};

/// Header names the generator sends or reads.
pub mod names {
    /// `Mcp-Session-Id`.
    pub const SESSION_ID: &str = "mcp-session-id";
    /// `MCP-Protocol-Version`.
    pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
    /// `Last-Event-ID`.
    pub const LAST_EVENT_ID: &str = "last-event-id";
}

/// How long each kind of wait may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// TCP connect.
    pub connect: Duration,
    /// From sending a request to its response headers.
    pub headers: Duration,
    /// Between two chunks of a response body.
    pub idle: Duration,
}

/// A server endpoint requests can go to.
#[derive(Debug, Clone)]
pub struct Node {
    /// The URL as given.
    pub url: String,
    /// Its `host[:port]`, sent as `Host`.
    pub authority: String,
    /// Its path and query (`/mcp`).
    pub path: String,
    /// The addresses it resolved to (tried in order).
    pub addrs: Vec<SocketAddr>,
}

/// Why a URL cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlError(pub String);

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UrlError {}

impl Node {
    /// Resolves `url` (`http://host:port/path`). Unless `allow_remote`,
    /// every address it resolves to must be a loopback address.
    pub async fn resolve(url: &str, allow_remote: bool) -> Result<Node, UrlError> {
        let uri: Uri = url
            .parse()
            .map_err(|e| UrlError(format!("{url:?} is not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(UrlError(format!(
                    "{url}: scheme {other:?} is not supported; rewind load speaks plain http"
                )))
            }
            None => {
                return Err(UrlError(format!(
                    "{url}: give the scheme, e.g. http://127.0.0.1:8080/mcp"
                )))
            }
        }
        let authority = uri
            .authority()
            .ok_or_else(|| UrlError(format!("{url}: no host")))?;
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(80);
        let lookup_host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((lookup_host, port))
            .await
            .map_err(|e| UrlError(format!("{url}: cannot resolve {host}: {e}")))?
            .collect();
        if addrs.is_empty() {
            return Err(UrlError(format!("{url}: {host} resolves to no address")));
        }
        if !allow_remote {
            if let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback()) {
                return Err(UrlError(format!(
                    "{url}: {host} resolves to {}, which is not a loopback address; \
                     pass --allow-remote to load a server on another machine",
                    a.ip()
                )));
            }
        }
        let path = uri
            .path_and_query()
            .map_or("/".to_owned(), |p| p.as_str().to_owned());
        Ok(Node {
            url: url.to_owned(),
            authority: authority.as_str().to_owned(),
            path,
            addrs,
        })
    }
}

/// The nodes of a run, handed out round-robin per request.
#[derive(Debug)]
pub struct Nodes {
    nodes: Vec<Node>,
    route: Route,
    /// Requests sent so far (round-robin).
    next: AtomicUsize,
    /// Sessions opened so far (sticky).
    sessions: AtomicUsize,
}

impl Nodes {
    /// `nodes` (at least one), requests spread as `route` says.
    pub fn new(nodes: Vec<Node>, route: Route) -> Nodes {
        assert!(!nodes.is_empty(), "at least one node");
        Nodes {
            nodes,
            route,
            next: AtomicUsize::new(0),
            sessions: AtomicUsize::new(0),
        }
    }

    /// How requests are spread.
    pub fn route(&self) -> Route {
        self.route
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none (never: [`Nodes::new`] needs one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The number of a new session (a fresh `initialize`) in the run,
    /// which places it under sticky routing.
    pub fn open_session(&self) -> usize {
        if self.nodes.len() == 1 || self.route != Route::Sticky {
            return 0;
        }
        self.sessions.fetch_add(1, Ordering::Relaxed)
    }

    /// The index of the node for the next request of the session numbered
    /// `session` by [`Nodes::open_session`].
    pub fn pick(&self, session: usize) -> usize {
        if self.nodes.len() == 1 {
            return 0;
        }
        let request = match self.route {
            Route::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed),
            Route::Sticky => 0,
        };
        self.route.target(self.nodes.len(), session, request)
    }

    /// Node `i`.
    pub fn get(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn all(&self) -> &[Node] {
        &self.nodes
    }
}

/// What went wrong on the wire.
#[derive(Debug)]
pub enum HttpError {
    /// The TCP connection could not be made.
    Connect(SocketAddr, std::io::Error),
    /// Connecting took longer than [`Timeouts::connect`].
    ConnectTimeout(SocketAddr),
    /// No response headers within [`Timeouts::headers`].
    HeadersTimeout,
    /// No body chunk within [`Timeouts::idle`].
    IdleTimeout,
    /// The connection failed (reset, closed mid-response, bad HTTP).
    Http(hyper::Error),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Connect(a, e) => write!(f, "connect to {a}: {e}"),
            HttpError::ConnectTimeout(a) => write!(f, "connect to {a}: timed out"),
            HttpError::HeadersTimeout => f.write_str("no response headers in time"),
            HttpError::IdleTimeout => f.write_str("response stalled (no data in time)"),
            HttpError::Http(e) => write!(f, "HTTP: {e}"),
        }
    }
}

impl std::error::Error for HttpError {}

impl HttpError {
    /// A short name for counting errors by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            HttpError::Connect(..) => "connect",
            HttpError::ConnectTimeout(_) => "connect_timeout",
            HttpError::HeadersTimeout => "headers_timeout",
            HttpError::IdleTimeout => "idle_timeout",
            HttpError::Http(_) => "http",
        }
    }
}

/// One kept-alive HTTP/1.1 connection. Dropping it closes the socket.
#[derive(Debug)]
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    driver: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Conn {
    /// Connects to `node`.
    pub async fn connect(node: &Node, t: &Timeouts) -> Result<Conn, HttpError> {
        let mut last = None;
        for &addr in &node.addrs {
            match tokio::time::timeout(t.connect, TcpStream::connect(addr)).await {
                Ok(Ok(tcp)) => {
                    let _ = tcp.set_nodelay(true);
                    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                        .await
                        .map_err(HttpError::Http)?;
                    let driver = tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    return Ok(Conn { sender, driver });
                }
                Ok(Err(e)) => last = Some(HttpError::Connect(addr, e)),
                Err(_) => last = Some(HttpError::ConnectTimeout(addr)),
            }
        }
        Err(last.unwrap_or(HttpError::ConnectTimeout(node.addrs[0])))
    }

    /// Whether the connection can take another request.
    pub fn is_usable(&self) -> bool {
        !self.sender.is_closed()
    }

    /// Sends `req`; returns the response once its headers are in.
    pub async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
        t: &Timeouts,
    ) -> Result<Answer, HttpError> {
        let started = Instant::now();
        let res = tokio::time::timeout(t.headers, async {
            self.sender.ready().await?;
            self.sender.send_request(req).await
        })
        .await
        .map_err(|_| HttpError::HeadersTimeout)?
        .map_err(HttpError::Http)?;
        let headers_after = started.elapsed();
        let (parts, body) = res.into_parts();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
            started,
            headers_after,
        })
    }
}

/// A request to the MCP endpoint of `node`.
pub fn request(
    node: &Node,
    method: Method,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(method)
        .uri(node.path.as_str())
        .header(http::header::HOST, node.authority.as_str())
        .header(http::header::ACCEPT, "application/json, text/event-stream");
    if body.is_some() {
        b = b.header(http::header::CONTENT_TYPE, "application/json");
    }
    for (name, value) in headers {
        b = b.header(*name, *value);
    }
    b.body(Full::new(body.map(Bytes::from).unwrap_or_default()))
        .unwrap_or_else(|_| Request::new(Full::new(Bytes::new())))
}

/// A response whose headers arrived.
#[derive(Debug)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body, not read yet.
    pub body: Incoming,
    /// When the request was handed to the connection.
    pub started: Instant,
    /// From then to the headers.
    pub headers_after: Duration,
}

impl Answer {
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the body is an SSE stream.
    pub fn is_event_stream(&self) -> bool {
        self.header(http::header::CONTENT_TYPE.as_str())
            .is_some_and(|c| c.trim_start().starts_with("text/event-stream"))
    }

    /// Whether the body is JSON.
    pub fn is_json(&self) -> bool {
        self.header(http::header::CONTENT_TYPE.as_str())
            .is_some_and(|c| c.trim_start().starts_with("application/json"))
    }

    /// Reads the whole body (at most `limit` bytes are kept), each chunk
    /// within the idle timeout.
    pub async fn text(self, limit: usize, t: &Timeouts) -> Result<String, HttpError> {
        let mut body = self.body;
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(t.idle, body.frame()).await {
                Err(_) => return Err(HttpError::IdleTimeout),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(HttpError::Http(e)),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let room = limit.saturating_sub(out.len());
                        out.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// The body as a stream of SSE events.
    pub fn events(self, t: &Timeouts) -> EventReader {
        EventReader {
            body: self.body,
            parser: SseParser::new(),
            queue: VecDeque::new(),
            scratch: Vec::new(),
            idle: t.idle,
            ended: false,
        }
    }
}

/// Reads SSE events off a response body, one bounded wait per chunk.
#[derive(Debug)]
pub struct EventReader {
    body: Incoming,
    parser: SseParser,
    queue: VecDeque<SseEvent>,
    scratch: Vec<SseEvent>,
    idle: Duration,
    ended: bool,
}

/// How an event stream ended.
#[derive(Debug)]
pub enum StreamEnd {
    /// The server ended the body cleanly.
    Ended,
    /// The body ended in the middle of an event (the connection dropped).
    Truncated,
}

impl EventReader {
    /// The next event, `Ok(None)` at the end of the body (see
    /// [`EventReader::end`] for how it ended).
    pub async fn next(&mut self) -> Result<Option<SseEvent>, HttpError> {
        self.next_within(self.idle).await
    }

    /// The next event, waiting at most `wait` for each chunk.
    pub async fn next_within(&mut self, wait: Duration) -> Result<Option<SseEvent>, HttpError> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Ok(Some(e));
            }
            if self.ended {
                return Ok(None);
            }
            match tokio::time::timeout(wait, self.body.frame()).await {
                Err(_) => return Err(HttpError::IdleTimeout),
                Ok(None) => self.ended = true,
                Ok(Some(Err(e))) => return Err(HttpError::Http(e)),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.parser.feed(&data, &mut self.scratch);
                        self.queue.extend(self.scratch.drain(..));
                    }
                }
            }
        }
    }

    /// How the body ended (meaningful once [`EventReader::next`] returned
    /// `Ok(None)`).
    pub fn end(&self) -> StreamEnd {
        if self.parser.has_partial_event() {
            StreamEnd::Truncated
        } else {
            StreamEnd::Ended
        }
    }
}
