//! The storm's gate: every session streams until its cut point, all are cut
//! at once, and all resume at once.
//!
//! The orchestrator moves a phase counter forward (from 0, before any
//! round; round `r`: start `3r + 1`, cut `3r + 2`, resume `3r + 3`);
//! sessions wait on it with a bound and report back through per-round
//! counters, so one stuck session delays a round by at most the timeout and
//! never deadlocks it. A round's counters are reset before its start is
//! published, so no session can report into a round before the reset.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::record::lock;

/// Phase value that ends the storm.
pub const STOP: u64 = u64::MAX;

/// Shared by the orchestrator and the sessions of a storm.
#[derive(Debug)]
pub struct Gate {
    phase: watch::Sender<u64>,
    ready: AtomicU64,
    cut: AtomicU64,
    done: AtomicU64,
    /// Sessions whose call ended before the cut point.
    dropped_early: AtomicU64,
    /// Sessions whose call ended without a result after the cut.
    dropped_late: AtomicU64,
    resumed_at: Mutex<Option<Instant>>,
    /// Per session that completed: (first replayed event, result), after the resume.
    times: Mutex<Vec<(Option<Duration>, Duration)>>,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            phase: watch::Sender::new(0),
            ready: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            done: AtomicU64::new(0),
            dropped_early: AtomicU64::new(0),
            dropped_late: AtomicU64::new(0),
            resumed_at: Mutex::new(None),
            times: Mutex::new(Vec::new()),
        }
    }
}

/// Phase values of round `r`. The phase starts at 0, below round 0's
/// start: were it round 0's start, sessions would begin before the
/// orchestrator reset the round's counters, and a session that reached its
/// cut point first had its report wiped, so the round waited out its whole
/// timeout for it (one storm run in six, the faster the server the more).
fn start(r: u64) -> u64 {
    3 * r + 1
}
fn cut_phase(r: u64) -> u64 {
    3 * r + 2
}
fn resume_phase(r: u64) -> u64 {
    3 * r + 3
}

impl Gate {
    async fn wait_for(&self, at_least: u64, bound: Duration) -> u64 {
        let mut rx = self.phase.subscribe();
        let _ = tokio::time::timeout(bound, rx.wait_for(|p| *p >= at_least)).await;
        let p = *rx.borrow();
        p
    }

    /// Session side: waits until round `r` starts; `false` if the storm is
    /// over (or the wait timed out).
    pub async fn wait_start(&self, r: u64, bound: Duration) -> bool {
        let p = self.wait_for(start(r), bound).await;
        p != STOP && p >= start(r)
    }

    /// Session side: reached the cut point of round `r`.
    pub fn ready(&self, _r: u64) {
        self.ready.fetch_add(1, Ordering::Relaxed);
    }

    /// Session side: waits for the cut.
    pub async fn wait_cut(&self, r: u64, bound: Duration) {
        self.wait_for(cut_phase(r), bound).await;
    }

    /// Session side: the connection is closed.
    pub fn cut_done(&self, _r: u64) {
        self.cut.fetch_add(1, Ordering::Relaxed);
    }

    /// Session side: waits for the resume.
    pub async fn wait_resume(&self, r: u64, bound: Duration) {
        self.wait_for(resume_phase(r), bound).await;
    }

    /// Session side: the call completed; `first` is when the first event
    /// after the resume arrived.
    pub fn done(&self, _r: u64, first: Option<Instant>, at: Instant) {
        if let Some(t0) = *lock(&self.resumed_at) {
            lock(&self.times).push((first.map(|f| f - t0), at - t0));
        }
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// Session side: the call ended without a result, before the cut
    /// point (`readied` false) or after it.
    pub fn drop_out(&self, _r: u64, readied: bool) {
        let counter = if readied {
            &self.dropped_late
        } else {
            &self.dropped_early
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    async fn wait_count(&self, arrived: impl Fn() -> u64, n: u64, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        loop {
            if arrived() >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Orchestrator side: one round with `n` sessions. Returns the round's
    /// outcome.
    pub async fn run_round(
        &self,
        r: u64,
        n: u64,
        delay: Duration,
        bound: Duration,
    ) -> RoundOutcome {
        self.ready.store(0, Ordering::Relaxed);
        self.cut.store(0, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        self.dropped_early.store(0, Ordering::Relaxed);
        self.dropped_late.store(0, Ordering::Relaxed);
        *lock(&self.resumed_at) = None;
        lock(&self.times).clear();
        self.phase.send_replace(start(r));
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let all_ready = self
            .wait_count(|| load(&self.ready) + load(&self.dropped_early), n, bound)
            .await;
        self.phase.send_replace(cut_phase(r));
        let readied = load(&self.ready);
        self.wait_count(|| load(&self.cut), readied, bound).await;
        tokio::time::sleep(delay).await;
        let resumed = Instant::now();
        *lock(&self.resumed_at) = Some(resumed);
        let resuming = load(&self.cut);
        self.phase.send_replace(resume_phase(r));
        let all_done = self
            .wait_count(
                || load(&self.done) + load(&self.dropped_late),
                resuming,
                bound,
            )
            .await
            && all_ready;
        let waited = resumed.elapsed();
        let times = lock(&self.times).clone();
        RoundOutcome {
            sessions: n,
            reached_cut: readied,
            resumed: resuming,
            completed: load(&self.done),
            dropped: load(&self.dropped_early) + load(&self.dropped_late),
            all_ready,
            all_done,
            waited,
            times,
        }
    }

    /// Orchestrator side: ends the storm.
    pub fn stop(&self) {
        self.phase.send_replace(STOP);
    }
}

/// What one storm round did.
#[derive(Debug, Clone)]
pub struct RoundOutcome {
    /// Sessions in the round.
    pub sessions: u64,
    /// Sessions that reached the cut point.
    pub reached_cut: u64,
    /// Sessions that were cut and resumed.
    pub resumed: u64,
    /// Sessions whose call completed after the resume.
    pub completed: u64,
    /// Sessions whose call failed.
    pub dropped: u64,
    /// Whether every session reached the cut point in time.
    pub all_ready: bool,
    /// Whether every session finished in time.
    pub all_done: bool,
    /// From the resume to the last completion (or the timeout).
    pub waited: Duration,
    /// Per completed session: first event and result after the resume.
    pub times: Vec<(Option<Duration>, Duration)>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Gate;

    #[tokio::test]
    async fn no_session_starts_a_round_before_the_orchestrator_does() {
        let gate = Gate::default();
        assert!(
            !gate.wait_start(0, Duration::from_millis(20)).await,
            "round 0 started by itself"
        );
    }

    #[tokio::test]
    async fn a_session_that_is_ready_at_once_is_counted() {
        // The session reports the moment its round starts; the round must
        // see it (and not wait out its bound).
        let gate = Arc::new(Gate::default());
        let session = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move {
                assert!(gate.wait_start(0, Duration::from_secs(5)).await);
                gate.ready(0);
                gate.wait_cut(0, Duration::from_secs(5)).await;
                gate.cut_done(0);
                gate.wait_resume(0, Duration::from_secs(5)).await;
                gate.done(0, None, std::time::Instant::now());
            })
        };
        let outcome = gate
            .run_round(0, 1, Duration::ZERO, Duration::from_secs(5))
            .await;
        session.await.unwrap();
        assert!(outcome.all_ready && outcome.all_done, "{outcome:?}");
        assert_eq!((outcome.reached_cut, outcome.completed), (1, 1));
    }
}
