//! Generations: each published module with its counters, and the one
//! pointer to the live generation that every deciding thread reads.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Release};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::config::PolicyHostConfig;
use super::module::PolicyModule;
use super::stats::GenerationCounters;

/// One published module: what every decision is attributed to.
pub(crate) struct Generation {
    pub(crate) number: u64,
    pub(crate) module: PolicyModule,
    pub(crate) counters: GenerationCounters,
    /// Set when a rollback took this generation out.
    pub(crate) rolled_back: AtomicBool,
    /// Set once the fault-rate rule has fired for this generation, so it
    /// fires at most once.
    pub(crate) auto_rollback_fired: AtomicBool,
}

impl Generation {
    pub(crate) fn new(number: u64, module: PolicyModule) -> Generation {
        Generation {
            number,
            module,
            counters: GenerationCounters::default(),
            rolled_back: AtomicBool::new(false),
            auto_rollback_fired: AtomicBool::new(false),
        }
    }
}

impl fmt::Debug for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Generation")
            .field("number", &self.number)
            .field("module", &self.module.name())
            .finish_non_exhaustive()
    }
}

/// What deciding threads share with the host: which generation is live,
/// and the budgets every instance runs under. Nothing cold (history,
/// rollback bookkeeping) lives here; the host keeps that.
pub(crate) struct LiveGeneration {
    /// Tells one host's slots from another's in a thread's instance cache.
    pub(crate) host_id: u64,
    pub(crate) config: PolicyHostConfig,
    /// The live generation. Readers load it (wait-free) only when
    /// `number` says it changed; [`publish`](Self::publish) stores it.
    current: ArcSwap<Generation>,
    /// `current`'s generation number, stored (`Release`) after every
    /// `current` store. The hot path reads only this (`Acquire`, a plain
    /// load on x86) to see whether its cached generation is still live.
    /// Reading a stale number just means deciding on the generation that
    /// was live a moment earlier, as if the decision had started before
    /// the swap.
    number: AtomicU64,
}

impl fmt::Debug for LiveGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveGeneration")
            .field("host_id", &self.host_id)
            .field("number", &self.number())
            .finish_non_exhaustive()
    }
}

impl LiveGeneration {
    pub(crate) fn new(
        host_id: u64,
        config: PolicyHostConfig,
        first: Arc<Generation>,
    ) -> LiveGeneration {
        LiveGeneration {
            host_id,
            config,
            number: AtomicU64::new(first.number),
            current: ArcSwap::new(first),
        }
    }

    /// The live generation's number.
    #[inline]
    pub(crate) fn number(&self) -> u64 {
        // `Acquire` pairs with the `Release` store in `publish`; the
        // generation itself comes from the `ArcSwap`.
        self.number.load(Acquire)
    }

    /// The live generation, for a short look.
    pub(crate) fn load(&self) -> Guard<Arc<Generation>> {
        self.current.load()
    }

    /// The live generation, to keep.
    pub(crate) fn load_full(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Makes `generation` the live one. Callers serialise publications
    /// (the host holds its history lock), so `number` always ends up
    /// naming `current`.
    pub(crate) fn publish(&self, generation: Arc<Generation>) {
        let number = generation.number;
        self.current.store(generation);
        self.number.store(number, Release);
    }
}
