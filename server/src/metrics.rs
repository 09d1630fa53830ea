//! Metrics: what the HTTP transport records ([`ServerMetrics`]), and the
//! Prometheus families `/metrics` serves ([`render`], or [`RewindCollector`]
//! in an embedder's own `prometheus-client` registry).
//!
//! Two kinds of numbers end up there. The transport's own observations
//! (resume decisions by verdict and policy generation, resume latency,
//! replay sizes, HTTP responses, open SSE streams) live in prometheus-client
//! families the transport updates as it goes. The engine's counters and the
//! policy host's per-generation statistics already exist as lock-free
//! counters inside those crates, so a scrape reads a snapshot of each and
//! encodes it: nothing is counted twice and nothing on the hot path knows
//! about Prometheus.
//!
//! One family per fact, and no label whose value changes for a series that
//! already exists (a policy generation's live/standby state is in the
//! admin's `GET /policy`, not in a label), so every counter can be graphed
//! with `rate()` across policy swaps. Counters carry the `_total` suffix on
//! the wire:
//!
//! | family | labels | what |
//! |---|---|---|
//! | `rewind_build_info` | `version` | always 1 |
//! | `rewind_appends`, `rewind_appends_refused` | | events stored, appends refused |
//! | `rewind_appends_stalled` | | appends that waited for another writer of their session, descheduled in the middle of an event while the session already held twice its retention (a steady rise: writers starved of CPU) |
//! | `rewind_events_delivered`, `rewind_delivered_bytes` | | events handed to readers (replayed or live) |
//! | `rewind_reader_gaps` | | times a reader found events it had not read released (one gap each) |
//! | `rewind_sessions_opened`, `_refused`, `_closed`, `_expired`, `_evicted` | | sessions by how they began and ended, and openings a session cap refused |
//! | `rewind_sessions_live`, `rewind_pool_bytes`, `rewind_bytes_held`, `rewind_bytes_released` (gauges) | | sessions now, the event pool's size (the global budget), the pool bytes live sessions hold, the free pool bytes given back to the OS |
//! | `rewind_resume_decisions` | `verdict`, `generation` | reconnects decided, by the verdict acted on and the policy generation that chose it |
//! | `rewind_resume_duration_seconds` (histogram) | | time to decide one |
//! | `rewind_replay_events` (histogram) | | events replayed from before the reconnect, per resumed stream |
//! | `rewind_policy_fallbacks` | `fault` | policy answers replaced by the safe default |
//! | `rewind_policy_faults` | `generation`, `policy`, `fault` | a breakdown of the fallbacks above by recent generation of the WebAssembly host, to see which plugin faults (do not add the two: a generation's series goes when it leaves the host's recent list, so only `rewind_policy_fallbacks` is a total that never goes back) |
//! | `rewind_policy_live_generation` (gauge) | | the generation deciding now |
//! | `rewind_policy_swaps`, `rewind_policy_rollbacks` | `trigger` | swaps published; rollbacks on command or by the fault-rate rule |
//! | `rewind_policy_loads` | `outcome` | modules loaded (the first included): `loaded`; `refused` for what the module is (not wasm, does not compile, a wrong export, …) or an unreadable file; `compiler_failed` when the child process compiling it could not start, crashed or ran past its timeout (see the log) |
//! | `rewind_policy_load_seconds` | | wall time spent in those loads, all outcomes (compiling, in the child or in process, and the load checks); over `rewind_policy_loads` summed, the mean time of a load |
//! | `rewind_http_responses` | `method`, `status` | HTTP answers of the MCP endpoint |
//! | `rewind_sse_streams_open` (gauge) | | SSE responses being served now |
//! | `rewind_cluster_node` (gauge) | | this node's number (cluster mode only, as every `rewind_cluster_*`) |
//! | `rewind_cluster_redis_up` (gauge) | | 1 while the last command sent to Redis succeeded, else 0 |
//! | `rewind_cluster_replicated_events` | | events copied to Redis |
//! | `rewind_cluster_replication_errors` | | rounds of copies Redis did not take (each is retried) |
//! | `rewind_cluster_forwarded_requests` | | requests forwarded to the node owning their session |
//! | `rewind_cluster_remote_streams` (gauge) | | SSE responses served from Redis now |
//! | `rewind_cluster_epoch_changes` | | times Redis lost its data and this node ended its sessions |
//! | `rewind_cluster_takeovers` | | sessions this node took over from a node that was gone |
//! | `process_*` | | CPU seconds, resident and virtual memory, open and max file descriptors, threads, start time (Linux; `rewind serve` and [`RewindCollector::with_process_metrics`]) |

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{text, DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use rewind_engine::policy::wasm::{GenerationState, PolicyHost, PolicyStatus};
use rewind_engine::{Engine, MetricsSnapshot, PolicyFault, Verdict};

/// Labels of a decision: the verdict acted on and the generation that chose it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    verdict: &'static str,
    generation: u64,
}

/// Labels of an HTTP answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    method: &'static str,
    status: u16,
}

/// Metrics recorded by the HTTP transport.
///
/// Cheap to update from any thread (atomic counters and histogram buckets;
/// a label set is created once per verdict and generation, or method and
/// status). Clones share the same counters.
#[derive(Debug, Clone)]
pub struct ServerMetrics {
    decisions: Family<DecisionLabels, Counter>,
    resume_seconds: Histogram,
    replay_events: Histogram,
    responses: Family<ResponseLabels, Counter>,
    sse_open: Gauge,
    pub(crate) cluster: ClusterMetrics,
}

/// The metrics of cluster mode (exported only when it is on).
#[derive(Debug, Default, Clone)]
pub(crate) struct ClusterMetrics {
    enabled: Gauge,
    node: Gauge,
    redis_up: Gauge,
    replicated: Counter,
    replication_errors: Counter,
    forwarded: Counter,
    remote_streams: Gauge,
    epoch_changes: Counter,
    takeovers: Counter,
}

impl ClusterMetrics {
    pub(crate) fn enable(&self, node: u16) {
        self.enabled.set(1);
        self.node.set(i64::from(node));
    }
    pub(crate) fn set_up(&self, up: bool) {
        self.redis_up.set(i64::from(up));
    }
    pub(crate) fn replicated(&self, events: u64) {
        self.replicated.inc_by(events);
    }
    pub(crate) fn replication_error(&self) {
        self.replication_errors.inc();
    }
    pub(crate) fn forwarded(&self) {
        self.forwarded.inc();
    }
    pub(crate) fn remote_stream(&self, opened: bool) {
        if opened {
            self.remote_streams.inc();
        } else {
            self.remote_streams.dec();
        }
    }
    pub(crate) fn epoch_changed(&self) {
        self.epoch_changes.inc();
    }
    pub(crate) fn took_over(&self) {
        self.takeovers.inc();
    }
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
            responses: Family::default(),
            sse_open: Gauge::default(),
            cluster: ClusterMetrics::default(),
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

    /// The MCP endpoint answered a request.
    pub fn observe_response(&self, method: &http::Method, status: http::StatusCode) {
        let method = match *method {
            http::Method::GET => "GET",
            http::Method::POST => "POST",
            http::Method::DELETE => "DELETE",
            http::Method::OPTIONS => "OPTIONS",
            _ => "other",
        };
        self.responses
            .get_or_create(&ResponseLabels {
                method,
                status: status.as_u16(),
            })
            .inc();
    }

    /// An SSE response started (`opened`) or ended.
    pub(crate) fn sse_stream(&self, opened: bool) {
        if opened {
            self.sse_open.inc();
        } else {
            self.sse_open.dec();
        }
    }

    /// SSE responses being served now.
    pub fn sse_streams_open(&self) -> i64 {
        self.sse_open.get()
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
struct FaultLabels {
    fault: &'static str,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoadLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Everything Rewind exports, as a `prometheus-client` [`Collector`]: an
/// embedder registers it in its own registry and its scrapes include the
/// engine, the policy host (if any), the transport and, optionally, process
/// metrics.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use prometheus_client::registry::Registry;
/// # use rewind_server::metrics::{RewindCollector, ServerMetrics};
/// # fn f(engine: rewind_engine::Engine, metrics: Arc<ServerMetrics>) {
/// let mut registry = Registry::default();
/// registry.register_collector(Box::new(RewindCollector::new(engine, metrics)));
/// # }
/// ```
#[derive(Clone)]
pub struct RewindCollector {
    engine: Engine,
    host: Option<Arc<PolicyHost>>,
    server: Arc<ServerMetrics>,
    process: bool,
}

impl fmt::Debug for RewindCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RewindCollector")
            .field("host", &self.host.is_some())
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

impl RewindCollector {
    /// The metrics of `engine` and of the transport recording into `server`.
    pub fn new(engine: Engine, server: Arc<ServerMetrics>) -> RewindCollector {
        RewindCollector {
            engine,
            host: None,
            server,
            process: false,
        }
    }

    /// Also the per-generation statistics of the WebAssembly policy host
    /// the engine decides with.
    pub fn with_policy_host(mut self, host: Arc<PolicyHost>) -> RewindCollector {
        self.host = Some(host);
        self
    }

    /// Also `process_*` metrics (Linux only; elsewhere none), for
    /// registries that do not export them already.
    pub fn with_process_metrics(mut self, on: bool) -> RewindCollector {
        self.process = on;
        self
    }
}

impl Collector for RewindCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let policy = self.host.as_ref().map(|h| h.status());
        encode_all(
            &mut encoder,
            &self.engine.metrics(),
            policy.as_ref(),
            &self.server,
            self.process,
        )
    }
}

/// Snapshots taken by the caller of [`render`].
#[derive(Debug)]
struct Snapshot {
    engine: MetricsSnapshot,
    policy: PolicyStatus,
    server: ServerMetrics,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        encode_all(
            &mut encoder,
            &self.engine,
            Some(&self.policy),
            &self.server,
            true,
        )
    }
}

/// Encodes everything `/metrics` serves, in the Prometheus text format
/// (OpenMetrics flavour, as prometheus-client writes it); the families are
/// listed in the [module docs](self).
pub fn render(engine: &MetricsSnapshot, policy: &PolicyStatus, server: &ServerMetrics) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot {
        engine: engine.clone(),
        policy: policy.clone(),
        server: server.clone(),
    }));
    let mut out = String::new();
    text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

/// Encodes one metric under `name` (no `_total`: the encoder adds it).
fn put(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: &impl EncodeMetric,
) -> Result<(), fmt::Error> {
    let m = encoder.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(m)
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), fmt::Error> {
    put(e, name, help, None, &ConstCounter::new(v))
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), fmt::Error> {
    put(
        e,
        name,
        help,
        None,
        &ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)),
    )
}

fn encode_all(
    e: &mut DescriptorEncoder,
    engine: &MetricsSnapshot,
    policy: Option<&PolicyStatus>,
    server: &ServerMetrics,
    process: bool,
) -> Result<(), fmt::Error> {
    put(
        e,
        "rewind_build",
        "The running Rewind build",
        None,
        &Info::new(BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
        }),
    )?;
    encode_engine(e, engine)?;
    encode_server(e, server)?;
    if let Some(p) = policy {
        encode_policy(e, p)?;
    }
    if process {
        encode_process(e)?;
    }
    Ok(())
}

fn encode_engine(e: &mut DescriptorEncoder, m: &MetricsSnapshot) -> Result<(), fmt::Error> {
    counter(e, "rewind_appends", "Events appended", m.appends)?;
    counter(
        e,
        "rewind_appends_refused",
        "Appends refused (payload too large, session ended, pool exhausted)",
        m.appends_refused,
    )?;
    counter(
        e,
        "rewind_appends_stalled",
        "Appends that waited for a writer of the same session descheduled in the middle of an event",
        m.appends_stalled,
    )?;
    counter(
        e,
        "rewind_events_delivered",
        "Events handed to readers (replayed or live)",
        m.events_replayed,
    )?;
    counter(
        e,
        "rewind_delivered_bytes",
        "Payload bytes handed to readers",
        m.replayed_bytes,
    )?;
    counter(
        e,
        "rewind_reader_gaps",
        "Times a reader found events it had not read released (one gap each)",
        m.reader_gaps,
    )?;
    counter(
        e,
        "rewind_sessions_opened",
        "Sessions opened",
        m.sessions_opened,
    )?;
    counter(
        e,
        "rewind_sessions_refused",
        "Session openings refused by a session cap",
        m.sessions_refused,
    )?;
    counter(
        e,
        "rewind_sessions_closed",
        "Sessions closed explicitly",
        m.sessions_closed,
    )?;
    counter(
        e,
        "rewind_sessions_expired",
        "Sessions ended by the idle TTL",
        m.sessions_expired,
    )?;
    counter(
        e,
        "rewind_sessions_evicted",
        "Idle sessions evicted to make room in the event pool",
        m.sessions_evicted,
    )?;
    gauge(
        e,
        "rewind_sessions_live",
        "Sessions live now",
        m.sessions_live,
    )?;
    gauge(
        e,
        "rewind_pool_bytes",
        "Bytes of the event pool (the global budget)",
        m.pool_bytes,
    )?;
    gauge(
        e,
        "rewind_bytes_held",
        "Bytes of the event pool held by live sessions' segments",
        m.bytes_held,
    )?;
    gauge(
        e,
        "rewind_bytes_released",
        "Bytes of free event-pool segments given back to the operating system (not resident until reused)",
        m.bytes_released,
    )?;
    let faults = Family::<FaultLabels, Counter>::default();
    for f in PolicyFault::ALL {
        faults
            .get_or_create(&FaultLabels { fault: f.name() })
            .inc_by(m.fault_count(f));
    }
    put(
        e,
        "rewind_policy_fallbacks",
        "Policy answers replaced by the safe default, by cause",
        None,
        &faults,
    )
}

fn encode_server(e: &mut DescriptorEncoder, server: &ServerMetrics) -> Result<(), fmt::Error> {
    put(
        e,
        "rewind_resume_decisions",
        "Reconnects decided, by the verdict acted on and the policy generation that chose it",
        None,
        &server.decisions,
    )?;
    put(
        e,
        "rewind_resume_duration",
        "Time to decide a reconnect (lookup, facts, policy)",
        Some(&Unit::Seconds),
        &server.resume_seconds,
    )?;
    put(
        e,
        "rewind_replay_events",
        "Events replayed from before the reconnect, per resumed stream",
        None,
        &server.replay_events,
    )?;
    put(
        e,
        "rewind_http_responses",
        "HTTP answers of the MCP endpoint, by method and status",
        None,
        &server.responses,
    )?;
    put(
        e,
        "rewind_sse_streams_open",
        "SSE responses being served now",
        None,
        &server.sse_open,
    )?;
    encode_cluster(e, &server.cluster)
}

fn encode_cluster(e: &mut DescriptorEncoder, c: &ClusterMetrics) -> Result<(), fmt::Error> {
    if c.enabled.get() == 0 {
        return Ok(());
    }
    put(
        e,
        "rewind_cluster_node",
        "This node's number in the cluster",
        None,
        &c.node,
    )?;
    put(
        e,
        "rewind_cluster_redis_up",
        "1 while the last command sent to Redis succeeded, else 0",
        None,
        &c.redis_up,
    )?;
    put(
        e,
        "rewind_cluster_replicated_events",
        "Events copied to Redis",
        None,
        &c.replicated,
    )?;
    put(
        e,
        "rewind_cluster_replication_errors",
        "Rounds of copies Redis did not take (each is retried)",
        None,
        &c.replication_errors,
    )?;
    put(
        e,
        "rewind_cluster_forwarded_requests",
        "Requests forwarded to the node owning their session",
        None,
        &c.forwarded,
    )?;
    put(
        e,
        "rewind_cluster_remote_streams",
        "SSE responses served from Redis now",
        None,
        &c.remote_streams,
    )?;
    put(
        e,
        "rewind_cluster_epoch_changes",
        "Times Redis lost its data and this node ended its sessions",
        None,
        &c.epoch_changes,
    )?;
    put(
        e,
        "rewind_cluster_takeovers",
        "Sessions this node took over from a node that was gone",
        None,
        &c.takeovers,
    )
}

fn encode_policy(e: &mut DescriptorEncoder, status: &PolicyStatus) -> Result<(), fmt::Error> {
    gauge(
        e,
        "rewind_policy_live_generation",
        "The policy generation deciding now",
        status.live.stats.generation,
    )?;
    let faults = Family::<GenerationFaultLabels, Counter>::default();
    for g in &status.generations {
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
    put(
        e,
        "rewind_policy_faults",
        "Policy faults by recent generation and kind",
        None,
        &faults,
    )?;
    counter(
        e,
        "rewind_policy_swaps",
        "Policy swaps published since start",
        status.swaps,
    )?;
    let rollbacks = Family::<RollbackLabels, Counter>::default();
    rollbacks
        .get_or_create(&RollbackLabels { trigger: "manual" })
        .inc_by(status.manual_rollbacks);
    rollbacks
        .get_or_create(&RollbackLabels {
            trigger: "automatic",
        })
        .inc_by(status.automatic_rollbacks);
    put(
        e,
        "rewind_policy_rollbacks",
        "Policy rollbacks, on command or by the fault-rate rule",
        None,
        &rollbacks,
    )?;
    let loads = Family::<LoadLabels, Counter>::default();
    for (outcome, count) in [
        ("loaded", status.loads.loaded),
        ("refused", status.loads.refused),
        ("compiler_failed", status.loads.compiler_failed),
    ] {
        loads.get_or_create(&LoadLabels { outcome }).inc_by(count);
    }
    put(
        e,
        "rewind_policy_loads",
        "Policy modules loaded (compiled and checked), by outcome",
        None,
        &loads,
    )?;
    put(
        e,
        "rewind_policy_load",
        "Wall time spent loading policy modules (compiling and the load checks), all outcomes",
        Some(&Unit::Seconds),
        &ConstCounter::new(status.loads.time.as_secs_f64()),
    )
}

#[cfg(target_os = "linux")]
fn encode_process(e: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    use procfs::WithCurrentSystemInfo as _;
    // A scrape must not fail because /proc is unreadable (a sandbox): the
    // process metrics are then simply absent.
    let Ok(me) = procfs::process::Process::myself() else {
        return Ok(());
    };
    if let Ok(stat) = me.stat() {
        let ticks = procfs::ticks_per_second().max(1) as f64;
        put(
            e,
            "process_cpu",
            "User and system CPU time spent",
            Some(&Unit::Seconds),
            &ConstCounter::new((stat.utime + stat.stime) as f64 / ticks),
        )?;
        put(
            e,
            "process_resident_memory",
            "Resident memory size",
            Some(&Unit::Bytes),
            &ConstGauge::new(i64::try_from(stat.rss_bytes().get()).unwrap_or(i64::MAX)),
        )?;
        put(
            e,
            "process_virtual_memory",
            "Virtual memory size",
            Some(&Unit::Bytes),
            &ConstGauge::new(i64::try_from(stat.vsize).unwrap_or(i64::MAX)),
        )?;
        put(
            e,
            "process_threads",
            "OS threads",
            None,
            &ConstGauge::new(stat.num_threads),
        )?;
        if let Ok(boot) = procfs::boot_time_secs() {
            let start = boot as f64 + stat.starttime as f64 / ticks;
            put(
                e,
                "process_start_time",
                "Start time since the Unix epoch",
                Some(&Unit::Seconds),
                &ConstGauge::new(start),
            )?;
        }
    }
    if let Ok(n) = me.fd_count() {
        gauge(e, "process_open_fds", "Open file descriptors", n as u64)?;
    }
    if let Ok(limits) = me.limits() {
        if let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit {
            gauge(e, "process_max_fds", "Limit of open file descriptors", max)?;
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn encode_process(_e: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_show_up_with_their_labels() {
        let m = ServerMetrics::new();
        m.observe_resume(Verdict::Conflict, 3, Duration::from_micros(5));
        m.observe_replay(7);
        m.observe_response(&http::Method::POST, http::StatusCode::NOT_FOUND);
        m.sse_stream(true);
        let host = rewind_engine::policy::wasm::PolicyHost::with_default_policy().unwrap();
        let text = render(&MetricsSnapshot::default(), &host.status(), &m);
        for want in [
            r#"rewind_resume_decisions_total{verdict="conflict",generation="3"} 1"#,
            "rewind_resume_duration_seconds_count 1",
            "rewind_replay_events_sum 7.0",
            "rewind_policy_live_generation 1",
            r#"rewind_http_responses_total{method="POST",status="404"} 1"#,
            "rewind_sse_streams_open 1",
            &format!(
                "rewind_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
        ] {
            assert!(text.contains(want), "{want} missing from {text}");
        }
        // One family per fact: no duplicate counts of the same decisions,
        // and no label that changes when a policy is swapped.
        for gone in [
            "rewind_resumes_total",
            "rewind_verdicts_total",
            "rewind_policy_decisions",
            "state=",
        ] {
            assert!(!text.contains(gone), "{gone} still in {text}");
        }
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn the_collector_fits_into_an_embedders_registry() {
        let engine = Engine::new(rewind_engine::Config::default()).unwrap();
        let server = Arc::new(ServerMetrics::new());
        let session = engine.open(None).unwrap();
        session.append(0, b"x").unwrap();
        let mut registry = Registry::default();
        let mine = Counter::<u64>::default();
        mine.inc();
        registry.register("my_app_requests", "The embedder's own", mine);
        registry.register_collector(Box::new(RewindCollector::new(engine, server)));
        let mut out = String::new();
        text::encode(&mut out, &registry).unwrap();
        assert!(out.contains("my_app_requests_total 1"), "{out}");
        assert!(out.contains("rewind_appends_total 1"), "{out}");
        assert!(!out.contains("process_"), "off unless asked: {out}");
    }
}
