//! `rmcp-shared-store ADDR:PORT`: rmcp's transport with one in-memory
//! `EventStore` shared by all sessions.

use std::sync::Arc;

use peer_rmcp::SharedEventStore;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let manager =
        LocalSessionManager::default().with_event_store(Arc::new(SharedEventStore::default()));
    peer_rmcp::serve(peer_rmcp::listen_addr(), manager, "rmcp-shared-store").await
}
