//! `rewind serve` as a real process: it prints where it listens, its admin
//! answers `rewind policy push/status/rollback`, a taken port is reported
//! clearly, and SIGTERM stops it within a bounded time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rewind_engine::policy::wasm::plugins::{self, fixtures};

struct Server {
    child: Child,
    mcp_url: String,
    admin_url: String,
    token: String,
    stdout: mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clean_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewind"));
    for (k, _) in std::env::vars() {
        if k.starts_with("REWIND_") {
            command.env_remove(k);
        }
    }
    command
}

fn start(args: &[&str]) -> Server {
    start_logging_to(args, Stdio::null())
}

/// [`start`], with the server's standard error (its logs) going to `stderr`.
fn start_logging_to(args: &[&str], stderr: impl Into<Stdio>) -> Server {
    start_with(clean_command(), args, stderr)
}

/// `command serve args`, once it has printed its URLs and token.
fn start_with(mut command: Command, args: &[&str], stderr: impl Into<Stdio>) -> Server {
    let mut child = command
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while lines.len() < 4 {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("rewind serve printed only {lines:?}"));
        lines.push(line);
    }
    let field = |prefix: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` in {lines:?}"))
            .trim()
            .to_owned()
    };
    let mcp_url = field("rewind: MCP endpoint");
    let admin_url = field("rewind: admin surface")
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let token = field("rewind: admin token");
    assert!(mcp_url.starts_with("http://127.0.0.1:") && mcp_url.ends_with("/mcp"));
    Server {
        child,
        mcp_url,
        admin_url,
        token,
        stdout: rx,
    }
}

fn policy(args: &[&str], server: &Server) -> Output {
    clean_command()
        .arg("policy")
        .args(args)
        .args(["--admin", &server.admin_url])
        .env("REWIND_ADMIN_TOKEN", &server.token)
        .output()
        .unwrap()
}

fn write_temp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rewind-cli-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Sends one raw HTTP/1.1 request to `url`'s host and returns the
/// connection and the response head (status line and headers).
fn raw_request(url: &str, request: impl FnOnce(&str) -> String) -> (TcpStream, String) {
    let authority = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let mut stream = TcpStream::connect(&authority).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request(&authority).as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).unwrap(),
            1,
            "connection closed in the head"
        );
        head.push(byte[0]);
    }
    (stream, String::from_utf8(head).unwrap())
}

/// `initialize` over raw HTTP; returns the session id.
fn initialize(mcp_url: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"cli-serve-test","version":"1"}}}"#;
    let (_stream, head) = raw_request(mcp_url, |host| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    });
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("mcp-session-id:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session id in {head}"))
}

/// Sends SIGTERM to the server and waits (at most 20 s) for it to exit.
fn sigterm(server: &mut Server) -> std::process::ExitStatus {
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    exit_status_after_sigterm(server)
}

/// Waits (up to 20 s) for a server that was sent SIGTERM to exit.
fn exit_status_after_sigterm(server: &mut Server) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "still running 20 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `rewind serve` with `args` and the variables `env`, which must make
/// it refuse to start; returns what it said on stderr. A server that starts
/// anyway is killed after 60 s and fails the test (rather than hanging it).
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = clean_command()
        .arg("serve")
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("rewind serve {args:?} started: {}", text(&out.stdout));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out.stdout));
    text(&out.stderr)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn serve_prints_its_urls_and_answers_policy_commands() {
    let server = start(&["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
    assert_eq!(server.token.len(), 32);
    assert!(server.token.bytes().all(|b| b.is_ascii_hexdigit()));

    // The printed MCP URL serves MCP.
    let _session = initialize(&server.mcp_url);

    let status = policy(&["status"], &server);
    assert!(status.status.success(), "{}", text(&status.stderr));
    assert!(text(&status.stdout).contains("live: generation 1 `default`"));

    let file = write_temp("status-400.wasm", plugins::STATUS_400);
    let push = policy(&["push", file.to_str().unwrap()], &server);
    assert!(push.status.success(), "{}", text(&push.stderr));
    assert!(
        text(&push.stdout).contains("`status-400`") && text(&push.stdout).contains("generation 2"),
        "{}",
        text(&push.stdout)
    );

    let trap = write_temp("trap.wasm", fixtures::TRAP);
    let refused = policy(&["push", trap.to_str().unwrap()], &server);
    assert!(!refused.status.success());
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("422") && stderr.contains("unreachable"),
        "{stderr}"
    );

    let wrong_token = clean_command()
        .args([
            "policy",
            "status",
            "--admin",
            &server.admin_url,
            "--token",
            "nope",
        ])
        .output()
        .unwrap();
    assert!(!wrong_token.status.success());
    assert!(text(&wrong_token.stderr).contains("401"));

    let rollback = policy(&["rollback"], &server);
    assert!(rollback.status.success(), "{}", text(&rollback.stderr));
    assert!(text(&rollback.stdout).contains("generation 1"));
    let status = policy(&["status"], &server);
    let listing = text(&status.stdout);
    assert!(
        listing.contains("live: generation 1 `default`"),
        "{listing}"
    );
    assert!(
        listing.contains("status-400") && listing.contains("rolled_back"),
        "{listing}"
    );
    // The default, status-400 and the trap all compiled (the trap failed
    // validation, which is the swap's, not the load's).
    assert!(
        listing.contains("loads: 3 loaded, 0 refused, 0 compiler failures ("),
        "{listing}"
    );
}

#[test]
fn a_taken_port_is_reported_clearly() {
    let first = start(&["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
    let taken = first
        .mcp_url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let stderr = refused_start(&["--listen", &taken, "--admin-listen", "127.0.0.1:0"], &[]);
    assert!(
        stderr.contains(&format!("cannot listen on {taken}"))
            && stderr.contains("already in use")
            && stderr.contains("--listen"),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_cluster_redis_is_reported_clearly() {
    // A loopback port nothing listens on (bound, then released).
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("redis://{free}");
    let started = std::time::Instant::now();
    let stderr = refused_start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--cluster",
            &url,
        ],
        &[],
    );
    assert!(
        stderr.contains("cannot reach the cluster's Redis") && stderr.contains(&url),
        "{stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "gave up only after {:?}",
        started.elapsed()
    );
}

#[cfg(unix)]
#[test]
fn sigterm_stops_the_server_promptly() {
    let mut server = start(&["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
    // An SSE stream open when the signal arrives must end, not hold the
    // process up.
    let session = initialize(&server.mcp_url);
    let (_open_stream, head) = raw_request(&server.mcp_url, |host| {
        format!(
            "GET /mcp HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\
             Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n\r\n"
        )
    });
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let status = sigterm(&mut server);
    assert!(status.success(), "{status:?}");
    let rest: Vec<String> = server.stdout.try_iter().collect();
    assert!(rest.iter().any(|l| l == "rewind: stopped"), "{rest:?}");
}

/// A SIGTERM sent the moment the server has printed its URLs (an
/// orchestrator that saw it ready and stops it at once) is a graceful stop,
/// not the default action's kill.
#[cfg(target_os = "linux")]
#[test]
fn sigterm_right_after_the_urls_stops_the_server_gracefully() {
    for _ in 0..5 {
        let mut server = start(&["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
        let pid = i32::try_from(server.child.id()).unwrap();
        // SAFETY: `kill` takes no pointers; `pid` is our child, not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = exit_status_after_sigterm(&mut server);
        assert!(status.success(), "{status:?}");
    }
}

/// Sends a JSON-RPC `body` on `session` and returns the response head.
fn post(mcp_url: &str, session: &str, body: &str) -> String {
    let (_stream, head) = raw_request(mcp_url, |host| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
             Content-Type: application/json\r\nMcp-Session-Id: {session}\r\n\
             MCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    });
    head
}

#[test]
fn json_logs_carry_one_access_line_per_request_and_no_rmcp_chatter() {
    let log_path = write_temp("json-logs.stderr", b"");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut server = start_logging_to(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
        log,
    );
    let session = initialize(&server.mcp_url);
    let head = post(
        &server.mcp_url,
        &session,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert!(head.starts_with("HTTP/1.1 202"), "{head}");
    let head = post(
        &server.mcp_url,
        &session,
        r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let head = post(
        &server.mcp_url,
        "0123456789abcdef0123456789abcdef",
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
    );
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert!(sigterm(&mut server).success());

    let logs = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty(), "no log lines");
    for line in &lines {
        let target = line["target"].as_str().unwrap_or_default();
        let level = line["level"].as_str().unwrap_or_default();
        assert!(
            !target.starts_with("rmcp") || matches!(level, "WARN" | "ERROR"),
            "rmcp below warn at the default filter: {line}"
        );
    }
    let access: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["target"] == "rewind::access")
        .map(|l| &l["fields"])
        .collect();
    let statuses: Vec<u64> = access
        .iter()
        .map(|f| f["status"].as_u64().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [200, 202, 200, 404],
        "one line per request: {access:?}"
    );
    let tag = &access[2]["session"];
    assert!(
        tag.as_str()
            .is_some_and(|t| t.len() == 16 && t.bytes().all(|b| b.is_ascii_hexdigit())),
        "session tag of the ping: {tag}"
    );
    assert_eq!(access[3]["session"], "-", "an unknown session has no tag");
    for fields in &access {
        assert_eq!(fields["method"], "POST", "{fields}");
        assert!(
            fields["ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            "{fields}"
        );
        for key in ["stream", "verdict"] {
            assert!(fields[key].is_string(), "{key} missing: {fields}");
        }
    }
}

#[test]
fn serve_starts_with_a_policy_file_and_refuses_a_bad_one() {
    let file = write_temp("status-400.wasm", plugins::STATUS_400);
    let server = start(&[
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--policy",
        file.to_str().unwrap(),
    ]);
    let status = policy(&["status"], &server);
    assert!(
        text(&status.stdout).contains("live: generation 1 `status-400`"),
        "{}",
        text(&status.stdout)
    );

    let trap = write_temp("trap.wasm", fixtures::TRAP);
    let stderr = refused_start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--policy",
            trap.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        stderr.contains("trap.wasm") && stderr.contains("validation"),
        "{stderr}"
    );
}

#[test]
fn the_child_compilers_limits_are_flags_and_the_smallest_cap_still_compiles() {
    // The smallest address-space cap accepted is enough to compile a
    // policy at start and another pushed later.
    let file = write_temp("status-400-capped.wasm", plugins::STATUS_400);
    let server = start(&[
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--policy-compile-memory-bytes",
        "67108864",
        "--policy-compile-timeout-secs",
        "20",
        "--policy",
        file.to_str().unwrap(),
    ]);
    let strict = write_temp("strict-capped.wasm", plugins::STRICT);
    let pushed = policy(&["push", strict.to_str().unwrap()], &server);
    assert!(pushed.status.success(), "{}", text(&pushed.stderr));
    let status = policy(&["status"], &server);
    assert!(
        text(&status.stdout).contains("live: generation 2 `strict-capped`"),
        "{}",
        text(&status.stdout)
    );
    drop(server);

    let stderr = refused_start(
        &["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
        &[("REWIND_POLICY_COMPILE_TIMEOUT_SECS", "0")],
    );
    assert!(
        stderr.contains("policy_compile_timeout_secs")
            && stderr.contains("REWIND_POLICY_COMPILE_TIMEOUT_SECS"),
        "{stderr}"
    );
}

#[test]
fn serve_keeps_its_events_in_a_data_dir_that_a_second_server_cannot_open() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let small = ["--global-bytes", "8388608", "--max-event-bytes", "65536"];
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
    ];
    args.extend(small);
    let first = start(&args);
    initialize(&first.mcp_url);
    assert!(dir.path().join("pool").exists() && dir.path().join("LOCK").exists());
    let mut second = vec![
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
    ];
    second.extend(small);
    let stderr = refused_start(&second, &[]);
    assert!(stderr.contains("locked by another process"), "{stderr}");
    drop(first);
    // The killed server's session is in the directory.
    let out = clean_command()
        .args(["data", "check", data])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("1 sessions"), "{stdout}");
}

/// Resident memory of `pid`, in KiB (Linux `/proc`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"))
}

/// A `ping` on `sid`; returns the HTTP status.
fn ping_status(mcp_url: &str, sid: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    let (_stream, head) = raw_request(mcp_url, |host| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
             Content-Type: application/json\r\nMcp-Session-Id: {sid}\r\n\
             Mcp-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    });
    head.lines().next().unwrap_or_default().to_owned()
}

/// The flood that once drove the server past its budget, against the real
/// process: thousands of `initialize` requests from one client, ten times
/// what the pool holds. The pool makes room by evicting the oldest idle
/// sessions, the server forgets them too (404), and its resident memory
/// stays within the pool's budget plus what the sessions it still holds
/// cost, instead of growing with every session ever opened.
#[test]
fn a_flood_of_sessions_keeps_the_servers_memory_within_its_budget() {
    const POOL: u64 = 1 << 20;
    let server = start(&[
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--global-bytes",
        &POOL.to_string(),
        "--max-event-bytes",
        "65536",
    ]);
    let pid = server.child.id();
    // Warm up (first allocations, thread stacks, code pages).
    for _ in 0..200 {
        initialize(&server.mcp_url);
    }
    let before = rss_kib(pid);
    let ids: Vec<String> = (0..6000).map(|_| initialize(&server.mcp_url)).collect();
    let mid = rss_kib(pid);
    let more: Vec<String> = (0..6000).map(|_| initialize(&server.mcp_url)).collect();
    let after = rss_kib(pid);
    eprintln!("RSS: {before} KiB before, {mid} KiB after 6000 sessions, {after} KiB after 12000");
    // The oldest sessions were evicted and are gone from the server too.
    assert!(ping_status(&server.mcp_url, &ids[0]).starts_with("HTTP/1.1 404"));
    assert!(ping_status(&server.mcp_url, more.last().unwrap()).starts_with("HTTP/1.1 200"));
    // The second 6000 sessions replaced the first: memory did not grow by
    // another flood's worth.
    let first_growth = mid.saturating_sub(before);
    let second_growth = after.saturating_sub(mid);
    assert!(
        second_growth <= first_growth / 2 + POOL / 1024,
        "the second flood grew RSS by {second_growth} KiB, the first by {first_growth} KiB"
    );
}

/// The policy compiler child is `/proc/self/exe` (the running build, even
/// after its file is gone), or with `REWIND_POLICY_COMPILER_BY_PATH=1` —
/// for emulators such as valgrind, which cannot start `/proc/self/exe` —
/// the executable's path. A copy of the binary, deleted after start, tells
/// the two apart: a push compiles by `/proc/self/exe` and fails by path.
#[test]
#[cfg(target_os = "linux")]
fn the_policy_compiler_is_this_build_or_by_request_its_path() {
    let dir = std::env::temp_dir().join(format!("rewind-cli-by-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy_file = write_temp("by-path-status-400.wasm", plugins::STATUS_400);
    let listen = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
    for by_path in [false, true] {
        let copy = dir.join(format!("rewind-copy-{by_path}"));
        std::fs::copy(env!("CARGO_BIN_EXE_rewind"), &copy).unwrap();
        let mut command = Command::new(&copy);
        for (k, _) in std::env::vars() {
            if k.starts_with("REWIND_") {
                command.env_remove(k);
            }
        }
        if by_path {
            command.env("REWIND_POLICY_COMPILER_BY_PATH", "1");
        }
        // Both compile the embedded default policy at start, in a child.
        let server = start_with(command, &listen, Stdio::null());
        std::fs::remove_file(&copy).unwrap();
        let push = policy(&["push", policy_file.to_str().unwrap()], &server);
        if by_path {
            assert!(!push.status.success(), "{}", text(&push.stdout));
            let stderr = text(&push.stderr);
            assert!(stderr.contains("rewind-copy-true"), "{stderr}");
        } else {
            assert!(push.status.success(), "{}", text(&push.stderr));
            assert!(
                text(&push.stdout).contains("generation 2"),
                "{}",
                text(&push.stdout)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
