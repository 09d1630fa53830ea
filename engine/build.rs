//! Builds the policy plugins (`plugins/*`) to `wasm32-unknown-unknown` so the
//! engine and its tests can embed them with
//! `include_bytes!(env!("REWIND_PLUGIN_<NAME>"))`.
//!
//! Only with the `wasm` feature. One inner `cargo build` builds every plugin
//! crate with the size-optimised `wasm-plugin` profile into its own target
//! directory under `OUT_DIR` (sharing the outer target directory would wait
//! forever on the lock the outer build holds). The outer build's
//! `CARGO_*`/`RUSTFLAGS`/wrapper variables are removed from the inner build's
//! environment: they describe the outer build (its target, its profile, a
//! `clippy-driver` wrapper, host rustflags) and would break or slow the inner
//! one.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";
const PROFILE: &str = "wasm-plugin";
/// The plugins need no more than this; a smaller stack keeps a plugin's
/// linear memory (stack + data) far below the host's memory cap.
const GUEST_STACK_BYTES: u32 = 64 * 1024;

fn main() {
    if env::var_os("CARGO_FEATURE_WASM").is_none() {
        return;
    }
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .expect("engine/ lives in the workspace root")
        .to_path_buf();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    for watched in [
        "policy-sdk/src",
        "policy-sdk/Cargo.toml",
        "plugins",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }

    let plugins = discover_plugins(&workspace.join("plugins"));
    if plugins.is_empty() {
        return;
    }
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    ensure_target_installed(&rustc);

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = out_dir.join("plugins");
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&workspace)
        .arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args(["--target", TARGET, "--profile", PROFILE, "--quiet"])
        .arg("--target-dir")
        .arg(&target_dir);
    for plugin in &plugins {
        cmd.args(["-p", &plugin.package]);
    }
    scrub_outer_build_env(&mut cmd);
    cmd.env("RUSTC", &rustc).env(
        "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS",
        format!("-C link-arg=-zstack-size={GUEST_STACK_BYTES}"),
    );

    let status = cmd.status().unwrap_or_else(|e| {
        panic!(
            "could not run `{}` to build the policy plugins: {e}",
            cargo.to_string_lossy()
        )
    });
    if !status.success() {
        panic!("building the policy plugins for {TARGET} failed ({status}); see the cargo output above");
    }

    let artifacts = target_dir.join(TARGET).join(PROFILE);
    for plugin in &plugins {
        let wasm = artifacts.join(format!("{}.wasm", plugin.package.replace('-', "_")));
        if !wasm.is_file() {
            panic!(
                "the plugin build finished but {} is missing",
                wasm.display()
            );
        }
        println!(
            "cargo:rustc-env=REWIND_PLUGIN_{}={}",
            plugin.env_name,
            wasm.display()
        );
    }
}

struct Plugin {
    /// Cargo package name, e.g. `rewind-fixture-loop`.
    package: String,
    /// Directory name in upper snake case, e.g. `FIXTURE_LOOP`.
    env_name: String,
}

fn discover_plugins(dir: &Path) -> Vec<Plugin> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut plugins: Vec<Plugin> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let manifest = fs::read_to_string(entry.path().join("Cargo.toml")).ok()?;
            let package = package_name(&manifest)?;
            let env_name = entry
                .file_name()
                .to_string_lossy()
                .to_uppercase()
                .replace('-', "_");
            Some(Plugin { package, env_name })
        })
        .collect();
    plugins.sort_by(|a, b| a.package.cmp(&b.package));
    plugins
}

/// The `name` of the `[package]` table: enough TOML for our own manifests.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(value) = line
                .strip_prefix("name")
                .map(str::trim_start)
                .and_then(|r| r.strip_prefix('='))
            {
                return Some(value.trim().trim_matches('"').to_owned());
            }
        }
    }
    None
}

/// Makes sure the wasm32 standard library is there, installing it with
/// rustup for the active toolchain when it is not: the toolchain file lists
/// the target, but rustup adds listed targets only when it installs the
/// toolchain itself (and never with `RUSTUP_AUTO_INSTALL=0`), so a machine
/// that already had the pinned toolchain lacks it.
fn ensure_target_installed(rustc: &OsStr) {
    if target_installed(rustc) {
        return;
    }
    let toolchain = env::var("RUSTUP_TOOLCHAIN").ok();
    let mut rustup = Command::new(env::var_os("RUSTUP").unwrap_or_else(|| "rustup".into()));
    rustup.args(["target", "add", TARGET]);
    if let Some(toolchain) = &toolchain {
        rustup.args(["--toolchain", toolchain]);
    }
    // The outer build's variables (RUSTC, CARGO, ...) must not steer rustup.
    scrub_outer_build_env(&mut rustup);
    println!(
        "cargo:warning=installing the {TARGET} target for the policy plugins (`rustup target add {TARGET}`)"
    );
    let added = rustup.status().is_ok_and(|s| s.success());
    if !added || !target_installed(rustc) {
        panic!(
            "the {TARGET} target is missing and `rustup target add {TARGET}{}` did not install it; \
             install it by hand, or build rewind-engine without its `wasm` feature",
            toolchain.map(|t| format!(" --toolchain {t}")).unwrap_or_default()
        );
    }
}

fn target_installed(rustc: &OsStr) -> bool {
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    libdir
        .and_then(|dir| fs::read_dir(dir).ok())
        .is_some_and(|mut entries| {
            entries
                .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcore-")))
        })
}

/// Removes what describes the outer build; keeps `CARGO_HOME` (registry and
/// credentials location), `RUSTUP_HOME`/`RUSTUP_TOOLCHAIN` and `PATH`.
fn scrub_outer_build_env(cmd: &mut Command) {
    const OUTER_ONLY: &[&str] = &[
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_LINKER",
        "RUSTDOC",
        "TARGET",
        "HOST",
        "OUT_DIR",
        "OPT_LEVEL",
        "PROFILE",
        "DEBUG",
        "NUM_JOBS",
        "MAKEFLAGS",
        "MFLAGS",
        "CLIPPY_ARGS",
        "CLIPPY_CONF_DIR",
        "__CLIPPY_INTERNAL_ARGS",
    ];
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let cargo_var = key.starts_with("CARGO") && key != "CARGO_HOME";
        if cargo_var
            || key.starts_with("__CARGO")
            || OUTER_ONLY.contains(&key)
            || key.starts_with("DEP_")
        {
            cmd.env_remove(key);
        }
    }
}
