//! A policy pushed into `rewind serve --policy-dir DIR` survives a restart
//! of the process (even a kill), a rollback is remembered the same way, and
//! a policy directory that names a broken module stops the start with a
//! message saying what to do.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rewind_engine::policy::wasm::plugins::{self, fixtures};

struct Server {
    child: Child,
    admin_url: String,
    token: String,
    start_lines: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TOKEN: &str = "policy-dir-test-token-0123456789";

fn rewind() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewind"));
    for (k, _) in std::env::vars() {
        if k.starts_with("REWIND_") {
            command.env_remove(k);
        }
    }
    command.env("RUST_LOG", "warn");
    command
}

/// Starts `rewind serve` on free loopback ports with `policy_dir`, and
/// reads its start lines (up to the policy directory's).
fn start(policy_dir: &Path) -> Server {
    let mut child = rewind()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--policy-dir")
        .arg(policy_dir)
        .args(["--admin-token", TOKEN])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
    let mut start_lines = Vec::new();
    while !start_lines
        .last()
        .is_some_and(|l: &String| l.starts_with("rewind: policy dir"))
    {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("rewind serve printed only {start_lines:?}"));
        start_lines.push(line);
    }
    let admin_url = start_lines
        .iter()
        .find_map(|l| l.strip_prefix("rewind: admin surface"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    Server {
        child,
        admin_url,
        token: TOKEN.to_owned(),
        start_lines,
    }
}

fn policy(server: &Server, args: &[&str]) -> Output {
    rewind()
        .arg("policy")
        .args(args)
        .args(["--admin", &server.admin_url])
        .env("REWIND_ADMIN_TOKEN", &server.token)
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The live policy's line of `rewind policy status`.
fn live_line(server: &Server) -> String {
    let status = ok(policy(server, &["status"]));
    status
        .lines()
        .find(|l| l.starts_with("live:"))
        .unwrap_or_else(|| panic!("{status}"))
        .to_owned()
}

#[test]
fn a_pushed_policy_is_live_again_after_a_restart_and_so_is_a_rollback() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("policies");
    let strict = work.path().join("strict.wasm");
    std::fs::write(&strict, plugins::STRICT).unwrap();
    let trap = work.path().join("trap.wasm");
    std::fs::write(&trap, fixtures::TRAP).unwrap();

    let server = start(&dir);
    assert!(live_line(&server).contains("`default`"));
    let pushed = ok(policy(&server, &["push", strict.to_str().unwrap()]));
    assert!(pushed.contains("kept in"), "{pushed}");
    // A refused push leaves the directory alone.
    assert!(!policy(&server, &["push", trap.to_str().unwrap()])
        .status
        .success());
    let modules: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".wasm"))
        .collect();
    assert_eq!(modules, ["000001-strict.wasm"]);
    // Killed, not stopped: the push was recorded before it was answered.
    drop(server);

    let server = start(&dir);
    assert!(
        server
            .start_lines
            .iter()
            .any(|l| l.contains("restored `strict`")),
        "{:?}",
        server.start_lines
    );
    let live = live_line(&server);
    assert!(
        live.contains("generation 2") && live.contains("`strict`"),
        "{live}"
    );
    let status = ok(policy(&server, &["status"]));
    assert!(status.contains("000001-strict.wasm"), "{status}");

    // Rolling back after the restart returns to the start policy, and that
    // is what the next restart runs.
    ok(policy(&server, &["rollback"]));
    assert!(live_line(&server).contains("`default`"));
    drop(server);
    let server = start(&dir);
    let live = live_line(&server);
    assert!(
        live.contains("generation 1") && live.contains("`default`"),
        "{live}"
    );
    assert!(
        server
            .start_lines
            .iter()
            .any(|l| l.contains("pushed policies are kept here")),
        "{:?}",
        server.start_lines
    );
}

#[test]
fn a_policy_dir_naming_a_broken_module_stops_the_start_and_says_why() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("policies");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("000003-mine.wasm"), fixtures::TRAP).unwrap();
    std::fs::write(dir.join("LIVE"), "000003-mine.wasm\n").unwrap();
    let mut child = rewind()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--policy-dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a server that started anyway is killed and the test fails.
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("000003-mine.wasm")
            && stderr.contains("validation")
            && stderr.contains("start"),
        "{stderr}"
    );
    // Nothing was changed on the way out.
    assert_eq!(
        std::fs::read_to_string(dir.join("LIVE")).unwrap(),
        "000003-mine.wasm\n"
    );
}
