//! Cluster mode (`rewind serve --cluster redis://… --node-id N`): three
//! real `rewind serve` processes sharing their sessions through one
//! `redis-server` the test starts itself, driven directly and through a
//! non-sticky round-robin proxy (every request to the next node).
//!
//! - A session created on one node is called and resumed through the
//!   others: a resume carries every event after its cursor exactly once,
//!   in order, nothing foreign, and ends once the call's result is out.
//! - Another session's cursor is 409 on every node; a deleted session is
//!   404 for `POST` and `GET` on every node; an unknown session is 404 and
//!   a `GET` without a session 400 everywhere.
//! - Redis restarted without persistence: the old session and cursor are
//!   404 on every node within 5 s — never replayed — and a new session
//!   works again.
//! - A node SIGKILLed mid-call: once its heartbeat expired, its sessions
//!   are taken over and resume through the survivors (every event Redis
//!   held after the cursor once, then the takeover's error, or an explicit
//!   `reset`); the other sessions resume to their result; all go on
//!   working, and the survivors count the takeovers.
//! - A node paused (SIGSTOP) mid-call past its heartbeat: another node
//!   takes the session over; when the paused node runs again, its next
//!   copy into Redis is refused and it ends its own copy, so nothing its
//!   call appends after the takeover reaches a client, and both nodes
//!   serve the session from its new owner.
//!
//! The tests that need Redis are `#[ignore]`d (`cargo test --workspace`
//! runs on machines without it); `.ci/cluster.sh` runs them with
//! `--ignored`. They fail, with a message saying so, when no
//! `redis-server` is found (`REWIND_REDIS_SERVER`, else `PATH`). The
//! proxy's own test against one plain node needs nothing and always runs.
//! Every wait is bounded; everything listens on loopback.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use rewind_engine::EventId;
use serde_json::{json, Value};

/// Progress notifications per call, and the pause between two.
const COUNT: u32 = 40;
const INTERVAL_MS: u64 = 5;
/// Longest a resume may take to end (its call takes COUNT × INTERVAL_MS).
const RESUME_LIMIT: Duration = Duration::from_secs(15);
/// How long the nodes may take to notice that Redis lost everything.
const REDIS_LOSS_LIMIT: Duration = Duration::from_secs(5);
/// The response header naming the node the proxy forwarded a request to.
const NODE_HEADER: &str = "x-rewind-test-node";

// ---------------------------------------------------------------------------
// Logs: every child process writes to a file, shown when a test fails.

struct Log {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Log {
    fn new(name: &str) -> Log {
        let dir = tempfile::Builder::new()
            .prefix("rewind-cluster-test")
            .tempdir()
            .expect("temp dir");
        let path = dir.path().join(format!("{name}.log"));
        File::create(&path).expect("log file");
        Log { path, _dir: dir }
    }

    fn stdio(&self) -> Stdio {
        File::options()
            .append(true)
            .open(&self.path)
            .expect("log file")
            .into()
    }

    fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The tail, on stderr, when the thread is unwinding (a test failed).
    fn show_if_panicking(&self, what: &str) {
        if std::thread::panicking() {
            eprintln!("--- last lines of {what}:\n{}\n---", self.tail(40));
        }
    }
}

// ---------------------------------------------------------------------------
// Redis: a `redis-server` of our own on a free loopback port, no persistence.

struct Redis {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    log: Log,
}

fn redis_binary() -> OsString {
    std::env::var_os("REWIND_REDIS_SERVER")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// A port the kernel just gave out and we released again.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

/// One inline command over a fresh connection; the first line of the reply.
fn redis_command(port: u16, command: &str) -> std::io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    Ok(line.trim_end().to_owned())
}

/// One inline command whose reply is a bulk string: its text (`None` for
/// a nil reply).
fn redis_bulk(port: u16, command: &str) -> Result<Option<String>, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let io = |e: std::io::Error| format!("redis {command}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(io)?;
    stream
        .write_all(format!("{command}\r\n").as_bytes())
        .map_err(io)?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).map_err(io)?;
    let len: i64 = match line.trim_end().strip_prefix('$').map(str::parse) {
        Some(Ok(n)) => n,
        _ => return Err(format!("redis {command}: answered {line:?}")),
    };
    if len < 0 {
        return Ok(None);
    }
    line.clear();
    r.read_line(&mut line).map_err(io)?;
    Ok(Some(line.trim_end().to_owned()))
}

impl Redis {
    fn start() -> Redis {
        let dir = tempfile::Builder::new()
            .prefix("rewind-cluster-redis")
            .tempdir()
            .expect("temp dir");
        let mut redis = Redis {
            child: None,
            port: 0,
            dir,
            log: Log::new("redis-server"),
        };
        // A port freed by another process in between is taken by the
        // time redis binds it: then redis exits, and we try another.
        for attempt in 1..=5 {
            redis.port = free_port();
            match redis.spawn() {
                Ok(()) => return redis,
                Err(e) if attempt < 5 => eprintln!("redis-server: {e}; another port"),
                Err(e) => panic!("{e}"),
            }
        }
        unreachable!()
    }

    /// Starts redis-server on `self.port` and waits until it answers PING.
    fn spawn(&mut self) -> Result<(), String> {
        let binary = redis_binary();
        let port = self.port.to_string();
        let child = Command::new(&binary)
            .args(["--bind", "127.0.0.1", "--port", &port])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(self.log.stdio())
            .stderr(self.log.stdio())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server not found ({binary:?}): these tests need one. Install \
                 redis-server, or set REWIND_REDIS_SERVER to its path (.ci/cluster.sh \
                 installs it and runs them)"
            ),
            Err(e) => panic!("cannot start {binary:?}: {e}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.as_mut().unwrap().try_wait() {
                self.child = None;
                return Err(format!(
                    "redis-server on port {port} exited ({status}):\n{}",
                    self.log.tail(20)
                ));
            }
            if redis_command(self.port, "PING").is_ok_and(|r| r == "+PONG") {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "redis-server on port {port} did not answer PING within 10 s:\n{}",
                    self.log.tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs redis-server and starts a new, empty one on the same port.
    fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("restarting redis: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        self.log.show_if_panicking("redis-server");
    }
}

// ---------------------------------------------------------------------------
// Nodes: `rewind serve` processes.

struct Node {
    child: Child,
    url: String,
    /// `http://127.0.0.1:PORT` of its admin surface, and its bearer token.
    admin: String,
    token: String,
    name: String,
    log: Log,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log.show_if_panicking(&self.name);
    }
}

/// `rewind serve` on free loopback ports with `args`; waits (60 s at most)
/// for it to print its MCP endpoint, admin surface and admin token.
fn start_node(name: &str, args: &[String]) -> Node {
    let log = Log::new(name);
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewind"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("REWIND_") {
            command.env_remove(k);
        }
    }
    let mut child = command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.stdio())
        .spawn()
        .expect("spawn rewind serve");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        // Drains stdout to the end: a closed pipe would kill the node at
        // its next line.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let (mut url, mut admin) = (None, None);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{name}: rewind serve {args:?} did not print its MCP endpoint, admin \
                     surface and admin token ({e:?}); stdout {seen:?}; stderr:\n{}",
                    log.tail(30)
                );
            }
        };
        if let Some(u) = line.strip_prefix("rewind: MCP endpoint") {
            let u = u.trim().to_owned();
            assert!(
                u.starts_with("http://127.0.0.1:") && u.ends_with("/mcp"),
                "{u}"
            );
            url = Some(u);
        } else if let Some(a) = line.strip_prefix("rewind: admin surface") {
            let a = a.split_whitespace().next().unwrap_or_default().to_owned();
            assert!(a.starts_with("http://127.0.0.1:"), "{a}");
            admin = Some(a);
        } else if let Some(t) = line.strip_prefix("rewind: admin token") {
            let (Some(url), Some(admin)) = (url.take(), admin.take()) else {
                panic!("{name}: the admin token before the endpoints: {seen:?}");
            };
            return Node {
                child,
                url,
                admin,
                token: t.trim().to_owned(),
                name: name.to_owned(),
                log,
            };
        }
        seen.push(line);
    }
}

impl Node {
    /// The value of counter `name` in the node's `/metrics` (summed over
    /// its label sets).
    fn counter(&self, http: &reqwest::blocking::Client, name: &str) -> Result<f64, String> {
        let resp = http
            .get(format!("{}/metrics", self.admin))
            .bearer_auth(&self.token)
            .send()
            .map_err(|e| format!("{}: GET /metrics: {e}", self.name))?;
        let status = resp.status();
        let text = resp
            .text()
            .map_err(|e| format!("{}: /metrics: {e}", self.name))?;
        if status != 200 {
            return Err(format!(
                "{}: GET /metrics answered {status}: {text}",
                self.name
            ));
        }
        let values: Vec<f64> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let metric = series.split('{').next()?;
                (metric == name || metric == format!("{name}_total")).then(|| value.parse().ok())?
            })
            .collect();
        if values.is_empty() {
            return Err(format!("{}: no {name} in /metrics:\n{text}", self.name));
        }
        Ok(values.iter().sum())
    }
}

// ---------------------------------------------------------------------------
// The proxy: each request to the next node in turn, the answer streamed back.

struct Proxy {
    url: String,
    forwarded: Arc<Vec<AtomicUsize>>,
    runtime: Option<tokio::runtime::Runtime>,
}

struct ProxyState {
    /// `http://127.0.0.1:PORT` of every node.
    upstreams: Vec<String>,
    next: AtomicUsize,
    forwarded: Arc<Vec<AtomicUsize>>,
    client: reqwest::Client,
}

/// Headers of one connection, not of the message (RFC 9110 7.6.1), and
/// the ones the forwarding itself sets.
fn hop_by_hop(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

async fn forward(State(state): State<Arc<ProxyState>>, request: Request) -> Response {
    let index = state.next.fetch_add(1, Ordering::Relaxed) % state.upstreams.len();
    state.forwarded[index].fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, 16 << 20).await {
        Ok(b) => b,
        Err(e) => return (http::StatusCode::BAD_REQUEST, format!("proxy: {e}")).into_response(),
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = http::HeaderMap::new();
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            headers.append(name, value.clone());
        }
    }
    let sent = state
        .client
        .request(parts.method, format!("{}{path}", state.upstreams[index]))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let upstream = match sent {
        Ok(r) => r,
        Err(e) => {
            let text = format!("proxy: node {index}: {e}");
            return (
                http::StatusCode::BAD_GATEWAY,
                [(NODE_HEADER, index.to_string())],
                text,
            )
                .into_response();
        }
    };
    let mut response = Response::builder().status(upstream.status());
    for (name, value) in upstream.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    response
        .header(NODE_HEADER, index)
        // Chunk by chunk as the node sends them: SSE flows live.
        .body(Body::from_stream(upstream.bytes_stream()))
        .expect("response")
}

impl Proxy {
    /// A proxy on 127.0.0.1:0 in front of `nodes` (their MCP URLs).
    fn start(nodes: &[&str]) -> Proxy {
        let upstreams: Vec<String> = nodes
            .iter()
            .map(|u| {
                let rest = u.strip_prefix("http://").expect("http URL");
                format!("http://{}", rest.split('/').next().unwrap())
            })
            .collect();
        let forwarded: Arc<Vec<AtomicUsize>> =
            Arc::new(nodes.iter().map(|_| AtomicUsize::new(0)).collect());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("test-proxy")
            .enable_all()
            .build()
            .expect("proxy runtime");
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            // Between two chunks: a stream idle this long is cut.
            .read_timeout(Duration::from_secs(30))
            .build()
            .expect("proxy client");
        let state = Arc::new(ProxyState {
            upstreams,
            next: AtomicUsize::new(0),
            forwarded: forwarded.clone(),
            client,
        });
        let app = axum::Router::new().fallback(forward).with_state(state);
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("proxy listener");
            axum::serve(listener, app).await.expect("proxy serve");
        });
        Proxy {
            url: format!("http://{addr}/mcp"),
            forwarded,
            runtime: Some(runtime),
        }
    }

    /// Requests forwarded to each node so far.
    fn forwarded(&self) -> Vec<usize> {
        self.forwarded
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Nodes 1..=`size` of a cluster on `redis`, named "`label` N", each
/// started with `extra` arguments after the cluster ones.
fn start_nodes(redis: &Redis, size: u16, label: &str, extra: &[String]) -> Vec<Node> {
    (1..=size)
        .map(|id| {
            let mut args = vec![
                "--cluster".to_owned(),
                redis.url(),
                "--node-id".to_owned(),
                id.to_string(),
            ];
            args.extend_from_slice(extra);
            start_node(&format!("{label} {id}"), &args)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// A cluster: Redis, three nodes, the proxy in front of them.

struct Cluster {
    // Dropped in this order: the proxy, the nodes, then Redis.
    proxy: Proxy,
    nodes: Vec<Node>,
    redis: Redis,
}

impl Cluster {
    fn start(size: u16) -> Cluster {
        let redis = Redis::start();
        let nodes = start_nodes(&redis, size, "node", &[]);
        let urls: Vec<&str> = nodes.iter().map(|n| n.url.as_str()).collect();
        let proxy = Proxy::start(&urls);
        Cluster {
            proxy,
            nodes,
            redis,
        }
    }

    fn node(&self, i: usize) -> &str {
        &self.nodes[i % self.nodes.len()].url
    }

    /// Every node's URL, then the proxy's, each with a name for messages.
    fn entry_points(&self) -> Vec<(String, &str)> {
        let mut all: Vec<(String, &str)> = self
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.url.as_str()))
            .collect();
        all.push(("proxy".to_owned(), self.proxy.url.as_str()));
        all
    }
}

// ---------------------------------------------------------------------------
// The MCP client side.

/// One SSE frame, complete (its blank line seen).
#[derive(Debug, Default, Clone)]
struct Frame {
    id: Option<String>,
    event: Option<String>,
    data: Option<String>,
}

/// Reads frames until the body ends (`Ok(Ok)`) or the connection fails
/// (`Ok(Err)`), handing each to `on` (which returns `false` to stop early,
/// or an error that ends the read with it).
fn frames(
    resp: reqwest::blocking::Response,
    mut on: impl FnMut(Frame) -> Result<bool, String>,
) -> Result<Result<(), String>, String> {
    let mut r = BufReader::new(resp);
    let mut frame = Frame::default();
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => return Ok(Ok(())),
            Ok(_) if !line.ends_with('\n') => return Ok(Err(format!("torn line {line:?}"))),
            Ok(_) => {}
            Err(e) => return Ok(Err(e.to_string())),
        }
        let l = line.trim_end_matches(['\n', '\r']);
        if l.is_empty() {
            let f = std::mem::take(&mut frame);
            let any = f.id.is_some() || f.event.is_some() || f.data.is_some();
            if any && !on(f)? {
                return Ok(Ok(()));
            }
            continue;
        }
        if l.starts_with(':') {
            continue;
        }
        let (field, value) = l.split_once(':').unwrap_or((l, ""));
        let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
        match field {
            "id" => frame.id = Some(value),
            "event" => frame.event = Some(value),
            "data" => match &mut frame.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(&value);
                }
                None => frame.data = Some(value),
            },
            _ => {}
        }
    }
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(15))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn post(
    http: &reqwest::blocking::Client,
    url: &str,
    session: Option<&str>,
    body: &Value,
) -> reqwest::Result<reqwest::blocking::Response> {
    let mut r = http
        .post(url)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .header("MCP-Protocol-Version", "2025-06-18");
    if let Some(s) = session {
        r = r.header("Mcp-Session-Id", s);
    }
    r.body(body.to_string()).send()
}

/// A `GET` on the endpoint; its status only (the body is dropped unread).
fn get_status(
    http: &reqwest::blocking::Client,
    url: &str,
    session: Option<&str>,
    cursor: Option<&str>,
) -> Result<u16, String> {
    let mut r = http
        .get(url)
        .header("Accept", "text/event-stream")
        .header("MCP-Protocol-Version", "2025-06-18")
        .timeout(Duration::from_secs(10));
    if let Some(s) = session {
        r = r.header("Mcp-Session-Id", s);
    }
    if let Some(c) = cursor {
        r = r.header("Last-Event-ID", c);
    }
    r.send()
        .map(|resp| resp.status().as_u16())
        .map_err(|e| format!("GET {url}: {e}"))
}

/// The node the proxy forwarded to, when `resp` came through it.
fn via(resp: &reqwest::blocking::Response) -> Option<usize> {
    resp.headers()
        .get(NODE_HEADER)
        .and_then(|v| v.to_str().ok()?.parse().ok())
}

static NEXT_REQUEST: AtomicU64 = AtomicU64::new(10);

/// A client-side MCP session.
#[derive(Debug, Clone)]
struct Session {
    id: String,
    /// The tag of its ids, from `initialize`'s priming event.
    tag: u64,
}

/// `initialize` then `notifications/initialized`. `Err` with the status
/// when `initialize` is not answered 200.
fn try_initialize(http: &reqwest::blocking::Client, url: &str) -> Result<Session, String> {
    let body = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"cluster-test","version":"1"}}});
    let resp = post(http, url, None, &body).map_err(|e| format!("initialize: {e}"))?;
    if resp.status() != 200 {
        return Err(format!("initialize answered {}", resp.status()));
    }
    let id = resp
        .headers()
        .get("mcp-session-id")
        .ok_or("initialize: no Mcp-Session-Id")?
        .to_str()
        .unwrap()
        .to_owned();
    let mut primed = None;
    let mut answered = false;
    frames(resp, |f| {
        match (&f.data, &f.id) {
            (Some(d), Some(i)) if d.is_empty() => {
                primed = Some(EventId::parse(i).map_err(|e| format!("priming id {i}: {e}"))?);
            }
            (Some(d), _) => {
                let v: Value = serde_json::from_str(d).map_err(|e| e.to_string())?;
                if v["result"]["protocolVersion"] != "2025-06-18" {
                    return Err(format!("initialize answered {d}"));
                }
                answered = true;
                return Ok(false);
            }
            _ => {}
        }
        Ok(true)
    })??;
    if !answered {
        return Err("initialize: no result".into());
    }
    let primed = primed.ok_or("initialize: no priming event")?;
    let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    let resp = post(http, url, Some(&id), &initialized).map_err(|e| format!("initialized: {e}"))?;
    if resp.status() != 202 {
        return Err(format!(
            "notifications/initialized answered {}",
            resp.status()
        ));
    }
    Ok(Session {
        id,
        tag: primed.tag,
    })
}

fn initialize(http: &reqwest::blocking::Client, url: &str) -> Session {
    try_initialize(http, url).unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// `ping` on a session: its HTTP status (200 only when answered).
fn ping(http: &reqwest::blocking::Client, url: &str, s: &Session) -> Result<u16, String> {
    let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
    let body = json!({"jsonrpc":"2.0","id":id,"method":"ping"});
    let resp = post(http, url, Some(&s.id), &body).map_err(|e| format!("ping: {e}"))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Ok(status);
    }
    let text = resp.text().map_err(|e| format!("ping: {e}"))?;
    let answered = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:").or(Some(l)))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .any(|v| v["id"] == json!(id) && v["result"] == json!({}));
    if !answered {
        return Err(format!("ping {id} was not answered: {text}"));
    }
    Ok(200)
}

/// One `progress_stream` call and everything its streams delivered.
#[derive(Debug, Clone)]
struct Call {
    session: Session,
    request: u64,
    token: String,
    /// Progress notifications the call sends before its result.
    count: u32,
    /// The POST's priming event: the call's stream.
    priming: Option<EventId>,
    /// The last event received (`Last-Event-ID`), as sent and parsed.
    cursor: Option<(String, EventId)>,
    progress: u32,
    done: bool,
    /// Every event received, in order (id, payload): the evidence.
    log: Vec<(String, String)>,
}

impl Call {
    fn new(session: &Session, count: u32) -> Call {
        let request = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
        Call {
            session: session.clone(),
            request,
            token: format!("t-{request}"),
            count,
            priming: None,
            cursor: None,
            progress: 0,
            done: false,
            log: Vec::new(),
        }
    }

    /// The same call as seen by a client that got only the priming event:
    /// resuming it must replay the whole call.
    fn rewound(&self) -> Call {
        let priming = self.priming.expect("the call was primed");
        Call {
            cursor: Some((priming.to_string(), priming)),
            progress: 0,
            done: false,
            log: Vec::new(),
            ..self.clone()
        }
    }

    fn cursor_text(&self) -> &str {
        &self.cursor.as_ref().expect("a cursor").0
    }

    fn evidence(&self) -> String {
        let tail: Vec<_> = self.log.iter().rev().take(6).rev().collect();
        format!(
            "session {} call {} (token {}): cursor {:?}, progress {}, done {}, last events {:?}",
            self.session.id,
            self.request,
            self.token,
            self.cursor.as_ref().map(|c| &c.0),
            self.progress,
            self.done,
            tail
        )
    }

    /// Takes one event of the call's stream, or says why it is wrong.
    fn accept(&mut self, f: &Frame, resumed: bool) -> Result<(), String> {
        if let Some(kind) = &f.event {
            return Err(format!(
                "`{kind}` event in a stream: {f:?}; {}",
                self.evidence()
            ));
        }
        let raw = f.id.clone().unwrap_or_default();
        let id = EventId::parse(&raw)
            .map_err(|e| format!("event id {raw:?} does not parse ({e}); {}", self.evidence()))?;
        if id.tag != self.session.tag {
            return Err(format!(
                "foreign event id {raw} (tag {:x}), the session's tag is {:x}; {}",
                id.tag,
                self.session.tag,
                self.evidence()
            ));
        }
        let data = f.data.clone().unwrap_or_default();
        let Some((_, cursor)) = self.cursor else {
            // The POST's priming event: the stream's position.
            if resumed || !data.is_empty() {
                return Err(format!(
                    "stream began with {raw} {data:?}; {}",
                    self.evidence()
                ));
            }
            self.priming = Some(id);
            self.cursor = Some((raw, id));
            return Ok(());
        };
        if id.epoch != cursor.epoch || id.stream != cursor.stream || id.seq <= cursor.seq {
            return Err(format!(
                "event {raw} is not after {cursor} on the same stream (duplicate or foreign): \
                 {data}; {}",
                self.evidence()
            ));
        }
        if self.done {
            return Err(format!(
                "event {raw} after the result: {data}; {}",
                self.evidence()
            ));
        }
        let v: Value = serde_json::from_str(&data).map_err(|e| {
            format!(
                "invalid payload at {raw}: {data:?} ({e}); {}",
                self.evidence()
            )
        })?;
        if v["method"] == "notifications/progress" {
            let token = v["params"]["progressToken"].as_str().unwrap_or_default();
            let progress = v["params"]["progress"].as_f64().unwrap_or(-1.0);
            if token != self.token || progress != f64::from(self.progress + 1) {
                return Err(format!(
                    "expected progress {} of {}, got {data} at {raw}; {}",
                    self.progress + 1,
                    self.token,
                    self.evidence()
                ));
            }
            self.progress += 1;
        } else if v["id"] == json!(self.request) && v.get("result").is_some() {
            if self.progress != self.count || v["result"]["isError"] == json!(true) {
                return Err(format!(
                    "result after {} progress events: {data}; {}",
                    self.progress,
                    self.evidence()
                ));
            }
            self.done = true;
        } else {
            return Err(format!(
                "foreign message at {raw}: {data}; {}",
                self.evidence()
            ));
        }
        self.cursor = Some((raw.clone(), id));
        self.log.push((raw, data));
        Ok(())
    }
}

/// The error a call gets on its stream when the node running it died and
/// another node took its session over.
const TAKEOVER_MESSAGE: &str =
    "the node serving this request died while it was running; it was not completed";
/// The 503 a node answers while it cannot take a session over yet.
const OWNER_GONE: &str = "the node that owned this session is gone";
/// How long after a node is killed its sessions may answer 503 (its
/// heartbeat key expires after 3 s).
const OWNER_LOSS_LIMIT: Duration = Duration::from_secs(10);

/// How the resume of a call whose node may have died ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Every event after the cursor, then the call's result.
    Result,
    /// Every event after the cursor that Redis held, then the error the
    /// node that took the session over answered the call with.
    Lost,
    /// An explicit `reset` first (the cursor's event was lost with the
    /// node): a fresh stream, nothing replayed.
    Reset,
}

impl Call {
    /// Takes the error response to the call (its node died), checked like
    /// any event: the session's, after the cursor on the same stream, and
    /// saying why.
    fn accept_lost(&mut self, f: &Frame, v: &Value) -> Result<(), String> {
        let raw = f.id.clone().unwrap_or_default();
        let data = f.data.clone().unwrap_or_default();
        let id = EventId::parse(&raw).map_err(|e| {
            format!(
                "error response id {raw:?} does not parse ({e}): {data}; {}",
                self.evidence()
            )
        })?;
        let (_, cursor) = *self.cursor.as_ref().expect("a resumed call has a cursor");
        if id.tag != self.session.tag
            || id.epoch != cursor.epoch
            || id.stream != cursor.stream
            || id.seq <= cursor.seq
        {
            return Err(format!(
                "error response {raw} is not after {cursor} on the same stream: {data}; {}",
                self.evidence()
            ));
        }
        if self.done {
            return Err(format!(
                "error response {raw} after the call was answered: {data}; {}",
                self.evidence()
            ));
        }
        let message = v["error"]["message"].as_str().unwrap_or_default();
        if message != TAKEOVER_MESSAGE {
            return Err(format!(
                "the call was answered with an error other than the takeover's: {data}; {}",
                self.evidence()
            ));
        }
        self.done = true;
        self.cursor = Some((raw.clone(), id));
        self.log.push((raw, data));
        Ok(())
    }
}

/// Resumes `c` with `GET` + `Last-Event-ID` on `url` after a node died:
/// retried while the node answers 503 "owner gone" (for at most
/// [`OWNER_LOSS_LIMIT`]), then it must be answered 200 and either open
/// with a `reset` (then the stream is left), or carry every event after
/// the cursor once, in order, then the result or the takeover's error,
/// then end, within [`RESUME_LIMIT`].
fn resume_after_loss(
    http: &reqwest::blocking::Client,
    url: &str,
    c: &mut Call,
) -> Result<Ending, String> {
    let cursor = c.cursor_text().to_owned();
    let mut refused = String::new();
    let resp = poll(OWNER_LOSS_LIMIT, || {
        let sent = http
            .get(url)
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", &c.session.id)
            .header("MCP-Protocol-Version", "2025-06-18")
            .header("Last-Event-ID", &cursor)
            .timeout(RESUME_LIMIT)
            .send();
        match sent {
            Ok(resp) if resp.status() == 503 => {
                refused = resp.text().unwrap_or_default();
                if refused.contains(OWNER_GONE) {
                    None
                } else {
                    Some(Err(format!("answered 503 {refused}")))
                }
            }
            Ok(resp) if resp.status() == 200 => Some(Ok(resp)),
            Ok(resp) => {
                let status = resp.status();
                Some(Err(format!(
                    "answered {status} {}",
                    resp.text().unwrap_or_default()
                )))
            }
            Err(e) => Some(Err(e.to_string())),
        }
    })
    .unwrap_or_else(|| Err(format!("still 503 after {OWNER_LOSS_LIMIT:?}: {refused}")))
    .map_err(|e| format!("resume from {cursor} on {url}: {e}; {}", c.evidence()))?;
    let started = Instant::now();
    let mut ending = None;
    let mut first = true;
    frames(resp, |f| {
        let opening = std::mem::replace(&mut first, false);
        if f.event.as_deref() == Some("reset") {
            if !opening {
                return Err(format!("`reset` mid-stream: {f:?}; {}", c.evidence()));
            }
            ending = Some(Ending::Reset);
            return Ok(false);
        }
        let message = f.data.as_deref().and_then(|d| serde_json::from_str(d).ok());
        if let Some(v) =
            message.filter(|v: &Value| v["id"] == json!(c.request) && v.get("error").is_some())
        {
            c.accept_lost(&f, &v)?;
            ending = Some(Ending::Lost);
            return Ok(true);
        }
        c.accept(&f, true)?;
        if c.done {
            ending = Some(Ending::Result);
        }
        Ok(true)
    })?
    .map_err(|e| {
        format!(
            "resume from {cursor} on {url} did not end cleanly after {:?} ({e}); {}",
            started.elapsed(),
            c.evidence()
        )
    })?;
    ending.ok_or_else(|| {
        format!(
            "resume from {cursor} on {url} ended after {:?} without the result, the \
             takeover's error or a reset; {}",
            started.elapsed(),
            c.evidence()
        )
    })
}

/// POSTs a `progress_stream` call and reads its stream: to the end, or
/// only until `cut_after` progress events (0: the priming event alone),
/// then drops the connection (the call goes on on its node). Returns the
/// call and the node the proxy chose, if it went through one.
fn call(
    http: &reqwest::blocking::Client,
    url: &str,
    session: &Session,
    cut_after: Option<u32>,
) -> Result<(Call, Option<usize>), String> {
    call_with(http, url, session, (COUNT, INTERVAL_MS), cut_after)
}

/// [`call`] with `count` notifications `interval_ms` apart.
fn call_with(
    http: &reqwest::blocking::Client,
    url: &str,
    session: &Session,
    (count, interval_ms): (u32, u64),
    cut_after: Option<u32>,
) -> Result<(Call, Option<usize>), String> {
    let mut c = Call::new(session, count);
    let body = json!({"jsonrpc":"2.0","id":c.request,"method":"tools/call","params":{
        "name":"progress_stream",
        "arguments":{"count":count,"interval_ms":interval_ms},
        "_meta":{"progressToken":c.token}}});
    let resp = post(http, url, Some(&session.id), &body)
        .map_err(|e| format!("tools/call on {url}: {e}"))?;
    let node = via(&resp);
    if resp.status() != 200 {
        let status = resp.status();
        return Err(format!(
            "tools/call on {url} answered {status}: {}",
            resp.text().unwrap_or_default()
        ));
    }
    frames(resp, |f| {
        if f.id.is_none() && f.event.is_none() {
            return Ok(true); // retry:
        }
        c.accept(&f, false)?;
        Ok(cut_after.is_none_or(|n| c.progress < n))
    })?
    .map_err(|e| format!("tools/call stream on {url}: {e}; {}", c.evidence()))?;
    if cut_after.is_none() && !c.done {
        return Err(format!("tools/call stream ended early; {}", c.evidence()));
    }
    if c.priming.is_none() {
        return Err(format!(
            "tools/call stream was not primed; {}",
            c.evidence()
        ));
    }
    Ok((c, node))
}

/// Resumes `c` with `GET` + `Last-Event-ID` on `url`: it must be answered
/// 200 and carry every event after the cursor once, in order, then the
/// result, then end, all within [`RESUME_LIMIT`]. Returns the node the
/// proxy chose, if it went through one.
fn resume(
    http: &reqwest::blocking::Client,
    url: &str,
    c: &mut Call,
) -> Result<Option<usize>, String> {
    let started = Instant::now();
    let cursor = c.cursor_text().to_owned();
    let resp = http
        .get(url)
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", &c.session.id)
        .header("MCP-Protocol-Version", "2025-06-18")
        .header("Last-Event-ID", &cursor)
        .timeout(RESUME_LIMIT)
        .send()
        .map_err(|e| format!("resume from {cursor} on {url}: {e}"))?;
    let node = via(&resp);
    if resp.status() != 200 {
        let status = resp.status();
        return Err(format!(
            "resume from {cursor} on {url} (proxy node {node:?}) answered {status} {}; {}",
            resp.text().unwrap_or_default(),
            c.evidence()
        ));
    }
    let mut first = true;
    frames(resp, |f| {
        if first && f.id.is_none() && f.event.is_none() {
            return Ok(true); // retry:
        }
        first = false;
        c.accept(&f, true)?;
        Ok(true)
    })?
    .map_err(|e| {
        format!(
            "resume from {cursor} on {url} did not end cleanly after {:?} ({e}); {}",
            started.elapsed(),
            c.evidence()
        )
    })?;
    if !c.done {
        return Err(format!(
            "resume from {cursor} on {url} ended without the result; {}",
            c.evidence()
        ));
    }
    Ok(node)
}

/// Polls `check` every 50 ms until it returns `Some`, for at most `limit`.
fn poll<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn random_session_id() -> String {
    let a = getrandom::u64().unwrap();
    let b = getrandom::u64().unwrap();
    format!("{a:016x}{b:016x}")
}

/// Long enough for a call that started now to have finished.
fn call_duration() -> Duration {
    Duration::from_millis(u64::from(COUNT) * INTERVAL_MS + 500)
}

// ---------------------------------------------------------------------------
// The harness itself.

/// The proxy in front of one plain node (no cluster): requests and SSE
/// streams go through it unchanged, round-robin is per request.
#[test]
fn proxy_forwards_requests_and_streams_to_a_plain_node() {
    let node = start_node("plain node", &[]);
    let proxy = Proxy::start(&[node.url.as_str()]);
    let http = client();

    let s = initialize(&http, &proxy.url);
    let (mut c, at) = call(&http, &proxy.url, &s, Some(5)).unwrap();
    assert_eq!(at, Some(0));
    assert_eq!(c.progress, 5);
    resume(&http, &proxy.url, &mut c).unwrap();
    assert_eq!(c.progress, COUNT);
    let mut again = c.rewound();
    resume(&http, &proxy.url, &mut again).unwrap();
    assert_eq!(again.progress, COUNT);
    assert_eq!(ping(&http, &proxy.url, &s), Ok(200));

    // Live, not buffered: the first notification of a call that takes
    // 4 s (3 notifications 2 s apart, the first at once) arrives at once.
    let sent = Instant::now();
    let (c, _) = call_with(&http, &proxy.url, &s, (3, 2000), Some(1)).unwrap();
    assert_eq!(c.progress, 1);
    assert!(
        sent.elapsed() < Duration::from_millis(1500),
        "the proxy held the stream back: first notification after {:?}",
        sent.elapsed()
    );

    let other = random_session_id();
    assert_eq!(get_status(&http, &proxy.url, Some(&other), None), Ok(404));
    assert_eq!(get_status(&http, &proxy.url, None, None), Ok(400));
    let resp = http
        .delete(&proxy.url)
        .header("Mcp-Session-Id", &s.id)
        .header("MCP-Protocol-Version", "2025-06-18")
        .send()
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(ping(&http, &proxy.url, &s), Ok(404));
    // initialize, initialized, call, 2 resumes, ping, call, 2 GETs,
    // DELETE, ping.
    assert_eq!(proxy.forwarded(), vec![11]);
}

/// The Redis harness: a server of our own that answers, and a restart on
/// the same port that loses everything.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn redis_harness_restarts_empty_on_the_same_port() {
    let mut redis = Redis::start();
    let port = redis.port;
    assert_eq!(redis_command(port, "SET rewind-test kept").unwrap(), "+OK");
    assert_eq!(redis_command(port, "GET rewind-test").unwrap(), "$4");
    redis.restart();
    assert_eq!(redis.port, port);
    assert_eq!(redis_command(port, "PING").unwrap(), "+PONG");
    assert_eq!(redis_command(port, "GET rewind-test").unwrap(), "$-1");
    drop(redis);
    assert!(
        redis_command(port, "PING").is_err(),
        "redis-server still answers after drop"
    );
}

// ---------------------------------------------------------------------------
// Cluster mode.

/// Sessions created on one node are called on a second and resumed on a
/// third, concurrently (so a foreign event would show): each resume
/// carries exactly the events after its cursor, then the result, then
/// ends. Then the same through the round-robin proxy.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn sessions_are_called_and_resumed_through_any_node() {
    let cluster = Cluster::start(3);
    let http = client();

    // (cut after, resume only once the call is over)
    let cases = [
        (0, false),
        (7, false),
        (COUNT - 1, false),
        (3, true),
        (COUNT, true),
    ];
    std::thread::scope(|scope| {
        let mut threads = Vec::new();
        for (i, (cut, late)) in cases.into_iter().enumerate() {
            let (cluster, http) = (&cluster, &http);
            threads.push(scope.spawn(move || -> Result<(), String> {
                let ctx = |e: String| format!("case {i} (cut after {cut}, late {late}): {e}");
                let s = initialize(http, cluster.node(i));
                let (mut c, _) = call(http, cluster.node(i + 1), &s, Some(cut)).map_err(ctx)?;
                if late {
                    std::thread::sleep(call_duration());
                }
                resume(http, cluster.node(i + 2), &mut c).map_err(ctx)?;
                // Every node, the one that ran the call included, replays
                // the whole call from its priming event.
                for n in 0..3 {
                    let mut again = c.rewound();
                    resume(http, cluster.node(i + n), &mut again).map_err(ctx)?;
                }
                // The session still answers everywhere.
                for n in 0..3 {
                    let status = ping(http, cluster.node(n), &s).map_err(ctx)?;
                    if status != 200 {
                        return Err(ctx(format!("ping on node {} answered {status}", n + 1)));
                    }
                }
                Ok(())
            }));
        }
        for t in threads {
            t.join().expect("case thread").unwrap();
        }
    });

    // Through the proxy: every request to the next node.
    let proxy = &cluster.proxy.url;
    for cut in [0, 10, COUNT] {
        let s = initialize(&http, proxy);
        let (mut c, called_on) = call(&http, proxy, &s, Some(cut)).unwrap();
        let resumed_on = resume(&http, proxy, &mut c).unwrap();
        assert_ne!(called_on, resumed_on, "the proxy sent both to one node");
        let mut again = c.rewound();
        resume(&http, proxy, &mut again).unwrap();
        // A call read to its end through the proxy, too.
        let (c, _) = call(&http, proxy, &s, None).unwrap();
        assert!(c.done);
    }
    let forwarded = cluster.proxy.forwarded();
    assert!(forwarded.iter().all(|&n| n >= 5), "{forwarded:?}");
}

/// Session A's id with session B's cursor is 409 on every node, whichever
/// node A, B and their calls were on.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn another_sessions_cursor_is_409_on_every_node() {
    let cluster = Cluster::start(3);
    let http = client();
    let a = initialize(&http, cluster.node(0));
    let b = initialize(&http, cluster.node(1));
    let (ca, _) = call(&http, cluster.node(1), &a, None).unwrap();
    let (cb, _) = call(&http, cluster.node(2), &b, None).unwrap();
    let priming_b = cb.priming.unwrap().to_string();
    for (name, url) in cluster.entry_points() {
        for (s, cursor) in [
            (&a, cb.cursor_text()),
            (&a, priming_b.as_str()),
            (&b, ca.cursor_text()),
        ] {
            assert_eq!(
                get_status(&http, url, Some(&s.id), Some(cursor)),
                Ok(409),
                "{name}: session {} with cursor {cursor}",
                s.id
            );
        }
        // Each with its own cursor: a resume (of nothing left), 200.
        assert_eq!(
            get_status(&http, url, Some(&a.id), Some(ca.cursor_text())),
            Ok(200),
            "{name}"
        );
    }
}

/// A session deleted through one node is gone on every node: 404 for
/// `POST`, for `GET` and for `GET` with a cursor.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn a_deleted_session_is_404_on_every_node() {
    let cluster = Cluster::start(3);
    let http = client();
    let s = initialize(&http, cluster.node(0));
    let (c, _) = call(&http, cluster.node(1), &s, None).unwrap();
    let resp = http
        .delete(cluster.node(2))
        .header("Mcp-Session-Id", &s.id)
        .header("MCP-Protocol-Version", "2025-06-18")
        .send()
        .unwrap();
    assert_eq!(resp.status(), 204, "DELETE on node 3");
    for (name, url) in cluster.entry_points() {
        assert_eq!(ping(&http, url, &s), Ok(404), "{name}: POST");
        assert_eq!(
            get_status(&http, url, Some(&s.id), None),
            Ok(404),
            "{name}: GET"
        );
        for cursor in [c.cursor_text().to_owned(), c.priming.unwrap().to_string()] {
            assert_eq!(
                get_status(&http, url, Some(&s.id), Some(&cursor)),
                Ok(404),
                "{name}: GET from {cursor}"
            );
        }
    }
}

/// An unknown session is 404 on every node (with or without a cursor); a
/// `GET` without a session id is 400.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn unknown_session_is_404_and_no_session_400_on_every_node() {
    let cluster = Cluster::start(3);
    let http = client();
    let s = initialize(&http, cluster.node(0));
    let (c, _) = call(&http, cluster.node(1), &s, Some(3)).unwrap();
    let unknown = random_session_id();
    for (name, url) in cluster.entry_points() {
        assert_eq!(
            get_status(&http, url, Some(&unknown), None),
            Ok(404),
            "{name}: unknown session"
        );
        assert_eq!(
            get_status(&http, url, Some(&unknown), Some(c.cursor_text())),
            Ok(404),
            "{name}: unknown session with a real cursor"
        );
        assert_eq!(
            get_status(&http, url, None, None),
            Ok(400),
            "{name}: no session"
        );
        assert_eq!(
            get_status(&http, url, None, Some(c.cursor_text())),
            Ok(400),
            "{name}: no session, a cursor"
        );
    }
}

/// Redis restarted without persistence: within 5 s every node answers the
/// old session and cursor 404 (never a replay), and a new session works
/// across nodes again.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn a_redis_restart_forgets_sessions_and_never_replays_them() {
    let mut cluster = Cluster::start(3);
    let http = client();
    let s = initialize(&http, cluster.node(0));
    let (c, _) = call(&http, cluster.node(1), &s, Some(5)).unwrap();
    let cursor = c.cursor_text().to_owned();
    // The cursor works before the restart.
    let mut before = c.clone();
    resume(&http, cluster.node(2), &mut before).unwrap();
    std::thread::sleep(call_duration());

    cluster.redis.restart();
    let restarted = Instant::now();
    let urls: Vec<(String, String)> = cluster
        .entry_points()
        .into_iter()
        .map(|(n, u)| (n, u.to_owned()))
        .collect();
    let mut last = Vec::new();
    let all_404 = poll(REDIS_LOSS_LIMIT, || {
        last = urls
            .iter()
            .map(|(name, url)| {
                let status = get_status(&http, url, Some(&s.id), Some(&cursor));
                assert_ne!(
                    status,
                    Ok(200),
                    "{name} answered the old session's resume 200 {:?} after Redis restarted",
                    restarted.elapsed()
                );
                (name.clone(), status)
            })
            .collect();
        last.iter().all(|(_, s)| *s == Ok(404)).then_some(())
    });
    assert!(
        all_404.is_some(),
        "not 404 everywhere {REDIS_LOSS_LIMIT:?} after Redis restarted: {last:?}"
    );
    // Stays so, a POST too.
    for (name, url) in &urls {
        assert_eq!(
            get_status(&http, url, Some(&s.id), Some(&cursor)),
            Ok(404),
            "{name}"
        );
        assert_eq!(ping(&http, url, &s), Ok(404), "{name}: POST");
    }

    // A new session works again, across nodes and through the proxy.
    for i in 0..3 {
        let s = poll(REDIS_LOSS_LIMIT, || {
            try_initialize(&http, cluster.node(i)).ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "initialize on node {} failed {REDIS_LOSS_LIMIT:?} after Redis restarted: {:?}",
                i + 1,
                try_initialize(&http, cluster.node(i)).err()
            )
        });
        let (mut c, _) = call(&http, cluster.node(i + 1), &s, Some(4)).unwrap();
        resume(&http, cluster.node(i + 2), &mut c).unwrap();
    }
    let proxy = &cluster.proxy.url;
    let s = initialize(&http, proxy);
    let (mut c, _) = call(&http, proxy, &s, Some(4)).unwrap();
    resume(&http, proxy, &mut c).unwrap();
}

/// A node SIGKILLed while calls stream: once its heartbeat expired, every
/// session resumes through the surviving nodes. A session the dead node
/// owned is taken over: its resume carries every event after the cursor
/// that Redis held, exactly once and in order, then the takeover's error
/// for the call (or opens with an explicit `reset` when the cursor's event
/// was lost with the node); a session a surviving node owns, whose stream
/// went through the dead node or not, resumes to its result. Every session
/// then answers `ping` and runs a new call on both surviving nodes, and
/// the survivors count the takeovers.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn a_killed_nodes_sessions_resume_through_the_others() {
    /// Long calls: still running on the survivors when the heartbeat expires.
    const CALL: (u32, u64) = (300, 20);
    // (name, node answering `initialize`, node the call is posted to
    // (`None`: through the round-robin proxy), progress read before the cut)
    let cases: [(&str, Option<usize>, Option<usize>, u32); 7] = [
        ("owner killed, call on the owner", Some(0), Some(0), 10),
        ("owner killed, call forwarded", Some(0), Some(1), 10),
        ("owner killed, cut at priming", Some(0), Some(2), 0),
        ("owner killed, resumed twice at once", Some(0), Some(0), 25),
        ("forwarding node killed", Some(1), Some(0), 10),
        ("owner and stream elsewhere", Some(2), Some(2), 10),
        ("through the proxy", None, None, 10),
    ];
    let mut cluster = Cluster::start(3);
    let http = client();
    let port = cluster.redis.port;
    let owner_of = |s: &Session| owner_in_redis(port, s);

    let set_up = Instant::now();
    let mut calls = Vec::new();
    for &(name, init_on, call_on, cut) in &cases {
        let at = |on: Option<usize>| on.map_or(cluster.proxy.url.as_str(), |i| cluster.node(i));
        let s = initialize(&http, at(init_on));
        let (c, _) = call_with(&http, at(call_on), &s, CALL, Some(cut))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(c.progress, cut, "{name}");
        let owner = owner_of(&s);
        if let Some(i) = init_on {
            assert_eq!(usize::from(owner), i + 1, "{}: the record's owner", name);
        }
        calls.push((c, owner));
    }

    // SIGKILL node 1 while every call still runs.
    assert!(
        set_up.elapsed() < Duration::from_millis(u64::from(CALL.0) * CALL.1 / 2),
        "the calls took {:?} to set up: the first may be over",
        set_up.elapsed()
    );
    let killed = Instant::now();
    cluster.nodes[0].child.kill().expect("SIGKILL node 1");
    cluster.nodes[0].child.wait().expect("node 1 exits");
    let expired = poll(OWNER_LOSS_LIMIT, || {
        (redis_command(port, "EXISTS rewind:node:1").ok()? == ":0").then_some(())
    });
    assert!(
        expired.is_some(),
        "node 1's heartbeat key still exists {OWNER_LOSS_LIMIT:?} after SIGKILL"
    );
    eprintln!(
        "node 1's heartbeat expired {:?} after SIGKILL",
        killed.elapsed()
    );

    // Resume every session at once through the survivors; one of them
    // twice at once, once on each survivor (both race to take it over).
    let survivors = [cluster.node(1).to_owned(), cluster.node(2).to_owned()];
    let jobs: Vec<(usize, usize)> = cases
        .iter()
        .enumerate()
        .flat_map(|(i, (name, ..))| {
            let times = if name.contains("twice") { 2 } else { 1 };
            (0..times).map(move |k| (i, k))
        })
        .collect();
    let mut endings: Vec<Vec<(Ending, Call)>> = cases.iter().map(|_| Vec::new()).collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = jobs
            .iter()
            .map(|&(i, k)| {
                let (http, url, name) = (&http, &survivors[(i + k) % 2], cases[i].0);
                let mut c = calls[i].0.clone();
                scope.spawn(move || {
                    let ending = resume_after_loss(http, url, &mut c)
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    (i, ending, c)
                })
            })
            .collect();
        for t in threads {
            let (i, ending, c) = t.join().expect("resume thread");
            endings[i].push((ending, c));
        }
    });

    let mut taken_over = 0;
    for ((&(name, ..), (c, owner)), resumes) in cases.iter().zip(&calls).zip(&endings) {
        let dead_owner = *owner == 1;
        for (ending, resumed) in resumes {
            eprintln!(
                "{name}: owner node {owner}, cut after {}: {ending:?} after {} progress",
                c.progress, resumed.progress
            );
            if dead_owner {
                assert_ne!(
                    *ending,
                    Ending::Result,
                    "{name}: a call whose node died was answered; {}",
                    resumed.evidence()
                );
            } else {
                assert_eq!(
                    (*ending, resumed.progress),
                    (Ending::Result, CALL.0),
                    "{name}: the owner lives; {}",
                    resumed.evidence()
                );
            }
        }
        if let [(a, ca), (b, cb)] = resumes.as_slice() {
            // Two resumes from one cursor deliver the same.
            if (*a, *b) == (Ending::Lost, Ending::Lost) {
                assert_eq!(ca.log, cb.log, "{name}: the two resumes differ");
            }
        }
        if dead_owner {
            taken_over += 1;
            let now = owner_of(&c.session);
            assert!(
                now == 2 || now == 3,
                "{name}: owner after the takeover: {now}"
            );
        }
        // A `Lost` call replays the same from its priming event, everywhere.
        if let Some((Ending::Lost, resumed)) = resumes.first() {
            for url in &survivors {
                let mut again = c.rewound();
                assert_eq!(
                    resume_after_loss(&http, url, &mut again),
                    Ok(Ending::Lost),
                    "{name}: replay of the whole call"
                );
                assert_eq!(
                    again.progress,
                    resumed.progress,
                    "{name}: {}",
                    again.evidence()
                );
            }
        }
        // The session goes on: `ping` and a new call on both survivors.
        for url in &survivors {
            assert_eq!(
                ping(&http, url, &c.session),
                Ok(200),
                "{name}: ping on {url}"
            );
            let (done, _) = call_with(&http, url, &c.session, (5, 5), None)
                .unwrap_or_else(|e| panic!("{name}: a new call on {url}: {e}"));
            assert!(done.done, "{name}");
        }
    }
    assert!(
        taken_over >= 3,
        "only {taken_over} sessions were owned by node 1"
    );

    let counted: f64 = cluster.nodes[1..]
        .iter()
        .map(|n| n.counter(&http, "rewind_cluster_takeovers").unwrap())
        .sum();
    assert!(
        counted >= 1.0,
        "rewind_cluster_takeovers on nodes 2 and 3: {counted}"
    );
    assert_eq!(
        counted,
        f64::from(taken_over),
        "rewind_cluster_takeovers on nodes 2 and 3 against the sessions node 1 owned"
    );
}

/// Sends `signal` (`-STOP`, `-CONT`) to `node`'s process.
fn signal(node: &Node, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &node.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {}: {status}", node.name);
}

/// The owner node recorded for session `s` in Redis on `port`.
fn owner_in_redis(port: u16, s: &Session) -> u16 {
    let owner = redis_bulk(port, &format!("HGET rewind:s:{{{}}} owner", s.id))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no record of session {} in Redis", s.id));
    owner
        .parse()
        .unwrap_or_else(|e| panic!("owner {owner:?}: {e}"))
}

/// A node paused (SIGSTOP) mid-call for longer than its heartbeat lives:
/// another node takes its session over. When the paused node runs again,
/// its call goes on producing progress — but its copy of the session is
/// no longer the session: the node must end it when Redis refuses its
/// next copy, so nothing it appends after the takeover reaches a client
/// (no split brain), and the session is served from the new owner by both
/// nodes.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn a_paused_owner_that_runs_again_after_a_takeover_ends_its_copy() {
    /// Long enough to be running still when node 1 wakes (6 s).
    const CALL: (u32, u64) = (300, 20);
    let cluster = Cluster::start(2);
    let http = client();
    let port = cluster.redis.port;
    let s = initialize(&http, cluster.node(0));
    let (c, _) = call_with(&http, cluster.node(0), &s, CALL, Some(10))
        .unwrap_or_else(|e| panic!("the call: {e}"));
    assert_eq!(owner_in_redis(port, &s), 1);
    let live = |node: usize| cluster.nodes[node].counter(&http, "rewind_sessions_live");
    assert_eq!(live(0), Ok(1.0), "node 1 holds the session");

    signal(&cluster.nodes[0], "-STOP");
    let paused = Instant::now();
    let expired = poll(OWNER_LOSS_LIMIT, || {
        (redis_command(port, "EXISTS rewind:node:1").ok()? == ":0").then_some(())
    });
    assert!(
        expired.is_some(),
        "node 1's heartbeat key still exists {OWNER_LOSS_LIMIT:?} after SIGSTOP"
    );
    // Node 2 takes the session over on the resume: whatever Redis held
    // after the cursor, then the takeover's error (or a reset).
    let mut taken = c.clone();
    let ending = resume_after_loss(&http, cluster.node(1), &mut taken)
        .unwrap_or_else(|e| panic!("the resume on node 2: {e}"));
    eprintln!(
        "node 2's resume after {:?} of pause: {ending:?} after {} progress",
        paused.elapsed(),
        taken.progress
    );
    assert_ne!(ending, Ending::Result, "{}", taken.evidence());
    assert_eq!(owner_in_redis(port, &s), 2, "node 2 took the session over");
    assert!(
        paused.elapsed() < Duration::from_millis(u64::from(CALL.0) * CALL.1),
        "node 1 was paused {:?}: its call would be over when it wakes",
        paused.elapsed()
    );

    signal(&cluster.nodes[0], "-CONT");
    // Its call appends again, its next copy into Redis is refused, and it
    // ends its copy of the session.
    let woke = Instant::now();
    let ended = poll(Duration::from_secs(10), || {
        (live(0).ok()? == 0.0).then_some(())
    });
    eprintln!("node 1 ended its copy {:?} after it woke", woke.elapsed());
    assert!(
        ended.is_some(),
        "node 1 still holds the session 10 s after it woke: {:?}; its log:\n{}",
        live(0),
        cluster.nodes[0].log.tail(20)
    );
    let log = std::fs::read_to_string(&cluster.nodes[0].log.path).unwrap_or_default();
    assert!(
        log.contains("owned elsewhere now; ending it here"),
        "node 1 ended the session another way; its log:\n{}",
        cluster.nodes[0].log.tail(20)
    );
    // Nothing node 1 appended after the takeover reached Redis: resuming
    // from the same cursor, on either node, delivers exactly what node 2's
    // resume did.
    for i in [1, 0] {
        let mut again = c.clone();
        let ending_again = resume_after_loss(&http, cluster.node(i), &mut again)
            .unwrap_or_else(|e| panic!("the resume on node {}: {e}", i + 1));
        assert_eq!(ending_again, ending, "node {}: {}", i + 1, again.evidence());
        assert_eq!(again.log, taken.log, "node {}: {}", i + 1, again.evidence());
    }
    assert_eq!(owner_in_redis(port, &s), 2);
    // The session goes on, from its new owner, through both nodes.
    for i in [0, 1] {
        assert_eq!(
            ping(&http, cluster.node(i), &s),
            Ok(200),
            "ping on node {}",
            i + 1
        );
        let (done, _) = call_with(&http, cluster.node(i), &s, (5, 5), None)
            .unwrap_or_else(|e| panic!("a new call on node {}: {e}", i + 1));
        assert!(done.done, "{}", done.evidence());
    }
    assert_eq!(live(0), Ok(0.0), "node 1 forwards, it holds nothing");
}

/// Redis unreachable: the owner goes on serving its sessions (calls
/// included), another node answers their requests with a clear 503, and
/// `rewind_cluster_redis_up` says so until Redis answers again.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn with_redis_unreachable_local_sessions_go_on_and_other_nodes_answer_503() {
    let mut cluster = Cluster::start(2);
    let http = client();
    let s = initialize(&http, cluster.node(0));
    assert_eq!(ping(&http, cluster.node(1), &s), Ok(200), "forwarded ping");
    let up = |node: usize| cluster.nodes[node].counter(&http, "rewind_cluster_redis_up");
    assert_eq!(up(0), Ok(1.0));

    cluster.redis.kill();
    // The owner: its session works as before, calls included.
    assert_eq!(ping(&http, cluster.node(0), &s), Ok(200), "local ping");
    let (c, _) = call(&http, cluster.node(0), &s, None).unwrap();
    assert_eq!(c.progress, COUNT, "{}", c.evidence());
    // Another node: a clear refusal, for POST and GET alike.
    let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
    let resp = post(
        &http,
        cluster.node(1),
        Some(&s.id),
        &json!({"jsonrpc":"2.0","id":id,"method":"ping"}),
    )
    .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let body = resp.text().unwrap();
    assert!(body.contains("Redis is unreachable"), "{body}");
    assert_eq!(
        get_status(&http, cluster.node(1), Some(&s.id), None),
        Ok(503)
    );
    let down = poll(Duration::from_secs(5), || (up(0) == Ok(0.0)).then_some(()));
    assert!(down.is_some(), "redis_up on node 1: {:?}", up(0));

    // Back (empty: this one has no persistence): every node sees it.
    cluster.redis.restart();
    for node in 0..2 {
        let back = poll(Duration::from_secs(10), || {
            (up(node) == Ok(1.0)).then_some(())
        });
        assert!(
            back.is_some(),
            "redis_up on node {}: {:?}",
            node + 1,
            up(node)
        );
    }
}

/// The first SSE frame of a `GET` with `cursor`, after its status.
fn first_frame(
    http: &reqwest::blocking::Client,
    url: &str,
    session: &str,
    cursor: &str,
) -> Result<(u16, Option<Frame>), String> {
    let resp = http
        .get(url)
        .header("Accept", "text/event-stream")
        .header("MCP-Protocol-Version", "2025-06-18")
        .header("Mcp-Session-Id", session)
        .header("Last-Event-ID", cursor)
        .timeout(Duration::from_secs(10))
        .send()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status().as_u16();
    let mut first = None;
    frames(resp, |f| {
        first = Some(f);
        Ok(false)
    })?
    .map_err(|e| format!("GET {url}: {e}"))?;
    Ok((status, first))
}

/// A cursor with this session's tag, epoch and a number Redis holds, but
/// naming another node than the one that appended the event Redis holds
/// there — a history that was not carried over, as a node that died after
/// delivering an event it never copied leaves behind: every node answers
/// with a fresh stream opening with `reset`, never a replay; the true
/// cursor resumes.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn a_cursor_from_a_history_redis_does_not_hold_gets_reset_on_every_node() {
    let cluster = Cluster::start(3);
    let http = client();
    let s = initialize(&http, cluster.node(0));
    let (c, _) = call(&http, cluster.node(0), &s, None).unwrap();
    let real = rewind_engine::EventId::parse(c.cursor_text()).unwrap();
    let lost = rewind_engine::EventId { node: 3, ..real };
    assert_ne!(real.node, lost.node);
    let lost = lost.to_string();
    for (name, url) in cluster.entry_points() {
        let (status, first) = first_frame(&http, url, &s.id, &lost).unwrap();
        assert_eq!(status, 200, "{name}");
        let first = first.unwrap_or_else(|| panic!("{name}: no frame"));
        assert_eq!(first.event.as_deref(), Some("reset"), "{name}: {first:?}");
        let (status, first) = first_frame(&http, url, &s.id, c.cursor_text()).unwrap();
        assert_eq!(status, 200, "{name}");
        assert_ne!(
            first.and_then(|f| f.event).as_deref(),
            Some("reset"),
            "{name}: the true cursor"
        );
    }
}

/// The strict policy (which refuses a resume whose cursor age is unknown)
/// on every node: a call cut on its owner resumes through another node,
/// every event once and then the result — the age of a cursor served from
/// Redis is known.
#[test]
#[ignore = "needs redis-server: .ci/cluster.sh runs them"]
fn the_strict_policy_resumes_through_another_node() {
    let dir = std::env::temp_dir().join(format!("rewind-strict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let strict = dir.join("strict.wasm");
    let out = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["policy", "export", "strict", "-o"])
        .arg(&strict)
        .output()
        .expect("rewind policy export");
    assert!(out.status.success(), "{out:?}");
    let redis = Redis::start();
    let policy = ["--policy".to_owned(), strict.display().to_string()];
    let nodes = start_nodes(&redis, 2, "strict node", &policy);
    let http = client();
    let s = initialize(&http, &nodes[0].url);
    let (mut c, _) = call(&http, &nodes[0].url, &s, Some(3)).unwrap();
    resume(&http, &nodes[1].url, &mut c).unwrap();
    assert!(c.done, "{}", c.evidence());
    assert_eq!(c.progress, COUNT, "{}", c.evidence());
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}
