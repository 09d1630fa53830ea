//! Per-generation counters and the status snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::policy::PolicyFault;

/// Counters of one generation. All `Relaxed`: they are statistics, read as a
/// snapshot that may lag; no other memory is published through them.
#[derive(Debug, Default)]
pub(crate) struct GenerationCounters {
    /// Decisions made, faulty ones included. Threads add theirs in batches
    /// (see `cache::FLUSH_EVERY`), so this lags by up to a batch per thread.
    decisions: AtomicU64,
    /// One per kind of fault, indexed by [`PolicyFault::index`].
    faults: [AtomicU64; PolicyFault::COUNT],
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
        self.faults[fault.index()].fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self, generation: u64) -> GenerationStats {
        let mut stats = GenerationStats {
            generation,
            decisions: self.decisions.load(Relaxed),
            instantiations: self.instantiations.load(Relaxed),
            ..GenerationStats::default()
        };
        for fault in PolicyFault::ALL {
            *stats.count_mut(fault) = self.faults[fault.index()].load(Relaxed);
        }
        stats
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
    /// out-of-fuel and unavailable, the [malfunctions](PolicyFault::is_malfunction).
    /// (Out-of-set answers are only clamped.)
    pub fn faults(&self) -> u64 {
        PolicyFault::ALL
            .into_iter()
            .filter(|f| f.is_malfunction())
            .map(|f| self.of(f))
            .sum()
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
        let mut stats = *self;
        *stats.count_mut(fault)
    }

    /// The field that counts `fault`: the one place a fault is matched to
    /// its named field (the fields predate [`PolicyFault::index`], and the
    /// admin surface and tests read them by name).
    fn count_mut(&mut self, fault: PolicyFault) -> &mut u64 {
        match fault {
            PolicyFault::OutOfSet => &mut self.out_of_set,
            PolicyFault::Trap => &mut self.traps,
            PolicyFault::OutOfFuel => &mut self.out_of_fuel,
            PolicyFault::Timeout => &mut self.timeouts,
            PolicyFault::Unavailable => &mut self.unavailable,
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
    /// Modules loaded (compiled and checked) since the host started, the
    /// first one included, by outcome.
    pub loads: LoadCounts,
}

/// Loads by outcome (see [`PolicyStatus::loads`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadCounts {
    /// Compiled and passed the load checks.
    pub loaded: u64,
    /// Refused for what the module is (not wasm, does not compile, imports
    /// something, a wrong export, too much memory, another ABI), or
    /// because its file could not be read.
    pub refused: u64,
    /// Refused because the child process compiling it failed (could not
    /// start, crashed, ran past its timeout): not necessarily the module's
    /// fault, worth an operator's look.
    pub compiler_failed: u64,
    /// Wall time spent in all of these loads (compiling, in process or in
    /// the child, and the load checks; validation is part of a swap, not
    /// of a load). With the counts, the mean time of a load.
    pub time: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fault_lands_in_its_own_field() {
        let counters = GenerationCounters::default();
        for (times, fault) in (1..).zip(PolicyFault::ALL) {
            for _ in 0..times {
                counters.count(fault);
            }
        }
        let stats = counters.snapshot(3);
        assert_eq!(
            (
                stats.out_of_set,
                stats.traps,
                stats.out_of_fuel,
                stats.timeouts,
                stats.unavailable
            ),
            (1, 2, 3, 4, 5)
        );
        for (times, fault) in (1..).zip(PolicyFault::ALL) {
            assert_eq!(stats.of(fault), times, "{fault}");
        }
        assert_eq!(stats.faults(), 2 + 3 + 4 + 5);
        assert_eq!(stats.generation, 3);
    }
}
