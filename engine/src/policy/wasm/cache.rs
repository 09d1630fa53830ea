//! The per-thread cache of instances: how a decision is one typed call with
//! no instantiation and no lock.
//!
//! Each thread keeps, per host, one slot: the generation it last used (an
//! `Arc`, so a swap cannot free a module under a running call) and an
//! instance of it. A decision reads the live generation's number (one
//! atomic load), and only when it differs from the slot's does the slot
//! load the live generation from the `ArcSwap` (wait-free) and switch to it,
//! instantiating the new module once on this thread. After any fault the
//! instance is dropped and the next decision re-instantiates.
//!
//! The cache sees only the [`LiveGeneration`]; what the host does about a
//! fault (the automatic-rollback rule) it decides itself, from the answer.

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use rewind_policy_sdk::ResumeFacts;

use super::generation::{Generation, LiveGeneration};
use super::instance::PolicyInstance;
use crate::policy::{PolicyAnswer, PolicyFault};

/// Decisions a thread counts locally before adding them to the
/// generation's shared counter (which would otherwise bounce between cores
/// on every decision).
const FLUSH_EVERY: u64 = 256;
/// Slots a thread keeps (one per host it decides with); past this, the
/// least recently added is dropped.
const MAX_SLOTS: usize = 8;

struct Slot {
    host_id: u64,
    host: Weak<LiveGeneration>,
    generation: Arc<Generation>,
    instance: Option<PolicyInstance>,
    pending_decisions: u64,
}

thread_local! {
    static SLOTS: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

/// Decides with `live`'s live generation on this thread's instance. A
/// fault is counted on the generation and reported in the answer.
#[inline]
pub(crate) fn decide(live: &Arc<LiveGeneration>, facts: &ResumeFacts) -> PolicyAnswer {
    let cached = SLOTS.try_with(|slots| {
        // Not re-entrant (a policy cannot call back), but a `Policy` might be
        // asked from a destructor during another decision: go uncached then.
        let mut slots = slots.try_borrow_mut().ok()?;
        Some(decide_cached(&mut slots, live, facts))
    });
    match cached {
        Ok(Some(answer)) => answer,
        // Thread-local storage is being torn down, or busy: a one-off slot.
        _ => Slot::new(live, live.load_full()).decide(live, facts),
    }
}

#[inline]
fn decide_cached(
    slots: &mut Vec<Slot>,
    live: &Arc<LiveGeneration>,
    facts: &ResumeFacts,
) -> PolicyAnswer {
    let index = match slots.iter().position(|s| s.host_id == live.host_id) {
        Some(index) => index,
        None => {
            slots.retain(|s| s.host.strong_count() > 0);
            if slots.len() >= MAX_SLOTS {
                slots.remove(0);
            }
            slots.push(Slot::new(live, live.load_full()));
            slots.len() - 1
        }
    };
    let slot = &mut slots[index];
    if live.number() != slot.generation.number {
        slot.switch_to(live.load_full());
    }
    slot.decide(live, facts)
}

impl Slot {
    fn new(live: &Arc<LiveGeneration>, generation: Arc<Generation>) -> Slot {
        Slot {
            host_id: live.host_id,
            host: Arc::downgrade(live),
            generation,
            instance: None,
            pending_decisions: 0,
        }
    }

    fn switch_to(&mut self, generation: Arc<Generation>) {
        self.flush();
        self.instance = None;
        self.generation = generation;
    }

    fn flush(&mut self) {
        self.generation
            .counters
            .add_decisions(self.pending_decisions);
        self.pending_decisions = 0;
    }

    #[inline]
    fn decide(&mut self, live: &LiveGeneration, facts: &ResumeFacts) -> PolicyAnswer {
        self.pending_decisions += 1;
        if self.pending_decisions >= FLUSH_EVERY {
            self.flush();
        }
        let generation = self.generation.number;
        let instance = match &mut self.instance {
            Some(instance) => instance,
            None => match PolicyInstance::new(self.generation.module.wasm(), &live.config) {
                Ok(instance) => {
                    self.generation.counters.count_instantiation();
                    self.instance.insert(instance)
                }
                Err(_) => return self.fault(facts, PolicyFault::Unavailable),
            },
        };
        match instance.call(facts) {
            Ok(code) if facts.allowed.contains_code(code) => PolicyAnswer {
                code,
                generation,
                fault: None,
            },
            Ok(_) => {
                // The instance is fine; only the answer is not allowed.
                self.generation.counters.count(PolicyFault::OutOfSet);
                fallback(facts, generation, PolicyFault::OutOfSet)
            }
            Err(failure) => {
                // A trapped instance may be mid-update: never call it again.
                self.instance = None;
                self.fault(facts, failure.fault)
            }
        }
    }

    /// Counts `fault` with the decisions so far flushed first, so that the
    /// host's fault-rate rule, reading the counters next, sees both.
    #[cold]
    fn fault(&mut self, facts: &ResumeFacts, fault: PolicyFault) -> PolicyAnswer {
        self.flush();
        self.generation.counters.count(fault);
        fallback(facts, self.generation.number, fault)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.flush();
    }
}

fn fallback(facts: &ResumeFacts, generation: u64, fault: PolicyFault) -> PolicyAnswer {
    PolicyAnswer {
        code: facts.default().code(),
        generation,
        fault: Some(fault),
    }
}
