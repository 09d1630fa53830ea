//! Configuration errors of `rewind serve` name the key and where it came
//! from; nothing starts listening on a bad configuration.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn write_temp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rewind-cli-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `rewind` with `args` and `env`, with every other REWIND_ variable
/// removed; a configuration that is accepted would start serving, so the
/// run is bounded and killed if it does.
fn rewind(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewind"));
    command.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("REWIND_") {
            command.env_remove(k);
        }
    }
    command.envs(env.iter().copied());
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn fails_naming(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted; stderr: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
    }
}

#[test]
fn an_unknown_key_in_the_file_is_named() {
    let file = write_temp(
        "typo.toml",
        "listen = \"127.0.0.1:0\"\n[engine]\nrign_slots = 64\n",
    );
    let out = rewind(&["serve", "--config", file.to_str().unwrap()], &[]);
    fails_naming(&out, &["typo.toml", "rign_slots", "line 3"]);
}

#[test]
fn a_value_of_the_wrong_type_is_named() {
    let file = write_temp("type.toml", "[engine]\nidle_ttl_secs = \"ten\"\n");
    let out = rewind(&["serve", "--config", file.to_str().unwrap()], &[]);
    fails_naming(&out, &["type.toml", "idle_ttl_secs"]);
}

#[test]
fn a_bad_value_names_the_key_and_its_origin() {
    let file = write_temp("segments.toml", "[engine]\nmax_segment_bytes = 1000\n");
    let out = rewind(&["serve", "--config", file.to_str().unwrap()], &[]);
    fails_naming(
        &out,
        &["engine.max_segment_bytes", "segments.toml", "power of two"],
    );

    let out = rewind(&["serve"], &[("REWIND_MAX_SEGMENT_BYTES", "3")]);
    fails_naming(
        &out,
        &["engine.max_segment_bytes", "REWIND_MAX_SEGMENT_BYTES"],
    );

    let out = rewind(&["serve", "--session-events", "0"], &[]);
    fails_naming(&out, &["engine.session_events", "--session-events"]);

    let out = rewind(&["serve", "--max-sessions", "0"], &[]);
    fails_naming(&out, &["engine.max_sessions", "--max-sessions"]);

    let out = rewind(&["serve", "--global-bytes", "1000"], &[]);
    fails_naming(&out, &["engine.global_bytes", "cannot hold one event"]);

    let out = rewind(&["serve", "--listen", "localhost"], &[]);
    fails_naming(&out, &["--listen"]);
}

#[test]
fn flags_beat_the_environment_which_beats_the_file() {
    // The file says 1000 (invalid), the environment 65536 (valid), the flag
    // 3 (invalid): the flag wins and is the one reported.
    let file = write_temp("prec.toml", "[engine]\nmax_segment_bytes = 1000\n");
    let out = rewind(
        &[
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--max-segment-bytes",
            "3",
        ],
        &[("REWIND_MAX_SEGMENT_BYTES", "65536")],
    );
    fails_naming(
        &out,
        &[
            "engine.max_segment_bytes",
            "flag --max-segment-bytes",
            "= 3 must",
        ],
    );
    // Without the flag the environment's valid 65536 beats the file's 1000,
    // so the next error is the file's bad TTL.
    let file = write_temp(
        "prec2.toml",
        "[engine]\nmax_segment_bytes = 1000\nidle_ttl_secs = 0\n",
    );
    let out = rewind(
        &["serve", "--config", file.to_str().unwrap()],
        &[("REWIND_MAX_SEGMENT_BYTES", "65536")],
    );
    fails_naming(&out, &["engine.idle_ttl_secs", "prec2.toml"]);
}

#[test]
fn a_public_admin_address_without_a_token_is_refused() {
    let out = rewind(&["serve", "--admin-listen", "0.0.0.0:0"], &[]);
    fails_naming(
        &out,
        &["admin_listen", "not a loopback address", "admin_token"],
    );
}

#[test]
fn a_missing_config_file_is_named() {
    let out = rewind(&["--config", "/nonexistent/rewind.toml"], &[]);
    fails_naming(&out, &["/nonexistent/rewind.toml"]);
}
