//! Links the `rewind` program with packed relative relocations
//! (`-z pack-relative-relocs`, `DT_RELR`) when the toolchain and the C
//! library support them.
//!
//! A position-independent executable carries one relocation per pointer in
//! its read-only data (vtables, string tables); the dynamic loader reads
//! every one at start. For `rewind` that is a 740 KB `.rela.dyn` section,
//! which the loader's reads bring into the process's resident memory along
//! with the pages around it. Packed, the same relocations take about 8 KB,
//! and `rewind serve` starts about 1.9 MiB smaller (BENCHMARKS.md, run AB).
//! The code and what it does are unchanged.
//!
//! The flag needs GNU ld 2.38+ or lld 15+ and glibc 2.36+. So it is probed:
//! a small C program with a relative relocation is linked with the flag
//! (warnings fatal, so a linker that ignores an unknown `-z` option fails
//! the probe) and run (a C library whose loader lacks `DT_RELR` refuses to
//! start it). Only when both succeed is the flag added, and only to this
//! package's binaries; `REWIND_NO_RELR=1` turns the probe off. Cross builds
//! (the probe could not run) and other targets link as before.

use std::env;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=REWIND_NO_RELR");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    if env::var_os("REWIND_NO_RELR").is_some_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    let target = env::var("TARGET").unwrap_or_default();
    let native = env::var("HOST").is_ok_and(|host| host == target);
    let linux_gnu = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !(native && linux_gnu) {
        return;
    }
    match probe() {
        Ok(()) => println!("cargo:rustc-link-arg-bins={FLAG}"),
        // Not an error: the binary links as it always did.
        Err(why) => println!(
            "cargo:warning=linking `rewind` without packed relocations ({why}); it works, with \
             about 1.9 MiB more resident at start"
        ),
    }
}

/// Links and runs the probe program with [`FLAG`].
fn probe() -> Result<(), String> {
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("no OUT_DIR")?);
    let exe = out.join("relr-probe");
    // The linker rustc uses for this target (cargo says which, if one is
    // configured); `cc` is rustc's default on linux-gnu.
    let linker = env::var_os("RUSTC_LINKER").unwrap_or_else(|| "cc".into());
    let mut cc = Command::new(&linker)
        .args(["-x", "c", "-", "-o"])
        .arg(&exe)
        .args([FLAG, "-Wl,--fatal-warnings"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", linker.to_string_lossy()))?;
    // `pointer` needs a relative relocation in a position-independent
    // executable, so the packed form is really used.
    let source = b"static int value = 7;\nint *pointer = &value;\nint main(void) { return *pointer == 7 ? 0 : 1; }\n";
    cc.stdin
        .take()
        .ok_or("no stdin")?
        .write_all(source)
        .map_err(|e| format!("cannot feed the probe to the linker: {e}"))?;
    let linked = cc.wait_with_output().map_err(|e| format!("linker: {e}"))?;
    if !linked.status.success() {
        let said = String::from_utf8_lossy(&linked.stderr);
        return Err(format!(
            "the linker refused the flag: {}",
            said.lines().next().unwrap_or("no message")
        ));
    }
    let ran = Command::new(&exe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("the probe did not start: {e}"))?;
    if !ran.success() {
        return Err(format!("the probe failed to run: {ran}"));
    }
    Ok(())
}
