//! Rewind's router with the WebAssembly policy host and the admin surface:
//! what `rewind serve` is made of, assembled by hand.
//!
//! ```text
//! cargo run -p rewind-server --example router_wasm_admin -- [--policy FILE.wasm] [--policy-dir DIR]
//! ```
//!
//! Serves the reference tools at `http://127.0.0.1:PORT/mcp` and the admin
//! surface (metrics, policy status, swaps, rollbacks) on a second loopback
//! port, both picked free, until Ctrl-C. Try, in another shell, with the
//! printed admin URL and token:
//!
//! ```text
//! rewind policy export strict
//! rewind policy push strict.wasm --admin URL --token TOKEN
//! rewind policy status --admin URL --token TOKEN
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rewind_engine::policy::wasm::{PolicyHost, PolicyHostConfig};
use rewind_engine::{Config, Engine};
use rewind_server::admin::{self, AdminState};
use rewind_server::mcp::{self, HostPolicy, McpOptions};
use rewind_server::metrics::ServerMetrics;
use rewind_server::policy_store::PolicyStore;
use rewind_server::tools::ReferenceServer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut policy, mut policy_dir) = (None::<PathBuf>, None::<PathBuf>);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--policy" => policy = Some(value()?.into()),
            "--policy-dir" => policy_dir = Some(value()?.into()),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }

    // Generation 1: the embedded default policy, or the given plugin
    // (loaded and validated like any swap).
    let host = Arc::new(match &policy {
        None => PolicyHost::with_default_policy()?,
        Some(path) => {
            let wasm = std::fs::read(path)?;
            PolicyHost::with_policy(PolicyHostConfig::default(), "start", &wasm)?
        }
    });
    // Optional: keep pushed policies across restarts. (`rewind serve` also
    // swaps the stored live policy back in at start; see its source.)
    let store = match &policy_dir {
        Some(dir) => {
            let store = Arc::new(PolicyStore::open(dir)?);
            store.record_start(host.live_generation());
            Some(store)
        }
        None => None,
    };

    // Every resume decision goes through the host's live generation.
    let engine = Engine::with_policy(Config::default(), Arc::clone(&host) as _)?;
    let metrics = Arc::new(ServerMetrics::new());

    let mcp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (mcp_addr, admin_addr) = (mcp_listener.local_addr()?, admin_listener.local_addr()?);

    let mut options = McpOptions::default();
    options.hosts = HostPolicy::for_listen_addr(mcp_addr);
    options.sweep_interval = Some(Duration::from_secs(1));
    let shutdown = options.shutdown.clone();
    let mcp_app = mcp::router(
        engine.clone(),
        Arc::clone(&metrics),
        options,
        ReferenceServer::new,
    );

    let token = admin::generate_token()?;
    let mut admin_state = AdminState::new(engine, Arc::clone(&host), metrics, token.clone());
    if let Some(store) = store {
        admin_state = admin_state.with_store(store);
    }
    let admin_app = admin::router(admin_state);

    println!("MCP endpoint  http://{mcp_addr}/mcp");
    println!("admin surface http://{admin_addr}  token {token}");
    println!(
        "policy        `{}` (generation {})",
        host.live_name(),
        host.live_generation()
    );

    let mcp = axum::serve(mcp_listener, mcp_app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let admin = axum::serve(admin_listener, admin_app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let stop = async move {
        let _ = tokio::signal::ctrl_c().await;
        shutdown.cancel();
        Ok::<(), std::io::Error>(())
    };
    tokio::try_join!(async { mcp.await }, async { admin.await }, stop)?;
    Ok(())
}
