//! The flags of `rewind load`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

/// What the sessions do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// Every session loops tool calls and reads each SSE response to its end.
    Throughput,
    /// Like throughput, but a fraction of calls is cut mid-stream and resumed
    /// with `Last-Event-ID` after a delay.
    Resume,
    /// All sessions stream, all are cut at once, and all resume at once (as
    /// after a load balancer or process restart); repeated while time is left.
    Storm,
    /// Three quarters of the sessions stream and resume; the others present
    /// foreign, stale, future and malformed cursors and check the answers.
    Adversarial,
    /// Sessions churn: open, stream, cut, resume, close or abandon, again.
    Soak,
    /// Every session mixes plain calls, cut-and-resume calls and probes.
    Mixed,
    /// Open the sessions, one short call each, then leave them idle and
    /// measure the server's memory per idle session.
    Idle,
}

impl Profile {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Throughput => "throughput",
            Profile::Resume => "resume",
            Profile::Storm => "storm",
            Profile::Adversarial => "adversarial",
            Profile::Soak => "soak",
            Profile::Mixed => "mixed",
            Profile::Idle => "idle",
        }
    }

    /// Progress notifications per call unless `--count` says.
    pub fn default_count(self) -> u32 {
        match self {
            Profile::Throughput => 200,
            Profile::Resume | Profile::Adversarial | Profile::Mixed => 100,
            Profile::Storm => 20,
            Profile::Soak => 50,
            Profile::Idle => 1,
        }
    }

    /// Pause between notifications unless `--interval` says.
    pub fn default_interval(self) -> Duration {
        match self {
            Profile::Soak => Duration::from_millis(1),
            _ => Duration::ZERO,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether probe answers are held to Rewind's decision table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Expect {
    /// When the server says it is Rewind (its `serverInfo.name` starts with
    /// `rewind`).
    Auto,
    /// Always (a violation for every other answer).
    Table,
    /// Never: record the answers, flag only deliveries of foreign events.
    Record,
}

/// How requests are spread over several `--url`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Route {
    /// Every request goes to the next URL in turn, whatever its session
    /// (the nodes forward to the session's owner).
    #[default]
    RoundRobin,
    /// Sessions go to the URLs in turn, and every request of a session goes
    /// to the URL its `initialize` went to, as a load balancer with session
    /// affinity by `Mcp-Session-Id` routes them.
    Sticky,
}

impl Route {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Route::RoundRobin => "round-robin",
            Route::Sticky => "sticky",
        }
    }

    /// The index of the URL (of `urls`, at least one) that a request goes
    /// to: the `request`-th request of the run, of the session whose fresh
    /// `initialize` was the `session`-th of the run (both from 0).
    /// Round-robin follows the run's requests, sticky the session.
    pub fn target(self, urls: usize, session: usize, request: usize) -> usize {
        debug_assert!(urls > 0, "at least one URL");
        match self {
            Route::RoundRobin => request % urls,
            Route::Sticky => session % urls,
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `rewind load`: load an MCP Streamable HTTP server and verify every event.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// MCP endpoint(s); repeat the flag or separate with commas. Requests are
    /// spread over them as `--route` says.
    #[arg(
        long = "url",
        value_name = "URL",
        required = true,
        value_delimiter = ','
    )]
    pub urls: Vec<String>,
    /// How requests are spread over several URLs: round-robin sends each
    /// request to the next URL; sticky sends sessions to the URLs in turn and
    /// every request of a session to the URL of its `initialize` (a load
    /// balancer with affinity by Mcp-Session-Id)
    #[arg(long, value_enum, default_value_t = Route::RoundRobin)]
    pub route: Route,
    /// Concurrent sessions
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub sessions: u32,
    /// How long to load (sessions stop starting calls after it)
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// What the sessions do
    #[arg(long, value_enum, default_value_t = Profile::Throughput)]
    pub profile: Profile,
    /// Progress notifications per call [default: by profile: 200 throughput, 100 resume/adversarial/mixed, 20 storm, 50 soak]
    #[arg(long, value_name = "N")]
    pub count: Option<u32>,
    /// Pause between two notifications of a call [default: 0ms; 1ms for soak]
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub interval: Option<Duration>,
    /// Extra arguments of every `progress_stream` call, a JSON object
    /// merged into `count`/`interval_ms`/`label` (which it may not set),
    /// e.g. `{"via":"peer"}` for Rewind's reference server
    #[arg(long, value_name = "JSON")]
    pub tool_args: Option<String>,
    /// Fraction of calls cut mid-stream and resumed (resume, adversarial, soak, mixed)
    #[arg(long, default_value_t = 0.5, value_name = "0..1")]
    pub resume_fraction: f64,
    /// Pause between the cut and the resume; several (comma-separated) are
    /// used in turn and reported apart
    #[arg(long, value_delimiter = ',', default_value = "0ms,50ms", value_parser = humantime::parse_duration)]
    pub resume_delay: Vec<Duration>,
    /// Pause a session takes after each call (throughput and resume
    /// profiles). 0 is a closed loop: every session calls again as soon as
    /// its last call ends, so a faster server is driven harder and its
    /// latencies include queueing behind that extra work. A pause bounds
    /// the offered load, so servers that keep up are compared at the same
    /// rate.
    #[arg(long, default_value = "0ms", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub think: Duration,
    /// Progress events a storm session reads before the cut
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub storm_cut_after: u32,
    /// How long a probe reads a 200 answer for events
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub probe_window: Duration,
    /// Hold probe answers to Rewind's decision table
    #[arg(long, value_enum, default_value_t = Expect::Auto)]
    pub expect: Expect,
    /// Sessions initialising at once while the run starts
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub open_concurrency: usize,
    /// Write the report as JSON to this file
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Sample this server process's CPU and memory (Linux /proc)
    #[arg(long, value_name = "PID")]
    pub server_pid: Option<u32>,
    /// Allow URLs that are not loopback addresses
    #[arg(long)]
    pub allow_remote: bool,
    /// TCP connect timeout
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Longest wait for response headers, and between two chunks of a body
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Violations printed in full (all are in the JSON, up to 1000)
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub show_violations: usize,
    /// Seed for the cut points and mixes [default: random]
    #[arg(long)]
    pub seed: Option<u64>,
    /// No progress bar even on a terminal
    #[arg(long)]
    pub quiet: bool,
}

impl LoadArgs {
    /// Arguments for `profile` against `urls`, everything else default.
    pub fn new(urls: Vec<String>, profile: Profile) -> LoadArgs {
        LoadArgs {
            urls,
            route: Route::RoundRobin,
            sessions: 20,
            duration: Duration::from_secs(10),
            profile,
            count: None,
            interval: None,
            tool_args: None,
            resume_fraction: 0.5,
            resume_delay: vec![Duration::ZERO, Duration::from_millis(50)],
            think: Duration::ZERO,
            storm_cut_after: 1,
            probe_window: Duration::from_millis(200),
            expect: Expect::Auto,
            open_concurrency: 128,
            json: None,
            server_pid: None,
            allow_remote: false,
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
            show_violations: 10,
            seed: None,
            quiet: true,
        }
    }

    /// Notifications per call.
    pub fn count(&self) -> u32 {
        self.count.unwrap_or_else(|| self.profile.default_count())
    }

    /// Pause between notifications.
    pub fn interval(&self) -> Duration {
        self.interval
            .unwrap_or_else(|| self.profile.default_interval())
    }

    /// The extra tool arguments of `--tool-args` (empty without it).
    pub fn tool_args(&self) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        let Some(text) = &self.tool_args else {
            return Ok(serde_json::Map::new());
        };
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("--tool-args is not JSON: {e}"))?;
        let serde_json::Value::Object(map) = value else {
            return Err("--tool-args must be a JSON object, e.g. '{\"via\":\"peer\"}'".into());
        };
        if let Some(k) = ["count", "interval_ms", "label"]
            .into_iter()
            .find(|k| map.contains_key(*k))
        {
            return Err(format!(
                "--tool-args may not set `{k}` (use --count, --interval; the label is the call's tag)"
            ));
        }
        Ok(map)
    }

    /// Checks the values clap cannot, naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        self.tool_args()?;
        if self.sessions == 0 {
            return Err("--sessions must be at least 1".into());
        }
        if !(1..=100_000).contains(&self.count()) {
            return Err("--count must be between 1 and 100000 (the tool's limit)".into());
        }
        if self.interval() > Duration::from_secs(60) {
            return Err("--interval must be at most 60s (the tool's limit)".into());
        }
        if !(0.0..=1.0).contains(&self.resume_fraction) {
            return Err("--resume-fraction must be between 0 and 1".into());
        }
        if self.resume_delay.is_empty() {
            return Err("--resume-delay needs at least one value".into());
        }
        if self.open_concurrency == 0 {
            return Err("--open-concurrency must be at least 1".into());
        }
        if self.profile == Profile::Storm
            && (self.storm_cut_after == 0 || self.storm_cut_after >= self.count())
        {
            return Err(format!(
                "--storm-cut-after must be between 1 and --count - 1 ({}) for the storm profile",
                self.count().saturating_sub(1)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_tool_args(text: &str) -> LoadArgs {
        let mut a = LoadArgs::new(vec!["http://127.0.0.1:1/mcp".into()], Profile::Throughput);
        a.tool_args = Some(text.into());
        a
    }

    #[test]
    fn tool_args_must_be_an_object_that_leaves_the_three_fixed_arguments_alone() {
        let ok = with_tool_args(r#"{"via":"peer"}"#).tool_args().unwrap();
        assert_eq!(ok["via"], "peer");
        let e = with_tool_args("[1]").validate().unwrap_err();
        assert!(e.contains("JSON object"), "{e}");
        let e = with_tool_args("{nope").validate().unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let e = with_tool_args(r#"{"count":3}"#).validate().unwrap_err();
        assert!(e.contains("`count`"), "{e}");
        assert!(LoadArgs::new(vec![], Profile::Throughput)
            .tool_args()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn round_robin_follows_the_run_s_requests_and_sticky_the_session() {
        // Request k of the run, of the session opened s-th, over 3 URLs.
        for s in 0..7 {
            for k in 0..10 {
                assert_eq!(Route::RoundRobin.target(3, s, k), k % 3);
                assert_eq!(Route::Sticky.target(3, s, k), s % 3);
            }
        }
        // Sticky: sessions in turn, each one's requests all on its URL.
        let homes: Vec<usize> = (0..6).map(|s| Route::Sticky.target(3, s, 0)).collect();
        assert_eq!(homes, [0, 1, 2, 0, 1, 2]);
        assert!((0..50).all(|k| Route::Sticky.target(3, 4, k) == 1));
        // Round-robin: consecutive requests of the run take the URLs in turn.
        let rr: Vec<usize> = (0..6).map(|k| Route::RoundRobin.target(3, 0, k)).collect();
        assert_eq!(rr, [0, 1, 2, 0, 1, 2]);
        // One URL: always it.
        for (s, k) in [(0, 0), (5, 9), (usize::MAX, usize::MAX)] {
            assert_eq!(Route::RoundRobin.target(1, s, k), 0);
            assert_eq!(Route::Sticky.target(1, s, k), 0);
        }
    }

    #[test]
    fn the_route_flag_defaults_to_round_robin_and_parses_sticky() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            load: LoadArgs,
        }
        let url = "--url=http://127.0.0.1:1/mcp";
        let a = Cli::try_parse_from(["load", url]).unwrap().load;
        assert_eq!(a.route, Route::RoundRobin);
        let a = Cli::try_parse_from(["load", url, "--route", "sticky"])
            .unwrap()
            .load;
        assert_eq!(a.route, Route::Sticky);
        assert!(Cli::try_parse_from(["load", url, "--route", "random"]).is_err());
        assert_eq!(Route::Sticky.to_string(), "sticky");
        assert_eq!(Route::RoundRobin.to_string(), "round-robin");
    }

    #[test]
    fn a_call_carries_the_extra_arguments_beside_its_own() {
        let extra = with_tool_args(r#"{"via":"peer","x":[1]}"#)
            .tool_args()
            .unwrap();
        let body = crate::mcp::call_progress_stream(
            7,
            crate::mcp::Tag {
                run: 1,
                session: 2,
                call: 3,
            },
            5,
            0,
            &extra,
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let args = &v["params"]["arguments"];
        assert_eq!(args["via"], "peer");
        assert_eq!(args["x"][0], 1);
        assert_eq!(args["count"], 5);
        assert_eq!(args["label"], v["params"]["_meta"]["progressToken"]);
    }
}
