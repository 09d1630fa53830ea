//! One instantiated policy in its own `Store`: what a thread keeps to decide
//! with a single typed call.
//!
//! An instance is built from a compiled [`wasmtime::Module`] and the host's
//! budgets, nothing else: it does not know which generation or host it
//! belongs to (the callers do).

use std::fmt;

use rewind_policy_sdk::{
    ResumeFacts, ABI_VERSION, EXPORT_ABI_VERSION, EXPORT_DECIDE, EXPORT_FACTS_PTR, EXPORT_MEMORY,
    FACTS_SIZE,
};
use wasmtime::{Instance, Memory, Module, Store, StoreLimits, StoreLimitsBuilder, Trap, TypedFunc};

use super::config::PolicyHostConfig;
use super::error::{LoadError, A_LINEAR_MEMORY, NO_ARGS_TO_I32};
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

/// A call that did not produce a code.
#[derive(Debug)]
pub(crate) struct CallFailure {
    /// Which budget or fault stopped it.
    pub(crate) fault: PolicyFault,
    /// wasmtime's error, when wasmtime raised one. The hot path drops it
    /// unread (it never formats); validation reports it.
    pub(crate) error: Option<wasmtime::Error>,
}

impl PolicyInstance {
    /// Instantiates `module` (compiled by the host's engine) under
    /// `config`'s budgets and runs the probes (ABI version, facts buffer).
    pub(crate) fn new(
        module: &Module,
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
        let mut store = Store::new(module.engine(), StoreState { limits });
        store.limiter(|state| &mut state.limits);
        arm(&mut store, config.fuel_per_decision, config.deadline_ticks)
            .map_err(LoadError::Instantiate)?;
        let instance = Instance::new(&mut store, module, &[]).map_err(LoadError::Instantiate)?;

        let memory =
            instance
                .get_memory(&mut store, EXPORT_MEMORY)
                .ok_or(LoadError::MissingExport {
                    name: EXPORT_MEMORY,
                    expected: A_LINEAR_MEMORY,
                })?;
        let abi_version = typed(&instance, &mut store, EXPORT_ABI_VERSION)?;
        let facts_ptr = typed(&instance, &mut store, EXPORT_FACTS_PTR)?;
        let decide = typed(&instance, &mut store, EXPORT_DECIDE)?;

        let probe = |store: &mut Store<StoreState>, func: TypedFunc<(), i32>, export| {
            arm(store, config.fuel_per_decision, config.deadline_ticks)
                .and_then(|()| func.call(&mut *store, ()))
                .map_err(|source| LoadError::Probe { export, source })
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
    /// budget and deadline. Returns the raw code, unchecked: the caller
    /// holds it against the facts' safe set.
    #[inline]
    pub(crate) fn call(&mut self, facts: &ResumeFacts) -> Result<u32, CallFailure> {
        if let Err(error) = arm(&mut self.store, self.fuel, self.deadline_ticks) {
            return Err(CallFailure {
                fault: PolicyFault::Unavailable,
                error: Some(error),
            });
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
            None => {
                return Err(CallFailure {
                    fault: PolicyFault::Unavailable,
                    error: None,
                })
            }
        }
        match self.decide.call(&mut self.store, ()) {
            Ok(code) => Ok(code as u32),
            Err(error) => Err(CallFailure {
                fault: classify(&error),
                error: Some(error),
            }),
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

/// The export `name` as a typed `() -> i32` function. The module's exports
/// were checked when it was loaded, so this fails only for a module that
/// got past those checks by mistake; the error then says what the export is.
fn typed(
    instance: &Instance,
    store: &mut Store<StoreState>,
    name: &'static str,
) -> Result<TypedFunc<(), i32>, LoadError> {
    let export = instance
        .get_export(&mut *store, name)
        .ok_or(LoadError::MissingExport {
            name,
            expected: NO_ARGS_TO_I32,
        })?;
    export
        .clone()
        .into_func()
        .and_then(|func| func.typed::<(), i32>(&*store).ok())
        .ok_or_else(|| LoadError::wrong_signature(name, NO_ARGS_TO_I32, &export.ty(&*store)))
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
