//! `rewind policy check`, run as the real binary.

use std::path::PathBuf;
use std::process::{Command, Output};

use rewind_engine::policy::wasm::plugins::{self, fixtures};
use rewind_engine::policy::wasm::vectors::decision_table;

fn write_temp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rewind-cli-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn check(path: &PathBuf) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["policy", "check"])
        .arg(path)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn prints_one_row_per_decision_table_row_and_marks_differences() {
    let out = check(&write_temp("status-400.wasm", plugins::STATUS_400));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let rows = decision_table();
    let table: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            !l.contains("rows:")
                && l.trim_start()
                    .split(' ')
                    .next()
                    .is_some_and(|n| n.parse::<usize>().is_ok())
        })
        .collect();
    assert_eq!(table.len(), rows.len(), "{stdout}");
    for (line, facts) in table.iter().zip(&rows) {
        let session = format!("{:?}", facts.session_fact().unwrap());
        let cursor = format!("{:?}", facts.cursor_fact().unwrap());
        assert!(line.contains(&session) && line.contains(&cursor), "{line}");
    }
    let foreign = table
        .iter()
        .find(|l| l.contains(" Live ") && l.contains(" Foreign "))
        .unwrap();
    assert!(
        foreign.contains("reject (409)")
            && foreign.contains("reject (400)")
            && foreign.contains("differs"),
        "{foreign}"
    );
    let in_window = table
        .iter()
        .find(|l| l.contains(" Live ") && l.contains(" InWindow "))
        .unwrap();
    assert!(!in_window.contains("differs"), "{in_window}");
    assert!(stdout.contains("passed"), "{stdout}");
    // Columns are aligned: every table line has its default column at the
    // same offset.
    let offset = |l: &str| {
        l.find("reject")
            .or_else(|| l.find("fresh"))
            .or_else(|| l.find("gone"))
            .or_else(|| l.find("resume"))
    };
    let offsets: std::collections::HashSet<_> = table.iter().map(|l| offset(l)).collect();
    assert_eq!(offsets.len(), 1, "{stdout}");
}

#[test]
fn the_default_policy_differs_nowhere() {
    let out = check(&write_temp("default.wasm", plugins::DEFAULT));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(!stdout.contains("* differs"), "{stdout}");
    assert!(
        stdout.contains("0 differ from the default, 0 fell back"),
        "{stdout}"
    );
}

#[test]
fn hostile_plugins_fail_with_a_clear_message() {
    let cases: [(&str, &[u8], &str); 5] = [
        ("trap.wasm", fixtures::TRAP, "unreachable"),
        ("loop.wasm", fixtures::LOOP, "out_of_fuel"),
        ("resume-all.wasm", fixtures::RESUME_ALL, "answered Resume"),
        ("wrong-abi.wasm", fixtures::WRONG_ABI, "ABI version 999"),
        ("imports.wasm", fixtures::IMPORTS, "must import nothing"),
    ];
    for (name, bytes, needle) in cases {
        let out = check(&write_temp(name, bytes));
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{name} passed");
        assert!(stderr.starts_with("rewind: "), "{name}: {stderr}");
        assert!(stderr.contains(needle), "{name}: {stderr}");
        assert!(!stderr.contains("backtrace"), "{name}: {stderr}");
    }
}

#[test]
fn missing_and_non_wasm_files_fail_with_a_clear_message() {
    let out = check(&PathBuf::from("/nonexistent/policy.wasm"));
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("cannot read /nonexistent/policy.wasm"));

    let out = check(&write_temp("script.wasm", b"#!/bin/sh\n"));
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is not a WebAssembly module"));
}
