//! `rmcp-builtin ADDR:PORT`: rmcp's transport with the session manager's
//! built-in cache (16 events per request stream).

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    peer_rmcp::serve(
        peer_rmcp::listen_addr(),
        LocalSessionManager::default(),
        "rmcp-builtin",
    )
    .await
}
