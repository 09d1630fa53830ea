//! `rewind serve --data-dir` SIGKILLed at random moments and restarted on
//! the same directory, 50+ times, with several MCP sessions streaming
//! `progress_stream` calls: every session resumes each of its streams with
//! `GET` + `Last-Event-ID` (the last event it received) and gets either
//! every event after that cursor exactly once and in order — nothing
//! foreign, torn or duplicated — and then the end of the stream, or an
//! explicit answer of the decision table (`gap`/`reset`, 404); never a
//! hang. The MCP session itself survives: its next `POST` works without
//! `initialize`, and so does a `GET` without `Last-Event-ID`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rewind_engine::EventId;
use serde_json::{json, Value};

const SESSIONS: usize = 3;
/// Kills per run; `REWIND_RESTART_ITERATIONS` asks for more (a soak).
const ITERATIONS: usize = 55;
const COUNT: u32 = 60;
const INTERVAL_MS: u64 = 4;
/// Longest a resume may take to end (the call it resumes is not running
/// any more, so its stream must end once the stored events are out).
const RESUME_LIMIT: Duration = Duration::from_secs(10);

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn kill(mut self) {
        // `Child::kill` is SIGKILL on Unix.
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

/// SIGKILLs the server while readers still borrow it (it is reaped by
/// [`Server::kill`] or its drop afterwards).
fn sigkill(server: &Server) {
    let status = Command::new("kill")
        .args(["-KILL", &server.child.id().to_string()])
        .status()
        .expect("kill -KILL");
    assert!(status.success(), "kill -KILL {}", server.child.id());
}

fn command(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rewind"));
    for (k, _) in std::env::vars() {
        if k.starts_with("REWIND_") {
            c.env_remove(k);
        }
    }
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .args(["--global-bytes", "8388608", "--max-event-bytes", "65536"])
    .arg("--data-dir")
    .arg(dir)
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    c
}

/// Spawns the server and a thread reading its stdout.
fn spawn(dir: &Path) -> (Child, mpsc::Receiver<String>) {
    let mut child = command(dir).spawn().expect("spawn rewind serve");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        // Drains stdout to the end even when nobody listens any more: a
        // closed pipe would kill the server at its next line.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

fn start(dir: &Path) -> Server {
    let (child, rx) = spawn(dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("rewind serve did not start; printed {seen:?}"));
        if let Some(url) = line.strip_prefix("rewind: MCP endpoint") {
            let url = url.trim().to_owned();
            assert!(url.starts_with("http://127.0.0.1:"), "{url}");
            return Server { child, url };
        }
        seen.push(line);
    }
}

/// A small deterministic generator (xorshift), seeded per run and printed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// One SSE frame as the client saw it complete (a frame cut by the kill
/// before its blank line is never dispatched, as an `EventSource` does).
#[derive(Debug, Default, Clone)]
struct Frame {
    id: Option<String>,
    event: Option<String>,
    data: Option<String>,
}

/// Reads frames until the body ends (`Ok`) or the connection fails
/// (`Err`), handing each to `on` (which returns `false` to stop early).
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
            Ok(_) if !line.ends_with('\n') => return Ok(Ok(())), // torn tail
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

/// A client-side MCP session.
#[derive(Debug)]
struct Session {
    index: usize,
    id: String,
    tag: u64,
    epoch: u64,
    call: Option<Arc<Mutex<Call>>>,
}

/// One `progress_stream` call and everything its stream delivered.
#[derive(Debug)]
struct Call {
    session: usize,
    tag: u64,
    epoch: u64,
    request: u64,
    token: String,
    /// The stream's id and the last event received (the priming event
    /// until a real one arrives): the client's `Last-Event-ID`.
    cursor: Option<EventId>,
    progress: u32,
    done: bool,
    /// The call ended with the restart's error, not its result.
    failed: bool,
    /// Every event received, in order (id, payload): the evidence.
    log: Vec<(String, String)>,
}

impl Call {
    fn evidence(&self) -> String {
        let tail: Vec<_> = self.log.iter().rev().take(6).rev().collect();
        format!(
            "session {} call {} (token {}): cursor {:?}, progress {}, done {}, last events {:?}",
            self.session,
            self.request,
            self.token,
            self.cursor.map(|c| c.to_string()),
            self.progress,
            self.done,
            tail
        )
    }

    /// Takes one event of the call's stream, or says why it is wrong.
    fn accept(&mut self, f: &Frame, resumed: bool) -> Result<(), String> {
        let raw = f.id.clone().unwrap_or_default();
        let id = EventId::parse(&raw)
            .map_err(|e| format!("event id {raw:?} does not parse ({e}); {}", self.evidence()))?;
        if id.tag != self.tag || id.epoch != self.epoch {
            return Err(format!(
                "foreign event id {raw} (tag {:x} epoch {}), expected tag {:x} epoch {}; {}",
                id.tag,
                id.epoch,
                self.tag,
                self.epoch,
                self.evidence()
            ));
        }
        let data = f.data.clone().unwrap_or_default();
        let Some(cursor) = self.cursor else {
            // The priming event of the POST: the stream's position.
            if resumed || !data.is_empty() {
                return Err(format!(
                    "stream began with {raw} {data:?}; {}",
                    self.evidence()
                ));
            }
            self.cursor = Some(id);
            return Ok(());
        };
        if id.stream != cursor.stream || id.seq <= cursor.seq {
            return Err(format!(
                "event {raw} is not after {cursor} on the same stream (duplicate or foreign): {data}; {}",
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
                "torn or invalid payload at {raw}: {data:?} ({e}); {}",
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
        } else if v["id"] == json!(self.request)
            && v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("server restarted"))
        {
            // The explicit answer to a call the restart cut short: only
            // ever on a resume, after the events stored before the kill.
            if !resumed {
                return Err(format!(
                    "restart error on a live stream: {data}; {}",
                    self.evidence()
                ));
            }
            self.done = true;
            self.failed = true;
        } else if v["id"] == json!(self.request) && v.get("result").is_some() {
            if self.progress != COUNT {
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
        self.cursor = Some(id);
        self.log.push((raw, data));
        Ok(())
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

static NEXT_REQUEST: AtomicU64 = AtomicU64::new(10);

fn initialize(http: &reqwest::blocking::Client, url: &str, index: usize) -> Session {
    let body = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"serve-restart-test","version":"1"}}});
    let resp = post(http, url, None, &body).expect("initialize");
    assert_eq!(resp.status(), 200, "initialize");
    let id = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut primed = None;
    let mut answered = false;
    frames(resp, |f| {
        match (&f.data, &f.id) {
            (Some(d), Some(i)) if d.is_empty() => primed = Some(EventId::parse(i).unwrap()),
            (Some(d), _) => {
                let v: Value = serde_json::from_str(d).unwrap();
                assert_eq!(v["result"]["protocolVersion"], "2025-06-18", "{d}");
                answered = true;
                return Ok(false);
            }
            _ => {}
        }
        Ok(true)
    })
    .unwrap()
    .unwrap();
    assert!(answered, "initialize was not answered");
    let primed = primed.expect("initialize primed its stream");
    let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    let resp = post(http, url, Some(&id), &initialized).expect("initialized");
    assert_eq!(resp.status(), 202);
    Session {
        index,
        id,
        tag: primed.tag,
        epoch: primed.epoch,
        call: None,
    }
}

/// Reads a call's stream, validating every event as it arrives. `Ok` when
/// the body ended; `Err` for a failed connection (expected once the
/// server is killed) is given back as `Ok(Err(..))`.
fn read_call(
    resp: reqwest::blocking::Response,
    call: &Mutex<Call>,
    resumed: bool,
    stop_after: Option<u32>,
) -> Result<Result<(), String>, String> {
    frames(resp, |f| {
        let mut c = call.lock().unwrap();
        if let Some(kind) = &f.event {
            return Err(format!(
                "unexpected `{kind}` event inside a stream: {f:?}; {}",
                c.evidence()
            ));
        }
        if f.id.is_none() {
            // The `retry:` opening of a resume.
            return Ok(true);
        }
        c.accept(&f, resumed)?;
        Ok(stop_after.is_none_or(|n| c.progress < n))
    })
}

#[derive(Debug, Default)]
struct Tally {
    restarts: usize,
    resumes: usize,
    replayed: usize,
    finished_on_resume: usize,
    answered_by_restart: usize,
    ended_without_answer: usize,
    explicit_signal: usize,
    not_found: usize,
    completed_live: usize,
    pings: usize,
}

/// What a resume answered, for the tally.
enum Resumed {
    /// 200 and events; whether the call ended (result or restart error)
    /// and whether it was the error.
    Replayed {
        events: u32,
        done: bool,
        failed: bool,
    },
    /// 200 starting with a `gap`/`reset` signal.
    Signal,
    /// 404.
    NotFound,
    /// The connection failed (only once the server was killed).
    Cut,
}

fn resume(
    http: &reqwest::blocking::Client,
    url: &str,
    session: &str,
    call: &Mutex<Call>,
    killed: &AtomicBool,
) -> Result<Resumed, String> {
    let cursor = call.lock().unwrap().cursor.expect("cursor");
    let before = call.lock().unwrap().progress;
    let started = Instant::now();
    let sent = http
        .get(url)
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", session)
        .header("MCP-Protocol-Version", "2025-06-18")
        .header("Last-Event-ID", cursor.to_string())
        .timeout(RESUME_LIMIT)
        .send();
    let resp = match sent {
        Ok(r) => r,
        Err(_) if killed.load(Ordering::SeqCst) => return Ok(Resumed::Cut),
        Err(e) => return Err(format!("resume from {cursor} failed: {e:?}")),
    };
    match resp.status().as_u16() {
        200 => {}
        404 => return Ok(Resumed::NotFound),
        other => {
            let body = resp.text().unwrap_or_default();
            return Err(format!(
                "resume from {cursor} answered {other} {body}; {}",
                call.lock().unwrap().evidence()
            ));
        }
    }
    let mut signal = None;
    let mut first = true;
    let result = frames(resp, |f| {
        if first && f.id.is_none() && f.event.is_none() {
            return Ok(true); // retry:
        }
        if first {
            first = false;
            if let Some(kind) = &f.event {
                if kind == "gap" || kind == "reset" {
                    signal = Some(kind.clone());
                    return Ok(false);
                }
            }
        }
        let mut c = call.lock().unwrap();
        if f.event.is_some() || f.id.is_none() {
            return Err(format!(
                "unexpected frame {f:?} in a resume; {}",
                c.evidence()
            ));
        }
        c.accept(&f, true)?;
        Ok(true)
    })?;
    if signal.is_some() {
        return Ok(Resumed::Signal);
    }
    if let Err(e) = result {
        if killed.load(Ordering::SeqCst) {
            return Ok(Resumed::Cut);
        }
        return Err(format!(
            "resume from {cursor} did not end in {:?} ({e}): a hang; {}",
            started.elapsed(),
            call.lock().unwrap().evidence()
        ));
    }
    let c = call.lock().unwrap();
    Ok(Resumed::Replayed {
        events: c.progress - before + u32::from(c.done),
        done: c.done,
        failed: c.failed,
    })
}

fn ping(http: &reqwest::blocking::Client, url: &str, s: &Session) -> Result<bool, String> {
    let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
    let resp = post(
        http,
        url,
        Some(&s.id),
        &json!({"jsonrpc":"2.0","id":id,"method":"ping"}),
    )
    .map_err(|e| format!("ping on session {}: {e}", s.index))?;
    match resp.status().as_u16() {
        200 => {}
        404 => return Ok(false),
        other => return Err(format!("ping on session {} answered {other}", s.index)),
    }
    let mut answered = false;
    let json_body = resp
        .headers()
        .get("content-type")
        .is_some_and(|c| c.as_bytes().starts_with(b"application/json"));
    if json_body {
        let v: Value = resp.json().map_err(|e| e.to_string())?;
        if v["id"] == json!(id) && v["result"] == json!({}) {
            return Ok(true);
        }
        return Err(format!("ping on session {} got {v}", s.index));
    }
    frames(resp, |f| {
        if let Some(d) = f.data.as_deref().filter(|d| !d.is_empty()) {
            let v: Value = serde_json::from_str(d).map_err(|e| e.to_string())?;
            if v["id"] == json!(id) && v["result"] == json!({}) {
                answered = true;
                return Ok(false);
            }
            return Err(format!("ping on session {} got {d}", s.index));
        }
        Ok(true)
    })?
    .map_err(|e| format!("ping on session {}: {e}", s.index))?;
    if !answered {
        return Err(format!("ping on session {} was not answered", s.index));
    }
    Ok(true)
}

/// A `GET` without `Last-Event-ID` opens the standalone stream of the
/// restored session: 200 and a priming event of that session.
fn standalone(http: &reqwest::blocking::Client, url: &str, s: &Session) -> Result<(), String> {
    let resp = http
        .get(url)
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", &s.id)
        .header("MCP-Protocol-Version", "2025-06-18")
        .send()
        .map_err(|e| format!("standalone GET on session {}: {e}", s.index))?;
    if resp.status() != 200 {
        return Err(format!(
            "standalone GET on session {} answered {}",
            s.index,
            resp.status()
        ));
    }
    let mut primed = None;
    frames(resp, |f| {
        primed = f.id.clone();
        Ok(primed.is_none())
    })?
    .map_err(|e| format!("standalone GET on session {}: {e}", s.index))?;
    let id = primed.ok_or_else(|| format!("standalone GET on session {}: no priming", s.index))?;
    let id = EventId::parse(&id).map_err(|e| e.to_string())?;
    if id.tag != s.tag || id.stream != 0 {
        return Err(format!(
            "standalone GET on session {} primed with {id}",
            s.index
        ));
    }
    Ok(())
}

#[test]
fn sessions_resume_exactly_or_explicitly_across_sigkill_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::env::var("REWIND_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("serve_restart seed {seed} (REWIND_TEST_SEED reruns it)");
    let mut rng = Rng(seed);
    let http = client();
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut sessions: Vec<Option<Session>> = (0..SESSIONS).map(|_| None).collect();
    let mut restored_once = false;

    let iterations = std::env::var("REWIND_RESTART_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ITERATIONS)
        .max(ITERATIONS);
    // A soak may take longer than the default run's budget.
    let budget = Duration::from_secs(170 * iterations.div_ceil(ITERATIONS) as u64);
    for iteration in 0..iterations {
        let ctx = |e: String| format!("iteration {iteration} (seed {seed}): {e}");
        // Sometimes the kill lands while the server is starting (recovery).
        if iteration > 0 && rng.below(10) == 0 {
            let (mut child, _rx) = spawn(dir.path());
            std::thread::sleep(Duration::from_millis(rng.below(40)));
            child.kill().unwrap();
            child.wait().unwrap();
            tally.restarts += 1;
        }
        let server = start(dir.path());
        let url = server.url.clone();
        tally.restarts += 1;
        let killed = AtomicBool::new(false);
        let kill_in_resume = rng.below(6) == 0;

        // Resume every stream that was cut.
        let mut outcomes = Vec::new();
        std::thread::scope(|scope| {
            let mut readers = Vec::new();
            for s in sessions.iter().flatten() {
                let Some(call) = s.call.clone() else { continue };
                {
                    // A call killed before its priming event has no cursor:
                    // the client never learnt its stream, nothing to resume.
                    let c = call.lock().unwrap();
                    if c.done || c.cursor.is_none() {
                        continue;
                    }
                }
                let (http, url, id, killed) = (&http, &url, s.id.clone(), &killed);
                readers.push((
                    s.index,
                    scope.spawn(move || resume(http, url, &id, &call, killed)),
                ));
            }
            if kill_in_resume {
                std::thread::sleep(Duration::from_millis(rng.below(30)));
                killed.store(true, Ordering::SeqCst);
                sigkill(&server);
            }
            for (index, r) in readers {
                outcomes.push((index, r.join().expect("resume thread")));
            }
        });
        for (index, outcome) in outcomes {
            let s = sessions[index].as_mut().unwrap();
            match outcome.map_err(ctx).unwrap() {
                Resumed::Replayed {
                    events,
                    done,
                    failed,
                } => {
                    tally.resumes += 1;
                    tally.replayed += events as usize;
                    restored_once = true;
                    match (done, failed) {
                        (true, false) => tally.finished_on_resume += 1,
                        // The call died with the server: its stored events,
                        // then the restart's error for it, then the end.
                        (true, true) => tally.answered_by_restart += 1,
                        (false, _) => tally.ended_without_answer += 1,
                    }
                    if !kill_in_resume {
                        s.call = None;
                    }
                }
                Resumed::Signal => {
                    tally.explicit_signal += 1;
                    s.call = None;
                }
                Resumed::NotFound => {
                    tally.not_found += 1;
                    sessions[index] = None;
                }
                Resumed::Cut => {}
            }
        }
        if kill_in_resume {
            server.kill();
            continue;
        }

        // The restored sessions answer a POST without re-initialising, and
        // a GET without Last-Event-ID.
        for slot in sessions.iter_mut() {
            let Some(s) = slot else { continue };
            match ping(&http, &url, s).map_err(ctx).unwrap() {
                true => tally.pings += 1,
                false => {
                    tally.not_found += 1;
                    *slot = None;
                }
            }
        }
        if let Some(s) = sessions.iter().flatten().next() {
            standalone(&http, &url, s).map_err(ctx).unwrap();
        }
        for (i, slot) in sessions.iter_mut().enumerate() {
            if slot.is_none() {
                *slot = Some(initialize(&http, &url, i));
            }
        }

        // Stream to every session, and kill the server at a random moment.
        let mut calls = Vec::new();
        for s in sessions.iter_mut().flatten() {
            let request = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
            let call = Arc::new(Mutex::new(Call {
                session: s.index,
                tag: s.tag,
                epoch: s.epoch,
                request,
                token: format!("t{iteration}-{}", s.index),
                cursor: None,
                progress: 0,
                done: false,
                failed: false,
                log: Vec::new(),
            }));
            s.call = Some(call.clone());
            // Half the clients drop their connection part way (the call
            // goes on storing its events): the resume has more to replay.
            let stop_after = (rng.below(2) == 0).then(|| rng.below(u64::from(COUNT)) as u32);
            calls.push((s.id.clone(), call, stop_after));
        }
        let mut results = Vec::new();
        std::thread::scope(|scope| {
            let mut readers = Vec::new();
            for (id, call, stop_after) in &calls {
                let stop_after = *stop_after;
                let (http, url, killed) = (&http, &url, &killed);
                readers.push(scope.spawn(move || {
                    let (request, token) = {
                        let c = call.lock().unwrap();
                        (c.request, c.token.clone())
                    };
                    let body = json!({"jsonrpc":"2.0","id":request,"method":"tools/call","params":{
                        "name":"progress_stream",
                        "arguments":{"count":COUNT,"interval_ms":INTERVAL_MS},
                        "_meta":{"progressToken":token}}});
                    let resp = match post(http, url, Some(id), &body) {
                        Ok(r) => r,
                        Err(_) if killed.load(Ordering::SeqCst) => return Ok(()),
                        Err(e) => return Err(format!("tools/call: {e}")),
                    };
                    if resp.status() != 200 {
                        return Err(format!("tools/call answered {}", resp.status()));
                    }
                    match read_call(resp, call, false, stop_after)? {
                        Ok(()) => Ok(()),
                        Err(_) if killed.load(Ordering::SeqCst) => Ok(()),
                        Err(e) => Err(format!("tools/call stream failed: {e}")),
                    }
                }));
            }
            let at = rng.below(u64::from(COUNT) * INTERVAL_MS * 2);
            std::thread::sleep(Duration::from_millis(at));
            killed.store(true, Ordering::SeqCst);
            sigkill(&server);
            for r in readers {
                results.push(r.join().expect("call thread"));
            }
        });
        server.kill();
        for r in results {
            r.map_err(ctx).unwrap();
        }
        for (_, call, _) in &calls {
            if call.lock().unwrap().done {
                tally.completed_live += 1;
            }
        }
        assert!(
            started.elapsed() < budget,
            "too slow: {iteration} iterations in {:?}; {tally:?}",
            started.elapsed()
        );
    }

    // A last restart: every surviving session answers a POST.
    let server = start(dir.path());
    for s in sessions.iter().flatten() {
        for call in s.call.iter() {
            let killed = AtomicBool::new(false);
            if call.lock().unwrap().cursor.is_some() && !call.lock().unwrap().done {
                if let Resumed::Replayed { events, .. } =
                    resume(&http, &server.url, &s.id, call, &killed).unwrap()
                {
                    tally.resumes += 1;
                    tally.replayed += events as usize;
                }
            }
        }
        assert!(
            ping(&http, &server.url, s).unwrap(),
            "session {} lost",
            s.index
        );
    }
    drop(server);
    eprintln!("serve_restart: {tally:?} in {:?}", started.elapsed());
    assert!(
        restored_once && tally.resumes > 0,
        "no stream was ever resumed: {tally:?}"
    );
    assert!(
        tally.replayed >= iterations,
        "resumes replayed too little to prove anything: {tally:?}"
    );
    // The client had its session id only once `initialize` was answered,
    // and the parameters are stored before that answer: a process kill
    // never loses a session.
    assert_eq!(
        tally.not_found, 0,
        "sessions lost across restarts: {tally:?}"
    );
    // Every call the restart cut short was answered: its result, stored
    // before the kill, or the restart's error — never a silent end. (A
    // resume cut by a kill of its own is resumed again next time.)
    assert_eq!(
        tally.ended_without_answer, 0,
        "resumes that ended with neither result nor error: {tally:?}"
    );
    assert!(tally.answered_by_restart > 0, "{tally:?}");
}
