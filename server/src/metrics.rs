//! Metrics: what the HTTP transport records ([`ServerMetrics`]) and the
//! Prometheus text the admin surface serves ([`render`]).
//!
//! Two kinds of numbers end up on `/metrics`. The transport's own
//! observations (verdicts by policy generation, resume latency, replay
//! sizes) live in prometheus-client families that the transport updates as
//! it goes. The engine's counters and the policy host's per-generation
//! statistics already exist as lock-free counters inside those crates, so a
//! scrape reads a snapshot of each and encodes it into a registry built for
//! that scrape: nothing is counted twice and nothing on the hot path knows
//! about Prometheus.

use std::time::Duration;

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use rewind_engine::policy::wasm::{GenerationState, PolicyStatus};
use rewind_engine::{MetricsSnapshot, PolicyFault, Verdict};

/// Labels of a decision: the verdict acted on and the generation that chose it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    verdict: &'static str,
    generation: u64,
}

/// Metrics recorded by the HTTP transport.
///
/// Cheap to update from any thread (atomic counters and histogram buckets;
/// a label set is created once per verdict and generation).
#[derive(Debug)]
pub struct ServerMetrics {
    decisions: Family<DecisionLabels, Counter>,
    resume_seconds: Histogram,
    replay_events: Histogram,
}

impl Default for ServerMetrics {
    fn default() -> ServerMetrics {
        ServerMetrics {
            decisions: Family::default(),
            // 1 µs .. ~4 s: a decision is tens of nanoseconds through the
            // WASM policy, but a resume that waits on a lock elsewhere or on
            // a swap's compile should still land in a bucket.
            resume_seconds: Histogram::new(exponential_buckets(1e-6, 4.0, 12)),
            // 0, 1, 2, 4 .. 32768 events replayed from before the reconnect.
            replay_events: Histogram::new(
                std::iter::once(0.0).chain(exponential_buckets(1.0, 2.0, 16)),
            ),
        }
    }
}

impl ServerMetrics {
    /// A fresh set of metrics.
    pub fn new() -> ServerMetrics {
        ServerMetrics::default()
    }

    /// One reconnect decided: its verdict, the policy generation that
    /// decided it, and how long the decision took (lookup, facts, policy).
    pub fn observe_resume(&self, verdict: Verdict, generation: u64, elapsed: Duration) {
        self.decisions
            .get_or_create(&DecisionLabels {
                verdict: verdict_label(verdict),
                generation,
            })
            .inc();
        self.resume_seconds.observe(elapsed.as_secs_f64());
    }

    /// A replay finished (caught up with live delivery or was cut): how
    /// many events it replayed from before the reconnect.
    pub fn observe_replay(&self, events: u64) {
        self.replay_events.observe(events as f64);
    }
}

/// A stable, lower-case name for a verdict, used as a metric label and in
/// the admin's JSON.
pub fn verdict_label(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Resume => "resume",
        Verdict::Fresh => "fresh",
        Verdict::FreshReset => "fresh_reset",
        Verdict::FreshGap => "fresh_gap",
        Verdict::BadRequest => "bad_request",
        Verdict::Conflict => "conflict",
        Verdict::Gone => "gone",
        _ => "unknown",
    }
}

/// A stable, lower-case name for a generation's state.
pub fn state_label(state: GenerationState) -> &'static str {
    match state {
        GenerationState::Live => "live",
        GenerationState::Standby => "standby",
        GenerationState::RolledBack => "rolled_back",
        GenerationState::Retired => "retired",
        _ => "unknown",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    fault: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GenerationLabels {
    generation: u64,
    policy: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GenerationFaultLabels {
    generation: u64,
    policy: String,
    fault: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RollbackLabels {
    trigger: &'static str,
}

/// Encodes everything `/metrics` serves, in the Prometheus text format
/// (OpenMetrics flavour, as prometheus-client writes it).
///
/// Metric names (counters carry the `_total` suffix on the wire):
/// - engine: `rewind_appends`, `rewind_appends_refused`,
///   `rewind_events_delivered`, `rewind_delivered_bytes`,
///   `rewind_reader_gaps`, `rewind_sessions_opened`,
///   `rewind_sessions_refused`, `rewind_sessions_closed`,
///   `rewind_sessions_expired`, `rewind_sessions_evicted`,
///   `rewind_sessions_live` (gauge), `rewind_pool_bytes` (gauge),
///   `rewind_bytes_held` (gauge),
///   `rewind_resumes`, `rewind_verdicts{verdict}`,
///   `rewind_policy_fallbacks{fault}`;
/// - transport: `rewind_resume_decisions{verdict,generation}`,
///   `rewind_resume_duration_seconds` (histogram),
///   `rewind_replay_events` (histogram);
/// - policy host: `rewind_policy_live_generation` (gauge),
///   `rewind_policy_decisions{generation,policy,state}`,
///   `rewind_policy_faults{generation,policy,fault}`,
///   `rewind_policy_swaps`, `rewind_policy_rollbacks{trigger}`.
pub fn render(engine: &MetricsSnapshot, policy: &PolicyStatus, server: &ServerMetrics) -> String {
    let mut registry = Registry::with_prefix("rewind");
    register_engine(&mut registry, engine);
    register_server(&mut registry, server);
    register_policy(&mut registry, policy);
    let mut out = String::new();
    text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    registry.register(name, help, ConstCounter::new(value));
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    registry.register(
        name,
        help,
        ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)),
    );
}

fn register_engine(registry: &mut Registry, m: &MetricsSnapshot) {
    counter(registry, "appends", "Events appended", m.appends);
    counter(
        registry,
        "appends_refused",
        "Appends refused (payload too large, session ended, pool exhausted)",
        m.appends_refused,
    );
    counter(
        registry,
        "events_delivered",
        "Events handed to readers (replayed or live)",
        m.events_replayed,
    );
    counter(
        registry,
        "delivered_bytes",
        "Payload bytes handed to readers",
        m.replayed_bytes,
    );
    counter(
        registry,
        "reader_gaps",
        "Times a reader found events it had not read released (one gap each)",
        m.reader_gaps,
    );
    counter(
        registry,
        "sessions_opened",
        "Sessions opened",
        m.sessions_opened,
    );
    counter(
        registry,
        "sessions_refused",
        "Session openings refused by a session cap",
        m.sessions_refused,
    );
    counter(
        registry,
        "sessions_closed",
        "Sessions closed explicitly",
        m.sessions_closed,
    );
    counter(
        registry,
        "sessions_expired",
        "Sessions ended by the idle TTL",
        m.sessions_expired,
    );
    counter(
        registry,
        "sessions_evicted",
        "Idle sessions evicted to make room in the event pool",
        m.sessions_evicted,
    );
    gauge(
        registry,
        "sessions_live",
        "Sessions live now",
        m.sessions_live,
    );
    gauge(
        registry,
        "pool_bytes",
        "Bytes of the event pool (the global budget)",
        m.pool_bytes,
    );
    gauge(
        registry,
        "bytes_held",
        "Bytes of the event pool held by live sessions' segments",
        m.bytes_held,
    );
    counter(registry, "resumes", "Resume decisions made", m.resumes);

    let verdicts = Family::<VerdictLabels, Counter>::default();
    for v in Verdict::ALL {
        verdicts
            .get_or_create(&VerdictLabels {
                verdict: verdict_label(v),
            })
            .inc_by(m.verdict_count(v));
    }
    registry.register("verdicts", "Resume decisions by verdict acted on", verdicts);

    let faults = Family::<FaultLabels, Counter>::default();
    for f in PolicyFault::ALL {
        faults
            .get_or_create(&FaultLabels { fault: f.name() })
            .inc_by(m.fault_count(f));
    }
    registry.register(
        "policy_fallbacks",
        "Policy answers replaced by the safe default, by cause",
        faults,
    );
}

fn register_server(registry: &mut Registry, server: &ServerMetrics) {
    // Families and histograms share their storage with their clones, so
    // registering clones exports the live values.
    registry.register(
        "resume_decisions",
        "Reconnects decided over HTTP, by verdict and policy generation",
        server.decisions.clone(),
    );
    registry.register_with_unit(
        "resume_duration",
        "Time to decide a reconnect (lookup, facts, policy)",
        Unit::Seconds,
        server.resume_seconds.clone(),
    );
    registry.register(
        "replay_events",
        "Events replayed from before the reconnect, per resumed stream",
        server.replay_events.clone(),
    );
}

fn register_policy(registry: &mut Registry, status: &PolicyStatus) {
    gauge(
        registry,
        "policy_live_generation",
        "The policy generation deciding now",
        status.live.stats.generation,
    );
    let decisions = Family::<GenerationLabels, Counter>::default();
    let faults = Family::<GenerationFaultLabels, Counter>::default();
    for g in &status.generations {
        decisions
            .get_or_create(&GenerationLabels {
                generation: g.stats.generation,
                policy: g.name.clone(),
                state: state_label(g.state),
            })
            .inc_by(g.stats.decisions);
        for f in PolicyFault::ALL {
            faults
                .get_or_create(&GenerationFaultLabels {
                    generation: g.stats.generation,
                    policy: g.name.clone(),
                    fault: f.name(),
                })
                .inc_by(g.stats.of(f));
        }
    }
    registry.register(
        "policy_decisions",
        "Decisions made by each recent policy generation (batched per thread; may lag)",
        decisions,
    );
    registry.register(
        "policy_faults",
        "Policy faults by recent generation and kind",
        faults,
    );
    counter(
        registry,
        "policy_swaps",
        "Policy swaps published since start",
        status.swaps,
    );
    let rollbacks = Family::<RollbackLabels, Counter>::default();
    rollbacks
        .get_or_create(&RollbackLabels { trigger: "manual" })
        .inc_by(status.manual_rollbacks);
    rollbacks
        .get_or_create(&RollbackLabels {
            trigger: "automatic",
        })
        .inc_by(status.automatic_rollbacks);
    registry.register(
        "policy_rollbacks",
        "Policy rollbacks, on command or by the fault-rate rule",
        rollbacks,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_show_up_with_their_labels() {
        let m = ServerMetrics::new();
        m.observe_resume(Verdict::Conflict, 3, Duration::from_micros(5));
        m.observe_replay(7);
        let host = rewind_engine::policy::wasm::PolicyHost::with_default_policy().unwrap();
        let text = render(&MetricsSnapshot::default(), &host.status(), &m);
        assert!(
            text.contains(r#"rewind_resume_decisions_total{verdict="conflict",generation="3"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("rewind_resume_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("rewind_replay_events_sum 7.0"), "{text}");
        assert!(text.contains("rewind_policy_live_generation 1"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
