//! One instantiated policy in its own `Store`: what a thread keeps to decide
//! with a single typed call.

use std::fmt;

use rewind_policy_sdk::{
    ResumeFacts, ABI_VERSION, EXPORT_ABI_VERSION, EXPORT_DECIDE, EXPORT_FACTS_PTR, FACTS_SIZE,
};
use wasmtime::{Engine, Instance, Memory, Store, StoreLimits, StoreLimitsBuilder, Trap, TypedFunc};

use super::config::PolicyHostConfig;
use super::error::LoadError;
use super::module::{PolicyModule, EXPORT_MEMORY};
use crate::policy::PolicyFault;

struct StoreState {
    limits: StoreLimits,
}

/// A policy instance with its store, memory and typed `rewind_decide`.
///
/// One per thread per generation; discarded after any fault, because a
/// trapped instance may have left its memory half-updated.
pub(crate) struct PolicyInstance {
    store: Store<StoreState>,
    memory: Memory,
    decide: TypedFunc<(), i32>,
    facts_offset: usize,
    fuel: u64,
    deadline_ticks: u64,
}

impl fmt::Debug for PolicyInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyInstance")
            .field("facts_offset", &self.facts_offset)
            .finish_non_exhaustive()
    }
}

/// A call that did not produce a code, with wasmtime's own description.
#[derive(Debug)]
pub(crate) struct CallFailure {
    pub(crate) fault: PolicyFault,
    pub(crate) detail: String,
}

impl PolicyInstance {
    /// Instantiates `policy` and runs the probes (ABI version, facts buffer).
    pub(crate) fn new(
        engine: &Engine,
        policy: &PolicyModule,
        config: &PolicyHostConfig,
    ) -> Result<PolicyInstance, LoadError> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(config.memory_limit_bytes)
            .table_elements(config.table_elements)
            .instances(1)
            .tables(1)
            .memories(1)
            // A refused `memory.grow` traps instead of returning -1: a guest
            // that asks for more than the cap is faulty, stop it now.
            .trap_on_grow_failure(true)
            .build();
        let mut store = Store::new(engine, StoreState { limits });
        store.limiter(|state| &mut state.limits);
        arm(&mut store, config.fuel_per_decision, config.deadline_ticks)
            .map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;
        let instance = Instance::new(&mut store, policy.wasm(), &[])
            .map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;

        let memory =
            instance
                .get_memory(&mut store, EXPORT_MEMORY)
                .ok_or(LoadError::MissingExport {
                    name: EXPORT_MEMORY,
                    expected: "a linear memory",
                })?;
        let abi_version = typed(&instance, &mut store, EXPORT_ABI_VERSION)?;
        let facts_ptr = typed(&instance, &mut store, EXPORT_FACTS_PTR)?;
        let decide = typed(&instance, &mut store, EXPORT_DECIDE)?;

        let probe = |store: &mut Store<StoreState>, func: TypedFunc<(), i32>, export| {
            arm(store, config.fuel_per_decision, config.deadline_ticks)
                .and_then(|()| func.call(&mut *store, ()))
                .map_err(|e| LoadError::Probe {
                    export,
                    message: format!("{e:#}"),
                })
        };
        let found = probe(&mut store, abi_version, EXPORT_ABI_VERSION)?;
        if u32::try_from(found) != Ok(ABI_VERSION) {
            return Err(LoadError::AbiVersion {
                found,
                expected: ABI_VERSION,
            });
        }
        let ptr = probe(&mut store, facts_ptr, EXPORT_FACTS_PTR)? as u32;
        let memory_bytes = memory.data_size(&store);
        let facts_error = |problem| LoadError::FactsPointer {
            ptr,
            problem,
            size: FACTS_SIZE,
            memory_bytes,
        };
        if !ptr.is_multiple_of(8) {
            return Err(facts_error("misaligned"));
        }
        let facts_offset = ptr as usize;
        if facts_offset
            .checked_add(FACTS_SIZE)
            .is_none_or(|end| end > memory_bytes)
        {
            return Err(facts_error("out of bounds"));
        }
        Ok(PolicyInstance {
            store,
            memory,
            decide,
            facts_offset,
            fuel: config.fuel_per_decision,
            deadline_ticks: config.deadline_ticks,
        })
    }

    /// Copies `facts` in and calls `rewind_decide` once, with a fresh fuel
    /// budget and deadline. Returns the raw code.
    #[inline]
    pub(crate) fn call(&mut self, facts: &ResumeFacts) -> Result<u32, PolicyFault> {
        self.call_detailed(facts, false).map_err(|f| f.fault)
    }

    /// [`call`](Self::call), keeping wasmtime's description of a failure
    /// when `detail` is set (validation reports it; the hot path does not
    /// format strings).
    #[inline]
    pub(crate) fn call_detailed(
        &mut self,
        facts: &ResumeFacts,
        detail: bool,
    ) -> Result<u32, CallFailure> {
        let fail = |fault, e: Option<&wasmtime::Error>| CallFailure {
            fault,
            detail: match e {
                Some(e) if detail => format!("{e:#}"),
                _ => String::new(),
            },
        };
        if let Err(e) = arm(&mut self.store, self.fuel, self.deadline_ticks) {
            return Err(fail(PolicyFault::Unavailable, Some(&e)));
        }
        let end = self.facts_offset + FACTS_SIZE;
        // Memory never shrinks, and the range was checked at instantiation;
        // `get_mut` keeps this free of `unsafe` anyway.
        match self
            .memory
            .data_mut(&mut self.store)
            .get_mut(self.facts_offset..end)
        {
            Some(buffer) => buffer.copy_from_slice(bytemuck::bytes_of(facts)),
            None => return Err(fail(PolicyFault::Unavailable, None)),
        }
        match self.decide.call(&mut self.store, ()) {
            Ok(code) => Ok(code as u32),
            Err(e) => Err(fail(classify(&e), Some(&e))),
        }
    }
}

/// Fresh fuel and a fresh deadline, relative to the engine's epoch now.
#[inline]
fn arm(store: &mut Store<StoreState>, fuel: u64, deadline_ticks: u64) -> wasmtime::Result<()> {
    store.set_fuel(fuel)?;
    store.set_epoch_deadline(deadline_ticks);
    Ok(())
}

fn typed(
    instance: &Instance,
    store: &mut Store<StoreState>,
    name: &'static str,
) -> Result<TypedFunc<(), i32>, LoadError> {
    instance
        .get_typed_func::<(), i32>(store, name)
        .map_err(|e| LoadError::WrongSignature {
            name,
            expected: "a function `() -> i32`",
            found: format!("{e:#}"),
        })
}

/// Which budget or fault stopped a call.
fn classify(error: &wasmtime::Error) -> PolicyFault {
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => PolicyFault::OutOfFuel,
        Some(Trap::Interrupt) => PolicyFault::Timeout,
        // Stack overflow, out-of-bounds access, `unreachable`, a refused
        // memory growth (`trap_on_grow_failure`): all traps.
        _ => PolicyFault::Trap,
    }
}
