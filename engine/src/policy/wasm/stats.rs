//! Per-generation counters and the status snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::policy::PolicyFault;

/// Counters of one generation. All `Relaxed`: they are statistics, read as a
/// snapshot that may lag; no other memory is published through them.
#[derive(Debug, Default)]
pub(crate) struct GenerationCounters {
    /// Decisions made, faulty ones included. Threads add theirs in batches
    /// (see `cache::FLUSH_EVERY`), so this lags by up to a batch per thread.
    decisions: AtomicU64,
    out_of_set: AtomicU64,
    traps: AtomicU64,
    out_of_fuel: AtomicU64,
    timeouts: AtomicU64,
    unavailable: AtomicU64,
    instantiations: AtomicU64,
}

impl GenerationCounters {
    pub(crate) fn count_instantiation(&self) {
        self.instantiations.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_decisions(&self, n: u64) {
        if n != 0 {
            self.decisions.fetch_add(n, Relaxed);
        }
    }

    pub(crate) fn count(&self, fault: PolicyFault) {
        let counter = match fault {
            PolicyFault::OutOfSet => &self.out_of_set,
            PolicyFault::Trap => &self.traps,
            PolicyFault::OutOfFuel => &self.out_of_fuel,
            PolicyFault::Timeout => &self.timeouts,
            _ => &self.unavailable,
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self, generation: u64) -> GenerationStats {
        GenerationStats {
            generation,
            decisions: self.decisions.load(Relaxed),
            out_of_set: self.out_of_set.load(Relaxed),
            traps: self.traps.load(Relaxed),
            out_of_fuel: self.out_of_fuel.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            unavailable: self.unavailable.load(Relaxed),
            instantiations: self.instantiations.load(Relaxed),
        }
    }
}

/// What one policy generation has done so far.
///
/// `decisions` is added in per-thread batches and may lag by up to a few
/// hundred per deciding thread; the fault counters are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GenerationStats {
    /// The generation number.
    pub generation: u64,
    /// Decisions made (faulty ones included).
    pub decisions: u64,
    /// Answers outside the facts' safe set (replaced by the default).
    pub out_of_set: u64,
    /// Traps: `unreachable`, stack overflow, memory faults, refused growth.
    pub traps: u64,
    /// Calls stopped by the fuel budget.
    pub out_of_fuel: u64,
    /// Calls stopped by the epoch deadline.
    pub timeouts: u64,
    /// Calls that could not run (instantiation failed).
    pub unavailable: u64,
    /// Instances created: one per deciding thread, plus one after every
    /// fault (a faulted instance is never called again).
    pub instantiations: u64,
}

impl GenerationStats {
    /// Faults that make a generation a rollback candidate: traps, timeouts,
    /// out-of-fuel and unavailable. (Out-of-set answers are only clamped.)
    pub fn faults(&self) -> u64 {
        self.traps + self.out_of_fuel + self.timeouts + self.unavailable
    }

    /// `faults() / decisions`, 0 before the first decision.
    pub fn fault_rate(&self) -> f64 {
        if self.decisions == 0 {
            0.0
        } else {
            self.faults() as f64 / self.decisions as f64
        }
    }

    /// The count of one kind of fault.
    pub fn of(&self, fault: PolicyFault) -> u64 {
        match fault {
            PolicyFault::OutOfSet => self.out_of_set,
            PolicyFault::Trap => self.traps,
            PolicyFault::OutOfFuel => self.out_of_fuel,
            PolicyFault::Timeout => self.timeouts,
            _ => self.unavailable,
        }
    }
}

/// Where a generation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GenerationState {
    /// Deciding now.
    Live,
    /// Replaced by a swap; a rollback can bring it back.
    Standby,
    /// Taken out by a rollback (on command or automatic).
    RolledBack,
    /// Replaced, and too old to be a rollback target any more.
    Retired,
}

/// One generation in a [`PolicyStatus`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationStatus {
    /// The policy's name.
    pub name: String,
    /// Where it stands.
    pub state: GenerationState,
    /// Its counters.
    pub stats: GenerationStats,
}

/// A snapshot of a [`PolicyHost`](super::PolicyHost).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyStatus {
    /// The live generation.
    pub live: GenerationStatus,
    /// Recent generations, newest first, the live one included.
    pub generations: Vec<GenerationStatus>,
    /// Swaps published since the host started.
    pub swaps: u64,
    /// Rollbacks on command.
    pub manual_rollbacks: u64,
    /// Rollbacks triggered by the fault-rate threshold.
    pub automatic_rollbacks: u64,
}
