//! The report of a run: one serde structure, written as JSON with `--json`
//! and rendered as text for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::client::RunContext;
use crate::procstat::ProcSample;
use crate::profiles::{Outcome, Settings};
use crate::record::{lock, Counters, ErrorRecord, Percentiles, ProbeTally, Violation};

/// Everything a run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The profile.
    pub profile: String,
    /// The URLs loaded.
    pub urls: Vec<String>,
    /// How requests were spread over them (`round-robin`, `sticky`).
    pub route: String,
    /// The server's `serverInfo` name and version.
    pub server: Option<ServerInfo>,
    /// Whether probe answers were held to Rewind's decision table.
    pub decision_table_checked: bool,
    /// Sessions asked for.
    pub sessions: u32,
    /// Sessions that initialised.
    pub sessions_opened: u32,
    /// Notifications per call, and the pause between them.
    pub count: u32,
    /// See `count`.
    pub interval_ms: u64,
    /// Milliseconds a session paused after each call (0: a closed loop).
    pub think_ms: u64,
    /// The seed of the cut points and mixes.
    pub seed: u64,
    /// Seconds the sessions took to initialise.
    pub opening_s: f64,
    /// Seconds of load (after the opening).
    pub elapsed_s: f64,
    /// Call counts.
    pub calls: Calls,
    /// Event counts.
    pub events: Events,
    /// POST → result of calls that were not cut.
    pub call_latency: Option<Percentiles>,
    /// Resume latencies by resume delay.
    pub resume: Vec<ResumeReport>,
    /// Storm rounds.
    pub storm: Vec<StormRound>,
    /// Probe answers by kind.
    pub probes: BTreeMap<String, ProbeTally>,
    /// The idle profile's memory per session.
    pub idle: Option<IdleReport>,
    /// The server process (with `--server-pid`).
    pub server_process: Option<ProcessReport>,
    /// This generator's own CPU.
    pub generator: ProcessReport,
    /// Session counts.
    pub session_counts: SessionCounts,
    /// Violation counts by kind, and the total.
    pub violations_by_kind: BTreeMap<String, u64>,
    /// All violations.
    pub violation_count: u64,
    /// The first violations in full.
    pub violations: Vec<Violation>,
    /// Transport errors by kind, and the total.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// All errors.
    pub error_count: u64,
    /// The first errors in full.
    pub errors: Vec<ErrorRecord>,
}

/// The server's `serverInfo`.
#[derive(Debug, Clone, Serialize)]
pub struct ServerInfo {
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
}

/// Call counts.
#[derive(Debug, Clone, Serialize)]
pub struct Calls {
    /// Sent.
    pub started: u64,
    /// With their result.
    pub completed: u64,
    /// Ended by `reset`.
    pub reset: u64,
    /// Without a result.
    pub failed: u64,
    /// Completed calls per second.
    pub per_s: f64,
    /// Resumes for calls (planned and not).
    pub resumes: u64,
    /// Resumes after the server ended a stream before its result.
    pub resumes_unplanned: u64,
    /// Streams still open after their result.
    pub streams_left_open: u64,
}

/// Event counts.
#[derive(Debug, Clone, Serialize)]
pub struct Events {
    /// Progress notifications delivered in order.
    pub delivered: u64,
    /// Per second.
    pub per_s: f64,
    /// Every event with data that was checked.
    pub checked: u64,
    /// `gap` signals.
    pub gaps: u64,
    /// `reset` signals.
    pub resets: u64,
}

/// Resume latencies for one delay.
#[derive(Debug, Clone, Serialize)]
pub struct ResumeReport {
    /// The delay between cut and resume.
    pub delay_ms: u64,
    /// `GET` → headers.
    pub headers: Option<Percentiles>,
    /// `GET` → first event with a message.
    pub first_event: Option<Percentiles>,
}

/// One storm round.
#[derive(Debug, Clone, Serialize)]
pub struct StormRound {
    /// Sessions in it.
    pub sessions: u64,
    /// Cut and resumed at once.
    pub resumed: u64,
    /// Whose call completed.
    pub completed: u64,
    /// Whose call failed.
    pub failed: u64,
    /// Resume → every session's first event (ms).
    pub all_first_event_ms: Option<f64>,
    /// Resume → every session's result (ms): the storm's completion time.
    pub completion_ms: f64,
    /// Median and 99th percentile of resume → result (ms).
    pub result_p50_ms: Option<f64>,
    /// See `result_p50_ms`.
    pub result_p99_ms: Option<f64>,
    /// Whether every session finished within the timeout.
    pub finished: bool,
}

/// The idle profile's figures.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    /// Sessions held idle.
    pub sessions: u32,
    /// Server RSS before the first session, KiB.
    pub rss_before_kib: u64,
    /// Server RSS with every session idle, KiB.
    pub rss_after_kib: u64,
    /// (after − before) / sessions.
    pub bytes_per_session: Option<f64>,
    /// Sampled sessions that still completed a call at the end.
    pub alive: u32,
    /// Sessions sampled.
    pub sampled: u32,
}

/// CPU and memory of a process over the measured phase.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    /// Process id (`None`: this generator).
    pub pid: Option<u32>,
    /// CPU seconds used in the measured phase.
    pub cpu_s: f64,
    /// Of one core.
    pub cpu_percent: f64,
    /// RSS before the sessions opened, KiB.
    pub rss_start_kib: Option<u64>,
    /// RSS when the load began, KiB.
    pub rss_before_kib: Option<u64>,
    /// RSS when it ended, KiB.
    pub rss_after_kib: Option<u64>,
    /// Of `rss_after_kib`, anonymous memory (what the process wrote; the
    /// rest is file-backed, mostly code), KiB.
    pub rss_anon_after_kib: Option<u64>,
    /// Largest RSS sampled during the load, KiB.
    pub rss_max_kib: Option<u64>,
    /// CPU microseconds per delivered event.
    pub cpu_us_per_event: Option<f64>,
}

/// Session counts.
#[derive(Debug, Clone, Serialize)]
pub struct SessionCounts {
    /// Initialised (re-initialisations and soak lives included).
    pub opened: u64,
    /// Ended with `DELETE`.
    pub deleted: u64,
    /// Left without `DELETE`.
    pub abandoned: u64,
    /// Adversarial probes.
    pub probes: u64,
}

fn per_s(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

impl Report {
    /// Assembles the report.
    pub fn build(
        ctx: &RunContext,
        s: &Settings,
        urls: Vec<String>,
        out: &Outcome,
        gen_before: Option<ProcSample>,
        gen_after: Option<ProcSample>,
    ) -> Report {
        let c = &ctx.record.counters;
        let secs = out.measured.as_secs_f64();
        let delivered = Counters::get(&c.events);
        let cpu = |before: Option<ProcSample>, after: Option<ProcSample>| match (before, after) {
            (Some(b), Some(a)) => (a.cpu_s - b.cpu_s).max(0.0),
            _ => 0.0,
        };
        let process = |pid: Option<u32>,
                       start: Option<ProcSample>,
                       before: Option<ProcSample>,
                       after: Option<ProcSample>,
                       max: Option<u64>| {
            let cpu_s = cpu(before, after);
            ProcessReport {
                pid,
                cpu_s,
                cpu_percent: if secs > 0.0 {
                    100.0 * cpu_s / secs
                } else {
                    0.0
                },
                rss_start_kib: start.map(|p| p.rss_kib),
                rss_before_kib: before.map(|p| p.rss_kib),
                rss_after_kib: after.map(|p| p.rss_kib),
                rss_anon_after_kib: after.and_then(|p| p.rss_anon_kib),
                rss_max_kib: max,
                cpu_us_per_event: (delivered > 0).then(|| cpu_s * 1e6 / delivered as f64),
            }
        };
        let rss_max = out.rss_series.iter().map(|&(_, k)| k).max();
        let server_process = s.server_pid.map(|pid| {
            process(
                Some(pid),
                out.server_at_start,
                out.server_before,
                out.server_after,
                rss_max.max(out.server_after.map(|p| p.rss_kib)),
            )
        });
        let resume = s
            .delays
            .iter()
            .zip(&ctx.record.resume)
            .map(|(d, l)| {
                let l = lock(l);
                ResumeReport {
                    delay_ms: d.as_millis() as u64,
                    headers: l.headers.percentiles(),
                    first_event: l.first_event.percentiles(),
                }
            })
            .collect();
        let storm = out
            .rounds
            .iter()
            .map(|r| {
                let mut results: Vec<f64> =
                    r.times.iter().map(|t| t.1.as_secs_f64() * 1e3).collect();
                results.sort_by(f64::total_cmp);
                let firsts: Vec<f64> = r
                    .times
                    .iter()
                    .filter_map(|t| t.0.map(|d| d.as_secs_f64() * 1e3))
                    .collect();
                StormRound {
                    sessions: r.sessions,
                    resumed: r.resumed,
                    completed: r.completed,
                    failed: r.dropped,
                    all_first_event_ms: firsts.iter().copied().reduce(f64::max),
                    completion_ms: results
                        .last()
                        .copied()
                        .unwrap_or(r.waited.as_secs_f64() * 1e3),
                    result_p50_ms: percentile(&results, 0.5),
                    result_p99_ms: percentile(&results, 0.99),
                    finished: r.all_done,
                }
            })
            .collect();
        let idle = out.idle.as_ref().map(|i| {
            let before = out.server_at_start.map_or(0, |p| p.rss_kib);
            let after = out.server_after.map_or(0, |p| p.rss_kib);
            IdleReport {
                sessions: i.sessions,
                rss_before_kib: before,
                rss_after_kib: after,
                bytes_per_session: (s.server_pid.is_some() && i.sessions > 0)
                    .then(|| (after as f64 - before as f64) * 1024.0 / f64::from(i.sessions)),
                alive: i.alive,
                sampled: i.sampled,
            }
        });
        let (violations, by_kind) = ctx.record.violations();
        let (errors, errors_by_kind) = ctx.record.errors();
        let completed = Counters::get(&c.calls_completed);
        Report {
            profile: s.profile.name().to_owned(),
            urls,
            route: ctx.nodes.route().name().to_owned(),
            server: ctx
                .server()
                .map(|(name, version)| ServerInfo { name, version }),
            decision_table_checked: ctx.strict(),
            sessions: s.sessions,
            sessions_opened: out.opened,
            count: s.count,
            interval_ms: s.interval_ms,
            think_ms: s.think.as_millis() as u64,
            seed: s.seed,
            opening_s: out.opening.as_secs_f64(),
            elapsed_s: secs,
            calls: Calls {
                started: Counters::get(&c.calls_started),
                completed,
                reset: Counters::get(&c.calls_reset),
                failed: Counters::get(&c.calls_failed),
                per_s: per_s(completed, secs),
                resumes: Counters::get(&c.resumes),
                resumes_unplanned: Counters::get(&c.resumes_unplanned),
                streams_left_open: Counters::get(&c.streams_left_open),
            },
            events: Events {
                delivered,
                per_s: per_s(delivered, secs),
                checked: Counters::get(&c.events_checked),
                gaps: Counters::get(&c.gaps),
                resets: Counters::get(&c.resets),
            },
            call_latency: lock(&ctx.record.call_latency).percentiles(),
            resume,
            storm,
            probes: lock(&ctx.record.probes)
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
            idle,
            server_process,
            generator: process(None, None, gen_before, gen_after, None),
            session_counts: SessionCounts {
                opened: Counters::get(&c.sessions_opened),
                deleted: Counters::get(&c.sessions_deleted),
                abandoned: Counters::get(&c.sessions_abandoned),
                probes: Counters::get(&c.probes),
            },
            violations_by_kind: by_kind
                .into_iter()
                .map(|(k, v)| (k.name().to_owned(), v))
                .collect(),
            violation_count: ctx.record.violation_count(),
            violations,
            errors_by_kind,
            error_count: ctx.record.error_count(),
            errors,
        }
    }

    /// Whether the run passed: no violation, no error, something done.
    pub fn passed(&self) -> bool {
        self.violation_count == 0
            && self.error_count == 0
            && self.sessions_opened > 0
            && (self.calls.completed > 0 || self.session_counts.probes > 0)
    }

    /// The report as text, with the first `show` violations in full.
    pub fn render(&self, show: usize) -> String {
        let mut o = String::new();
        let server = self.server.as_ref().map_or_else(
            || "unknown server".to_owned(),
            |s| format!("{} {}", s.name, s.version),
        );
        let _ = writeln!(
            o,
            "rewind load: profile {} against {} ({server}); route {}",
            self.profile,
            self.urls.join(", "),
            self.route
        );
        let _ = writeln!(
            o,
            "  sessions       {} of {} opened in {:.2} s; load {:.2} s; {} notifications per call, {} ms apart; {}; seed {}",
            self.sessions_opened,
            self.sessions,
            self.opening_s,
            self.elapsed_s,
            self.count,
            self.interval_ms,
            if self.think_ms == 0 {
                "closed loop".to_owned()
            } else {
                format!("{} ms pause after each call", self.think_ms)
            },
            self.seed
        );
        let _ = writeln!(
            o,
            "  events         {} delivered in order ({:.0}/s); {} checked; {} gap, {} reset signals",
            self.events.delivered, self.events.per_s, self.events.checked, self.events.gaps, self.events.resets
        );
        let _ = writeln!(
            o,
            "  calls          {} completed ({:.1}/s), {} reset, {} failed of {}; {} resumes ({} after the server ended a stream early)",
            self.calls.completed,
            self.calls.per_s,
            self.calls.reset,
            self.calls.failed,
            self.calls.started,
            self.calls.resumes,
            self.calls.resumes_unplanned
        );
        if let Some(p) = &self.call_latency {
            let _ = writeln!(
                o,
                "  call latency   POST → result p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                p.p50_ms, p.p99_ms, p.max_ms
            );
        }
        for r in &self.resume {
            let show_p = |p: &Option<Percentiles>| {
                p.as_ref().map_or_else(
                    || "-".to_owned(),
                    |p| {
                        format!(
                            "p50 {:.2} / p99 {:.2} / p999 {:.2} ms (n={})",
                            p.p50_ms, p.p99_ms, p.p999_ms, p.count
                        )
                    },
                )
            };
            if r.headers.is_some() || r.first_event.is_some() {
                let _ = writeln!(
                    o,
                    "  resume {:>4} ms GET → headers {}; → first event {}",
                    r.delay_ms,
                    show_p(&r.headers),
                    show_p(&r.first_event)
                );
            }
        }
        const STORM_ROUNDS_SHOWN: usize = 3;
        if self.storm.len() > STORM_ROUNDS_SHOWN {
            let worst = self
                .storm
                .iter()
                .map(|r| r.completion_ms)
                .fold(0.0, f64::max);
            let _ = writeln!(
                o,
                "  storm          {} rounds; slowest completion {worst:.1} ms; the first {STORM_ROUNDS_SHOWN}:",
                self.storm.len()
            );
        }
        for (i, r) in self.storm.iter().take(STORM_ROUNDS_SHOWN).enumerate() {
            let _ = writeln!(
                o,
                "  storm round {}  {} sessions cut and resumed at once: all results in {:.1} ms (p50 {:.1}, p99 {:.1}), first events in {}; {} completed, {} failed{}",
                i + 1,
                r.resumed,
                r.completion_ms,
                r.result_p50_ms.unwrap_or(0.0),
                r.result_p99_ms.unwrap_or(0.0),
                r.all_first_event_ms.map_or("-".to_owned(), |v| format!("{v:.1} ms")),
                r.completed,
                r.failed,
                if r.finished { "" } else { " (timed out)" }
            );
        }
        for (kind, t) in &self.probes {
            let answers: Vec<String> = t
                .answers
                .iter()
                .map(|(s, n)| {
                    if *s == 0 {
                        format!("{n}× no re-initialisation under the same id")
                    } else {
                        format!("{n}× {s}")
                    }
                })
                .collect();
            let _ = writeln!(
                o,
                "  probe {kind:<9} {} sent: {}; {} signalled; {} own, {} foreign events delivered; {} errors",
                t.sent,
                answers.join(", "),
                t.signalled,
                t.own_events,
                t.foreign_events,
                t.errors
            );
        }
        if let Some(i) = &self.idle {
            let _ = writeln!(
                o,
                "  idle           {} sessions held; server RSS {} → {} KiB{}; {} of {} sampled sessions still alive",
                i.sessions,
                i.rss_before_kib,
                i.rss_after_kib,
                i.bytes_per_session
                    .map_or(String::new(), |b| format!(" ({b:.0} bytes per idle session)")),
                i.alive,
                i.sampled
            );
        }
        let proc_line = |name: &str, p: &ProcessReport| {
            let rss = match (p.rss_before_kib, p.rss_after_kib, p.rss_max_kib) {
                (Some(b), Some(a), m) => format!(
                    "; RSS {:.1} → {:.1} MiB{}{}",
                    b as f64 / 1024.0,
                    a as f64 / 1024.0,
                    p.rss_anon_after_kib.map_or(String::new(), |n| format!(
                        " (anonymous {:.1})",
                        n as f64 / 1024.0
                    )),
                    m.map_or(String::new(), |m| format!(
                        " (max {:.1})",
                        m as f64 / 1024.0
                    ))
                ),
                _ => String::new(),
            };
            format!(
                "  {name:<14} CPU {:.2} s ({:.0} % of a core){}{}\n",
                p.cpu_s,
                p.cpu_percent,
                p.cpu_us_per_event
                    .map_or(String::new(), |u| format!(", {u:.2} µs per event")),
                rss
            )
        };
        if let Some(p) = &self.server_process {
            o.push_str(&proc_line("server", p));
        }
        o.push_str(&proc_line("generator", &self.generator));
        let _ = writeln!(
            o,
            "  verification   {} violations{}; {} errors{}",
            self.violation_count,
            kinds(&self.violations_by_kind),
            self.error_count,
            kinds(&self.errors_by_kind)
        );
        for v in self.violations.iter().take(show) {
            let _ = writeln!(
                o,
                "  VIOLATION {}: session {} ({}) call {} on {}{}{}\n      arrived:  {}\n      expected: {}",
                v.kind,
                v.session,
                v.session_id,
                v.call.as_deref().unwrap_or("-"),
                v.leg,
                v.cursor
                    .as_ref()
                    .map_or(String::new(), |c| format!(" (Last-Event-ID: {c})")),
                v.event_id
                    .as_ref()
                    .map_or(String::new(), |c| format!(", event id {c}")),
                v.arrived,
                v.expected
            );
        }
        if self.violation_count as usize > show.min(self.violations.len()) {
            let _ = writeln!(
                o,
                "  … {} more violations (all counted above; up to 1000 in --json)",
                self.violation_count as usize - show.min(self.violations.len())
            );
        }
        for e in self.errors.iter().take(show.min(5)) {
            let _ = writeln!(
                o,
                "  ERROR session {}: {}: {}",
                if e.session == u32::MAX {
                    "-".to_owned()
                } else {
                    e.session.to_string()
                },
                e.doing,
                e.error
            );
        }
        let _ = writeln!(
            o,
            "{}",
            if self.passed() {
                "PASS: no violations"
            } else if self.violation_count > 0 {
                "FAIL: violations found"
            } else {
                "FAIL: errors (see above)"
            }
        );
        o
    }
}

fn kinds(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(" ({})", parts.join(", "))
}
