//! The policy host: the live generation, swaps, rollbacks and the engine's
//! [`Policy`] trait.

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rewind_policy_sdk::ResumeFacts;
use wasmtime::Engine;

use super::cache;
use super::compiler::build_engine;
use super::config::PolicyHostConfig;
use super::error::{HostError, LoadError, RollbackError, SwapError};
use super::generation::{Generation, LiveGeneration};
use super::module::PolicyModule;
use super::plugins;
use super::report::ValidationReport;
use super::stats::{GenerationState, GenerationStats, GenerationStatus, LoadCounts, PolicyStatus};
use super::ticker::EpochTicker;
use super::validate::validate;
use crate::policy::{Policy, PolicyAnswer};

/// Good generations kept as rollback targets (the live one included).
const ROLLBACK_DEPTH: usize = 8;
/// Generations listed in [`PolicyStatus::generations`].
const STATUS_DEPTH: usize = 16;

static NEXT_HOST_ID: AtomicU64 = AtomicU64::new(1);

/// Cold bookkeeping, touched by swaps, rollbacks and status only.
#[derive(Debug)]
struct History {
    next_generation: u64,
    /// Rollback targets, oldest first; the last one is live.
    good: Vec<Arc<Generation>>,
    /// Recently published generations, newest first.
    recent: VecDeque<Arc<Generation>>,
}

/// Runs resume policies as sandboxed WebAssembly, swappable while deciding.
///
/// See the [module documentation](super) for what it guarantees. Share it
/// behind an `Arc`; every method takes `&self`.
pub struct PolicyHost {
    /// What deciding threads read (their instance caches hold a `Weak`).
    live: Arc<LiveGeneration>,
    /// Compiles this host's modules; a module only runs on the engine
    /// that compiled it.
    engine: Engine,
    /// Held while publishing, so that publications are ordered and
    /// `history.good.last()` is always what is live.
    history: Mutex<History>,
    swaps: AtomicU64,
    /// Loads by outcome ([`LoadCounts`]).
    loaded: AtomicU64,
    refused: AtomicU64,
    compiler_failed: AtomicU64,
    /// Wall time spent in loads, all outcomes, in nanoseconds.
    load_nanos: AtomicU64,
    manual_rollbacks: AtomicU64,
    automatic_rollbacks: AtomicU64,
    _ticker: EpochTicker,
}

/// `d` in nanoseconds, saturating (a load does not take 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl fmt::Debug for PolicyHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let live = self.live.load();
        f.debug_struct("PolicyHost")
            .field("id", &self.live.host_id)
            .field(
                "live",
                &format_args!("{}#{}", live.module.name(), live.number),
            )
            .finish_non_exhaustive()
    }
}

impl PolicyHost {
    /// A host with the default configuration running the embedded default
    /// policy (the decision table of `docs/decision-table.md`) as generation 1.
    pub fn with_default_policy() -> Result<PolicyHost, HostError> {
        PolicyHost::new(PolicyHostConfig::default())
    }

    /// A host with `config` running the embedded default policy.
    pub fn new(config: PolicyHostConfig) -> Result<PolicyHost, HostError> {
        PolicyHost::with_policy(config, "default", plugins::DEFAULT)
    }

    /// A host with `config` whose generation 1 is `wasm`, loaded and
    /// validated like any swap.
    pub fn with_policy(
        config: PolicyHostConfig,
        name: &str,
        wasm: &[u8],
    ) -> Result<PolicyHost, HostError> {
        let engine = build_engine(&config)?;
        let started = Instant::now();
        let module = PolicyModule::load(&engine, &config, name, wasm)?;
        let load_nanos = nanos(started.elapsed());
        let report = validate(&config, &module);
        if !report.passed() {
            return Err(HostError::Validation(Box::new(report)));
        }
        let first = Arc::new(Generation::new(1, module));
        let ticker =
            EpochTicker::start(engine.clone(), config.epoch_tick).map_err(HostError::Ticker)?;
        let host_id = NEXT_HOST_ID.fetch_add(1, Relaxed);
        Ok(PolicyHost {
            live: Arc::new(LiveGeneration::new(host_id, config, Arc::clone(&first))),
            engine,
            history: Mutex::new(History {
                next_generation: 2,
                good: vec![Arc::clone(&first)],
                recent: VecDeque::from([first]),
            }),
            swaps: AtomicU64::new(0),
            // The first module loaded, or there would be no host.
            loaded: AtomicU64::new(1),
            refused: AtomicU64::new(0),
            compiler_failed: AtomicU64::new(0),
            load_nanos: AtomicU64::new(load_nanos),
            manual_rollbacks: AtomicU64::new(0),
            automatic_rollbacks: AtomicU64::new(0),
            _ticker: ticker,
        })
    }

    /// The configuration this host runs with.
    pub fn config(&self) -> &PolicyHostConfig {
        &self.live.config
    }

    /// Compiles and checks a module (see [`PolicyModule`]). Nothing goes
    /// live until [`swap`](Self::swap).
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<PolicyModule, LoadError> {
        let started = Instant::now();
        self.counted(
            started,
            PolicyModule::load(&self.engine, self.config(), name, wasm),
        )
    }

    /// [`load`](Self::load) from a file, memory-mapped; named after the
    /// file's stem.
    pub fn load_file(&self, path: impl AsRef<Path>) -> Result<PolicyModule, LoadError> {
        let started = Instant::now();
        self.counted(
            started,
            PolicyModule::load_file(&self.engine, self.config(), path.as_ref()),
        )
    }

    /// Counts a load that began at `started` in [`PolicyStatus::loads`]: its
    /// outcome and its time.
    fn counted(
        &self,
        started: Instant,
        loaded: Result<PolicyModule, LoadError>,
    ) -> Result<PolicyModule, LoadError> {
        self.load_nanos.fetch_add(nanos(started.elapsed()), Relaxed);
        let counter = match &loaded {
            Ok(_) => &self.loaded,
            Err(LoadError::Compiler { .. }) => &self.compiler_failed,
            Err(_) => &self.refused,
        };
        counter.fetch_add(1, Relaxed);
        loaded
    }

    /// Runs `module` on the validation vectors (every row of the decision
    /// table, then the configured number of seeded random facts) with this
    /// host's budgets.
    pub fn validate(&self, module: &PolicyModule) -> ValidationReport {
        validate(self.config(), module)
    }

    /// Validates `module` and, if it passes, publishes it as the next
    /// generation and returns that generation's number. Deciding threads
    /// pick it up on their next decision; decisions already running finish
    /// on the module they started with.
    pub fn swap(&self, module: &PolicyModule) -> Result<u64, SwapError> {
        self.check_ours(module)?;
        let report = self.validate(module);
        if !report.passed() {
            return Err(SwapError::Validation(Box::new(report)));
        }
        Ok(self.publish(module))
    }

    /// Publishes `module` without validation. Call-time containment still
    /// applies (budgets, fallback, counting, automatic rollback); this is
    /// for tests and for an operator who knows better than the vectors.
    pub fn swap_unvalidated(&self, module: &PolicyModule) -> Result<u64, SwapError> {
        self.check_ours(module)?;
        Ok(self.publish(module))
    }

    /// Takes the live generation out and re-publishes the previous good one
    /// (with its number and counters). Returns the generation now live.
    pub fn rollback(&self) -> Result<u64, RollbackError> {
        let restored = self.roll_back(&mut self.history())?;
        self.manual_rollbacks.fetch_add(1, Relaxed);
        Ok(restored)
    }

    /// The live generation's number.
    pub fn live_generation(&self) -> u64 {
        self.live.load().number
    }

    /// The live policy's name.
    pub fn live_name(&self) -> String {
        self.live.load().module.name().to_owned()
    }

    /// Counters of a recent generation (see [`PolicyStatus::generations`]).
    pub fn stats(&self, generation: u64) -> Option<GenerationStats> {
        let history = self.history();
        history
            .recent
            .iter()
            .find(|g| g.number == generation)
            .map(|g| g.counters.snapshot(g.number))
    }

    /// A snapshot of the live and recent generations and their counters.
    pub fn status(&self) -> PolicyStatus {
        let history = self.history();
        let live = self.live.load_full();
        let status_of = |g: &Arc<Generation>| GenerationStatus {
            name: g.module.name().to_owned(),
            state: if Arc::ptr_eq(g, &live) {
                GenerationState::Live
            } else if g.rolled_back.load(Relaxed) {
                GenerationState::RolledBack
            } else if history.good.iter().any(|good| Arc::ptr_eq(good, g)) {
                GenerationState::Standby
            } else {
                GenerationState::Retired
            },
            stats: g.counters.snapshot(g.number),
        };
        PolicyStatus {
            live: status_of(&live),
            generations: history.recent.iter().map(status_of).collect(),
            swaps: self.swaps.load(Relaxed),
            manual_rollbacks: self.manual_rollbacks.load(Relaxed),
            automatic_rollbacks: self.automatic_rollbacks.load(Relaxed),
            loads: LoadCounts {
                loaded: self.loaded.load(Relaxed),
                refused: self.refused.load(Relaxed),
                compiler_failed: self.compiler_failed.load(Relaxed),
                time: Duration::from_nanos(self.load_nanos.load(Relaxed)),
            },
        }
    }

    fn check_ours(&self, module: &PolicyModule) -> Result<(), SwapError> {
        if Engine::same(module.wasm().engine(), &self.engine) {
            Ok(())
        } else {
            Err(SwapError::ForeignModule(module.name().to_owned()))
        }
    }

    fn publish(&self, module: &PolicyModule) -> u64 {
        let mut history = self.history();
        let number = history.next_generation;
        history.next_generation += 1;
        let generation = Arc::new(Generation::new(number, module.clone()));
        history.good.push(Arc::clone(&generation));
        if history.good.len() > ROLLBACK_DEPTH {
            history.good.remove(0);
        }
        history.recent.push_front(Arc::clone(&generation));
        history.recent.truncate(STATUS_DEPTH);
        self.live.publish(generation);
        self.swaps.fetch_add(1, Relaxed);
        number
    }

    fn history(&self) -> MutexGuard<'_, History> {
        // The history is consistent after every statement that can panic
        // (none of them do in practice), so a poisoned lock is still usable.
        self.history
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the live generation out and re-publishes the previous good
    /// one; `history` is this host's, locked.
    fn roll_back(&self, history: &mut History) -> Result<u64, RollbackError> {
        if history.good.len() < 2 {
            return Err(RollbackError::NothingToRollBackTo {
                current: self.live.number(),
            });
        }
        let out = history.good.pop().expect("checked: two or more");
        out.rolled_back.store(true, Relaxed);
        let previous = Arc::clone(history.good.last().expect("checked: two or more"));
        let number = previous.number;
        self.live.publish(previous);
        Ok(number)
    }

    /// The automatic rollback rule, applied after generation `number`
    /// malfunctioned: once it has made enough decisions and its fault rate
    /// is over the threshold, it is rolled back, at most once, and only if
    /// it is still live (a rollback must not undo a newer swap).
    #[cold]
    fn after_malfunction(&self, number: u64) {
        let Some(rule) = self.config().auto_rollback else {
            return;
        };
        let generation = self.live.load_full();
        if generation.number != number {
            return;
        }
        let stats = generation.counters.snapshot(number);
        if stats.decisions < rule.min_decisions || stats.fault_rate() <= rule.max_fault_rate {
            return;
        }
        if generation.auto_rollback_fired.swap(true, Relaxed) {
            return;
        }
        let mut history = self.history();
        let still_live = history
            .good
            .last()
            .is_some_and(|live| Arc::ptr_eq(live, &generation));
        if still_live && self.roll_back(&mut history).is_ok() {
            self.automatic_rollbacks.fetch_add(1, Relaxed);
        }
    }
}

impl Policy for PolicyHost {
    /// One typed call into the live generation's per-thread instance; on a
    /// trap, timeout, out-of-fuel or out-of-set answer, the facts' default
    /// with the fault set (and counted on the generation).
    #[inline]
    fn decide(&self, facts: &ResumeFacts) -> PolicyAnswer {
        let answer = cache::decide(&self.live, facts);
        if answer.fault.is_some_and(|f| f.is_malfunction()) {
            self.after_malfunction(answer.generation);
        }
        answer
    }

    fn name(&self) -> String {
        let live = self.live.load();
        format!("wasm:{}#{}", live.module.name(), live.number)
    }
}
