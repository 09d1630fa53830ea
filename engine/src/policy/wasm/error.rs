//! What can go wrong when loading, swapping and rolling back policies.
//!
//! Each message is complete on its own, because the server and the CLI
//! print an error's `Display` and nothing else: it says what is wrong and,
//! where there is one, how to fix it, and it ends with the description of
//! the error underneath (wasmtime's, the operating system's). That error is
//! also kept as the [`source`](std::error::Error::source), not flattened to a
//! string, so a caller can walk the chain or downcast it (to
//! [`wasmtime::Trap`], say) instead of parsing text.

use std::io;
use std::path::PathBuf;

use wasmtime::ExternType;

use super::report::ValidationReport;

/// How a [`LoadError`] describes each function export of the ABI.
pub(crate) const NO_ARGS_TO_I32: &str = "a function `() -> i32`";
/// How a [`LoadError`] describes the memory export.
pub(crate) const A_LINEAR_MEMORY: &str = "a linear memory";

/// Why a module was refused at load. Each variant says what is wrong with
/// the module, so an operator can fix it without reading the host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The policy file could not be opened or mapped.
    #[error("cannot read policy file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The bytes are not a valid WebAssembly module (or do not compile).
    #[error("not a valid WebAssembly module: {0:#}")]
    Compile(#[source] wasmtime::Error),
    /// The child process that compiles modules
    /// ([`PolicyCompiler::ChildProcess`](super::PolicyCompiler::ChildProcess))
    /// failed: it could not be started, crashed, ran past its timeout, or
    /// handed back code this host cannot load. Nothing was loaded.
    #[error("the policy compiler {} {problem}", program.display())]
    Compiler {
        /// The program that was run.
        program: PathBuf,
        /// What went wrong, ending with the error underneath (if any).
        problem: String,
        /// The operating system's or wasmtime's error, if there was one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The module imports something; policies must import nothing.
    #[error("the module imports `{module}::{name}`; a policy must import nothing")]
    Import {
        /// Import module name.
        module: String,
        /// Import field name.
        name: String,
    },
    /// A required export is absent.
    #[error("the module does not export `{name}` (expected {expected})")]
    MissingExport {
        /// The export's name.
        name: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// A required export has the wrong kind or type.
    #[error("the export `{name}` is {found}, expected {expected}")]
    WrongSignature {
        /// The export's name.
        name: &'static str,
        /// What it should be.
        expected: &'static str,
        /// What it is.
        found: String,
    },
    /// The module's linear memory is shared or 64-bit.
    #[error("the exported memory is {found}; a policy needs a plain 32-bit, unshared memory")]
    UnsupportedMemory {
        /// What the memory is.
        found: String,
    },
    /// The module's initial memory is larger than the host allows.
    #[error(
        "the module starts with {initial_bytes} bytes of memory, over this host's cap of \
         {limit_bytes} (link it with a smaller stack, e.g. -C link-arg=-zstack-size=65536)"
    )]
    MemoryTooLarge {
        /// Initial memory of the module.
        initial_bytes: u64,
        /// The host's cap.
        limit_bytes: usize,
    },
    /// `rewind_abi_version` returned something other than the host's version.
    #[error("the module speaks policy ABI version {found}; this host speaks version {expected}")]
    AbiVersion {
        /// What the module returned.
        found: i32,
        /// [`rewind_policy_sdk::ABI_VERSION`].
        expected: u32,
    },
    /// `rewind_facts_ptr` names a buffer the facts do not fit in.
    #[error(
        "the facts buffer at {ptr:#x} is {problem} (needs {size} bytes, 8-aligned, inside a \
         memory of {memory_bytes} bytes)"
    )]
    FactsPointer {
        /// The address the module returned.
        ptr: u32,
        /// `"misaligned"` or `"out of bounds"`.
        problem: &'static str,
        /// [`rewind_policy_sdk::FACTS_SIZE`].
        size: usize,
        /// Size of the module's memory.
        memory_bytes: usize,
    },
    /// Instantiation failed (its start function trapped, or a limit was hit).
    #[error("instantiating the module failed: {0:#}")]
    Instantiate(#[source] wasmtime::Error),
    /// Calling a probe export during load trapped or ran out of budget.
    #[error("calling `{export}` while loading failed: {source:#}")]
    Probe {
        /// The export.
        export: &'static str,
        /// What happened: a trap, usually (see [`wasmtime::Trap`]).
        #[source]
        source: wasmtime::Error,
    },
}

impl LoadError {
    /// The export `name` is `found` where the ABI wants `expected`.
    pub(crate) fn wrong_signature(
        name: &'static str,
        expected: &'static str,
        found: &ExternType,
    ) -> LoadError {
        let found = match found {
            ExternType::Func(f) => format!("a function `{f}`"),
            ExternType::Memory(_) => "a memory".to_owned(),
            ExternType::Table(_) => "a table".to_owned(),
            ExternType::Global(_) => "a global".to_owned(),
            _ => "something else".to_owned(),
        };
        LoadError::WrongSignature {
            name,
            expected,
            found,
        }
    }
}

/// Why a swap was refused. The live policy is unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SwapError {
    /// The candidate misbehaved on the validation facts.
    #[error("{0}")]
    Validation(Box<ValidationReport>),
    /// The module was loaded by another [`PolicyHost`](super::PolicyHost);
    /// compiled code belongs to the host (engine) that compiled it.
    #[error("policy `{0}` was loaded by another policy host; load it with this one")]
    ForeignModule(String),
}

/// Why a rollback did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RollbackError {
    /// The live generation is the oldest one this host still keeps.
    #[error("no earlier good policy generation to roll back to (live: generation {current})")]
    NothingToRollBackTo {
        /// The live generation.
        current: u64,
    },
}

/// Why a [`PolicyHost`](super::PolicyHost) could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// wasmtime refused the configuration, or the compilation cache could
    /// not be set up.
    #[error("cannot configure the wasm engine: {0:#}")]
    Engine(#[source] wasmtime::Error),
    /// The epoch ticker thread could not be started.
    #[error("cannot start the epoch ticker thread: {0}")]
    Ticker(#[source] io::Error),
    /// The initial policy did not load under this configuration.
    #[error("the initial policy did not load: {0}")]
    Load(#[from] LoadError),
    /// The initial policy failed validation under this configuration.
    #[error("the initial policy failed validation: {0}")]
    Validation(Box<ValidationReport>),
}
