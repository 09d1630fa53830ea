//! The plugins of this workspace, compiled to wasm by the engine's build
//! script and embedded.

/// The default policy: the decision table of `docs/decision-table.md`.
pub const DEFAULT: &[u8] = include_bytes!(env!("REWIND_PLUGIN_DEFAULT"));
/// The strict policy: any doubt is a rejection; no resume past
/// `max_resume_age_ms` or with an unknown cursor age.
pub const STRICT: &[u8] = include_bytes!(env!("REWIND_PLUGIN_STRICT"));
/// The operator example: 400 instead of 409.
pub const STATUS_400: &[u8] = include_bytes!(env!("REWIND_PLUGIN_STATUS_400"));

/// Hostile and benchmark fixtures, for tests and benchmarks of the host.
/// Never load these in production.
pub mod fixtures {
    /// `rewind_decide` never returns.
    pub const LOOP: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_LOOP"));
    /// `rewind_decide` executes `unreachable`.
    pub const TRAP: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_TRAP"));
    /// `rewind_decide` grows memory in a loop.
    pub const MEMORY_BOMB: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_MEMORY_BOMB"));
    /// `rewind_decide` recurses until the stack overflows.
    pub const DEEP_RECURSION: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_DEEP_RECURSION"));
    /// Declares ABI version 999.
    pub const WRONG_ABI: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_WRONG_ABI"));
    /// Imports `env::rewind_host_log`.
    pub const IMPORTS: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_IMPORTS"));
    /// Answers verdict code 99.
    pub const OUT_OF_RANGE: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_OUT_OF_RANGE"));
    /// Answers `Resume` to everything.
    pub const RESUME_ALL: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_RESUME_ALL"));
    /// Returns a constant without reading the facts: the bare call floor.
    pub const EMPTY: &[u8] = include_bytes!(env!("REWIND_PLUGIN_FIXTURE_EMPTY"));
}
