//! Rewind engine: session-scoped replay from one shared segment pool, with epoch-tagged cursors.
//!
//! Servers that stream over SSE keep recent events per session so that a
//! client reconnecting with `Last-Event-ID` can pick up where it left off.
//! This crate keeps those events and decides each reconnect, with one
//! promise above all: a client never receives an event that belonged to
//! another session, an earlier incarnation of its own session, or a gap it
//! was not told about.
//!
//! ```
//! use rewind_engine::{Config, Engine, ResumeAction, ResumeRequest};
//!
//! let engine = Engine::new(Config::default())?;
//! let session = engine.open(None)?;
//! let stream = session.new_stream().expect("fresh session has streams left");
//! let first = session.append(stream, b"progress 1")?;
//! session.append(stream, b"progress 2")?;
//!
//! // The client reconnects, presenting its session and the last id it saw.
//! let (sid, cursor) = (session.id().to_string(), first.to_string());
//! let decision = engine.resume(ResumeRequest {
//!     session_id: Some(&sid),
//!     last_event_id: Some(&cursor),
//!     principal: None,
//! });
//! let ResumeAction::Replay(mut replay) = decision.action else { panic!("expected a replay") };
//! let mut buf = Vec::new();
//! assert!(replay.next_into(&mut buf)?.is_some());
//! assert_eq!(buf, b"progress 2");
//! assert_eq!(replay.next_into(&mut buf)?, None); // caught up: wait for more
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The pieces: [`Engine`] (sessions, admission, metrics), [`SessionHandle`]
//! (append, streams, attachments), [`Engine::resume`] (facts → policy →
//! safe verdict → [`ResumeAction`]), [`Replay`] (one read loop for replay
//! and live delivery), [`policy`] (the policy trait, the native reference,
//! and the WebAssembly host). Events live in one segment pool per engine;
//! `docs/storage.md` describes its layout and protocol.
#![cfg_attr(not(test), warn(missing_docs))]
// Under loom only the storage layer and its models are built; the engine
// around it is compiled out, so much of the storage API has no caller.
#![cfg_attr(
    loom,
    allow(
        dead_code,
        unused_imports,
        reason = "under loom only the storage layer is built"
    )
)]

pub(crate) mod storage;
pub(crate) mod sync;
mod words;

#[cfg(not(loom))]
mod clock;
#[cfg(not(loom))]
mod config;
#[cfg(not(loom))]
pub mod durable;
#[cfg(not(loom))]
mod engine;
#[cfg(not(loom))]
mod handle;
#[cfg(not(loom))]
pub mod id;
#[cfg(not(loom))]
mod metrics;
#[cfg(not(loom))]
pub mod policy;
#[cfg(not(loom))]
mod replay;
#[cfg(not(loom))]
mod resume;
#[cfg(not(loom))]
mod session;
#[cfg(not(loom))]
mod shared;

#[cfg(not(loom))]
pub use crate::{
    config::{Config, ConfigError, SyncPolicy},
    engine::Engine,
    handle::{AppendError, CallGuard, SessionHandle, SessionWriter},
    id::{EventId, EventIdError, SessionId, SessionIdError, TagKey},
    metrics::MetricsSnapshot,
    policy::{
        CursorFact, NativePolicy, Policy, PolicyAnswer, PolicyFault, ResumeFacts, SessionFact,
        Verdict,
    },
    replay::{Batch, Hold, Replay, ReplayError},
    resume::{Decided, Rejection, ResumeAction, ResumeDecision, ResumeRequest, Signal, SignalKind},
    session::{Attachment, EndReason, Waiter},
    shared::OpenError,
};
