//! What an embedding server chooses: path, DNS-rebinding and origin policy,
//! CORS, limits, JSON or SSE answers, SSE timing, early stream close,
//! shutdown, and who the caller is.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Finds the authenticated principal of a request (e.g. from a bearer token
/// an auth layer already checked). Sessions are bound to it: a session opened
/// by one principal is answered 404/409 to every other.
pub type PrincipalExtractor = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// What an operator must hear about a listener's host policy (see
/// [`HostPolicy::for_listener`]); its `Display` is the warning's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostWarning {
    /// Listening beyond loopback with no host list: only loopback names
    /// pass, so remote clients get 403 until their host is named.
    LoopbackNamesOnly,
    /// `"*"` in the host list: any `Host` header is accepted.
    ProtectionOff,
}

impl fmt::Display for HostWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostWarning::LoopbackNamesOnly => {
                "LISTENING BEYOND LOOPBACK WITH LOOPBACK-ONLY HOSTS: requests whose Host is \
                 not localhost/127.0.0.1/[::1] get 403 (DNS-rebinding protection stays on); \
                 name the hosts clients use with --allowed-hosts (or REWIND_ALLOWED_HOSTS)"
            }
            HostWarning::ProtectionOff => {
                "DNS-REBINDING PROTECTION IS OFF: allowed_hosts is \"*\", so any Host header is \
                 accepted; do this only behind a proxy that checks Host itself, or with \
                 authentication in front of the endpoint"
            }
        })
    }
}

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
    /// The policy for a server listening on `addr` that was told no host
    /// names: [`HostPolicy::Loopback`], whatever the address. A server
    /// listening on `0.0.0.0` or a public address keeps its DNS-rebinding
    /// protection until it is given the names clients use
    /// ([`HostPolicy::Allow`]), or told to check nothing
    /// ([`HostPolicy::Any`]) because something in front of it does.
    pub fn for_listen_addr(addr: SocketAddr) -> HostPolicy {
        let _ = addr;
        HostPolicy::Loopback
    }

    /// The policy for a server listening on `listen` with the operator's
    /// `allowed` host list (`None`: not configured; `"*"` in it: check
    /// nothing), and what the operator must be told about it: listening
    /// beyond loopback with loopback-only names, or no DNS-rebinding
    /// protection at all. `rewind serve` logs the warning at start.
    pub fn for_listener(
        listen: SocketAddr,
        allowed: Option<&[String]>,
    ) -> (HostPolicy, Option<HostWarning>) {
        match allowed {
            Some(list) if list.iter().any(|h| h == "*") => {
                (HostPolicy::Any, Some(HostWarning::ProtectionOff))
            }
            Some(list) => (HostPolicy::Allow(list.to_vec()), None),
            None => (
                HostPolicy::for_listen_addr(listen),
                (!listen.ip().is_loopback()).then_some(HostWarning::LoopbackNamesOnly),
            ),
        }
    }

    /// Whether `host` (a `Host` header value or the host of an `Origin`,
    /// port optional) passes. A value that is not an authority never does.
    pub fn allows(&self, host: &str) -> bool {
        if let HostPolicy::Any = self {
            return true;
        }
        let Ok(authority) = host.parse::<http::uri::Authority>() else {
            return false;
        };
        // An authority with user info is not a Host header.
        if authority.as_str().contains('@') {
            return false;
        }
        let name = authority.host();
        match self {
            HostPolicy::Any => true,
            HostPolicy::Loopback => {
                name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1" || name == "[::1]"
            }
            HostPolicy::Allow(names) => names.iter().any(|n| n.eq_ignore_ascii_case(name)),
        }
    }
}

/// Which `Origin` headers are accepted. Requests without `Origin` (every
/// non-browser client) are not affected.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OriginPolicy {
    /// The origin's host must pass the [`HostPolicy`] (any scheme, any
    /// port). The default.
    #[default]
    FollowHosts,
    /// Exactly these origins: scheme, host and port, as browsers send them
    /// (`https://app.example.com` and `https://app.example.com:443` are the
    /// same origin). `null` matches the opaque origin `Origin: null`.
    /// Build it with [`OriginPolicy::allow`].
    Allow(Vec<String>),
}

impl OriginPolicy {
    /// A precise list of origins, each `scheme://host[:port]`; refuses an
    /// entry that is not an origin (a path, a query, user info, no host),
    /// naming it.
    pub fn allow<S: AsRef<str>>(
        origins: impl IntoIterator<Item = S>,
    ) -> Result<OriginPolicy, String> {
        let mut out = Vec::new();
        for raw in origins {
            let raw = raw.as_ref().trim();
            out.push(normalize_origin(raw).ok_or_else(|| {
                format!(
                    "`{raw}` is not an origin: write scheme://host[:port], e.g. https://app.example.com or http://localhost:5173"
                )
            })?);
        }
        Ok(OriginPolicy::Allow(out))
    }

    /// Whether an `Origin` header value passes, given the host policy.
    pub fn allows(&self, origin: &str, hosts: &HostPolicy) -> bool {
        match self {
            OriginPolicy::FollowHosts => url::Url::parse(origin)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .is_some_and(|h| hosts.allows(&h)),
            OriginPolicy::Allow(list) => {
                normalize_origin(origin).is_some_and(|o| list.contains(&o))
            }
        }
    }
}

/// The serialisation of `origin` as a browser would send it (`null`, or
/// `scheme://host[:port]` with the default port left out); `None` when it
/// is not an origin.
fn normalize_origin(origin: &str) -> Option<String> {
    if origin == "null" {
        return Some(origin.to_owned());
    }
    let url = url::Url::parse(origin).ok()?;
    let bare = url.path() == "/" || url.path().is_empty();
    if !bare || url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return None;
    }
    match url.origin() {
        o @ url::Origin::Tuple(..) => Some(o.ascii_serialization()),
        url::Origin::Opaque(_) => None,
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
    /// `Origin` validation beside the host list. Default
    /// [`OriginPolicy::FollowHosts`].
    pub origins: OriginPolicy,
    /// Answer CORS preflights (`OPTIONS`) and add CORS headers for the
    /// origins that pass [`McpOptions::origins`], exposing `Mcp-Session-Id`
    /// to browser clients. Default `false`.
    pub cors: bool,
    /// Answer a POST that carries one request with a single JSON body when
    /// its answer is that response alone, and with SSE as soon as the
    /// handler sends anything first (rmcp's `json_response`). A POST whose
    /// `Accept` lists `application/json` but not `text/event-stream` is
    /// answered with JSON whatever this says. Default `false`.
    pub json_response: bool,
    /// Largest POST body accepted (413 above). Default 4 MiB.
    pub max_body_bytes: usize,
    /// Largest total size of a request's headers (names, values and the
    /// `: ` and line ends between them) accepted (431 above). Default 16 KiB.
    pub max_header_bytes: usize,
    /// Share sessions with other nodes through Redis
    /// ([`Cluster`](crate::cluster::Cluster), connected with
    /// [`Cluster::connect`](crate::cluster::Cluster::connect); the engine's
    /// [`Config::node`](rewind_engine::Config::node) must be the cluster's
    /// node number). `None`: a single node. Default `None`.
    pub cluster: Option<crate::cluster::Cluster>,
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
            origins: OriginPolicy::FollowHosts,
            cors: false,
            json_response: false,
            max_body_bytes: 4 << 20,
            max_header_bytes: 16 << 10,
            cluster: None,
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
            .field("origins", &self.origins)
            .field("cors", &self.cors)
            .field("json_response", &self.json_response)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("cluster", &self.cluster)
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

    #[test]
    fn a_public_listener_keeps_dns_rebinding_protection() {
        let p = HostPolicy::for_listen_addr("0.0.0.0:8080".parse().unwrap());
        assert_eq!(p, HostPolicy::Loopback);
        assert!(!p.allows("evil.example"));
        let named = HostPolicy::Allow(vec!["mcp.example.com".into()]);
        assert!(named.allows("MCP.example.com:443"));
        assert!(!named.allows("evil.example"));
        assert!(!named.allows("user@mcp.example.com"));
    }

    #[test]
    fn a_listener_beyond_loopback_is_protected_and_the_operator_is_warned() {
        let public: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let (p, warning) = HostPolicy::for_listener(public, None);
        assert_eq!(p, HostPolicy::Loopback);
        assert_eq!(warning, Some(HostWarning::LoopbackNamesOnly));
        assert!(warning.unwrap().to_string().contains("BEYOND LOOPBACK"));
        assert!(!p.allows("evil.example") && !p.allows("10.0.0.5:8080"));
        assert!(p.allows("127.0.0.1:8080"));

        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(
            HostPolicy::for_listener(local, None),
            (HostPolicy::Loopback, None)
        );
        let named = ["mcp.example.com".to_string()];
        let (p, warning) = HostPolicy::for_listener(public, Some(&named));
        assert_eq!(
            (p.clone(), warning),
            (HostPolicy::Allow(named.to_vec()), None)
        );
        assert!(p.allows("mcp.example.com") && !p.allows("evil.example"));

        let any = ["mcp.example.com".to_string(), "*".to_string()];
        let (p, warning) = HostPolicy::for_listener(local, Some(&any));
        assert_eq!(p, HostPolicy::Any);
        assert_eq!(warning, Some(HostWarning::ProtectionOff));
        assert!(warning.unwrap().to_string().contains("IS OFF"));
    }

    #[test]
    fn origins_match_scheme_host_and_port() {
        let hosts = HostPolicy::Loopback;
        let p = OriginPolicy::allow(["https://app.example.com", "http://localhost:5173"]).unwrap();
        for ok in [
            "https://app.example.com",
            "https://app.example.com:443",
            "http://localhost:5173",
        ] {
            assert!(p.allows(ok, &hosts), "{ok}");
        }
        for bad in [
            "http://app.example.com",
            "https://app.example.com:8443",
            "http://localhost:5174",
            "https://evil.example",
            "null",
            "not an origin",
        ] {
            assert!(!p.allows(bad, &hosts), "{bad}");
        }
        let e = OriginPolicy::allow(["https://app.example.com/path"]).unwrap_err();
        assert!(e.contains("/path"), "{e}");
        let follow = OriginPolicy::FollowHosts;
        assert!(follow.allows("http://localhost:3000", &hosts));
        assert!(follow.allows("http://[::1]:3000", &hosts));
        assert!(!follow.allows("http://evil.example", &hosts));
    }
}
