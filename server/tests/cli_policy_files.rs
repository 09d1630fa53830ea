//! `rewind policy list`, `export` and `new`, run as the real binary; the
//! crate `new` writes is built to wasm with cargo, tested natively, and
//! passes `rewind policy check`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rewind_engine::policy::wasm::plugins::{self, fixtures};

fn rewind(args: &[&str], cwd: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewind"));
    for (k, _) in std::env::vars() {
        if k.starts_with("REWIND_") {
            command.env_remove(k);
        }
    }
    command.args(args).current_dir(cwd).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn list_shows_every_bundled_policy_with_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = rewind(&["policy", "list"], dir.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for (name, wasm) in [
        ("default", plugins::DEFAULT),
        ("strict", plugins::STRICT),
        ("status-400", plugins::STATUS_400),
    ] {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}: {stdout}"));
        assert!(row.contains(&wasm.len().to_string()), "{row}");
    }
    assert!(!stdout.contains("fixture-trap"), "{stdout}");

    let out = rewind(&["policy", "list", "--fixtures"], dir.path());
    assert!(text(&out.stdout).contains("fixture-trap"));
}

#[test]
fn export_writes_the_embedded_bytes_and_never_overwrites_unasked() {
    let dir = tempfile::tempdir().unwrap();
    // Default file name, in the current directory.
    let out = rewind(&["policy", "export", "strict"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let default_path = dir.path().join("strict.wasm");
    assert_eq!(std::fs::read(&default_path).unwrap(), plugins::STRICT);

    // An existing file is kept as it is...
    let target = dir.path().join("policy.wasm");
    std::fs::write(&target, b"keep me").unwrap();
    let out = rewind(
        &[
            "policy",
            "export",
            "default",
            "-o",
            target.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--force"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    // ...unless --force.
    let out = rewind(
        &[
            "policy",
            "export",
            "default",
            "-o",
            target.to_str().unwrap(),
            "--force",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&target).unwrap(), plugins::DEFAULT);

    // `-o -`: the module on standard output, the message on standard error.
    let out = rewind(&["policy", "export", "fixture-trap", "-o", "-"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, fixtures::TRAP);
    assert!(
        text(&out.stderr).contains("fixture"),
        "{}",
        text(&out.stderr)
    );

    // An unknown name lists the real ones and writes nothing.
    let out = rewind(&["policy", "export", "strcit"], dir.path());
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("strcit") && stderr.contains("strict"),
        "{stderr}"
    );
    assert!(!dir.path().join("strcit.wasm").exists());
}

#[test]
fn new_refuses_bad_names_and_occupied_directories() {
    let dir = tempfile::tempdir().unwrap();
    let out = rewind(&["policy", "new", "9lives"], dir.path());
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("9lives"),
        "{}",
        text(&out.stderr)
    );

    let occupied = dir.path().join("occupied");
    std::fs::create_dir(&occupied).unwrap();
    std::fs::write(occupied.join("notes.txt"), b"mine").unwrap();
    let out = rewind(
        &["policy", "new", "p", "--dir", occupied.to_str().unwrap()],
        dir.path(),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not empty"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(&occupied).unwrap().count(), 1);
}

/// `cargo` for a build of its own: none of the variables that describe the
/// build running this test (its target dir, profile, flags, wrappers).
fn clean_cargo(dir: &Path, target_dir: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if (k.starts_with("CARGO") && k != "CARGO_HOME")
            || k.starts_with("RUSTC")
            || matches!(k, "RUSTFLAGS" | "RUSTDOCFLAGS")
        {
            command.env_remove(k);
        }
    }
    command.current_dir(dir).env("CARGO_TARGET_DIR", target_dir);
    command
}

fn succeeds(command: &mut Command, what: &str) {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn a_new_policy_crate_builds_to_wasm_passes_its_tests_and_passes_check() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = dir.path().join("crates/my-policy");
    let out = rewind(
        &[
            "policy",
            "new",
            "my-policy",
            "--dir",
            crate_dir.to_str().unwrap(),
        ],
        dir.path(),
    );
    let summary = text(&out.stdout);
    assert!(out.status.success(), "{summary}{}", text(&out.stderr));
    for file in [
        "Cargo.toml",
        ".cargo/config.toml",
        "src/lib.rs",
        "README.md",
        ".gitignore",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} missing; {summary}");
    }
    let readme = std::fs::read_to_string(crate_dir.join("README.md")).unwrap();
    assert!(readme.contains("cargo build --release --target wasm32-unknown-unknown"));
    // Built from this checkout: the SDK is this checkout's, as a path.
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("path = ") && manifest.contains("policy-sdk"),
        "{manifest}"
    );

    // What the README says to run, in the crate's directory.
    let target_dir = dir.path().join("target");
    succeeds(
        clean_cargo(&crate_dir, &target_dir).args([
            "build",
            "--release",
            "--target",
            "wasm32-unknown-unknown",
        ]),
        "cargo build --release --target wasm32-unknown-unknown",
    );
    succeeds(
        clean_cargo(&crate_dir, &target_dir).arg("test"),
        "cargo test",
    );

    let wasm: PathBuf = target_dir.join("wasm32-unknown-unknown/release/my_policy.wasm");
    let bytes = std::fs::read(&wasm).unwrap();
    assert!(bytes.starts_with(b"\0asm"));
    // The release profile and the stack size keep the module small.
    assert!(bytes.len() < 64 * 1024, "{} bytes", bytes.len());

    let out = rewind(&["policy", "check", wasm.to_str().unwrap()], dir.path());
    let report = text(&out.stdout);
    assert!(out.status.success(), "{report}{}", text(&out.stderr));
    assert!(report.contains("0 fell back"), "{report}");
}
