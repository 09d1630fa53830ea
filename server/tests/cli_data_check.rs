//! `rewind data check DIR`, run as the real binary.

use std::path::Path;
use std::process::{Command, Output};

use rewind_engine::{Config, Engine};

fn check(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["data", "check"])
        .arg(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn fill(dir: &Path) {
    let mut c = Config::default();
    c.global_bytes = 4 << 20;
    c.max_event_bytes = 16 * 1024;
    c.data_dir = Some(dir.to_owned());
    let e = Engine::new(c).unwrap();
    let s = e.open(Some("dana")).unwrap();
    for i in 0..5 {
        s.append(0, format!("CHECK-ME-EVENT-{i}").as_bytes())
            .unwrap();
    }
}

#[test]
fn a_healthy_directory_is_listed_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path());
    let out = check(dir.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("1 sessions, 5 events"), "{stdout}");
    assert!(stdout.contains("principal \"dana\""), "{stdout}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}

#[test]
fn a_damaged_event_makes_the_check_fail_after_its_report() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path());
    let pool = dir.path().join("pool");
    let mut bytes = std::fs::read(&pool).unwrap();
    let at = bytes
        .windows(16)
        .position(|w| w == b"CHECK-ME-EVENT-2")
        .expect("the event is in the pool file");
    bytes[at + 3] ^= 1;
    std::fs::write(&pool, bytes).unwrap();
    let out = check(dir.path());
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("DAMAGED"), "{stdout}");
    assert!(
        text(&out.stderr).contains("damaged"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_directory_without_a_pool_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(dir.path());
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("pool"), "{}", text(&out.stderr));
}
