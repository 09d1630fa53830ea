//! What a run records while it goes: counters, latency histograms,
//! violations with their evidence, and transport errors.
//!
//! Counters are atomics read by the progress bar; histograms and the
//! violation list sit behind mutexes taken once per resume or finding, never
//! per event.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::verify::{Finding, ViolationKind};

/// Violations kept in full (all are counted).
pub const KEPT_VIOLATIONS: usize = 1000;
/// Transport errors kept in full (all are counted).
pub const KEPT_ERRORS: usize = 100;

/// Event and call counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// Sessions initialised.
    pub sessions_opened: AtomicU64,
    /// Sessions ended with `DELETE`.
    pub sessions_deleted: AtomicU64,
    /// Sessions left without `DELETE` (soak).
    pub sessions_abandoned: AtomicU64,
    /// Tool calls sent.
    pub calls_started: AtomicU64,
    /// Calls whose result arrived and checked out.
    pub calls_completed: AtomicU64,
    /// Calls ended by a `reset` signal (the server said the stream is gone).
    pub calls_reset: AtomicU64,
    /// Calls that ended without a result (a violation or error said why).
    pub calls_failed: AtomicU64,
    /// Progress notifications delivered in order (the events/s figure).
    pub events: AtomicU64,
    /// Every SSE event carrying data that was checked.
    pub events_checked: AtomicU64,
    /// Resumes (`GET` with `Last-Event-ID`) for calls.
    pub resumes: AtomicU64,
    /// Of those, resumes after the server ended a stream before the result.
    pub resumes_unplanned: AtomicU64,
    /// `gap` signals received.
    pub gaps: AtomicU64,
    /// `reset` signals received.
    pub resets: AtomicU64,
    /// Streams still open a while after their result (the connection was
    /// closed to move on).
    pub streams_left_open: AtomicU64,
    /// Adversarial probes sent.
    pub probes: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// One violation with its evidence.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// What kind.
    pub kind: ViolationKind,
    /// The session's index in this run.
    pub session: u32,
    /// The session's `Mcp-Session-Id`.
    pub session_id: String,
    /// The call's tag (`L<run>.<session>.<call>`), if a call was involved.
    pub call: Option<String>,
    /// The request that delivered it (`POST`, `GET resume 1`, `probe foreign`, …).
    pub leg: String,
    /// The cursor presented on that request, if any.
    pub cursor: Option<String>,
    /// The `id:` of the offending event, if it had one.
    pub event_id: Option<String>,
    /// What arrived.
    pub arrived: String,
    /// What was expected.
    pub expected: String,
}

impl Violation {
    /// A violation from a [`Finding`] and where it was found.
    pub fn new(f: Finding, at: &Where<'_>) -> Violation {
        Violation {
            kind: f.kind,
            session: at.session,
            session_id: at.session_id.to_owned(),
            call: at.call.clone(),
            leg: at.leg.to_owned(),
            cursor: at.cursor.map(str::to_owned),
            event_id: f.event_id,
            arrived: f.arrived,
            expected: f.expected,
        }
    }
}

/// Where a finding was made.
#[derive(Debug)]
pub struct Where<'a> {
    /// The session's index.
    pub session: u32,
    /// Its id.
    pub session_id: &'a str,
    /// The call's tag.
    pub call: Option<String>,
    /// The request.
    pub leg: &'a str,
    /// The cursor presented on it.
    pub cursor: Option<&'a str>,
}

/// A transport error, with its context.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorRecord {
    /// The session's index.
    pub session: u32,
    /// What the session was doing.
    pub doing: String,
    /// What went wrong.
    pub error: String,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

/// A latency histogram, microsecond resolution, up to an hour.
#[derive(Debug)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Latency {
        Latency(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"))
    }
}

impl Latency {
    /// Records one sample.
    pub fn record(&mut self, d: Duration) {
        let us = (d.as_micros() as u64).clamp(1, 3_600_000_000);
        let _ = self.0.record(us);
    }

    /// Its percentiles, `None` when empty.
    pub fn percentiles(&self) -> Option<Percentiles> {
        if self.0.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Percentiles {
            count: self.0.len(),
            p50_ms: ms(self.0.value_at_quantile(0.5)),
            p99_ms: ms(self.0.value_at_quantile(0.99)),
            p999_ms: ms(self.0.value_at_quantile(0.999)),
            max_ms: ms(self.0.max()),
        })
    }
}

/// Resume latencies for one resume delay.
#[derive(Debug, Default)]
pub struct ResumeLatency {
    /// `GET` sent → response headers.
    pub headers: Latency,
    /// `GET` sent → first event carrying a message.
    pub first_event: Latency,
}

/// How the server answered one kind of adversarial probe.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProbeTally {
    /// Probes sent.
    pub sent: u64,
    /// HTTP status → how often.
    pub answers: BTreeMap<u16, u64>,
    /// 200 answers whose first event was a `reset` or `gap` signal.
    pub signalled: u64,
    /// Events of the prober's own session delivered in answer.
    pub own_events: u64,
    /// Events of another session (or incarnation) delivered in answer.
    pub foreign_events: u64,
    /// Probes that failed on the wire.
    pub errors: u64,
}

/// Everything recorded by a run.
#[derive(Debug)]
pub struct Record {
    /// Counters.
    pub counters: Counters,
    violations: Mutex<(Vec<Violation>, BTreeMap<ViolationKind, u64>)>,
    errors: Mutex<(Vec<ErrorRecord>, BTreeMap<String, u64>)>,
    /// One entry per resume delay of the run.
    pub resume: Vec<Mutex<ResumeLatency>>,
    /// POST of a call → its result, for calls that were not cut.
    pub call_latency: Mutex<Latency>,
    /// Probe answers by probe kind.
    pub probes: Mutex<BTreeMap<&'static str, ProbeTally>>,
    violation_count: AtomicU64,
    error_count: AtomicU64,
}

impl Record {
    /// An empty record with `delays` resume-latency slots.
    pub fn new(delays: usize) -> Record {
        Record {
            counters: Counters::default(),
            violations: Mutex::new((Vec::new(), BTreeMap::new())),
            errors: Mutex::new((Vec::new(), BTreeMap::new())),
            resume: (0..delays.max(1))
                .map(|_| Mutex::new(ResumeLatency::default()))
                .collect(),
            call_latency: Mutex::new(Latency::default()),
            probes: Mutex::new(BTreeMap::new()),
            violation_count: AtomicU64::new(0),
            error_count: AtomicU64::new(0),
        }
    }

    /// Records a violation.
    pub fn violation(&self, v: Violation) {
        self.violation_count.fetch_add(1, Ordering::Relaxed);
        let mut g = lock(&self.violations);
        *g.1.entry(v.kind).or_default() += 1;
        if g.0.len() < KEPT_VIOLATIONS {
            g.0.push(v);
        }
    }

    /// Records a transport error of kind `kind`.
    pub fn error(&self, kind: &str, e: ErrorRecord) {
        self.error_count.fetch_add(1, Ordering::Relaxed);
        let mut g = lock(&self.errors);
        *g.1.entry(kind.to_owned()).or_default() += 1;
        if g.0.len() < KEPT_ERRORS {
            g.0.push(e);
        }
    }

    /// Violations so far.
    pub fn violation_count(&self) -> u64 {
        self.violation_count.load(Ordering::Relaxed)
    }

    /// Transport errors so far.
    pub fn error_count(&self) -> u64 {
        self.error_count.load(Ordering::Relaxed)
    }

    /// The kept violations and the count by kind.
    pub fn violations(&self) -> (Vec<Violation>, BTreeMap<ViolationKind, u64>) {
        lock(&self.violations).clone()
    }

    /// The kept errors and the count by kind.
    pub fn errors(&self) -> (Vec<ErrorRecord>, BTreeMap<String, u64>) {
        lock(&self.errors).clone()
    }

    /// Adds one probe answer.
    pub fn probe(&self, kind: &'static str, f: impl FnOnce(&mut ProbeTally)) {
        let mut g = lock(&self.probes);
        let t = g.entry(kind).or_default();
        t.sent += 1;
        f(t);
    }
}

/// Locks `m`, recovering from a panicked holder (a record is still worth
/// reporting).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
