//! Two link-time layouts for the `rewind` program, each probed first and
//! each changing only where things lie in the file, never what the code
//! does:
//!
//! 1. **Packed relative relocations** (`-z pack-relative-relocs`,
//!    `DT_RELR`). A position-independent executable carries one relocation
//!    per pointer in its read-only data (vtables, string tables); the
//!    dynamic loader reads every one at start. For `rewind` that is a 740 KB
//!    `.rela.dyn` section, which the loader's reads bring into the
//!    process's resident memory along with the pages around it. Packed, the
//!    same relocations take about 8 KB, and `rewind serve` starts about
//!    1.9 MiB smaller (BENCHMARKS.md, run AB). The flag needs GNU ld 2.38+
//!    or lld 15+ and glibc 2.36+, so a small C program with a relative
//!    relocation is linked with it (warnings fatal, so a linker that
//!    ignores an unknown `-z` option fails the probe) and run (a C library
//!    whose loader lacks `DT_RELR` refuses to start it).
//!    `REWIND_NO_RELR=1` turns it off.
//!
//! 2. **The server's code in one place** (`--symbol-ordering-file`). The
//!    code `rewind serve` runs — start-up and serving — is about 2 MiB of
//!    an 18 MiB `.text`, spread through it by crate and codegen unit, and
//!    the kernel maps 64 KiB of the file around every page fault, so the
//!    server kept about 8 MiB of its code resident after serving one
//!    client. `symbol-order.txt` lists those functions (recorded by
//!    `symbol-order.sh`, which runs the server under callgrind with the
//!    load generator's profiles); the linker puts them first in `.text`,
//!    in that order, and everything else after. About 2.4 MiB of code is
//!    then resident (run AF). A symbol in the list that the build does not
//!    have is skipped, so a list older than the code still links, only
//!    less tightly; `symbol-order.sh --check` says how much of it matches.
//!    The option is lld's (rustc links with its bundled lld on
//!    x86_64 Linux); the probe links an empty program with the same rustc,
//!    flags and linker as this build, and without that linker nothing is
//!    added. `REWIND_NO_SYMBOL_ORDER=1` turns it off.
//!
//! Both apply only to this package's binaries. Cross builds (the probes
//! could not run what they link) and other targets link as before.

use std::env;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

/// The list of functions to lay out first, beside this script.
const ORDER_FILE: &str = "symbol-order.txt";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={ORDER_FILE}");
    println!("cargo:rerun-if-env-changed=REWIND_NO_RELR");
    println!("cargo:rerun-if-env-changed=REWIND_NO_SYMBOL_ORDER");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let target = env::var("TARGET").unwrap_or_default();
    let native = env::var("HOST").is_ok_and(|host| host == target);
    let linux_gnu = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !(native && linux_gnu) {
        return;
    }
    if !switched_off("REWIND_NO_RELR") {
        packed_relocations();
    }
    if !switched_off("REWIND_NO_SYMBOL_ORDER") {
        symbol_order();
    }
}

/// Whether `var` is set to something other than empty or `0`.
fn switched_off(var: &str) -> bool {
    env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Adds [`FLAG`] when [`probe`] says the toolchain supports it.
fn packed_relocations() {
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

/// Adds the symbol ordering when the linker this build uses takes it.
fn symbol_order() {
    let dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let list = dir.join(ORDER_FILE);
    if !list.is_file() {
        println!(
            "cargo:warning=linking `rewind` without a symbol order: {} is missing",
            list.display()
        );
        return;
    }
    // `-Xlinker`, not `-Wl,`: a path may hold a comma.
    let Some(list) = list.to_str() else {
        println!("cargo:warning=linking `rewind` without a symbol order: its path is not UTF-8");
        return;
    };
    let args = [
        "-Xlinker".to_owned(),
        format!("--symbol-ordering-file={list}"),
        "-Xlinker".to_owned(),
        "--no-warn-symbol-ordering".to_owned(),
    ];
    match probe_with_rustc(&args) {
        Ok(()) => {
            for arg in args {
                println!("cargo:rustc-link-arg-bins={arg}");
            }
        }
        // Not an error: the binary links as it always did.
        Err(why) => println!(
            "cargo:warning=linking `rewind` without its symbol order ({why}); it works, with \
             about 5 MiB more of its code resident"
        ),
    }
}

/// Links an empty Rust program with `link_args`, using the rustc, flags
/// and linker of this build.
fn probe_with_rustc(link_args: &[String]) -> Result<(), String> {
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("no OUT_DIR")?);
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(&rustc);
    cmd.args([
        "--crate-type",
        "bin",
        "--crate-name",
        "order_probe",
        "--edition",
        "2021",
    ])
    .arg("--target")
    .arg(env::var("TARGET").map_err(|_| "no TARGET")?)
    .arg("-o")
    .arg(out.join("order-probe"));
    for arg in link_args {
        cmd.arg("-C").arg(format!("link-arg={arg}"));
    }
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        cmd.arg("-C").arg({
            let mut a = std::ffi::OsString::from("linker=");
            a.push(linker);
            a
        });
    }
    // The flags cargo passes this build (they may choose the linker).
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    cmd.arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", rustc.to_string_lossy()))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(b"fn main() {}\n")
        .map_err(|e| format!("cannot feed the probe to rustc: {e}"))?;
    let linked = child
        .wait_with_output()
        .map_err(|e| format!("rustc: {e}"))?;
    if linked.status.success() {
        Ok(())
    } else {
        let said = String::from_utf8_lossy(&linked.stderr);
        let line = said
            .lines()
            .find(|l| l.contains("unrecognized") || l.contains("unknown"))
            .or_else(|| said.lines().next())
            .unwrap_or("no message");
        Err(format!("the linker refused it: {}", line.trim()))
    }
}
