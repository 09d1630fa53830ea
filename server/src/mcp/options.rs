//! What an embedding server chooses: path, DNS-rebinding policy, SSE timing,
//! early stream close, shutdown, and who the caller is.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Finds the authenticated principal of a request (e.g. from a bearer token
/// an auth layer already checked). Sessions are bound to it: a session opened
/// by one principal is answered 404/409 to every other.
pub type PrincipalExtractor = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// Which `Host` and `Origin` headers are accepted (DNS-rebinding protection).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostPolicy {
    /// Only loopback names, with any port: `localhost`, `127.0.0.1`, `[::1]`.
    /// The default, and the right answer for a server listening on loopback.
    Loopback,
    /// Exactly these host names (without port; compared case-insensitively),
    /// for both `Host` and the host of `Origin`.
    Allow(Vec<String>),
    /// No check (a server behind a proxy that validates hosts itself, or
    /// listening publicly with its own authentication).
    Any,
}

impl HostPolicy {
    /// [`HostPolicy::Loopback`] when `addr` is a loopback address, else
    /// [`HostPolicy::Any`]: protection on by default where DNS rebinding is
    /// the threat.
    pub fn for_listen_addr(addr: SocketAddr) -> HostPolicy {
        if addr.ip().is_loopback() {
            HostPolicy::Loopback
        } else {
            HostPolicy::Any
        }
    }

    /// Whether `host` (a `Host` header value or the authority of an
    /// `Origin`, port optional) passes.
    pub fn allows(&self, host: &str) -> bool {
        let name = strip_port(host);
        match self {
            HostPolicy::Any => true,
            HostPolicy::Loopback => {
                name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1" || name == "[::1]"
            }
            HostPolicy::Allow(names) => names.iter().any(|n| n.eq_ignore_ascii_case(name)),
        }
    }
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// How the MCP endpoint behaves. `McpOptions::default()` is a loopback
/// server at `/mcp`.
#[derive(Clone)]
#[non_exhaustive]
pub struct McpOptions {
    /// The MCP endpoint path. Default `/mcp`.
    pub path: String,
    /// `Host`/`Origin` validation. Default [`HostPolicy::Loopback`].
    pub hosts: HostPolicy,
    /// The SSE `retry:` hint sent on every stream. Default 1 s.
    pub retry: Duration,
    /// Interval of keep-alive comments on idle streams (each one also
    /// touches the session's idle TTL). `None`: none. Default 15 s.
    pub keep_alive: Option<Duration>,
    /// End every POST response stream right after its priming event; the
    /// client resumes with `GET` + `Last-Event-ID` and receives everything,
    /// including results produced while it was away (SSE polling, SEP-1699).
    /// Default `false`. Tools can also close their own stream at any time
    /// with [`SseStream::close`](crate::mcp::SseStream::close).
    pub close_post_streams_after_priming: bool,
    /// Cancelled → every open stream ends cleanly and running services stop.
    pub shutdown: CancellationToken,
    /// The principal of a request, if the embedding authenticates callers.
    pub principal: Option<PrincipalExtractor>,
    /// How often ended and idle-expired sessions are swept (the engine's
    /// [`sweep`](rewind_engine::Engine::sweep), then the sessions' services
    /// stop). `None`: the embedding calls
    /// [`RewindMcp::sweep`](crate::mcp::RewindMcp::sweep) itself. Default 1 s.
    pub sweep_interval: Option<Duration>,
    /// Inbound messages buffered per session before a POST waits.
    /// Default 64.
    pub inbound_capacity: usize,
}

impl Default for McpOptions {
    fn default() -> McpOptions {
        McpOptions {
            path: "/mcp".to_owned(),
            hosts: HostPolicy::Loopback,
            retry: Duration::from_secs(1),
            keep_alive: Some(Duration::from_secs(15)),
            close_post_streams_after_priming: false,
            shutdown: CancellationToken::new(),
            principal: None,
            sweep_interval: Some(Duration::from_secs(1)),
            inbound_capacity: 64,
        }
    }
}

impl fmt::Debug for McpOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpOptions")
            .field("path", &self.path)
            .field("hosts", &self.hosts)
            .field("retry", &self.retry)
            .field("keep_alive", &self.keep_alive)
            .field(
                "close_post_streams_after_priming",
                &self.close_post_streams_after_priming,
            )
            .field("shutdown", &self.shutdown.is_cancelled())
            .field("principal", &self.principal.is_some())
            .field("sweep_interval", &self.sweep_interval)
            .field("inbound_capacity", &self.inbound_capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_pass_with_any_port() {
        let p = HostPolicy::Loopback;
        for ok in [
            "localhost",
            "LOCALHOST:3000",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:9",
        ] {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:80",
            "127.0.0.2",
            "localhost.evil.example",
        ] {
            assert!(!p.allows(bad), "{bad}");
        }
    }
}
