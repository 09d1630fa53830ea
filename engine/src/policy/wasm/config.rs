//! Budgets and switches of a [`PolicyHost`](super::PolicyHost).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// How a [`PolicyHost`](super::PolicyHost) sandboxes and checks its policies.
///
/// Every budget exists because a policy is untrusted code run on the resume
/// path of every reconnect:
///
/// - `fuel_per_decision` bounds the *work* of one decision, deterministically
///   (the same facts always cost the same fuel), so a loop is stopped after
///   the same number of instructions on every machine.
/// - `epoch_tick` × `deadline_ticks` bounds its *wall-clock time*: a backstop
///   for work that fuel does not meter well (memory growth, host slowness).
/// - `memory_limit_bytes` caps each instance's linear memory (a growth bomb
///   gets a trap, not the server's RAM).
/// - `max_wasm_stack_bytes` caps native stack use, so runaway recursion
///   traps instead of overflowing the host thread's stack.
/// - `table_elements` caps the indirect-call table.
///
/// The validation and rollback settings decide when a module may go live and
/// when it is taken back out.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PolicyHostConfig {
    /// Fuel (≈ wasm instructions) one decision may use. Default 100 000;
    /// the default plugin uses well under 100.
    pub fuel_per_decision: u64,
    /// Period of the epoch ticker thread. Default 5 ms.
    pub epoch_tick: Duration,
    /// Ticks a decision may run before it is interrupted (so the deadline
    /// is between `deadline_ticks - 1` and `deadline_ticks` ticks). Default
    /// 20, about 100 ms. Generous on purpose: wall time includes the time
    /// the OS keeps the deciding thread descheduled, and on a loaded
    /// machine that alone can pass 10 ms (seen in this workspace's tests),
    /// which would fail an innocent decision. Fuel is the tight budget.
    pub deadline_ticks: u64,
    /// Cap on one instance's linear memory. Default 2 MiB: a Rust guest
    /// built with the toolchain's default 1 MiB stack fits; the plugins in
    /// this workspace are linked with a 64 KiB stack and use 128 KiB.
    pub memory_limit_bytes: usize,
    /// Cap on the native stack wasm code may use. Default 128 KiB.
    pub max_wasm_stack_bytes: usize,
    /// Cap on table elements per instance. Default 1 024.
    pub table_elements: usize,
    /// Randomised facts a candidate runs during validation, after every row
    /// of the decision table. Default 4 096.
    pub validation_random_cases: usize,
    /// Seed of those randomised facts (validation is reproducible).
    pub validation_seed: u64,
    /// Automatic rollback of a live generation whose fault rate gets too
    /// high; `None` turns it off.
    pub auto_rollback: Option<AutoRollback>,
    /// A directory for wasmtime's cache of compiled modules (keyed by the
    /// module's bytes and this host's compiler settings, so it only ever
    /// hands back code that a host with the same settings compiled). `None`
    /// (the default) compiles every load. Used by whichever process
    /// compiles (see [`compiler`](Self::compiler)).
    pub compilation_cache_dir: Option<PathBuf>,
    /// Where a module's wasm is compiled to machine code: in this process
    /// (the default), or in a child process that hands back the compiled
    /// code.
    pub compiler: PolicyCompiler,
}

/// Where a [`PolicyHost`](super::PolicyHost) compiles the modules it loads.
///
/// Compiling is the only time the host runs wasmtime's compiler
/// (Cranelift, its register allocator, the wasm parser): several MiB of
/// machine code that a process which only *runs* policies never needs
/// resident. [`ChildProcess`](Self::ChildProcess) keeps that code out of
/// this process: the child compiles and exits, and this process maps the
/// compiled code it hands back. It also confines what a hostile module can
/// do to the compiler to the child: a crash ends only the child, a compile
/// that never ends is killed after [`ChildCompiler::timeout`], and one
/// that takes more memory than [`ChildCompiler::memory_limit`] fails.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PolicyCompiler {
    /// Compile in this process (what an embedder gets by default).
    #[default]
    InProcess,
    /// Compile in a child process.
    ChildProcess(ChildCompiler),
}

/// The child process a [`PolicyCompiler::ChildProcess`] runs for each
/// module: a program whose `main` calls
/// [`compile_child_main`](super::compile_child_main).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCompiler {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) timeout: Duration,
    pub(crate) memory_limit: Option<u64>,
}

impl ChildCompiler {
    /// How long a compile may take by default before the child is killed.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// The child's address space by default: 4 GiB. Compiling the default
    /// policy fits in 28 MiB of address space, the whole program included.
    pub const DEFAULT_MEMORY_LIMIT: u64 = 4 << 30;

    /// Runs `program` with `args` for each module to compile.
    ///
    /// # Safety
    ///
    /// The host loads what the child writes as compiled machine code and
    /// runs it: `program` run with `args` must answer exactly as
    /// [`compile_child_main`](super::compile_child_main) does, built with
    /// this version of this crate (the same wasmtime). wasmtime checks the
    /// version and compiler settings recorded in the code it is handed, but
    /// cannot check that the code is what compiling the module produces.
    /// The program's own executable (`/proc/self/exe`) with an argument
    /// that makes its `main` call `compile_child_main` meets this.
    pub unsafe fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> ChildCompiler {
        ChildCompiler {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            timeout: Self::DEFAULT_TIMEOUT,
            memory_limit: Some(Self::DEFAULT_MEMORY_LIMIT),
        }
    }

    /// Sets how long one compile may take before the child is killed and
    /// the load refused ([`DEFAULT_TIMEOUT`](Self::DEFAULT_TIMEOUT)). A
    /// duration too long to add to the clock (`Duration::MAX`) waits for
    /// the child however long it takes.
    pub fn timeout(mut self, timeout: Duration) -> ChildCompiler {
        self.timeout = timeout;
        self
    }

    /// Caps the child's address space (`RLIMIT_AS`, which the child sets on
    /// itself before it compiles; Linux only), so that a module that makes
    /// the compiler allocate without bound fails the load instead of
    /// pushing the machine into its out-of-memory killer; `None` for no
    /// cap ([`DEFAULT_MEMORY_LIMIT`](Self::DEFAULT_MEMORY_LIMIT)).
    pub fn memory_limit(mut self, bytes: Option<u64>) -> ChildCompiler {
        self.memory_limit = bytes;
        self
    }

    /// The program run for each compile.
    pub fn program(&self) -> &std::path::Path {
        &self.program
    }
}

/// When a live generation is rolled back automatically.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoRollback {
    /// Fault rate (traps + timeouts + out-of-fuel + unavailable, over
    /// decisions) above which the generation is rolled back.
    pub max_fault_rate: f64,
    /// Decisions a generation must have made before its rate is judged,
    /// so one early fault does not roll it back.
    pub min_decisions: u64,
}

impl Default for AutoRollback {
    fn default() -> Self {
        AutoRollback {
            max_fault_rate: 0.01,
            min_decisions: 1_000,
        }
    }
}

impl Default for PolicyHostConfig {
    fn default() -> Self {
        PolicyHostConfig {
            fuel_per_decision: 100_000,
            epoch_tick: Duration::from_millis(5),
            deadline_ticks: 20,
            memory_limit_bytes: 2 << 20,
            max_wasm_stack_bytes: 128 << 10,
            table_elements: 1_024,
            validation_random_cases: 4_096,
            validation_seed: 0x5EED_2E51_0DE0_0001,
            auto_rollback: Some(AutoRollback::default()),
            compilation_cache_dir: None,
            compiler: PolicyCompiler::InProcess,
        }
    }
}

impl PolicyHostConfig {
    /// Sets [`fuel_per_decision`](Self::fuel_per_decision).
    pub fn fuel_per_decision(mut self, fuel: u64) -> Self {
        self.fuel_per_decision = fuel;
        self
    }

    /// Sets the wall-clock deadline: `ticks` periods of `tick`.
    pub fn deadline(mut self, tick: Duration, ticks: u64) -> Self {
        self.epoch_tick = tick;
        self.deadline_ticks = ticks;
        self
    }

    /// Sets [`memory_limit_bytes`](Self::memory_limit_bytes).
    pub fn memory_limit_bytes(mut self, bytes: usize) -> Self {
        self.memory_limit_bytes = bytes;
        self
    }

    /// Sets [`max_wasm_stack_bytes`](Self::max_wasm_stack_bytes).
    pub fn max_wasm_stack_bytes(mut self, bytes: usize) -> Self {
        self.max_wasm_stack_bytes = bytes;
        self
    }

    /// Sets the number and seed of randomised validation facts.
    pub fn validation(mut self, random_cases: usize, seed: u64) -> Self {
        self.validation_random_cases = random_cases;
        self.validation_seed = seed;
        self
    }

    /// Sets (or, with `None`, turns off) automatic rollback.
    pub fn auto_rollback(mut self, rule: Option<AutoRollback>) -> Self {
        self.auto_rollback = rule;
        self
    }

    /// Sets [`compilation_cache_dir`](Self::compilation_cache_dir).
    pub fn compilation_cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.compilation_cache_dir = dir;
        self
    }

    /// Sets [`compiler`](Self::compiler).
    pub fn compiler(mut self, compiler: PolicyCompiler) -> Self {
        self.compiler = compiler;
        self
    }
}
