//! Compiling a policy and refusing it early: everything that can be checked
//! before a module goes near the hot path is checked here.

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use rewind_policy_sdk::{EXPORT_ABI_VERSION, EXPORT_DECIDE, EXPORT_FACTS_PTR, EXPORT_MEMORY};
use wasmtime::{Engine, ExternType, Module, ValType};

use super::compiler::compile;
use super::config::PolicyHostConfig;
use super::error::{LoadError, A_LINEAR_MEMORY, NO_ARGS_TO_I32};
use super::instance::PolicyInstance;

const WASM_PAGE: u64 = 64 * 1024;

/// A compiled policy module that passed the load checks: no imports, the
/// three exports with the right types, a memory within the host's cap, the
/// host's ABI version, and a facts buffer inside memory and 8-aligned.
///
/// Cheap to clone (the compiled code is shared). Only usable with the
/// [`PolicyHost`](super::PolicyHost) that loaded it.
#[derive(Clone)]
pub struct PolicyModule {
    name: Arc<str>,
    module: Module,
}

impl fmt::Debug for PolicyModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyModule")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PolicyModule {
    /// The name it was loaded under (a file's stem, or what the caller chose).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn wasm(&self) -> &Module {
        &self.module
    }

    /// Compiles (where `config` says) and checks `bytes`.
    pub(crate) fn load(
        engine: &Engine,
        config: &PolicyHostConfig,
        name: &str,
        bytes: &[u8],
    ) -> Result<PolicyModule, LoadError> {
        let module = compile(engine, config, bytes)?;
        check_imports(&module)?;
        check_exports(&module, config)?;
        // Instantiating once runs the probes: ABI version, facts pointer.
        PolicyInstance::new(&module, config)?;
        Ok(PolicyModule {
            name: name.into(),
            module,
        })
    }

    /// Maps the file and compiles it (see [`load`](Self::load)).
    pub(crate) fn load_file(
        engine: &Engine,
        config: &PolicyHostConfig,
        path: &Path,
    ) -> Result<PolicyModule, LoadError> {
        let io_error = |source| LoadError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io_error)?;
        // SAFETY: the map is read-only and lives only while the module
        // compiles; wasmtime validates every byte it reads and copies what it
        // keeps. The one hazard of a file map is another process truncating
        // the file meanwhile (a SIGBUS); policy files are written once and
        // replaced by rename, which leaves this mapping intact.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error)?;
        let name = path
            .file_stem()
            .map_or_else(|| "policy".into(), |s| s.to_string_lossy());
        Self::load(engine, config, &name, &map)
    }
}

fn check_imports(module: &Module) -> Result<(), LoadError> {
    match module.imports().next() {
        Some(import) => Err(LoadError::Import {
            module: import.module().to_owned(),
            name: import.name().to_owned(),
        }),
        None => Ok(()),
    }
}

fn check_exports(module: &Module, config: &PolicyHostConfig) -> Result<(), LoadError> {
    match module.get_export(EXPORT_MEMORY) {
        None => {
            return Err(LoadError::MissingExport {
                name: EXPORT_MEMORY,
                expected: A_LINEAR_MEMORY,
            });
        }
        Some(ExternType::Memory(memory)) => {
            if memory.is_shared() || memory.is_64() {
                return Err(LoadError::UnsupportedMemory {
                    found: format!("{memory:?}"),
                });
            }
            let initial_bytes = memory.minimum().saturating_mul(WASM_PAGE);
            if initial_bytes > config.memory_limit_bytes as u64 {
                return Err(LoadError::MemoryTooLarge {
                    initial_bytes,
                    limit_bytes: config.memory_limit_bytes,
                });
            }
        }
        Some(other) => {
            return Err(LoadError::wrong_signature(
                EXPORT_MEMORY,
                A_LINEAR_MEMORY,
                &other,
            ));
        }
    }
    for name in [EXPORT_ABI_VERSION, EXPORT_FACTS_PTR, EXPORT_DECIDE] {
        match module.get_export(name) {
            None => {
                return Err(LoadError::MissingExport {
                    name,
                    expected: NO_ARGS_TO_I32,
                })
            }
            Some(ExternType::Func(func))
                if func.params().len() == 0
                    && func.results().len() == 1
                    && func.results().all(|r| matches!(r, ValType::I32)) => {}
            Some(other) => {
                return Err(LoadError::wrong_signature(name, NO_ARGS_TO_I32, &other));
            }
        }
    }
    Ok(())
}
