//! Rewind engine: session-scoped replay rings with epoch-tagged cursors.
#![cfg_attr(not(test), warn(missing_docs))]

pub mod policy;
pub mod ring;
pub(crate) mod sync;
