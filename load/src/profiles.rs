//! What the sessions of each profile do, and the orchestration around them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::args::{LoadArgs, Profile};
use crate::client::{
    future_cursor, CallEnd, CallPlan, Client, Cut, ProbeKind, RunContext, MALFORMED_CURSOR,
};
use crate::gate::{Gate, RoundOutcome};
use crate::procstat;
use crate::record::{Counters, ErrorRecord};

/// Progress notifications of the short calls probers make to get a cursor.
const PROBER_CALL_COUNT: u32 = 3;
/// Sessions whose liveness the idle profile checks at the end.
const IDLE_LIVENESS_SAMPLE: usize = 100;

/// The settings of one run, resolved from the arguments.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The profile.
    pub profile: Profile,
    /// Sessions.
    pub sessions: u32,
    /// Load time.
    pub duration: Duration,
    /// Notifications per call.
    pub count: u32,
    /// Milliseconds between them.
    pub interval_ms: u64,
    /// Fraction of calls cut.
    pub resume_fraction: f64,
    /// Resume delays, used in turn.
    pub delays: Vec<Duration>,
    /// Pause after each call (throughput, resume).
    pub think: Duration,
    /// Storm cut point.
    pub storm_cut_after: u32,
    /// Sessions initialising at once.
    pub open_concurrency: usize,
    /// Random seed.
    pub seed: u64,
    /// Server process to sample.
    pub server_pid: Option<u32>,
}

impl Settings {
    /// The settings `args` ask for.
    pub fn from_args(args: &LoadArgs, seed: u64) -> Settings {
        Settings {
            profile: args.profile,
            sessions: args.sessions,
            duration: args.duration,
            count: args.count(),
            interval_ms: args.interval().as_millis() as u64,
            resume_fraction: args.resume_fraction,
            delays: args.resume_delay.clone(),
            think: args.think,
            storm_cut_after: args.storm_cut_after,
            open_concurrency: args.open_concurrency,
            seed,
            server_pid: args.server_pid,
        }
    }

    fn plain(&self) -> CallPlan {
        CallPlan {
            count: self.count,
            interval_ms: self.interval_ms,
            cut: Cut::Never,
        }
    }

    /// A call that is cut with probability `fraction`, at a random point,
    /// resumed after the next delay in turn.
    fn maybe_cut(&self, fraction: f64, rng: &mut fastrand::Rng, turn: &mut usize) -> CallPlan {
        if self.count < 2 || rng.f64() >= fraction {
            return self.plain();
        }
        let slot = *turn % self.delays.len();
        *turn += 1;
        CallPlan {
            count: self.count,
            interval_ms: self.interval_ms,
            cut: Cut::After {
                events: rng.u64(1..u64::from(self.count)),
                delay: self.delays[slot],
                slot,
            },
        }
    }
}

/// What a profile measured besides the shared record.
#[derive(Debug, Default)]
pub struct Outcome {
    /// From the end of the opening phase to the end of the load.
    pub measured: Duration,
    /// How long opening the sessions took.
    pub opening: Duration,
    /// Sessions that opened.
    pub opened: u32,
    /// Storm rounds.
    pub rounds: Vec<RoundOutcome>,
    /// The idle profile's figures.
    pub idle: Option<IdleOutcome>,
    /// Server RSS sampled while loading: (seconds since start, KiB).
    pub rss_series: Vec<(f64, u64)>,
    /// Server CPU and RSS just before and after the measured phase.
    pub server_before: Option<procstat::ProcSample>,
    /// See `server_before`.
    pub server_after: Option<procstat::ProcSample>,
    /// Server RSS before any session was opened.
    pub server_at_start: Option<procstat::ProcSample>,
}

/// The idle profile's figures.
#[derive(Debug, Clone)]
pub struct IdleOutcome {
    /// Sessions held.
    pub sessions: u32,
    /// Of the sampled sessions, how many still answered a call at the end.
    pub alive: u32,
    /// How many were sampled.
    pub sampled: u32,
}

/// Runs `settings.profile`.
pub async fn run(ctx: Arc<RunContext>, s: Settings) -> Outcome {
    let mut out = Outcome {
        server_at_start: s.server_pid.and_then(|p| procstat::sample(Some(p))),
        ..Outcome::default()
    };
    let opening = Instant::now();
    let clients = open_all(&ctx, &s).await;
    out.opening = opening.elapsed();
    out.opened = clients.len() as u32;
    if clients.is_empty() {
        return out;
    }
    out.server_before = s.server_pid.and_then(|p| procstat::sample(Some(p)));
    let started = Instant::now();
    let (stop_sampler, stopped) = tokio::sync::oneshot::channel::<()>();
    let sampler = s
        .server_pid
        .map(|pid| tokio::spawn(sample_rss(pid, started, stopped)));
    match s.profile {
        Profile::Storm => out.rounds = storm(&ctx, &s, clients).await,
        Profile::Idle => out.idle = Some(idle(&ctx, &s, clients).await),
        _ => looping(&ctx, &s, clients, started + s.duration).await,
    }
    out.measured = started.elapsed();
    out.server_after = s.server_pid.and_then(|p| procstat::sample(Some(p)));
    let _ = stop_sampler.send(());
    if let Some(h) = sampler {
        if let Ok(series) = h.await {
            out.rss_series = series;
        }
    }
    out
}

/// Samples the server's RSS four times a second until `stop` fires or the
/// process is gone.
async fn sample_rss(
    pid: u32,
    started: Instant,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<(f64, u64)> {
    let mut series = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => return series,
        }
        match procstat::sample(Some(pid)) {
            Some(p) => series.push((started.elapsed().as_secs_f64(), p.rss_kib)),
            None => return series,
        }
        if series.len() > 100_000 {
            return series;
        }
    }
}

/// Opens every session, `open_concurrency` at a time.
async fn open_all(ctx: &Arc<RunContext>, s: &Settings) -> Vec<Client> {
    let permits = Arc::new(Semaphore::new(s.open_concurrency));
    let mut set = JoinSet::new();
    for i in 0..s.sessions {
        let ctx = Arc::clone(ctx);
        let permits = Arc::clone(&permits);
        let held_idle = s.profile == Profile::Idle;
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let mut c = Client::new(ctx.clone(), i);
            match c.open().await {
                Ok(()) => {
                    // Idle sessions are held without a connection each, so
                    // their number is not bounded by open files on either
                    // side and the server's memory is the sessions', not
                    // 100k sockets' buffers.
                    if held_idle {
                        c.drop_connections();
                    }
                    Some(c)
                }
                Err(e) => {
                    ctx.record.error(
                        "setup",
                        ErrorRecord {
                            session: i,
                            doing: "opening the session".into(),
                            error: e.0,
                        },
                    );
                    None
                }
            }
        });
    }
    let mut clients = Vec::with_capacity(s.sessions as usize);
    while let Some(r) = set.join_next().await {
        if let Ok(Some(c)) = r {
            clients.push(c);
        }
    }
    clients.sort_by_key(|c| c.index);
    clients
}

/// The profiles whose sessions loop until the deadline.
async fn looping(ctx: &Arc<RunContext>, s: &Settings, clients: Vec<Client>, deadline: Instant) {
    let n = clients.len();
    let mut set = JoinSet::new();
    for c in clients {
        let s = s.clone();
        let ctx = Arc::clone(ctx);
        let seed = s
            .seed
            .wrapping_add(u64::from(c.index).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let prober = s.profile == Profile::Adversarial && n >= 2 && c.index % 4 == 3;
        set.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            match (s.profile, prober) {
                (Profile::Adversarial, true) => probe_loop(c, &ctx, &s, deadline, &mut rng).await,
                (Profile::Soak, _) => soak_loop(c, &ctx, &s, deadline, &mut rng).await,
                (Profile::Mixed, _) => mixed_loop(c, &ctx, &s, deadline, &mut rng).await,
                (Profile::Throughput, _) => call_loop(c, &s, deadline, 0.0, &mut rng).await,
                _ => call_loop(c, &s, deadline, s.resume_fraction, &mut rng).await,
            }
        });
    }
    // Every call is bounded by its timeouts; this bound only guards against
    // a bug leaving a task behind.
    let grace = ctx.timeouts.headers + ctx.timeouts.idle * 8 + Duration::from_secs(5);
    let all = async { while set.join_next().await.is_some() {} };
    if tokio::time::timeout_at((deadline + grace).into(), all)
        .await
        .is_err()
    {
        ctx.record.error(
            "stuck",
            ErrorRecord {
                session: u32::MAX,
                doing: "finishing the load".into(),
                error: format!(
                    "{} session(s) still busy {grace:?} after the end",
                    set.len()
                ),
            },
        );
        set.abort_all();
    }
}

async fn call_loop(
    mut c: Client,
    s: &Settings,
    deadline: Instant,
    fraction: f64,
    rng: &mut fastrand::Rng,
) {
    let mut turn = c.index as usize;
    let think = s.think;
    if !think.is_zero() {
        // Sessions start spread over one pause, not in lockstep.
        tokio::time::sleep(think.mul_f64(rng.f64())).await;
    }
    while Instant::now() < deadline {
        let plan = s.maybe_cut(fraction, rng, &mut turn);
        c.call(&plan).await;
        if !think.is_zero() {
            tokio::time::sleep(think).await;
        }
    }
}

/// An adversarial session: probes in turn while the others stream.
async fn probe_loop(
    mut c: Client,
    ctx: &RunContext,
    s: &Settings,
    deadline: Instant,
    rng: &mut fastrand::Rng,
) {
    let kinds = [
        ProbeKind::Foreign,
        ProbeKind::Future,
        ProbeKind::Malformed,
        ProbeKind::Stale,
        ProbeKind::Dead,
    ];
    let mut i = 0usize;
    // Every kind at least once, however short the run.
    while Instant::now() < deadline || i < kinds.len() {
        let kind = kinds[i % kinds.len()];
        i += 1;
        if !probe_once(&mut c, ctx, s, kind, rng).await {
            return;
        }
    }
}

/// A call short enough to hand the prober a cursor of its own.
fn short_call(s: &Settings) -> CallPlan {
    CallPlan {
        count: PROBER_CALL_COUNT,
        interval_ms: s.interval_ms.min(1),
        cut: Cut::Never,
    }
}

/// One probe of `kind`; `false` when the session cannot go on.
async fn probe_once(
    c: &mut Client,
    ctx: &RunContext,
    s: &Settings,
    kind: ProbeKind,
    rng: &mut fastrand::Rng,
) -> bool {
    let Some(sid) = c.session_id.clone() else {
        return false;
    };
    match kind {
        ProbeKind::Foreign => {
            // Until somebody published a cursor, stream a little meanwhile.
            for _ in 0..3 {
                if let Some(p) = ctx.board.pick_other(c.index, rng) {
                    c.probe(kind, &sid, &p.cursor).await;
                    break;
                }
                c.call(&short_call(s)).await;
            }
        }
        ProbeKind::Future => {
            let cursor = match own_cursor(c, s).await {
                Some(x) => x,
                None => return true,
            };
            c.probe(kind, &sid, &future_cursor(&cursor, ctx.strict()))
                .await;
        }
        ProbeKind::Malformed => c.probe(kind, &sid, MALFORMED_CURSOR).await,
        ProbeKind::Stale => {
            let Some(old) = fresh_cursor(c, s).await else {
                return true;
            };
            match c.reinitialize().await {
                Ok(true) => c.probe(kind, &sid, &old).await,
                Ok(false) => {
                    ctx.record
                        .probe("stale", |t| *t.answers.entry(0).or_default() += 1);
                }
                // The server refused to re-initialise under the same id
                // (most do): there is no earlier incarnation to probe.
                Err(_) => {
                    ctx.record
                        .probe("stale", |t| *t.answers.entry(0).or_default() += 1);
                    return c.open().await.is_ok();
                }
            }
        }
        ProbeKind::Dead => {
            let Some(old) = fresh_cursor(c, s).await else {
                return true;
            };
            if let Err(e) = c.delete().await {
                ctx.record.error(
                    e.kind(),
                    ErrorRecord {
                        session: c.index,
                        doing: "DELETE before a dead-session probe".into(),
                        error: e.to_string(),
                    },
                );
            }
            c.probe(kind, &sid, &old).await;
            return c.open().await.is_ok();
        }
    }
    true
}

/// The session's latest cursor, making a short call first if it has none.
async fn own_cursor(c: &mut Client, s: &Settings) -> Option<String> {
    if c.last_cursor.is_none() {
        c.call(&short_call(s)).await;
    }
    c.last_cursor.clone()
}

/// A cursor of a call made just now.
async fn fresh_cursor(c: &mut Client, s: &Settings) -> Option<String> {
    match c.call(&short_call(s)).await {
        CallEnd::Completed => c.last_cursor.clone(),
        _ => None,
    }
}

/// A soak session: lives of a few calls, each ended by `DELETE` or by
/// walking away, until the deadline.
async fn soak_loop(
    mut c: Client,
    ctx: &RunContext,
    s: &Settings,
    deadline: Instant,
    rng: &mut fastrand::Rng,
) {
    let mut turn = c.index as usize;
    loop {
        for _ in 0..rng.u32(1..=4) {
            if Instant::now() >= deadline {
                return;
            }
            let plan = s.maybe_cut(s.resume_fraction, rng, &mut turn);
            c.call(&plan).await;
        }
        if rng.bool() {
            if let Err(e) = c.delete().await {
                ctx.record.error(
                    e.kind(),
                    ErrorRecord {
                        session: c.index,
                        doing: "DELETE".into(),
                        error: e.to_string(),
                    },
                );
            }
        } else {
            c.abandon();
        }
        if Instant::now() >= deadline {
            return;
        }
        if let Err(e) = c.open().await {
            ctx.record.error(
                "setup",
                ErrorRecord {
                    session: c.index,
                    doing: "initialize (soak)".into(),
                    error: e.0,
                },
            );
            return;
        }
    }
}

/// A mixed session: plain calls, cut-and-resume calls and probes.
async fn mixed_loop(
    mut c: Client,
    ctx: &RunContext,
    s: &Settings,
    deadline: Instant,
    rng: &mut fastrand::Rng,
) {
    let probes = [ProbeKind::Foreign, ProbeKind::Future, ProbeKind::Malformed];
    let mut turn = c.index as usize;
    let mut p = 0usize;
    while Instant::now() < deadline {
        if rng.f64() < 0.15 {
            let kind = probes[p % probes.len()];
            p += 1;
            if !probe_once(&mut c, ctx, s, kind, rng).await {
                return;
            }
        } else {
            let plan = s.maybe_cut(s.resume_fraction, rng, &mut turn);
            c.call(&plan).await;
        }
    }
}

/// Storm rounds until the time is up (at least one).
async fn storm(ctx: &Arc<RunContext>, s: &Settings, clients: Vec<Client>) -> Vec<RoundOutcome> {
    let gate = Arc::new(Gate::default());
    let n = clients.len() as u64;
    let bound = ctx.timeouts.headers + ctx.timeouts.idle;
    let mut set = JoinSet::new();
    for mut c in clients {
        let gate = Arc::clone(&gate);
        let s = s.clone();
        set.spawn(async move {
            let mut round = 0u64;
            while gate.wait_start(round, bound * 4).await {
                let plan = CallPlan {
                    count: s.count,
                    interval_ms: s.interval_ms,
                    cut: Cut::Storm {
                        events: u64::from(s.storm_cut_after),
                        gate: Arc::clone(&gate),
                        round,
                    },
                };
                c.call(&plan).await;
                round += 1;
            }
        });
    }
    let deadline = Instant::now() + s.duration;
    let mut rounds = Vec::new();
    // The storm's resume latencies go to slot 0: its delay is the first.
    let delay = s.delays.first().copied().unwrap_or_default();
    for r in 0.. {
        let outcome = gate.run_round(r, n, delay, bound).await;
        let stop = !outcome.all_done;
        rounds.push(outcome);
        if stop || Instant::now() >= deadline {
            break;
        }
    }
    gate.stop();
    let all = async { while set.join_next().await.is_some() {} };
    if tokio::time::timeout(bound * 2, all).await.is_err() {
        set.abort_all();
    }
    rounds
}

/// Holds every session idle after one short call, then checks a sample is
/// still alive.
async fn idle(ctx: &Arc<RunContext>, s: &Settings, clients: Vec<Client>) -> IdleOutcome {
    let permits = Arc::new(Semaphore::new(s.open_concurrency));
    let mut set = JoinSet::new();
    let plan = CallPlan {
        count: s.count,
        interval_ms: s.interval_ms,
        cut: Cut::Never,
    };
    for mut c in clients {
        let permits = Arc::clone(&permits);
        let plan = plan.clone();
        set.spawn(async move {
            let _p = permits.acquire_owned().await;
            c.call(&plan).await;
            c.drop_connections();
            c
        });
    }
    let mut held = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(c) = r {
            held.push(c);
        }
    }
    // Let the server settle (close sockets, free buffers) before the
    // caller samples its memory.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sessions = held.len() as u32;
    let step = (held.len() / IDLE_LIVENESS_SAMPLE).max(1);
    let mut sampled = 0;
    let mut alive = 0;
    for c in held.iter_mut().step_by(step).take(IDLE_LIVENESS_SAMPLE) {
        sampled += 1;
        let before = Counters::get(&ctx.record.counters.calls_completed);
        c.call(&plan).await;
        if Counters::get(&ctx.record.counters.calls_completed) > before {
            alive += 1;
        }
        c.drop_connections();
    }
    IdleOutcome {
        sessions,
        alive,
        sampled,
    }
}
