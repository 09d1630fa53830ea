//! The policy host: the live generation, swaps, rollbacks and the engine's
//! [`Policy`] trait.

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use rewind_policy_sdk::ResumeFacts;
use wasmtime::{Cache, CacheConfig, Config, Engine, OptLevel, Strategy};

use super::cache;
use super::config::PolicyHostConfig;
use super::error::{HostError, LoadError, RollbackError, SwapError};
use super::module::PolicyModule;
use super::plugins;
use super::stats::{
    GenerationCounters, GenerationState, GenerationStats, GenerationStatus, PolicyStatus,
};
use super::ticker::EpochTicker;
use super::validate::{validate, ValidationReport};
use crate::policy::{Policy, PolicyAnswer};

/// Good generations kept as rollback targets (the live one included).
const ROLLBACK_DEPTH: usize = 8;
/// Generations listed in [`PolicyStatus::generations`].
const STATUS_DEPTH: usize = 16;

static NEXT_HOST_ID: AtomicU64 = AtomicU64::new(1);

/// One published module: what every decision is attributed to.
pub(crate) struct Generation {
    pub(crate) number: u64,
    pub(crate) module: PolicyModule,
    pub(crate) counters: GenerationCounters,
    rolled_back: AtomicBool,
    /// Set once the fault-rate rule has fired for this generation, so it
    /// fires at most once.
    auto_rollback_fired: AtomicBool,
}

impl fmt::Debug for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Generation")
            .field("number", &self.number)
            .field("module", &self.module.name())
            .finish_non_exhaustive()
    }
}

/// Cold bookkeeping, touched by swaps, rollbacks and status only.
#[derive(Debug)]
struct History {
    next_generation: u64,
    /// Rollback targets, oldest first; the last one is live.
    good: Vec<Arc<Generation>>,
    /// Recently published generations, newest first.
    recent: VecDeque<Arc<Generation>>,
}

/// What the deciding threads share.
pub(crate) struct HostShared {
    pub(crate) id: u64,
    pub(crate) engine: Engine,
    pub(crate) config: PolicyHostConfig,
    /// The live generation. Readers `load` it once per decision (wait-free);
    /// writers hold `history` while they `store`, so publications are
    /// ordered and `history.good.last()` is always what is live.
    pub(crate) live: ArcSwap<Generation>,
    /// `live`'s generation number, stored (`Release`) after every `live`
    /// store, under `history`. The hot path reads only this (`Acquire`,
    /// a plain load on x86) to see whether its cached generation is still
    /// live, and loads `live` itself only when it is not. Reading a stale
    /// number just means deciding on the generation that was live a moment
    /// earlier, as if the decision had started before the swap.
    pub(crate) live_number: AtomicU64,
    history: Mutex<History>,
    swaps: AtomicU64,
    manual_rollbacks: AtomicU64,
    automatic_rollbacks: AtomicU64,
}

impl fmt::Debug for HostShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostShared")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Runs resume policies as sandboxed WebAssembly, swappable while deciding.
///
/// See the [module documentation](super) for what it guarantees. Share it
/// behind an `Arc`; every method takes `&self`.
pub struct PolicyHost {
    shared: Arc<HostShared>,
    _ticker: EpochTicker,
}

impl fmt::Debug for PolicyHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let live = self.shared.live.load();
        f.debug_struct("PolicyHost")
            .field("id", &self.shared.id)
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
        let module = PolicyModule::load(&engine, &config, name, wasm)?;
        let report = validate(&engine, &config, &module);
        if !report.passed() {
            return Err(HostError::Validation(Box::new(report)));
        }
        let first = Arc::new(Generation::new(1, module));
        let ticker =
            EpochTicker::start(engine.clone(), config.epoch_tick).map_err(HostError::Ticker)?;
        let shared = HostShared {
            id: NEXT_HOST_ID.fetch_add(1, Relaxed),
            engine,
            config,
            live: ArcSwap::new(Arc::clone(&first)),
            live_number: AtomicU64::new(1),
            history: Mutex::new(History {
                next_generation: 2,
                good: vec![Arc::clone(&first)],
                recent: VecDeque::from([first]),
            }),
            swaps: AtomicU64::new(0),
            manual_rollbacks: AtomicU64::new(0),
            automatic_rollbacks: AtomicU64::new(0),
        };
        Ok(PolicyHost {
            shared: Arc::new(shared),
            _ticker: ticker,
        })
    }

    /// The configuration this host runs with.
    pub fn config(&self) -> &PolicyHostConfig {
        &self.shared.config
    }

    /// Compiles and checks a module (see [`PolicyModule`]). Nothing goes
    /// live until [`swap`](Self::swap).
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<PolicyModule, LoadError> {
        PolicyModule::load(&self.shared.engine, &self.shared.config, name, wasm)
    }

    /// [`load`](Self::load) from a file, memory-mapped; named after the
    /// file's stem.
    pub fn load_file(&self, path: impl AsRef<Path>) -> Result<PolicyModule, LoadError> {
        PolicyModule::load_file(&self.shared.engine, &self.shared.config, path.as_ref())
    }

    /// Runs `module` on the validation vectors (every row of the decision
    /// table, then the configured number of seeded random facts) with this
    /// host's budgets.
    pub fn validate(&self, module: &PolicyModule) -> ValidationReport {
        validate(&self.shared.engine, &self.shared.config, module)
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
        let restored = self.shared.roll_back(None)?;
        self.shared.manual_rollbacks.fetch_add(1, Relaxed);
        Ok(restored)
    }

    /// The live generation's number.
    pub fn live_generation(&self) -> u64 {
        self.shared.live.load().number
    }

    /// The live policy's name.
    pub fn live_name(&self) -> String {
        self.shared.live.load().module.name().to_owned()
    }

    /// Counters of a recent generation (see [`PolicyStatus::generations`]).
    pub fn stats(&self, generation: u64) -> Option<GenerationStats> {
        let history = self.shared.history();
        history
            .recent
            .iter()
            .find(|g| g.number == generation)
            .map(|g| g.counters.snapshot(g.number))
    }

    /// A snapshot of the live and recent generations and their counters.
    pub fn status(&self) -> PolicyStatus {
        let history = self.shared.history();
        let live = self.shared.live.load_full();
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
            swaps: self.shared.swaps.load(Relaxed),
            manual_rollbacks: self.shared.manual_rollbacks.load(Relaxed),
            automatic_rollbacks: self.shared.automatic_rollbacks.load(Relaxed),
        }
    }

    fn check_ours(&self, module: &PolicyModule) -> Result<(), SwapError> {
        if Engine::same(module.wasm().engine(), &self.shared.engine) {
            Ok(())
        } else {
            Err(SwapError::ForeignModule(module.name().to_owned()))
        }
    }

    fn publish(&self, module: &PolicyModule) -> u64 {
        let mut history = self.shared.history();
        let number = history.next_generation;
        history.next_generation += 1;
        let generation = Arc::new(Generation::new(number, module.clone()));
        history.good.push(Arc::clone(&generation));
        if history.good.len() > ROLLBACK_DEPTH {
            history.good.remove(0);
        }
        history.recent.push_front(Arc::clone(&generation));
        history.recent.truncate(STATUS_DEPTH);
        self.shared.live.store(generation);
        self.shared.live_number.store(number, Release);
        self.shared.swaps.fetch_add(1, Relaxed);
        number
    }
}

impl Policy for PolicyHost {
    /// One typed call into the live generation's per-thread instance; on a
    /// trap, timeout, out-of-fuel or out-of-set answer, the facts' default
    /// with the fault set (and counted on the generation).
    #[inline]
    fn decide(&self, facts: &ResumeFacts) -> PolicyAnswer {
        cache::decide(&self.shared, facts)
    }

    fn name(&self) -> String {
        let live = self.shared.live.load();
        format!("wasm:{}#{}", live.module.name(), live.number)
    }
}

impl Generation {
    fn new(number: u64, module: PolicyModule) -> Generation {
        Generation {
            number,
            module,
            counters: GenerationCounters::default(),
            rolled_back: AtomicBool::new(false),
            auto_rollback_fired: AtomicBool::new(false),
        }
    }
}

impl HostShared {
    fn history(&self) -> MutexGuard<'_, History> {
        // The history is consistent after every statement that can panic
        // (none of them do in practice), so a poisoned lock is still usable.
        self.history
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Rolls back the live generation; with `only`, only if `only` is still
    /// the live one (an automatic rollback must not undo a newer swap).
    fn roll_back(&self, only: Option<&Arc<Generation>>) -> Result<u64, RollbackError> {
        let mut history = self.history();
        let live = Arc::clone(
            history
                .good
                .last()
                .expect("the live generation is always kept"),
        );
        if only.is_some_and(|g| !Arc::ptr_eq(g, &live)) {
            return Ok(live.number);
        }
        if history.good.len() < 2 {
            return Err(RollbackError::NothingToRollBackTo {
                current: live.number,
            });
        }
        history.good.pop();
        live.rolled_back.store(true, Relaxed);
        let previous = Arc::clone(history.good.last().expect("checked: two or more"));
        self.live.store(Arc::clone(&previous));
        self.live_number.store(previous.number, Release);
        Ok(previous.number)
    }

    /// Called after a counted fault: applies the automatic rollback rule.
    pub(crate) fn after_fault(&self, generation: &Arc<Generation>) {
        let Some(rule) = self.config.auto_rollback else {
            return;
        };
        let stats = generation.counters.snapshot(generation.number);
        if stats.decisions < rule.min_decisions || stats.fault_rate() <= rule.max_fault_rate {
            return;
        }
        if generation.auto_rollback_fired.swap(true, Relaxed) {
            return;
        }
        if let Ok(restored) = self.roll_back(Some(generation)) {
            if restored != generation.number {
                self.automatic_rollbacks.fetch_add(1, Relaxed);
            }
        }
    }
}

fn build_engine(config: &PolicyHostConfig) -> Result<Engine, HostError> {
    let mut wasm = Config::new();
    wasm.strategy(Strategy::Cranelift)
        .cranelift_opt_level(OptLevel::Speed)
        .consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(config.max_wasm_stack_bytes);
    if let Some(dir) = &config.compilation_cache_dir {
        let mut cache = CacheConfig::new();
        cache.with_directory(dir);
        let cache = Cache::new(cache).map_err(|e| HostError::Engine(format!("{e:#}")))?;
        wasm.cache(Some(cache));
    }
    Engine::new(&wasm).map_err(|e| HostError::Engine(format!("{e:#}")))
}
