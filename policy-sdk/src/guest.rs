//! The guest side: what a policy plugin needs to export its decision.
//!
//! A policy crate writes one ordinary Rust function from `&ResumeFacts` to a
//! verdict and wraps it in [`rewind_policy!`](crate::rewind_policy). On
//! `wasm32` the macro adds the three exports of the ABI (see the crate
//! docs); on every other target it adds nothing, so the same function is
//! unit-tested natively by calling it directly (or through the generated
//! `rewind_decide_native`, which converts the answer to its wire code exactly
//! as the wasm export does).
//!
//! # A complete policy crate
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "my-policy"
//! version = "0.1.0"
//! edition = "2021"
//!
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//!
//! [dependencies]
//! rewind-policy-sdk = "0.1"
//!
//! [profile.release]
//! opt-level = "z"
//! lto = true
//! panic = "abort"
//! ```
//!
//! `src/lib.rs`:
//!
//! ```
//! #![cfg_attr(target_arch = "wasm32", no_std)]
//!
//! use rewind_policy_sdk::{rewind_policy, CursorFact, ResumeFacts, SessionFact, Verdict};
//!
//! rewind_policy! {
//!     /// The default table, except that a cursor from an older epoch is
//!     /// refused instead of answered with a `reset` stream.
//!     pub fn decide(facts: &ResumeFacts) -> Verdict {
//!         match (facts.session_fact(), facts.cursor_fact()) {
//!             (Some(SessionFact::Live), Some(CursorFact::OlderEpoch)) => Verdict::Conflict,
//!             // Everything else: what the host would answer anyway.
//!             _ => facts.default(),
//!         }
//!     }
//! }
//!
//! // Natively the function is plain Rust: test it like any other.
//! let facts = ResumeFacts::new(SessionFact::Live, CursorFact::OlderEpoch).with_safe_set();
//! assert_eq!(decide(&facts), Verdict::Conflict);
//! assert_eq!(rewind_decide_native(&facts), Verdict::Conflict.code());
//! ```
//!
//! Build it with
//! `cargo build --release --target wasm32-unknown-unknown` and load
//! `target/wasm32-unknown-unknown/release/my_policy.wasm` into the host.
//!
//! # What the host guarantees, and what a policy must not assume
//!
//! The host calls `rewind_decide` once per reconnect, with the facts already
//! copied into the buffer `rewind_facts_ptr` names. Each call has a fuel
//! budget and a wall-clock deadline; a guest that traps or runs out is
//! discarded and re-instantiated, so a policy must keep no state it cannot
//! lose. Whatever the policy answers, the host only accepts verdicts in
//! `facts.allowed`; anything else becomes `facts.default()`.

use crate::{ResumeFacts, Verdict};

/// What a policy function may return: a [`Verdict`], or a raw wire code.
///
/// Raw codes exist so test fixtures can return codes no verdict has; a real
/// policy returns a [`Verdict`].
pub trait IntoVerdictCode {
    /// The wire code sent back to the host.
    fn into_verdict_code(self) -> u32;
}

impl IntoVerdictCode for Verdict {
    #[inline(always)]
    fn into_verdict_code(self) -> u32 {
        self.code()
    }
}

impl IntoVerdictCode for u32 {
    #[inline(always)]
    fn into_verdict_code(self) -> u32 {
        self
    }
}

/// Runs `policy` on a copy of `facts` and returns its wire code: what the
/// wasm export does after reading the facts buffer, for native tests.
#[inline]
pub fn decide_native<R: IntoVerdictCode>(
    policy: impl FnOnce(&ResumeFacts) -> R,
    facts: &ResumeFacts,
) -> u32 {
    let copy = *facts;
    policy(&copy).into_verdict_code()
}

/// The 72-byte, 8-aligned buffer the host writes facts into (wasm32 only).
///
/// Not part of the public API: used by the code [`rewind_policy!`]
/// generates.
///
/// [`rewind_policy!`]: crate::rewind_policy
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[repr(transparent)]
#[derive(Debug)]
pub struct FactsBuffer(core::cell::UnsafeCell<ResumeFacts>);

// SAFETY: `wasm32-unknown-unknown` guests built by this SDK have one thread
// (no shared memory, no atomics feature), and the host writes the buffer only
// between calls into the guest, so no two accesses ever overlap.
#[cfg(target_arch = "wasm32")]
unsafe impl Sync for FactsBuffer {}

#[cfg(target_arch = "wasm32")]
impl FactsBuffer {
    /// A zeroed buffer, for a `static`.
    pub const fn new() -> FactsBuffer {
        FactsBuffer(core::cell::UnsafeCell::new(ResumeFacts {
            abi_version: 0,
            session: 0,
            cursor: 0,
            allowed: crate::VerdictSet::EMPTY,
            default_verdict: 0,
            _pad0: 0,
            cursor_seq: 0,
            high_water: 0,
            oldest_retained: 0,
            cursor_age_ms: 0,
            idle_ms: 0,
            max_resume_age_ms: 0,
        }))
    }

    /// The buffer's address in linear memory, for `rewind_facts_ptr`.
    #[inline(always)]
    pub fn address(&self) -> i32 {
        self.0.get() as usize as i32
    }

    /// A copy of the facts the host last wrote.
    #[inline(always)]
    pub fn read(&self) -> ResumeFacts {
        // SAFETY: the pointer comes from a live `static` and is aligned; any
        // bit pattern is a valid `ResumeFacts` (it is `Pod`); no write can
        // overlap (see the `Sync` impl). Volatile because the writer is the
        // host, outside the program the compiler sees.
        unsafe { core::ptr::read_volatile(self.0.get()) }
    }
}

#[cfg(target_arch = "wasm32")]
impl Default for FactsBuffer {
    fn default() -> Self {
        Self::new()
    }
}

/// Exports a policy function as a Rewind policy plugin.
///
/// Wrap one function taking `&ResumeFacts` and returning a [`Verdict`] (or a
/// raw `u32` code). The function is emitted unchanged, so native code and
/// tests call it directly. Next to it the macro emits
/// `rewind_decide_native(&ResumeFacts) -> u32` (the same conversion the wasm
/// export does, callable on any target) and, on `wasm32` only, the exports
/// `rewind_abi_version`, `rewind_facts_ptr` and `rewind_decide` plus the
/// static facts buffer. Use it once per crate.
///
/// See the [`guest`](crate::guest) module for a complete crate.
///
/// ```
/// use rewind_policy_sdk::{rewind_policy, ResumeFacts, Verdict};
///
/// rewind_policy! {
///     fn decide(facts: &ResumeFacts) -> Verdict {
///         // Never replay: every resume gets a fresh stream or a rejection.
///         match facts.default() {
///             Verdict::Resume => Verdict::Fresh,
///             other => other,
///         }
///     }
/// }
/// # let f = ResumeFacts::new(rewind_policy_sdk::SessionFact::Live,
/// #     rewind_policy_sdk::CursorFact::InWindow).with_safe_set();
/// # assert_eq!(decide(&f), Verdict::Fresh);
/// ```
#[macro_export]
macro_rules! rewind_policy {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident ($facts:ident : $facts_ty:ty) -> $ret:ty $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name($facts: $facts_ty) -> $ret $body

        /// Runs the policy natively and returns its wire code, exactly as
        /// the wasm export `rewind_decide` would.
        #[allow(dead_code, reason = "used by native tests and embedders only")]
        pub fn rewind_decide_native(facts: &$crate::ResumeFacts) -> u32 {
            $crate::guest::decide_native($name, facts)
        }

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            static REWIND_FACTS: $crate::guest::FactsBuffer = $crate::guest::FactsBuffer::new();

            #[unsafe(no_mangle)]
            extern "C" fn rewind_abi_version() -> i32 {
                $crate::ABI_VERSION as i32
            }

            #[unsafe(no_mangle)]
            extern "C" fn rewind_facts_ptr() -> i32 {
                REWIND_FACTS.address()
            }

            #[unsafe(no_mangle)]
            extern "C" fn rewind_decide() -> i32 {
                let facts = REWIND_FACTS.read();
                $crate::guest::IntoVerdictCode::into_verdict_code($name(&facts)) as i32
            }
        };
    };
}

/// A panic handler for `no_std` wasm32 plugins: a panic traps, and the host
/// counts it and answers the safe default.
#[cfg(all(target_arch = "wasm32", feature = "panic-handler"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}
