//! Server-side metrics the MCP transport records and the admin surface
//! exports. (Minimal version; the admin work extends it.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rewind_engine::Verdict;

/// Metrics recorded by the HTTP transport.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    resumes: AtomicU64,
    replayed_events: AtomicU64,
}

impl ServerMetrics {
    /// A fresh set of metrics.
    pub fn new() -> ServerMetrics {
        ServerMetrics::default()
    }

    /// One reconnect decided: its verdict, the policy generation that
    /// decided it, and how long the decision took (lookup, facts, policy).
    pub fn observe_resume(&self, verdict: Verdict, generation: u64, elapsed: Duration) {
        let _ = (verdict, generation, elapsed);
        self.resumes.fetch_add(1, Ordering::Relaxed);
    }

    /// A replay finished (caught up with live delivery or was cut): how
    /// many events it replayed from before the reconnect.
    pub fn observe_replay(&self, events: u64) {
        self.replayed_events.fetch_add(events, Ordering::Relaxed);
    }
}
