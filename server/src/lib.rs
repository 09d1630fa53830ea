//! Rewind for MCP Streamable HTTP servers built on `rmcp`.
#![cfg_attr(not(test), warn(missing_docs))]

pub mod metrics;
