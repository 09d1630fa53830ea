//! The in-process transport between one rmcp service and its session.
//!
//! rmcp runs the MCP protocol (initialize, dispatch, cancellation, the
//! handler); this transport is its only way in and out. Inbound messages
//! come from the HTTP handlers through a channel; every outbound message is
//! appended to the session's events in the engine — on the one stream the
//! session's routing table names — *before* any HTTP response sees it. The
//! append happens synchronously inside [`Transport::send`], which rmcp calls
//! in the order the messages were produced, so per-request order (progress
//! 1..n, then the result) is the order the session stores them in.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::RoleServer;
use rmcp::transport::Transport;
use tokio::sync::mpsc;

use super::session::{Inbound, McpSession};

/// rmcp's side of a session.
#[derive(Debug)]
pub(crate) struct SessionTransport {
    session: Arc<McpSession>,
    inbound: mpsc::Receiver<Inbound>,
}

impl SessionTransport {
    pub(crate) fn new(
        session: Arc<McpSession>,
        inbound: mpsc::Receiver<Inbound>,
    ) -> SessionTransport {
        SessionTransport { session, inbound }
    }
}

impl Transport<RoleServer> for SessionTransport {
    // Delivery cannot fail in a way rmcp could act on: a message for an
    // ended session is dropped (the service is being stopped anyway).
    type Error = Infallible;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.session.deliver(&item);
        std::future::ready(Ok(()))
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.inbound.recv().await.map(|m| *m)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inbound.close();
        Ok(())
    }
}
