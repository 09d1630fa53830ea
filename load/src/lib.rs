//! `rewind load`: loads an MCP Streamable HTTP server and verifies every
//! event it delivers.
//!
//! Any server that offers the `progress_stream` tool (arguments `count`,
//! `interval_ms`, `label`; it sends `count` progress notifications with
//! progress `1..=count` and message `"<label> step <i>/<count>"`, then
//! returns the text `"<label> progress_stream done: <count> notifications"`)
//! can be loaded: `rewind serve`, and the peers under `benches/peers/`.
//!
//! Sessions are real HTTP/1.1 keep-alive clients ([`client`]) driven by a
//! [`args::Profile`] ([`profiles`]). Every event is checked as it arrives
//! ([`verify`]): each progress value exactly once and in order (or an
//! announced `gap`/`reset`), the result exactly once, nothing of another
//! call, session or incarnation (every call carries a unique [`mcp::Tag`]
//! in its progress token and in the text the tool echoes). A violation is
//! recorded with its evidence and makes the run fail ([`report`]).

pub mod args;
pub mod client;
pub mod gate;
pub mod http;
pub mod mcp;
pub mod procstat;
pub mod profiles;
pub mod record;
pub mod report;
pub mod sse;
pub mod verify;

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub use args::{Expect, LoadArgs, Profile, Route};
pub use report::Report;

use client::RunContext;
use http::{Node, Nodes, Timeouts};
use profiles::Settings;
use record::Counters;

/// Why a run could not start.
#[derive(Debug)]
pub struct LoadError(pub String);

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

/// Runs a load as `args` say and returns its report (also written to
/// `--json` when given). Call it inside a Tokio runtime with timers and IO.
pub async fn run(args: &LoadArgs) -> Result<Report, LoadError> {
    args.validate().map_err(LoadError)?;
    procstat::raise_open_files_limit();
    let mut nodes = Vec::with_capacity(args.urls.len());
    for url in args.urls.iter().map(|u| u.trim()).filter(|u| !u.is_empty()) {
        nodes.push(
            Node::resolve(url, args.allow_remote)
                .await
                .map_err(|e| LoadError(e.to_string()))?,
        );
    }
    if nodes.is_empty() {
        return Err(LoadError("--url: no URL given".into()));
    }
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let settings = Settings::from_args(args, seed);
    let mut ctx = RunContext::new(
        Nodes::new(nodes, args.route),
        Timeouts {
            connect: args.connect_timeout,
            headers: args.timeout,
            idle: args.timeout,
        },
        fastrand::Rng::with_seed(seed).u32(..),
        settings.delays.len(),
        settings.sessions,
        args.probe_window,
        args.expect,
    );
    ctx.tool_args = args.tool_args().map_err(LoadError)?;
    let ctx = Arc::new(ctx);
    let bar = progress_bar(args, Arc::clone(&ctx));
    let gen_before = procstat::sample(None);
    let outcome = profiles::run(Arc::clone(&ctx), settings.clone()).await;
    let gen_after = procstat::sample(None);
    if let Some((bar, task)) = bar {
        task.abort();
        bar.finish_and_clear();
    }
    let report = Report::build(&ctx, &settings, urls, &outcome, gen_before, gen_after);
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| LoadError(format!("cannot encode the report: {e}")))?;
        std::fs::write(path, json + "\n")
            .map_err(|e| LoadError(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(report)
}

/// A progress bar on stdout while it is a terminal (and not `--quiet`).
fn progress_bar(
    args: &LoadArgs,
    ctx: Arc<RunContext>,
) -> Option<(ProgressBar, tokio::task::JoinHandle<()>)> {
    if args.quiet || !std::io::stdout().is_terminal() {
        return None;
    }
    let total = args.duration.as_millis() as u64;
    let bar = ProgressBar::new(total.max(1));
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let b = bar.clone();
    let task = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            let c = &ctx.record.counters;
            b.set_position((started.elapsed().as_millis() as u64).min(total));
            b.set_message(format!(
                "{} sessions, {} events, {} calls, {} resumes, {} violations, {} errors",
                Counters::get(&c.sessions_opened),
                Counters::get(&c.events),
                Counters::get(&c.calls_completed),
                Counters::get(&c.resumes),
                ctx.record.violation_count(),
                ctx.record.error_count()
            ));
        }
    });
    Some((bar, task))
}

/// `rewind load` as a program: runs, prints the report, and exits 0 only
/// when nothing was violated and nothing failed (1: violations, 2: errors
/// only, 3: the run could not start).
pub fn main(args: LoadArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rewind load: cannot start a runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(report) => {
            print!("{}", report.render(args.show_violations));
            if report.violation_count > 0 {
                ExitCode::from(1)
            } else if !report.passed() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("rewind load: {e}");
            ExitCode::from(3)
        }
    }
}
