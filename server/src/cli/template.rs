//! `rewind policy new`: a new policy crate from a template, ready to build
//! to wasm, test natively, check and push.
//!
//! The crate is its own workspace (an empty `[workspace]` table), so it
//! builds wherever it is created, even inside another workspace. Its
//! release profile is the one Rewind builds its own plugins with (small,
//! `panic = "abort"`), and `.cargo/config.toml` gives the module a 64 KiB
//! stack so its linear memory stays far below the host's cap.
//!
//! The SDK dependency: `--sdk-path`, else the `policy-sdk/` directory of
//! the source tree this program was built from when it is still there (so
//! a checkout's `rewind` makes crates that build offline against that
//! checkout), else the crates.io version requirement.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use super::CommandError;

/// The SDK directory of the source tree this program was built from.
const BUILT_FROM_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../policy-sdk");
/// The SDK version requirement used when no SDK source is at hand.
const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// How the new crate depends on `rewind-policy-sdk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SdkSource {
    /// A path dependency on this directory.
    Path(PathBuf),
    /// A crates.io version requirement.
    Version(String),
}

impl SdkSource {
    /// `--sdk-path` if given (it must be the SDK crate), else the SDK this
    /// program was built from if it is still there, else crates.io.
    pub fn choose(sdk_path: Option<&Path>) -> Result<SdkSource, CommandError> {
        match sdk_path {
            Some(dir) => {
                if !is_sdk(dir) {
                    return Err(CommandError(format!(
                        "--sdk-path {}: no `rewind-policy-sdk` crate there (expected its Cargo.toml)",
                        dir.display()
                    )));
                }
                Ok(SdkSource::Path(absolute(dir)?))
            }
            None if is_sdk(Path::new(BUILT_FROM_SDK)) => {
                Ok(SdkSource::Path(absolute(Path::new(BUILT_FROM_SDK))?))
            }
            None => Ok(SdkSource::Version(SDK_VERSION.to_owned())),
        }
    }

    /// The value of `rewind-policy-sdk = …` in `[dependencies]`.
    fn dependency(&self) -> String {
        match self {
            SdkSource::Path(dir) => format!(
                "{{ path = {} }}",
                toml::Value::String(dir.to_string_lossy().into_owned())
            ),
            SdkSource::Version(version) => toml::Value::String(version.clone()).to_string(),
        }
    }
}

fn is_sdk(dir: &Path) -> bool {
    fs::read_to_string(dir.join("Cargo.toml"))
        .is_ok_and(|manifest| manifest.contains("name = \"rewind-policy-sdk\""))
}

fn absolute(dir: &Path) -> Result<PathBuf, CommandError> {
    fs::canonicalize(dir).map_err(|e| CommandError(format!("{}: {e}", dir.display())))
}

/// What `new` wrote.
#[derive(Debug)]
pub struct NewCrate {
    /// The crate's directory.
    pub dir: PathBuf,
    /// The file `cargo build --release --target wasm32-unknown-unknown`
    /// produces, relative to `dir`.
    pub wasm: PathBuf,
    /// The files written, relative to `dir`.
    pub files: Vec<&'static str>,
    /// How it depends on the SDK.
    pub sdk: SdkSource,
}

impl NewCrate {
    /// What to tell the operator.
    pub fn summary(&self) -> String {
        let mut out = format!("created policy crate {}:\n", self.dir.display());
        for file in &self.files {
            let _ = writeln!(out, "  {file}");
        }
        match &self.sdk {
            SdkSource::Path(dir) => {
                let _ = writeln!(
                    out,
                    "rewind-policy-sdk: path dependency on {}",
                    dir.display()
                );
            }
            SdkSource::Version(v) => {
                let _ = writeln!(
                    out,
                    "rewind-policy-sdk: version {v} from crates.io (pass --sdk-path DIR to use a local checkout)"
                );
            }
        }
        let _ = write!(
            out,
            "\nnext:\n  cd {}\n  cargo test\n  cargo build --release --target wasm32-unknown-unknown\n  \
             rewind policy check {}\n  rewind policy push {}\n",
            self.dir.display(),
            self.wasm.display(),
            self.wasm.display()
        );
        out
    }
}

/// Rust's strict and reserved keywords, and names cargo refuses for a
/// package: none of them can name a crate.
const RESERVED: &[&str] = &[
    "abstract",
    "as",
    "async",
    "await",
    "become",
    "box",
    "break",
    "const",
    "continue",
    "crate",
    "do",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "final",
    "fn",
    "for",
    "gen",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "pub",
    "ref",
    "return",
    "self",
    "Self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
    "while",
    "yield",
    "core",
    "std",
    "alloc",
    "proc_macro",
    "proc-macro",
    "test",
];

/// Checks that `name` can be a package name and a crate name.
pub fn check_name(name: &str) -> Result<(), CommandError> {
    let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !first_ok || !rest_ok || name.len() > 64 {
        return Err(CommandError(format!(
            "`{name}` cannot name a policy crate: use 1 to 64 characters of a-z, A-Z, 0-9, `-` and `_`, \
             starting with a letter (e.g. `my-policy`)"
        )));
    }
    if RESERVED.contains(&name) || RESERVED.contains(&name.replace('-', "_").as_str()) {
        return Err(CommandError(format!(
            "`{name}` is a Rust keyword or a reserved crate name; choose another (e.g. `{name}-policy`)"
        )));
    }
    Ok(())
}

/// `rewind policy new NAME [--dir DIR]`: writes the crate into `dir`
/// (default `./NAME`), which must not exist or be empty. Nothing is written
/// if any check fails.
pub fn new_crate(name: &str, dir: Option<&Path>, sdk: SdkSource) -> Result<NewCrate, CommandError> {
    check_name(name)?;
    let dir = dir.map_or_else(|| PathBuf::from(name), Path::to_owned);
    if let Ok(mut entries) = fs::read_dir(&dir) {
        if entries.next().is_some() {
            return Err(CommandError(format!(
                "{} exists and is not empty; left as it is (choose another --dir)",
                dir.display()
            )));
        }
    } else if dir.exists() {
        return Err(CommandError(format!(
            "{} exists and is not a directory; left as it is (choose another --dir)",
            dir.display()
        )));
    }

    let lib_name = name.replace('-', "_");
    let files: [(&'static str, String); 5] = [
        ("Cargo.toml", cargo_toml(name, &sdk)),
        (".cargo/config.toml", CARGO_CONFIG.to_owned()),
        ("src/lib.rs", LIB_RS.replace("{name}", name)),
        ("README.md", readme(name, &lib_name)),
        (".gitignore", "/target\n".to_owned()),
    ];
    for (file, text) in &files {
        let path = dir.join(file);
        let written = path
            .parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| fs::write(&path, text));
        if let Err(e) = written {
            return Err(CommandError(format!(
                "cannot write {}: {e}",
                path.display()
            )));
        }
    }
    Ok(NewCrate {
        wasm: PathBuf::from(format!(
            "target/wasm32-unknown-unknown/release/{lib_name}.wasm"
        )),
        dir,
        files: files.iter().map(|(file, _)| *file).collect(),
        sdk,
    })
}

fn cargo_toml(name: &str, sdk: &SdkSource) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
# cdylib: the .wasm module the policy host loads; rlib: so `cargo test` runs
# the policy natively.
crate-type = ["cdylib", "rlib"]

[dependencies]
rewind-policy-sdk = {dependency}

# A workspace of its own, so the crate builds wherever it lives.
[workspace]

# The profile Rewind builds its own plugins with: a small module, and a
# panic is a trap (the host falls back to the safe default and counts it).
[profile.release]
opt-level = "z"
lto = true
codegen-units = 1
panic = "abort"
strip = true
debug = false
"#,
        dependency = sdk.dependency()
    )
}

const CARGO_CONFIG: &str = r#"# A 64 KiB stack instead of Rust's default 1 MiB keeps the module's linear
# memory far below the policy host's 2 MiB cap. (A RUSTFLAGS environment
# variable replaces these flags: keep the link argument if you set one.)
[target.wasm32-unknown-unknown]
rustflags = ["-C", "link-arg=-zstack-size=65536"]
"#;

const LIB_RS: &str = r#"//! `{name}`: a Rewind resume policy.
//!
//! The host works out the facts of every reconnect and the verdicts that are
//! safe for them (`facts.allowed`); this function picks one. An answer
//! outside the safe set, a trap or an exhausted budget is replaced by
//! `facts.default()` and counted, so a mistake here costs availability,
//! never another session's events.
#![cfg_attr(target_arch = "wasm32", no_std)]

use rewind_policy_sdk::{rewind_policy, CursorFact, ResumeFacts, SessionFact, Verdict, UNKNOWN};

rewind_policy! {
    /// The default decision table, except that a cursor older than the
    /// operator's `max_resume_age_secs` (when one is set) gets a fresh
    /// stream with a `gap` signal instead of a replay.
    pub fn decide(facts: &ResumeFacts) -> Verdict {
        let in_window = facts.session_fact().is_some_and(SessionFact::is_live)
            && facts.cursor_fact() == Some(CursorFact::InWindow);
        let limit = facts.max_resume_age_ms;
        if in_window && limit != 0 && (facts.cursor_age_ms == UNKNOWN || facts.cursor_age_ms > limit) {
            return Verdict::FreshGap;
        }
        facts.default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_inside_the_safe_set_on_every_row() {
        for session in SessionFact::ALL {
            for cursor in CursorFact::ALL {
                let facts = ResumeFacts::new(session, cursor).with_safe_set();
                let verdict = decide(&facts);
                assert!(facts.allowed.contains(verdict), "{session:?} {cursor:?}: {verdict:?}");
                assert_eq!(rewind_decide_native(&facts), verdict.code());
            }
        }
    }

    #[test]
    fn an_old_cursor_gets_a_gap_stream_and_a_recent_one_is_replayed() {
        let mut facts = ResumeFacts::new(SessionFact::Live, CursorFact::InWindow).with_safe_set();
        facts.max_resume_age_ms = 30_000;
        facts.cursor_age_ms = 60_000;
        assert_eq!(decide(&facts), Verdict::FreshGap);
        facts.cursor_age_ms = 1_000;
        assert_eq!(decide(&facts), Verdict::Resume);
    }

    #[test]
    fn without_a_limit_it_is_the_default_table() {
        for session in SessionFact::ALL {
            for cursor in CursorFact::ALL {
                let mut facts = ResumeFacts::new(session, cursor).with_safe_set();
                facts.cursor_age_ms = 3_600_000;
                assert_eq!(decide(&facts), facts.default(), "{session:?} {cursor:?}");
            }
        }
    }
}
"#;

fn readme(name: &str, lib_name: &str) -> String {
    format!(
        r#"# {name}

A resume policy for Rewind, compiled to WebAssembly and run in the policy
host's sandbox. Edit `decide` in `src/lib.rs`; the host only accepts a verdict
from `facts.allowed`, so a policy can make decisions stricter, never looser.

## Test, build, check, deploy

```sh
cargo test                                             # natively
rustup target add wasm32-unknown-unknown               # once
cargo build --release --target wasm32-unknown-unknown
rewind policy check target/wasm32-unknown-unknown/release/{lib_name}.wasm
rewind policy push  target/wasm32-unknown-unknown/release/{lib_name}.wasm   # into a running server
```

`rewind policy check` loads the module in a sandbox of its own, validates it
the way a server would (every row of the decision table and thousands of
random facts, under the real budgets) and prints its verdict next to the
default's for every row. A server configured with a policy directory keeps
the pushed module across restarts; `rewind serve --policy FILE.wasm` starts
with it.

## Rules of the sandbox

- Import nothing (no WASI, no host functions): a module with any import is
  refused.
- Keep no state you cannot lose: each thread has its own instance, and an
  instance is thrown away after a trap or an exhausted budget.
- Each decision has a fuel budget (about 100 000 instructions), a
  wall-clock deadline (about 100 ms) and 2 MiB of memory.
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_cannot_be_crates_are_refused() {
        for bad in [
            "",
            "1policy",
            "my policy",
            "my/policy",
            "fn",
            "self",
            "test",
            "std",
            "é",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["my-policy", "strict_v2", "P"] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn the_sdk_dependency_is_valid_toml_for_a_path_and_a_version() {
        let path = SdkSource::Path(PathBuf::from("/a \"quoted\" dir/policy-sdk"));
        let manifest: toml::Table = toml::from_str(&cargo_toml("p", &path)).unwrap();
        assert_eq!(
            manifest["dependencies"]["rewind-policy-sdk"]["path"].as_str(),
            Some("/a \"quoted\" dir/policy-sdk")
        );
        let version = SdkSource::Version("0.1.0".to_owned());
        let manifest: toml::Table = toml::from_str(&cargo_toml("p", &version)).unwrap();
        assert_eq!(
            manifest["dependencies"]["rewind-policy-sdk"].as_str(),
            Some("0.1.0")
        );
        assert_eq!(
            manifest["profile"]["release"]["panic"].as_str(),
            Some("abort")
        );
    }

    #[test]
    fn a_checkout_built_program_uses_its_own_sdk() {
        assert_eq!(
            SdkSource::choose(None).unwrap(),
            SdkSource::Path(fs::canonicalize(BUILT_FROM_SDK).unwrap())
        );
        assert!(SdkSource::choose(Some(Path::new("/nonexistent"))).is_err());
    }
}
