//! The `rewind` command line: its arguments, and the `policy` commands
//! (`list`, `export`, `new` and `check` offline; `push`, `status`,
//! `rollback` against a running server's admin surface).
//!
//! `rewind` with no subcommand is `rewind serve`; the serve flags are
//! accepted at the top level too, so `rewind --listen 127.0.0.1:9000` works.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use rewind_engine::policy::wasm::{vectors, PolicyHost};
use rewind_engine::policy::{clamp, Policy};
use rewind_engine::{PolicyFault, Verdict};
use serde_json::Value;

use crate::admin::{describe_failure, describe_report};
use crate::settings::ServeArgs;

pub mod bundled;
pub mod template;

/// Where `policy push/status/rollback` find the admin surface by default.
pub const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:8081";

/// Rewind: session-safe SSE resumption for MCP Streamable HTTP servers.
#[derive(Debug, Parser)]
#[command(name = "rewind", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do (default: `serve`).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of `serve`, when no subcommand is given.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the MCP server (Streamable HTTP at /mcp) and its admin surface
    Serve(Box<ServeArgs>),
    /// Check a policy plugin offline, or control the policy of a running server
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Walk an in-process engine through the decision table and print what it did
    Demo,
    /// Load an MCP server with verifying clients and report throughput, latency and violations
    Load(rewind_load::LoadArgs),
    /// Inspect a data directory of durable sessions
    #[command(subcommand)]
    Data(DataCommand),
    /// Compile one policy module for `rewind serve` (the child process of
    /// `--policy-compiler child`: a request on stdin, the compiled module on
    /// stdout); not meant to be run by hand
    #[command(hide = true)]
    CompilePolicy,
}

/// `rewind data ...`
#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Verify a data directory offline (header, lock, journal checksums,
    /// segment chains, event checksums) and print what a restart would
    /// restore; exits non-zero if anything is damaged
    Check {
        /// The data directory
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// Runs a `rewind data` command. A damaged directory is an error (non-zero
/// exit) after its report is printed.
pub fn run_data(command: DataCommand) -> Result<(), CommandError> {
    match command {
        DataCommand::Check { dir } => {
            let report = rewind_engine::durable::check(&dir)
                .map_err(|e| CommandError(format!("data check: {e}")))?;
            println!("{report}");
            if report.is_clean() {
                Ok(())
            } else {
                Err(CommandError(format!(
                    "data check: {} is damaged (a restart skips the damaged parts)",
                    dir.display()
                )))
            }
        }
    }
}

/// `rewind policy ...`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// List the policy plugins built into this program (name, size, what it decides)
    List {
        /// Also list the hostile fixtures used to test the sandbox
        #[arg(long)]
        fixtures: bool,
    },
    /// Write a bundled plugin's .wasm to a file (see `policy list`)
    Export {
        /// The plugin's name, as `policy list` shows it
        name: String,
        /// Where to write it (`-` for standard output) [default: NAME.wasm]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Overwrite the file if it exists
        #[arg(long)]
        force: bool,
    },
    /// Start a new policy crate from a template (build it with
    /// `cargo build --release --target wasm32-unknown-unknown`)
    New {
        /// The crate's name, e.g. `my-policy`
        name: String,
        /// The crate's directory, which must not exist or be empty [default: ./NAME]
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Depend on the rewind-policy-sdk crate in this directory [default: the
        /// source tree this program was built from, if present; else crates.io]
        #[arg(long, value_name = "DIR")]
        sdk_path: Option<PathBuf>,
    },
    /// Validate a plugin and print its verdict for every row of the decision table
    Check {
        /// The plugin
        #[arg(value_name = "FILE.wasm")]
        file: PathBuf,
    },
    /// Upload a plugin to a running server, which validates it and swaps it in
    Push {
        /// The plugin
        #[arg(value_name = "FILE.wasm")]
        file: PathBuf,
        /// Name of the policy [default: the file's stem]
        #[arg(long)]
        name: Option<String>,
        /// The server's admin surface.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show the live policy generation of a running server and its history
    Status {
        /// The server's admin surface.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Put the previous good policy generation of a running server back
    Rollback {
        /// The server's admin surface.
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// How to reach a running server's admin surface.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// Base URL of the admin surface
    #[arg(long, env = "REWIND_ADMIN_URL", default_value = DEFAULT_ADMIN_URL)]
    pub admin: String,
    /// Bearer token of the admin surface (printed by `rewind serve` at start)
    #[arg(long, env = "REWIND_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// A failed command: the message to print, already worded for the operator.
#[derive(Debug)]
pub struct CommandError(pub String);

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommandError {}

/// Runs a `policy` subcommand, printing its result on stdout.
pub fn run_policy(command: PolicyCommand) -> Result<(), CommandError> {
    match command {
        PolicyCommand::List { fixtures } => {
            print!("{}", bundled::list(fixtures));
            Ok(())
        }
        PolicyCommand::Export {
            name,
            output,
            force,
        } => {
            let target = bundled::ExportTarget::from_arg(output.as_deref(), &name);
            let done = bundled::export(&name, &target, force)?;
            if target == bundled::ExportTarget::Stdout {
                eprintln!("{done}");
            } else {
                println!("{done}");
            }
            Ok(())
        }
        PolicyCommand::New {
            name,
            dir,
            sdk_path,
        } => {
            let sdk = template::SdkSource::choose(sdk_path.as_deref())?;
            let created = template::new_crate(&name, dir.as_deref(), sdk)?;
            print!("{}", created.summary());
            Ok(())
        }
        PolicyCommand::Check { file } => {
            let (table, outcome) = check(&file)?;
            print!("{table}");
            outcome
        }
        PolicyCommand::Push { file, name, admin } => {
            let name = match name {
                Some(n) => n,
                None => file
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "uploaded".to_owned()),
            };
            let wasm = std::fs::read(&file)
                .map_err(|e| CommandError(format!("cannot read {}: {e}", file.display())))?;
            let url = format!("{}/policy", admin.admin.trim_end_matches('/'));
            let body = admin_request(&admin, reqwest::Method::POST, url, &[("name", &name)], wasm)?;
            println!("{}", message_of(&body));
            Ok(())
        }
        PolicyCommand::Status { admin } => {
            let url = format!("{}/policy", admin.admin.trim_end_matches('/'));
            let body = admin_request(&admin, reqwest::Method::GET, url, &[], Vec::new())?;
            print!("{}", status_table(&body));
            Ok(())
        }
        PolicyCommand::Rollback { admin } => {
            let url = format!("{}/policy/rollback", admin.admin.trim_end_matches('/'));
            let body = admin_request(&admin, reqwest::Method::POST, url, &[], Vec::new())?;
            println!("{}", message_of(&body));
            Ok(())
        }
    }
}

/// A plain table (no borders, columns aligned): easy to read and to grep.
fn table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header.iter().copied());
    t
}

/// Right-aligns column `i` (numbers).
fn right(t: &mut comfy_table::Table, i: usize) {
    if let Some(c) = t.column_mut(i) {
        c.set_cell_alignment(comfy_table::CellAlignment::Right);
    }
}

/// A short name for a verdict and the answer it becomes over MCP HTTP.
pub fn verdict_answer(v: Verdict) -> &'static str {
    match v {
        Verdict::Resume => "resume (200, replay)",
        Verdict::Fresh => "fresh (200)",
        Verdict::FreshReset => "fresh (200, `reset`)",
        Verdict::FreshGap => "fresh (200, `gap`)",
        Verdict::BadRequest => "reject (400)",
        Verdict::Conflict => "reject (409)",
        Verdict::Gone => "gone (404)",
        _ => "unknown",
    }
}

/// `rewind policy check`: loads the plugin in a sandbox of its own,
/// validates it, and tabulates its verdict on every decision-table row
/// next to the default's. Returns the text to print and whether the plugin
/// passed; a plugin that does not load gives only an error.
pub fn check(file: &Path) -> Result<(String, Result<(), CommandError>), CommandError> {
    let host = PolicyHost::with_default_policy()
        .map_err(|e| CommandError(format!("cannot start the policy host: {e}")))?;
    let wasm = std::fs::read(file)
        .map_err(|e| CommandError(format!("cannot read {}: {e}", file.display())))?;
    if !wasm.starts_with(b"\0asm") {
        return Err(CommandError(format!(
            "{} is not a WebAssembly module (it does not start with `\\0asm`)",
            file.display()
        )));
    }
    let name = file
        .file_stem()
        .map_or_else(|| "policy".into(), |s| s.to_string_lossy());
    let module = host
        .load(&name, &wasm)
        .map_err(|e| CommandError(format!("policy {} does not load: {e}", file.display())))?;
    let report = host.validate(&module);
    // Run the table through the host's real decision path (budgets,
    // fallback, clamping), on a host of its own so nothing else is affected.
    host.swap_unvalidated(&module)
        .map_err(|e| CommandError(format!("cannot run policy {}: {e}", file.display())))?;
    let host = Arc::new(host);

    let rows = vectors::decision_table();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "policy `{}` ({}), every row of the decision table:\n",
        module.name(),
        file.display()
    );
    let mut rendered = table(&["#", "session", "cursor", "default", "this policy", ""]);
    let (mut differ, mut faulted) = (0, 0);
    for (i, facts) in rows.iter().enumerate() {
        let (verdict, fault) = clamp(facts, host.decide(facts));
        let default = facts.default();
        let mark = match fault {
            Some(PolicyFault::OutOfSet) => {
                faulted += 1;
                "!! out of the safe set: default used".to_owned()
            }
            Some(f) => {
                faulted += 1;
                format!("!! {f}: default used")
            }
            None if verdict != default => {
                differ += 1;
                "* differs".to_owned()
            }
            None => String::new(),
        };
        rendered.add_row([
            (i + 1).to_string(),
            facts
                .session_fact()
                .map_or_else(|| facts.session.to_string(), |s| format!("{s:?}")),
            facts
                .cursor_fact()
                .map_or_else(|| facts.cursor.to_string(), |c| format!("{c:?}")),
            verdict_answer(default).to_owned(),
            verdict_answer(verdict).to_owned(),
            mark,
        ]);
    }
    right(&mut rendered, 0);
    for line in rendered.to_string().lines() {
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(
        out,
        "\n{} rows: {} differ from the default, {} fell back to it",
        rows.len(),
        differ,
        faulted
    );
    let _ = writeln!(out, "validation: {}", describe_report(&report));
    let outcome = if report.passed() {
        Ok(())
    } else {
        let mut message = format!(
            "{}; a server would refuse it. First failures:",
            describe_report(&report)
        );
        for failure in &report.failures {
            let _ = write!(message, "\n  - {}", describe_failure(failure));
        }
        Err(CommandError(message))
    };
    Ok((out, outcome))
}

fn admin_request(
    admin: &AdminArgs,
    method: reqwest::Method,
    url: String,
    query: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Value, CommandError> {
    let token = admin.token.as_deref().ok_or_else(|| {
        CommandError(
            "no admin token: pass --token or set REWIND_ADMIN_TOKEN (the token `rewind serve` printed)"
                .to_owned(),
        )
    })?;
    let client = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .map_err(|e| CommandError(format!("cannot build an HTTP client: {e}")))?;
    let response = client
        .request(method, &url)
        .query(query)
        .bearer_auth(token)
        .header(reqwest::header::CONTENT_TYPE, "application/wasm")
        .body(body)
        .send()
        .map_err(|e| CommandError(format!("cannot reach the admin surface at {url}: {e}")))?;
    let status = response.status();
    let text = response
        .text()
        .map_err(|e| CommandError(format!("reading the answer from {url}: {e}")))?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status.is_success() {
        Ok(body)
    } else {
        Err(CommandError(format!(
            "the server refused ({status}): {}",
            refusal_text(&body)
        )))
    }
}

fn message_of(body: &Value) -> String {
    body.get("message")
        .and_then(Value::as_str)
        .map_or_else(|| body.to_string(), str::to_owned)
}

fn refusal_text(body: &Value) -> String {
    let mut text = message_of(body);
    if let Some(failures) = body.get("failures").and_then(Value::as_array) {
        for f in failures.iter().filter_map(Value::as_str) {
            let _ = write!(text, "\n  - {f}");
        }
    }
    text
}

fn status_table(body: &Value) -> String {
    let mut out = String::new();
    let live = &body["live"];
    let _ = writeln!(
        out,
        "live: generation {} `{}` ({} swaps, {} manual and {} automatic rollbacks)",
        live["generation"],
        live["name"].as_str().unwrap_or("?"),
        body["swaps"],
        body["manual_rollbacks"],
        body["automatic_rollbacks"]
    );
    if let Some(loads) = body.get("loads").filter(|l| l.is_object()) {
        let _ = writeln!(
            out,
            "loads: {} loaded, {} refused, {} compiler failures ({:.3} s in all)",
            loads["loaded"],
            loads["refused"],
            loads["compiler_failed"],
            loads["seconds"].as_f64().unwrap_or(0.0)
        );
    }
    // A blank line before the table.
    out.push('\n');
    let mut rendered = table(&["generation", "name", "state", "decisions", "faults"]);
    for g in body["generations"].as_array().into_iter().flatten() {
        let faults: u64 = g["faults"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        rendered.add_row([
            g["generation"].to_string(),
            g["name"].as_str().unwrap_or("?").to_owned(),
            g["state"].as_str().unwrap_or("?").to_owned(),
            g["decisions"].to_string(),
            faults.to_string(),
        ]);
    }
    for i in [0, 3, 4] {
        right(&mut rendered, i);
    }
    for line in rendered.to_string().lines() {
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if let Some(store) = body.get("store").filter(|s| s.is_object()) {
        let live = store["live_file"]
            .as_str()
            .map_or_else(|| "the start policy".to_owned(), str::to_owned);
        let _ = writeln!(
            out,
            "\npolicy dir: {} (after a restart: {live})",
            store["dir"].as_str().unwrap_or("?")
        );
        if let Some(e) = store["error"].as_str() {
            let _ = writeln!(out, "WARNING: {e}");
        }
    }
    out
}
