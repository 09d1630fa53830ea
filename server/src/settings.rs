//! Configuration of `rewind serve`: flags, environment variables, a TOML
//! file and defaults, resolved in that order of precedence into one
//! [`Settings`].
//!
//! Flags and environment variables arrive through clap ([`ServeArgs`], where
//! each flag names its variable), so "flag over environment" is clap's rule;
//! this module puts both over the file and the file over the defaults, then
//! checks every value and names the offending key and where it came from.
//!
//! The file (all keys optional):
//!
//! ```toml
//! listen = "127.0.0.1:8080"        # MCP endpoint, served at /mcp
//! admin_listen = "127.0.0.1:8081"  # admin surface (metrics, policy)
//! admin_token = "..."              # bearer token; generated when absent
//! policy = "policies/strict.wasm"  # relative to this file; default: embedded
//! policy_dir = "policies/live"     # keeps pushed policies across restarts
//! policy_compiler = "child"        # or "in-process": where policies are compiled
//! policy_compile_timeout_secs = 30 # the child compiler is killed after this long
//! policy_compile_memory_bytes = 4294967296  # the child's address space; 0: no cap
//!
//! log_format = "text"             # or "json": one JSON object per log line
//!
//! [http]
//! allowed_hosts = ["mcp.example.com"]   # Host names accepted; default loopback only; ["*"]: any
//! allowed_origins = ["https://app.example.com"]  # exact origins; default: the host list decides
//! cors = false                     # answer CORS preflights for the accepted origins
//! json_response = false            # one JSON body when the answer is the response alone
//! max_body_bytes = 4194304         # largest POST body (413 above)
//! max_header_bytes = 16384         # largest request header block (431 above)
//!
//! [engine]
//! session_events = 1024            # events each session keeps (at least)
//! session_bytes = 32768            # segment bytes each session keeps (at least)
//! reader_hold_bytes = 262144       # kept while a connected stream still reads it
//! global_bytes = 1073741824        # the event pool shared by all sessions
//! max_segment_bytes = 8192         # largest segment of a session's growth
//! max_event_bytes = 33553408       # largest single event (message)
//! max_sessions = 250000            # sessions live at once; more get 503
//! max_sessions_per_principal = 10000
//! idle_ttl_secs = 1800             # a session idle this long ends
//! max_resume_age_secs = 600        # told to the policy; unset by default
//! data_dir = "data"                # durable pool + session journal; default: heap
//! sync = "none"                    # durable pools: "none", "every-append" or "100ms"
//!
//! [cluster]                        # absent: a single node
//! redis = "redis://127.0.0.1:6379" # the shared tier several nodes share sessions through
//! node_id = 3                      # 1..=65535, unique per node; default: allocated by Redis
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use rewind_engine::policy::wasm::ChildCompiler;
use rewind_engine::Config;
use serde::Deserialize;

/// Where the MCP endpoint listens unless configured.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Where the admin surface listens unless configured.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";
/// The smallest address-space cap the child compiler accepts: it maps
/// about 28 MiB to compile the default policy, program included, so a
/// smaller cap would refuse every module (and is more likely a value
/// meant in another unit).
pub const MIN_COMPILE_MEMORY: u64 = 64 << 20;
/// The longest compile timeout accepted: a day (a policy compiles in
/// milliseconds; a longer wait is a mistake, not a setting).
pub const MAX_COMPILE_TIMEOUT_SECS: u64 = 86_400;

/// Flags of `rewind serve` (also accepted by a bare `rewind`). Every flag can
/// also be set by the environment variable it names, or in the file.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML configuration file (flags and environment variables override it)
    #[arg(long, env = "REWIND_CONFIG", value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Address of the MCP endpoint [default: 127.0.0.1:8080]
    #[arg(long, env = "REWIND_LISTEN", value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// Address of the admin surface [default: 127.0.0.1:8081]
    #[arg(long, env = "REWIND_ADMIN_LISTEN", value_name = "ADDR:PORT")]
    pub admin_listen: Option<SocketAddr>,
    /// Bearer token of the admin surface [default: a random one, printed at start]
    #[arg(
        long,
        env = "REWIND_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Policy plugin to start with [default: the embedded default policy]
    #[arg(long, env = "REWIND_POLICY", value_name = "FILE.wasm")]
    pub policy: Option<PathBuf>,
    /// Directory where policies pushed through the admin surface are kept;
    /// at start the last one live is swapped in over --policy [default: none,
    /// a pushed policy lasts until the server stops]
    #[arg(long, env = "REWIND_POLICY_DIR", value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,
    /// Where policies are compiled: "child" (a short-lived child process,
    /// so the compiler's code never occupies the server's memory) or
    /// "in-process" [default: child]
    #[arg(long, env = "REWIND_POLICY_COMPILER", value_name = "WHERE")]
    pub policy_compiler: Option<PolicyCompilerSetting>,
    /// Seconds one policy compile may take in the child before it is
    /// killed and the load refused [default: 30]
    #[arg(long, env = "REWIND_POLICY_COMPILE_TIMEOUT_SECS", value_name = "SECS")]
    pub policy_compile_timeout_secs: Option<u64>,
    /// Address space the compiling child may map (Linux), so that a
    /// module that makes the compiler allocate without bound fails its
    /// load; 0: no cap [default: 4294967296]
    #[arg(long, env = "REWIND_POLICY_COMPILE_MEMORY_BYTES", value_name = "BYTES")]
    pub policy_compile_memory_bytes: Option<u64>,
    /// Events each session keeps, at least [default: 1024]
    #[arg(long, env = "REWIND_SESSION_EVENTS", value_name = "N")]
    pub session_events: Option<u64>,
    /// Segment bytes each session keeps, at least [default: 32768]
    #[arg(long, env = "REWIND_SESSION_BYTES", value_name = "BYTES")]
    pub session_bytes: Option<u64>,
    /// Segment bytes a session may keep while an open stream has not read
    /// them yet [default: 262144]
    #[arg(long, env = "REWIND_READER_HOLD_BYTES", value_name = "BYTES")]
    pub reader_hold_bytes: Option<u64>,
    /// The event pool all sessions share: the memory budget [default: 1073741824]
    #[arg(long, env = "REWIND_GLOBAL_BYTES", value_name = "BYTES")]
    pub global_bytes: Option<u64>,
    /// Largest segment of a session's growth, a power of two [default: 8192]
    #[arg(long, env = "REWIND_MAX_SEGMENT_BYTES", value_name = "BYTES")]
    pub max_segment_bytes: Option<usize>,
    /// Largest single event (one MCP message) [default: 33553408]
    #[arg(long, env = "REWIND_MAX_EVENT_BYTES", value_name = "BYTES")]
    pub max_event_bytes: Option<usize>,
    /// Sessions live at once; more initializations get 503 [default: 250000]
    #[arg(long, env = "REWIND_MAX_SESSIONS", value_name = "N")]
    pub max_sessions: Option<usize>,
    /// Sessions live at once per principal [default: 10000]
    #[arg(long, env = "REWIND_MAX_SESSIONS_PER_PRINCIPAL", value_name = "N")]
    pub max_sessions_per_principal: Option<usize>,
    /// Seconds after which an idle session ends [default: 1800]
    #[arg(long, env = "REWIND_IDLE_TTL_SECS", value_name = "SECS")]
    pub idle_ttl_secs: Option<u64>,
    /// Oldest disconnect, in seconds, a strict policy may still resume [default: unset]
    #[arg(long, env = "REWIND_MAX_RESUME_AGE_SECS", value_name = "SECS")]
    pub max_resume_age_secs: Option<u64>,
    /// Directory for the durable event pool and session journal (created if
    /// missing, locked while the server runs) [default: none, events on the heap]
    #[arg(long, env = "REWIND_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// When a durable pool is forced to disk: `none`, `every-append`, or an
    /// interval such as `100ms` [default: none]
    #[arg(long, env = "REWIND_SYNC", value_name = "POLICY")]
    pub sync: Option<String>,
    /// Host names the MCP endpoint accepts in `Host`, comma-separated; `*`: any (no DNS-rebinding protection) [default: loopback names only]
    #[arg(
        long,
        env = "REWIND_ALLOWED_HOSTS",
        value_name = "HOST,...",
        value_delimiter = ','
    )]
    pub allowed_hosts: Option<Vec<String>>,
    /// Exact browser origins accepted (`scheme://host[:port]`), comma-separated [default: an origin's host must pass --allowed-hosts]
    #[arg(
        long,
        env = "REWIND_ALLOWED_ORIGINS",
        value_name = "ORIGIN,...",
        value_delimiter = ','
    )]
    pub allowed_origins: Option<Vec<String>>,
    /// Answer CORS preflights and expose Mcp-Session-Id to the accepted origins [default: false]
    #[arg(long, env = "REWIND_CORS", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub cors: Option<bool>,
    /// Answer with one JSON body when the answer is the response alone [default: false]
    #[arg(long, env = "REWIND_JSON_RESPONSE", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub json_response: Option<bool>,
    /// Largest POST body in bytes (413 above) [default: 4194304]
    #[arg(long, env = "REWIND_MAX_BODY_BYTES", value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Largest request header block in bytes (431 above) [default: 16384]
    #[arg(long, env = "REWIND_MAX_HEADER_BYTES", value_name = "BYTES")]
    pub max_header_bytes: Option<usize>,
    /// Log line format: text or json [default: text]
    #[arg(long, env = "REWIND_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Share sessions with other nodes through this Redis (`redis://host:port[/db]`): any node serves any session [default: none, a single node]
    #[arg(long, env = "REWIND_CLUSTER", value_name = "URL")]
    pub cluster: Option<String>,
    /// This node's number in the cluster, 1..=65535, unique per node [default: allocated by Redis]
    #[arg(long, env = "REWIND_NODE_ID", value_name = "N")]
    pub node_id: Option<u16>,
}

/// Where `rewind serve` compiles policy plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyCompilerSetting {
    /// A child process (`rewind` itself) per compile: the compiler's code
    /// is never mapped in the server, and a module that crashes the
    /// compiler or compiles forever only takes the child down.
    #[default]
    Child,
    /// The server process.
    InProcess,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The `[http]` table of the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpFileSettings {
    /// `http.allowed_hosts`
    pub allowed_hosts: Option<Vec<String>>,
    /// `http.allowed_origins`
    pub allowed_origins: Option<Vec<String>>,
    /// `http.cors`
    pub cors: Option<bool>,
    /// `http.json_response`
    pub json_response: Option<bool>,
    /// `http.max_body_bytes`
    pub max_body_bytes: Option<usize>,
    /// `http.max_header_bytes`
    pub max_header_bytes: Option<usize>,
}

/// How the MCP endpoint treats HTTP requests, resolved and checked.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// `Host` names accepted; `None`: loopback names only; `Some([])`
    /// never happens (refused); `Some(["*"])` is kept as given and means any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Exact origins accepted (already checked to be origins); `None`: the
    /// host list decides.
    pub allowed_origins: Option<Vec<String>>,
    /// CORS on.
    pub cors: bool,
    /// JSON answers when the answer is the response alone.
    pub json_response: bool,
    /// Largest POST body.
    pub max_body_bytes: usize,
    /// Largest request header block.
    pub max_header_bytes: usize,
}

/// The configuration file, as written. Unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    /// `listen`
    pub listen: Option<SocketAddr>,
    /// `admin_listen`
    pub admin_listen: Option<SocketAddr>,
    /// `admin_token`
    pub admin_token: Option<String>,
    /// `policy`, relative to the file's directory
    pub policy: Option<PathBuf>,
    /// `policy_dir`, relative to the file's directory
    pub policy_dir: Option<PathBuf>,
    /// `policy_compiler`
    pub policy_compiler: Option<PolicyCompilerSetting>,
    /// `policy_compile_timeout_secs`
    pub policy_compile_timeout_secs: Option<u64>,
    /// `policy_compile_memory_bytes`
    pub policy_compile_memory_bytes: Option<u64>,
    /// `log_format`
    pub log_format: Option<LogFormat>,
    /// `[http]`
    #[serde(default)]
    pub http: HttpFileSettings,
    /// `[engine]`
    #[serde(default)]
    pub engine: EngineFileSettings,
    /// `[cluster]`
    #[serde(default)]
    pub cluster: ClusterFileSettings,
}

/// The `[cluster]` table of the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFileSettings {
    /// `cluster.redis`
    pub redis: Option<String>,
    /// `cluster.node_id`
    pub node_id: Option<u16>,
}

/// Cluster mode: the shared tier and this node's number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// The Redis URL (`redis://…`).
    pub redis: String,
    /// This node's number; `None`: allocate one from Redis at start.
    pub node_id: Option<u16>,
}

/// The `[engine]` table of the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineFileSettings {
    /// `engine.session_events`
    pub session_events: Option<u64>,
    /// `engine.session_bytes`
    pub session_bytes: Option<u64>,
    /// `engine.reader_hold_bytes`
    pub reader_hold_bytes: Option<u64>,
    /// `engine.global_bytes`
    pub global_bytes: Option<u64>,
    /// `engine.max_segment_bytes`
    pub max_segment_bytes: Option<usize>,
    /// `engine.max_event_bytes`
    pub max_event_bytes: Option<usize>,
    /// `engine.max_sessions`
    pub max_sessions: Option<usize>,
    /// `engine.max_sessions_per_principal`
    pub max_sessions_per_principal: Option<usize>,
    /// `engine.idle_ttl_secs`
    pub idle_ttl_secs: Option<u64>,
    /// `engine.max_resume_age_secs`
    pub max_resume_age_secs: Option<u64>,
    /// `engine.data_dir`, relative to the file's directory
    pub data_dir: Option<PathBuf>,
    /// `engine.sync`
    pub sync: Option<String>,
}

/// Everything `rewind serve` runs with, resolved and checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address of the MCP endpoint.
    pub listen: SocketAddr,
    /// Address of the admin surface.
    pub admin_listen: SocketAddr,
    /// The configured admin token; `None`: generate one at start.
    pub admin_token: Option<String>,
    /// The policy plugin to start with; `None`: the embedded default.
    pub policy: Option<PathBuf>,
    /// Where pushed policies are kept across restarts
    /// ([`crate::policy_store`]); `None`: nowhere.
    pub policy_dir: Option<PathBuf>,
    /// Where policies are compiled.
    pub policy_compiler: PolicyCompilerSetting,
    /// How long one compile may take in the child compiler.
    pub policy_compile_timeout: Duration,
    /// The child compiler's address-space cap; `None`: uncapped.
    pub policy_compile_memory: Option<u64>,
    /// The engine's configuration (already validated).
    pub engine: Config,
    /// The MCP endpoint's HTTP settings.
    pub http: HttpSettings,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// Cluster mode; `None`: a single node.
    pub cluster: Option<ClusterSettings>,
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag.
    Flag(&'static str),
    /// An environment variable.
    Env(&'static str),
    /// The configuration file.
    File(PathBuf),
    /// The built-in default.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => write!(f, "flag --{flag}"),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::File(path) => write!(f, "config file {}", path.display()),
            Origin::Default => f.write_str("built-in default"),
        }
    }
}

/// A configuration `rewind serve` refuses.
#[derive(Debug)]
#[non_exhaustive]
pub enum SettingsError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key, or a value of the
    /// wrong type (toml's message gives the line, column and key).
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's report.
        message: String,
    },
    /// A value is out of range.
    Invalid {
        /// The key, as written in the file (`engine.session_events`).
        key: &'static str,
        /// Where the value came from.
        origin: Origin,
        /// What is wrong.
        message: String,
    },
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsError::Read { path, source } => {
                write!(f, "cannot read config file {}: {source}", path.display())
            }
            SettingsError::Parse { path, message } => {
                write!(f, "config file {}: {}", path.display(), message.trim_end())
            }
            SettingsError::Invalid {
                key,
                origin,
                message,
            } => write!(f, "invalid `{key}` (from {origin}): {message}"),
        }
    }
}

impl std::error::Error for SettingsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SettingsError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl FileSettings {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<FileSettings, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: path.to_owned(),
            source,
        })?;
        FileSettings::parse(&text, path)
    }

    /// Parses `text`, read from `path` (named in errors; relative `policy`
    /// paths are taken from its directory).
    pub fn parse(text: &str, path: &Path) -> Result<FileSettings, SettingsError> {
        let mut file: FileSettings = toml::from_str(text).map_err(|e| SettingsError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        if let Some(dir) = path.parent() {
            for relative in [
                &mut file.policy,
                &mut file.policy_dir,
                &mut file.engine.data_dir,
            ] {
                if let Some(p) = relative.as_ref().filter(|p| p.is_relative()) {
                    let joined = dir.join(p);
                    *relative = Some(joined);
                }
            }
        }
        Ok(file)
    }
}

/// Picks the value of one setting and remembers where it came from.
struct Resolver<'a> {
    matches: Option<&'a ArgMatches>,
    file_path: Option<&'a Path>,
}

impl Resolver<'_> {
    fn pick<T>(
        &self,
        id: &'static str,
        env: &'static str,
        flag: Option<T>,
        file: Option<T>,
    ) -> (Option<T>, Origin) {
        if let Some(v) = flag {
            let origin = match self.matches.and_then(|m| m.value_source(id)) {
                Some(ValueSource::EnvVariable) => Origin::Env(env),
                _ => Origin::Flag(flag_name(id)),
            };
            return (Some(v), origin);
        }
        match (file, self.file_path) {
            (Some(v), Some(path)) => (Some(v), Origin::File(path.to_owned())),
            (v, _) => (v, Origin::Default),
        }
    }
}

/// `none`, `every-append`, or `N` milliseconds written `Nms`.
fn parse_sync(text: &str) -> Option<rewind_engine::SyncPolicy> {
    use rewind_engine::SyncPolicy;
    match text.trim() {
        "none" => Some(SyncPolicy::None),
        "every-append" => Some(SyncPolicy::EveryAppend),
        t => t
            .strip_suffix("ms")
            .and_then(|n| n.trim().parse().ok())
            .map(SyncPolicy::EveryMs),
    }
}

fn flag_name(id: &'static str) -> &'static str {
    match id {
        "listen" => "listen",
        "admin_listen" => "admin-listen",
        "admin_token" => "admin-token",
        "policy" => "policy",
        "policy_dir" => "policy-dir",
        "policy_compiler" => "policy-compiler",
        "policy_compile_timeout_secs" => "policy-compile-timeout-secs",
        "policy_compile_memory_bytes" => "policy-compile-memory-bytes",
        "session_events" => "session-events",
        "session_bytes" => "session-bytes",
        "reader_hold_bytes" => "reader-hold-bytes",
        "global_bytes" => "global-bytes",
        "max_segment_bytes" => "max-segment-bytes",
        "max_event_bytes" => "max-event-bytes",
        "max_sessions" => "max-sessions",
        "max_sessions_per_principal" => "max-sessions-per-principal",
        "idle_ttl_secs" => "idle-ttl-secs",
        "max_resume_age_secs" => "max-resume-age-secs",
        "data_dir" => "data-dir",
        "sync" => "sync",
        "allowed_hosts" => "allowed-hosts",
        "allowed_origins" => "allowed-origins",
        "cors" => "cors",
        "json_response" => "json-response",
        "max_body_bytes" => "max-body-bytes",
        "max_header_bytes" => "max-header-bytes",
        "log_format" => "log-format",
        "cluster" => "cluster",
        "node_id" => "node-id",
        other => other,
    }
}

impl Settings {
    /// Resolves `args` (flags and environment, already parsed by clap) over
    /// the file they name, if any, over the defaults. `matches` are the
    /// clap matches `args` came from, used to tell a flag from an
    /// environment variable in error messages.
    pub fn resolve(
        args: &ServeArgs,
        matches: Option<&ArgMatches>,
    ) -> Result<Settings, SettingsError> {
        let file = match &args.config {
            Some(path) => FileSettings::load(path)?,
            None => FileSettings::default(),
        };
        Settings::resolve_with_file(args, matches, file, args.config.as_deref())
    }

    /// [`resolve`](Self::resolve) with the file already parsed.
    pub fn resolve_with_file(
        args: &ServeArgs,
        matches: Option<&ArgMatches>,
        file: FileSettings,
        file_path: Option<&Path>,
    ) -> Result<Settings, SettingsError> {
        let r = Resolver { matches, file_path };
        let defaults = Config::default();

        let (listen, _) = r.pick("listen", "REWIND_LISTEN", args.listen, file.listen);
        let (admin_listen, admin_listen_origin) = r.pick(
            "admin_listen",
            "REWIND_ADMIN_LISTEN",
            args.admin_listen,
            file.admin_listen,
        );
        let (admin_token, token_origin) = r.pick(
            "admin_token",
            "REWIND_ADMIN_TOKEN",
            args.admin_token.clone(),
            file.admin_token,
        );
        let (policy, _) = r.pick("policy", "REWIND_POLICY", args.policy.clone(), file.policy);
        let (policy_dir, _) = r.pick(
            "policy_dir",
            "REWIND_POLICY_DIR",
            args.policy_dir.clone(),
            file.policy_dir,
        );
        let (policy_compiler, _) = r.pick(
            "policy_compiler",
            "REWIND_POLICY_COMPILER",
            args.policy_compiler,
            file.policy_compiler,
        );
        let (compile_timeout, compile_timeout_origin) = r.pick(
            "policy_compile_timeout_secs",
            "REWIND_POLICY_COMPILE_TIMEOUT_SECS",
            args.policy_compile_timeout_secs,
            file.policy_compile_timeout_secs,
        );
        let (compile_memory, compile_memory_origin) = r.pick(
            "policy_compile_memory_bytes",
            "REWIND_POLICY_COMPILE_MEMORY_BYTES",
            args.policy_compile_memory_bytes,
            file.policy_compile_memory_bytes,
        );
        let (log_format, _) = r.pick(
            "log_format",
            "REWIND_LOG_FORMAT",
            args.log_format,
            file.log_format,
        );
        let http = resolve_http(&r, args, file.http)?;
        let (cluster_url, cluster_origin) = r.pick(
            "cluster",
            "REWIND_CLUSTER",
            args.cluster.clone(),
            file.cluster.redis,
        );
        let (node_id, node_origin) = r.pick(
            "node_id",
            "REWIND_NODE_ID",
            args.node_id,
            file.cluster.node_id,
        );
        let e = file.engine;
        let (session_events, events_origin) = r.pick(
            "session_events",
            "REWIND_SESSION_EVENTS",
            args.session_events,
            e.session_events,
        );
        let (session_bytes, session_origin) = r.pick(
            "session_bytes",
            "REWIND_SESSION_BYTES",
            args.session_bytes,
            e.session_bytes,
        );
        let (reader_hold_bytes, _) = r.pick(
            "reader_hold_bytes",
            "REWIND_READER_HOLD_BYTES",
            args.reader_hold_bytes,
            e.reader_hold_bytes,
        );
        let (global_bytes, global_origin) = r.pick(
            "global_bytes",
            "REWIND_GLOBAL_BYTES",
            args.global_bytes,
            e.global_bytes,
        );
        let (max_segment_bytes, segment_origin) = r.pick(
            "max_segment_bytes",
            "REWIND_MAX_SEGMENT_BYTES",
            args.max_segment_bytes,
            e.max_segment_bytes,
        );
        let (max_event_bytes, event_origin) = r.pick(
            "max_event_bytes",
            "REWIND_MAX_EVENT_BYTES",
            args.max_event_bytes,
            e.max_event_bytes,
        );
        let (max_sessions, sessions_origin) = r.pick(
            "max_sessions",
            "REWIND_MAX_SESSIONS",
            args.max_sessions,
            e.max_sessions,
        );
        let (max_per_principal, per_principal_origin) = r.pick(
            "max_sessions_per_principal",
            "REWIND_MAX_SESSIONS_PER_PRINCIPAL",
            args.max_sessions_per_principal,
            e.max_sessions_per_principal,
        );
        let (idle_ttl_secs, ttl_origin) = r.pick(
            "idle_ttl_secs",
            "REWIND_IDLE_TTL_SECS",
            args.idle_ttl_secs,
            e.idle_ttl_secs,
        );
        let (max_resume_age_secs, _) = r.pick(
            "max_resume_age_secs",
            "REWIND_MAX_RESUME_AGE_SECS",
            args.max_resume_age_secs,
            e.max_resume_age_secs,
        );
        let (data_dir, _) = r.pick(
            "data_dir",
            "REWIND_DATA_DIR",
            args.data_dir.clone(),
            e.data_dir,
        );
        let (sync, sync_origin) = r.pick("sync", "REWIND_SYNC", args.sync.clone(), e.sync);

        let invalid =
            |key: &'static str, origin: &Origin, message: String| SettingsError::Invalid {
                key,
                origin: origin.clone(),
                message,
            };

        let mut engine = defaults;
        if let Some(n) = session_events {
            engine.session_events = n;
        }
        if let Some(n) = session_bytes {
            engine.session_bytes = n;
        }
        if let Some(n) = reader_hold_bytes {
            engine.reader_hold_bytes = n;
        }
        if let Some(n) = global_bytes {
            engine.global_bytes = n;
        }
        if let Some(n) = max_segment_bytes {
            engine.max_segment_bytes = n;
        }
        if let Some(n) = max_event_bytes {
            engine.max_event_bytes = n;
        }
        if let Some(n) = max_sessions {
            engine.max_sessions = n;
        }
        if let Some(n) = max_per_principal {
            engine.max_sessions_per_principal = n;
        }
        if let Some(secs) = idle_ttl_secs {
            if secs == 0 {
                return Err(invalid(
                    "engine.idle_ttl_secs",
                    &ttl_origin,
                    "must be at least 1 second".to_owned(),
                ));
            }
            engine.idle_ttl = Duration::from_secs(secs);
        }
        engine.max_resume_age = max_resume_age_secs.map(Duration::from_secs);
        engine.data_dir = data_dir;
        if let Some(text) = sync {
            engine.sync = parse_sync(&text).ok_or_else(|| {
                invalid(
                    "engine.sync",
                    &sync_origin,
                    format!(
                        "{text:?} is not a sync policy: use \"none\", \"every-append\" or \
                             an interval such as \"100ms\""
                    ),
                )
            })?;
        }
        if let Err(e) = engine.validate() {
            // The engine words the problem; name the key it is about.
            use rewind_engine::ConfigError as E;
            let (key, origin) = match &e {
                E::ZeroRetention {
                    setting: "session_events",
                } => ("engine.session_events", events_origin),
                E::ZeroRetention { .. } => ("engine.session_bytes", session_origin),
                E::SegmentSize { .. } => ("engine.max_segment_bytes", segment_origin),
                E::PoolTooSmall { .. } if max_event_bytes.is_some() => {
                    ("engine.max_event_bytes", event_origin)
                }
                E::PoolTooSmall { .. } => ("engine.global_bytes", global_origin),
                E::ZeroCap {
                    setting: "max_sessions",
                } => ("engine.max_sessions", sessions_origin),
                E::ZeroCap { .. } => ("engine.max_sessions_per_principal", per_principal_origin),
                E::ZeroSyncInterval => ("engine.sync", sync_origin),
                _ => ("engine.idle_ttl_secs", ttl_origin),
            };
            return Err(invalid(key, &origin, e.to_string()));
        }

        let policy_compiler = policy_compiler.unwrap_or_default();
        // The child compiler's limits mean nothing to an in-process one:
        // setting one anyway is a mistake, not a no-op.
        if policy_compiler == PolicyCompilerSetting::InProcess {
            for (key, set, origin) in [
                (
                    "policy_compile_timeout_secs",
                    compile_timeout.is_some(),
                    &compile_timeout_origin,
                ),
                (
                    "policy_compile_memory_bytes",
                    compile_memory.is_some(),
                    &compile_memory_origin,
                ),
            ] {
                if set {
                    return Err(invalid(
                        key,
                        origin,
                        "applies to the child compiler only, and policy_compiler is \"in-process\""
                            .to_owned(),
                    ));
                }
            }
        }
        let policy_compile_timeout = match compile_timeout {
            None => ChildCompiler::DEFAULT_TIMEOUT,
            Some(secs) if !(1..=MAX_COMPILE_TIMEOUT_SECS).contains(&secs) => {
                return Err(invalid(
                    "policy_compile_timeout_secs",
                    &compile_timeout_origin,
                    format!("must be 1 to {MAX_COMPILE_TIMEOUT_SECS} seconds (a day)"),
                ))
            }
            Some(secs) => Duration::from_secs(secs),
        };
        let policy_compile_memory = match compile_memory {
            None => Some(ChildCompiler::DEFAULT_MEMORY_LIMIT),
            Some(0) => None,
            Some(bytes) if bytes < MIN_COMPILE_MEMORY => {
                return Err(invalid(
                    "policy_compile_memory_bytes",
                    &compile_memory_origin,
                    format!(
                        "{bytes} bytes is less than the compiler itself maps; use at least \
                         {MIN_COMPILE_MEMORY} (64 MiB), or 0 for no cap"
                    ),
                ))
            }
            Some(bytes) => Some(bytes),
        };

        if let Some(token) = &admin_token {
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(
                    "admin_token",
                    &token_origin,
                    "must be at least 16 visible ASCII characters (no spaces)".to_owned(),
                ));
            }
        }
        let admin_listen = admin_listen.unwrap_or_else(|| {
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("the default admin address parses")
        });
        if !admin_listen.ip().is_loopback() && admin_token.is_none() {
            return Err(invalid(
                "admin_listen",
                &admin_listen_origin,
                format!(
                    "{admin_listen} is not a loopback address; the admin surface may listen \
                     elsewhere only with a configured admin_token (--admin-token or \
                     REWIND_ADMIN_TOKEN)"
                ),
            ));
        }

        let cluster = match (cluster_url, node_id) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(invalid(
                    "cluster.node_id",
                    &node_origin,
                    "a node id needs cluster mode: set cluster.redis (--cluster) too".to_owned(),
                ))
            }
            (Some(url), node_id) => {
                let url = url.trim().to_owned();
                if let Err(why) = check_redis_url(&url) {
                    return Err(invalid("cluster.redis", &cluster_origin, why));
                }
                if node_id == Some(0) {
                    return Err(invalid(
                        "cluster.node_id",
                        &node_origin,
                        "must be 1..=65535 (0 means a single engine)".to_owned(),
                    ));
                }
                if engine.data_dir.is_some() {
                    return Err(invalid(
                        "cluster.redis",
                        &cluster_origin,
                        "cluster mode and a data directory (engine.data_dir) cannot be combined \
                         yet: in a cluster, Redis is the tier that outlives a node"
                            .to_owned(),
                    ));
                }
                Some(ClusterSettings {
                    redis: url,
                    node_id,
                })
            }
        };

        Ok(Settings {
            cluster,
            listen: listen
                .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("the default address parses")),
            admin_listen,
            admin_token,
            policy,
            policy_dir,
            policy_compiler,
            policy_compile_timeout,
            policy_compile_memory,
            engine,
            http,
            log_format: log_format.unwrap_or_default(),
        })
    }
}

/// Why `url` cannot name the shared tier, if it cannot.
fn check_redis_url(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match parsed.scheme() {
        "redis" => {}
        "rediss" => {
            return Err(
                "rediss:// (TLS) is not supported by this build; use redis:// on a trusted \
                 network or a TLS tunnel"
                    .to_owned(),
            )
        }
        other => {
            return Err(format!(
                "scheme {other:?} is not Redis: use redis://host:port[/db]"
            ))
        }
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{url:?} names no host"));
    }
    redis::Client::open(url).map_err(|e| format!("{url:?}: {e}"))?;
    Ok(())
}

/// The `[http]` settings over their flags, checked.
fn resolve_http(
    r: &Resolver<'_>,
    args: &ServeArgs,
    file: HttpFileSettings,
) -> Result<HttpSettings, SettingsError> {
    let (hosts, hosts_origin) = r.pick(
        "allowed_hosts",
        "REWIND_ALLOWED_HOSTS",
        args.allowed_hosts.clone(),
        file.allowed_hosts,
    );
    let (origins, origins_origin) = r.pick(
        "allowed_origins",
        "REWIND_ALLOWED_ORIGINS",
        args.allowed_origins.clone(),
        file.allowed_origins,
    );
    let (cors, _) = r.pick("cors", "REWIND_CORS", args.cors, file.cors);
    let (json_response, _) = r.pick(
        "json_response",
        "REWIND_JSON_RESPONSE",
        args.json_response,
        file.json_response,
    );
    let (max_body, body_origin) = r.pick(
        "max_body_bytes",
        "REWIND_MAX_BODY_BYTES",
        args.max_body_bytes,
        file.max_body_bytes,
    );
    let (max_header, header_origin) = r.pick(
        "max_header_bytes",
        "REWIND_MAX_HEADER_BYTES",
        args.max_header_bytes,
        file.max_header_bytes,
    );
    let invalid = |key: &'static str, origin: &Origin, message: String| SettingsError::Invalid {
        key,
        origin: origin.clone(),
        message,
    };
    let hosts = match hosts {
        None => None,
        Some(list) => {
            let list: Vec<String> = list
                .iter()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .collect();
            if list.is_empty() {
                return Err(invalid(
                    "http.allowed_hosts",
                    &hosts_origin,
                    "is empty; leave it out for loopback names only, or use \"*\" for any host"
                        .to_owned(),
                ));
            }
            if let Some(bad) = list.iter().find(|h| {
                h.as_str() != "*" && (h.contains('/') || h.parse::<http::uri::Authority>().is_err())
            }) {
                return Err(invalid(
                    "http.allowed_hosts",
                    &hosts_origin,
                    format!("`{bad}` is not a host name (write it without scheme or path)"),
                ));
            }
            Some(list)
        }
    };
    let origins = match origins {
        None => None,
        Some(list) => {
            crate::mcp::OriginPolicy::allow(&list)
                .map_err(|m| invalid("http.allowed_origins", &origins_origin, m))?;
            Some(list)
        }
    };
    let max_body_bytes = max_body.unwrap_or(4 << 20);
    if max_body_bytes < 1024 {
        return Err(invalid(
            "http.max_body_bytes",
            &body_origin,
            format!("{max_body_bytes} is below 1024; an initialize request alone needs more"),
        ));
    }
    let max_header_bytes = max_header.unwrap_or(16 << 10);
    if max_header_bytes < 1024 {
        return Err(invalid(
            "http.max_header_bytes",
            &header_origin,
            format!("{max_header_bytes} is below 1024; ordinary clients send more"),
        ));
    }
    Ok(HttpSettings {
        allowed_hosts: hosts,
        allowed_origins: origins,
        cors: cors.unwrap_or(false),
        json_response: json_response.unwrap_or(false),
        max_body_bytes,
        max_header_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileSettings, SettingsError> {
        FileSettings::parse(text, Path::new("/etc/rewind/rewind.toml"))
    }

    #[test]
    fn cluster_mode_is_checked_and_names_the_key() {
        let on = |url: &str, node: Option<u16>| ServeArgs {
            cluster: Some(url.to_owned()),
            node_id: node,
            ..ServeArgs::default()
        };
        let s = Settings::resolve(&on("redis://127.0.0.1:6379/2", Some(7)), None).unwrap();
        assert_eq!(
            s.cluster,
            Some(ClusterSettings {
                redis: "redis://127.0.0.1:6379/2".to_owned(),
                node_id: Some(7)
            })
        );
        assert_eq!(
            Settings::resolve(&ServeArgs::default(), None)
                .unwrap()
                .cluster,
            None
        );
        let file = parse("[cluster]\nredis = \"redis://10.0.0.5:6380\"\n").unwrap();
        let s =
            Settings::resolve_with_file(&ServeArgs::default(), None, file, Some(Path::new("x")))
                .unwrap();
        assert_eq!(
            s.cluster.map(|c| (c.redis, c.node_id)),
            Some(("redis://10.0.0.5:6380".to_owned(), None))
        );
        for (args, key, words) in [
            (
                on("http://127.0.0.1:6379", None),
                "cluster.redis",
                "not Redis",
            ),
            (on("rediss://127.0.0.1:6379", None), "cluster.redis", "TLS"),
            (on("not a url", None), "cluster.redis", "not a URL"),
            (
                on("redis://127.0.0.1:6379", Some(0)),
                "cluster.node_id",
                "1..=65535",
            ),
            (
                ServeArgs {
                    node_id: Some(3),
                    ..ServeArgs::default()
                },
                "cluster.node_id",
                "needs cluster mode",
            ),
            (
                ServeArgs {
                    data_dir: Some(PathBuf::from("/var/lib/rewind")),
                    ..on("redis://127.0.0.1:6379", None)
                },
                "cluster.redis",
                "data directory",
            ),
        ] {
            let e = Settings::resolve(&args, None).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(words), "{args:?}: {e}");
        }
        let e = parse("[cluster]\nredis = \"redis://h\"\nnode = 1\n").unwrap_err();
        assert!(e.to_string().contains("node"), "{e}");
    }

    #[test]
    fn the_data_dir_and_sync_policy_reach_the_engine_config() {
        let file = parse("[engine]\ndata_dir = \"state\"\nsync = \"every-append\"\n").unwrap();
        let s =
            Settings::resolve_with_file(&ServeArgs::default(), None, file, Some(Path::new("x")))
                .unwrap();
        assert_eq!(
            s.engine.data_dir.as_deref(),
            Some(Path::new("/etc/rewind/state")),
            "relative to the file"
        );
        assert_eq!(s.engine.sync, rewind_engine::SyncPolicy::EveryAppend);
        let args = ServeArgs {
            data_dir: Some(PathBuf::from("/var/lib/rewind")),
            sync: Some("250ms".to_owned()),
            ..ServeArgs::default()
        };
        let s = Settings::resolve(&args, None).unwrap();
        assert_eq!(
            s.engine.data_dir.as_deref(),
            Some(Path::new("/var/lib/rewind"))
        );
        assert_eq!(s.engine.sync, rewind_engine::SyncPolicy::EveryMs(250));
        for bad in ["sometimes", "0ms", "ms"] {
            let args = ServeArgs {
                sync: Some(bad.to_owned()),
                ..ServeArgs::default()
            };
            let e = Settings::resolve(&args, None).unwrap_err().to_string();
            assert!(e.contains("engine.sync"), "{bad}: {e}");
        }
        assert_eq!(
            Settings::resolve(&ServeArgs::default(), None)
                .unwrap()
                .engine
                .data_dir,
            None
        );
    }

    #[test]
    fn defaults_without_anything() {
        let s = Settings::resolve(&ServeArgs::default(), None).unwrap();
        assert_eq!(s.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(s.admin_listen.to_string(), DEFAULT_ADMIN_LISTEN);
        assert_eq!(s.engine.session_events, Config::default().session_events);
        assert!(s.admin_token.is_none() && s.policy.is_none());
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let file = parse(
            "listen = \"127.0.0.1:9000\"\npolicy = \"p/strict.wasm\"\n[engine]\nsession_events = 64\nidle_ttl_secs = 5\n",
        )
        .unwrap();
        let args = ServeArgs {
            session_events: Some(128),
            ..ServeArgs::default()
        };
        let s = Settings::resolve_with_file(&args, None, file, Some(Path::new("x.toml"))).unwrap();
        assert_eq!(s.listen.port(), 9000);
        assert_eq!(s.engine.session_events, 128);
        assert_eq!(s.engine.idle_ttl, Duration::from_secs(5));
        assert_eq!(
            s.policy.as_deref(),
            Some(Path::new("/etc/rewind/p/strict.wasm"))
        );
    }

    #[test]
    fn the_policy_dir_is_taken_from_the_file_relative_to_it_unless_a_flag_says_otherwise() {
        let file = parse("policy_dir = \"state/policies\"\n").unwrap();
        let s = Settings::resolve_with_file(&ServeArgs::default(), None, file, None).unwrap();
        assert_eq!(
            s.policy_dir.as_deref(),
            Some(Path::new("/etc/rewind/state/policies"))
        );
        let file = parse("policy_dir = \"state/policies\"\n").unwrap();
        let args = ServeArgs {
            policy_dir: Some("/var/lib/rewind".into()),
            ..ServeArgs::default()
        };
        let s = Settings::resolve_with_file(&args, None, file, None).unwrap();
        assert_eq!(s.policy_dir.as_deref(), Some(Path::new("/var/lib/rewind")));
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = parse("[engine]\nrign_slots = 64\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rign_slots") && e.contains("rewind.toml"), "{e}");
        let e = parse("listen = 8080\n").unwrap_err().to_string();
        assert!(e.contains("listen"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key_and_origin() {
        let file = parse("[engine]\nmax_segment_bytes = 1000\n").unwrap();
        let e = Settings::resolve_with_file(
            &ServeArgs::default(),
            None,
            file,
            Some(Path::new("r.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("engine.max_segment_bytes") && e.contains("r.toml") && e.contains("1000"),
            "{e}"
        );
        let args = ServeArgs {
            global_bytes: Some(10),
            ..ServeArgs::default()
        };
        let e = Settings::resolve(&args, None).unwrap_err().to_string();
        assert!(
            e.contains("engine.global_bytes") && e.contains("--global-bytes"),
            "{e}"
        );
    }

    #[test]
    fn http_settings_resolve_and_bad_ones_are_named() {
        let file = parse(
            "[http]\nallowed_hosts = [\"mcp.example.com\"]\ncors = true\nmax_header_bytes = 8192\n",
        )
        .unwrap();
        let args = ServeArgs {
            allowed_origins: Some(vec!["https://app.example.com".into()]),
            ..ServeArgs::default()
        };
        let s = Settings::resolve_with_file(&args, None, file, Some(Path::new("r.toml"))).unwrap();
        assert_eq!(
            s.http.allowed_hosts,
            Some(vec!["mcp.example.com".to_owned()])
        );
        assert!(s.http.cors && !s.http.json_response);
        assert_eq!(s.http.max_header_bytes, 8192);
        assert_eq!(s.http.max_body_bytes, 4 << 20);

        let args = ServeArgs {
            allowed_origins: Some(vec!["https://app.example.com/x".into()]),
            ..ServeArgs::default()
        };
        let e = Settings::resolve(&args, None).unwrap_err().to_string();
        assert!(
            e.contains("http.allowed_origins") && e.contains("/x"),
            "{e}"
        );
        let file = parse("[http]\nallowed_hosts = [\"http://x\"]\n").unwrap();
        let e = Settings::resolve_with_file(
            &ServeArgs::default(),
            None,
            file,
            Some(Path::new("r.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("http.allowed_hosts") && e.contains("r.toml"),
            "{e}"
        );
        let e = parse("[http]\ncorz = true\n").unwrap_err().to_string();
        assert!(e.contains("corz"), "{e}");
        let file = parse("log_format = \"json\"\n").unwrap();
        let s = Settings::resolve_with_file(&ServeArgs::default(), None, file, None).unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
    }

    #[test]
    fn policies_compile_in_a_child_unless_a_flag_or_the_file_says_otherwise() {
        let s = Settings::resolve(&ServeArgs::default(), None).unwrap();
        assert_eq!(s.policy_compiler, PolicyCompilerSetting::Child);
        let file = parse("policy_compiler = \"in-process\"\n").unwrap();
        let s = Settings::resolve_with_file(&ServeArgs::default(), None, file, None).unwrap();
        assert_eq!(s.policy_compiler, PolicyCompilerSetting::InProcess);
        let args = ServeArgs {
            policy_compiler: Some(PolicyCompilerSetting::Child),
            ..ServeArgs::default()
        };
        let file = parse("policy_compiler = \"in-process\"\n").unwrap();
        let s = Settings::resolve_with_file(&args, None, file, None).unwrap();
        assert_eq!(s.policy_compiler, PolicyCompilerSetting::Child);
        let e = parse("policy_compiler = \"elsewhere\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("elsewhere") && e.contains("in-process"), "{e}");
    }

    #[test]
    fn the_child_compilers_limits_are_settings_checked_against_the_compiler() {
        let s = Settings::resolve(&ServeArgs::default(), None).unwrap();
        assert_eq!(s.policy_compile_timeout, ChildCompiler::DEFAULT_TIMEOUT);
        assert_eq!(
            s.policy_compile_memory,
            Some(ChildCompiler::DEFAULT_MEMORY_LIMIT)
        );
        let file =
            parse("policy_compile_timeout_secs = 5\npolicy_compile_memory_bytes = 134217728\n")
                .unwrap();
        let s = Settings::resolve_with_file(&ServeArgs::default(), None, file, None).unwrap();
        assert_eq!(s.policy_compile_timeout, Duration::from_secs(5));
        assert_eq!(s.policy_compile_memory, Some(128 << 20));
        // A flag over the file; 0 lifts the cap.
        let args = ServeArgs {
            policy_compile_timeout_secs: Some(90),
            policy_compile_memory_bytes: Some(0),
            ..ServeArgs::default()
        };
        let file = parse("policy_compile_timeout_secs = 5\n").unwrap();
        let s = Settings::resolve_with_file(&args, None, file, None).unwrap();
        assert_eq!(s.policy_compile_timeout, Duration::from_secs(90));
        assert_eq!(s.policy_compile_memory, None);

        let refused = |args: ServeArgs, file: &str| {
            let file = parse(file).unwrap();
            Settings::resolve_with_file(&args, None, file, Some(Path::new("r.toml")))
                .unwrap_err()
                .to_string()
        };
        for secs in ["0", "86401"] {
            let e = refused(
                ServeArgs::default(),
                &format!("policy_compile_timeout_secs = {secs}\n"),
            );
            assert!(
                e.contains("policy_compile_timeout_secs")
                    && e.contains("r.toml")
                    && e.contains("1 to 86400"),
                "{secs}: {e}"
            );
        }
        // Too long to add to a clock: refused here, not a panic at a load.
        let args = ServeArgs {
            policy_compile_timeout_secs: Some(u64::MAX),
            ..ServeArgs::default()
        };
        let e = refused(args, "");
        assert!(e.contains("--policy-compile-timeout-secs"), "{e}");
        // Four thousand bytes is a cap meant in another unit.
        let args = ServeArgs {
            policy_compile_memory_bytes: Some(4096),
            ..ServeArgs::default()
        };
        let e = refused(args, "");
        assert!(
            e.contains("policy_compile_memory_bytes")
                && e.contains("--policy-compile-memory-bytes")
                && e.contains("67108864"),
            "{e}"
        );
        // A limit of a compiler that does not run is a mistake, not a no-op.
        let e = refused(
            ServeArgs::default(),
            "policy_compiler = \"in-process\"\npolicy_compile_timeout_secs = 5\n",
        );
        assert!(
            e.contains("policy_compile_timeout_secs") && e.contains("in-process"),
            "{e}"
        );
        let args = ServeArgs {
            policy_compile_memory_bytes: Some(1 << 30),
            policy_compiler: Some(PolicyCompilerSetting::InProcess),
            ..ServeArgs::default()
        };
        let e = refused(args, "");
        assert!(e.contains("policy_compile_memory_bytes"), "{e}");
    }

    #[test]
    fn a_public_admin_address_needs_a_token() {
        let args = ServeArgs {
            admin_listen: Some("0.0.0.0:8081".parse().unwrap()),
            ..ServeArgs::default()
        };
        let e = Settings::resolve(&args, None).unwrap_err().to_string();
        assert!(e.contains("admin_listen"), "{e}");
        let args = ServeArgs {
            admin_token: Some("0123456789abcdef0123".into()),
            ..args
        };
        assert!(Settings::resolve(&args, None).is_ok());
    }
}
