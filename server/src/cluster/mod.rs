//! Cluster mode: several `rewind serve` nodes sharing sessions through
//! Redis.
//!
//! Each node keeps its sessions in its own engine (the fast, local tier)
//! and writes what it appends to Redis (the shared tier), so any node can
//! serve any request:
//!
//! - **Ownership.** The node that answers `initialize` owns the session. Its
//!   *record* in Redis (`rewind:s:{<id>}`, a hash) names the owner and the
//!   owner's boot, and holds the session's tag, epoch, principal, the
//!   cluster epoch it was opened in and, once answered, the `initialize`
//!   parameters. The record expires after twice the idle TTL unless the
//!   owner refreshes it (every batch of events it writes does).
//! - **Event ids carry the node.** A node's engine mints format-2 ids
//!   (`tag-node-epoch-stream-seq`), so a cursor names the node that
//!   appended its event. A cursor that reaches a node is classified against
//!   the session's *record* and the events Redis holds
//!   (the `remote` module), never against whatever the node has locally: a foreign
//!   or stale cursor is refused on every node.
//! - **Replication.** The owner copies every event of a session, in
//!   sequence order, to the session's Redis Stream
//!   (`rewind:s:{<id>}:<epoch>`) with the entry id `<seq>-0`: the mapping
//!   between stream ids and sequence numbers is exact, and a reader finds
//!   the cursor's entry by id. Control entries (`<seq>-<k>`, k ≥ 1) mark
//!   where a request stream closed and where the session ended. Writes
//!   are batched per round of the replicator task, off the appending
//!   thread (the `replicate` module), and trimmed with `MAXLEN ~` to the session's
//!   retention.
//! - **Reads anywhere.** A `GET` for a session another node owns is
//!   decided by the same policy on facts from the record and the stream
//!   ([`SessionFact::Remote`](rewind_engine::SessionFact::Remote),
//!   [`SessionFact::OwnerLost`](rewind_engine::SessionFact::OwnerLost)),
//!   then served by one read loop over the Redis Stream — replayed entries
//!   and live ones (`XREAD BLOCK`) alike, each once, in order; a jump in
//!   sequence numbers is reported as a `gap`.
//! - **Writes at the owner.** A `POST` or `DELETE` for a session another
//!   node owns is forwarded to the owner through its request stream in
//!   Redis (`rewind:in:<node>`); the owner runs it as if it had arrived
//!   there and replies on the forwarding node's reply stream
//!   (`rewind:rep:<node>`) with the status and, for an SSE answer, the
//!   stream id and priming position: the forwarding node then serves the
//!   answer from the session's Redis Stream. Server→client requests
//!   (sampling, elicitation) and the client's answers travel the same way.
//! - **Liveness and the cluster epoch.** Every node refreshes a heartbeat
//!   key (`rewind:node:<n>`, holding its boot) every second, with a
//!   three-second expiry. `rewind:epoch` is a random value created once:
//!   if Redis loses its data (a restart without persistence, a failover to
//!   an empty replica) the key is gone, the next heartbeat creates a new
//!   value, and every node ends the sessions it holds — cursors minted
//!   before are a previous incarnation, never replayed.
//! - **Redis unreachable.** Local sessions keep working; the replicator
//!   retries its batch until Redis answers; requests that need another
//!   node get 503; `rewind_cluster_redis_up` says so and the log says when
//!   it changes.

mod forward;
pub(crate) mod remote;
pub(crate) mod replicate;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use rewind_engine::{Engine, SessionHandle, SessionId};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::metrics::ServerMetrics;
use crate::settings::ClusterSettings;

pub(crate) use forward::{ForwardError, ForwardReply, Forwarded};
pub(crate) use replicate::{Control, SessionReplica};

/// How often a node refreshes its heartbeat and checks the cluster epoch.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a heartbeat key lives: a node silent for this long is gone.
const NODE_TTL: Duration = Duration::from_secs(3);
/// Idle reader connections a node keeps for the next remote readers.
const IDLE_READERS: usize = 64;
/// How long one Redis command may take before it counts as a failure.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Why cluster mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Redis did not answer.
    #[error("cannot reach the cluster's Redis at {url}: {source}")]
    Unreachable {
        /// The configured URL.
        url: String,
        /// What the client said.
        source: redis::RedisError,
    },
    /// The configured node id belongs to a live node.
    #[error(
        "node id {node} is in use by a live node (its heartbeat key rewind:node:{node} \
         did not expire within {secs} s); give each node its own --node-id"
    )]
    NodeIdTaken {
        /// The node id.
        node: u16,
        /// How long this node waited for the key to expire.
        secs: u64,
    },
    /// Every node id is taken.
    #[error("no free node id in the cluster (1..=65535 all have live heartbeats)")]
    NoFreeNodeId,
}

/// What a node needs from its configuration besides the Redis URL.
#[derive(Debug, Clone, Copy)]
pub struct ClusterOptions {
    /// The engine's idle TTL: records live twice as long unless refreshed.
    pub idle_ttl: Duration,
    /// Events each session keeps: the Redis Stream is trimmed to about
    /// as many.
    pub session_events: u64,
}

/// Runs a request forwarded by another node, on the node that owns its
/// session.
pub(crate) type InboxHandler = dyn Fn(Forwarded) -> BoxFuture<'static, ForwardReply> + Send + Sync;

/// This node's membership in a cluster. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) node: u16,
    /// A random value for this process: the heartbeat's value, and the
    /// owner boot of the records it writes.
    pub(crate) boot: String,
    url: String,
    client: redis::Client,
    /// Multiplexed connection for every command that does not block.
    pub(crate) conn: ConnectionManager,
    /// The cluster epoch this node's sessions belong to.
    epoch: Mutex<String>,
    up: AtomicBool,
    pub(crate) metrics: Arc<ServerMetrics>,
    pub(crate) options: ClusterOptions,
    pub(crate) replicator: replicate::Sender,
    replicator_rx: Mutex<Option<replicate::Receiver>>,
    /// Forwarded requests awaiting their owner's reply, by nonce.
    pub(crate) pending: Mutex<HashMap<String, oneshot::Sender<ForwardReply>>>,
    inbox: OnceLock<Arc<InboxHandler>>,
    started: AtomicBool,
    /// Commands that found Redis unreachable, and how many of them the
    /// last check of the cluster epoch came after: while they differ,
    /// Redis may have lost its data meanwhile, and a request for a local
    /// session checks the epoch first ([`Cluster::verify_if_suspect`]).
    failures: AtomicU64,
    verified: AtomicU64,
    engine: OnceLock<Engine>,
    /// Idle connections of remote readers that ended.
    readers: Mutex<Vec<redis::aio::MultiplexedConnection>>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.inner.node)
            .field("url", &self.inner.url)
            .field("up", &self.inner.up.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Redis keys. `{…}` is a Redis Cluster hash tag: a session's record and
/// its events hash to the same slot.
pub(crate) mod keys {
    use rewind_engine::SessionId;

    pub(crate) const EPOCH: &str = "rewind:epoch";
    pub(crate) const NODE_COUNTER: &str = "rewind:nodes";

    pub(crate) fn node(n: u16) -> String {
        format!("rewind:node:{n}")
    }
    pub(crate) fn record(id: SessionId) -> String {
        format!("rewind:s:{{{id}}}")
    }
    pub(crate) fn events(id: SessionId, epoch: u64) -> String {
        format!("rewind:s:{{{id}}}:{epoch:x}")
    }
    pub(crate) fn inbox(n: u16) -> String {
        format!("rewind:in:{n}")
    }
    pub(crate) fn replies(n: u16) -> String {
        format!("rewind:rep:{n}")
    }
}

fn random_hex() -> String {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).expect("the OS random source is unavailable");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The wall clock in Unix milliseconds.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, ms)
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Cluster {
    /// Connects to the cluster's Redis, joins the cluster epoch and claims
    /// a node id (the configured one, or the next free one). Nothing runs
    /// until an endpoint with it in its options builds its router.
    pub async fn connect(
        settings: &ClusterSettings,
        options: ClusterOptions,
        metrics: Arc<ServerMetrics>,
    ) -> Result<Cluster, ClusterError> {
        let url = settings.redis.clone();
        let unreachable = |source| ClusterError::Unreachable {
            url: url.clone(),
            source,
        };
        let client = redis::Client::open(url.as_str()).map_err(unreachable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let mut conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(unreachable)?;
        let fresh = random_hex();
        let _: Option<String> = redis::cmd("SET")
            .arg(keys::EPOCH)
            .arg(&fresh)
            .arg("NX")
            .query_async(&mut conn)
            .await
            .map_err(unreachable)?;
        let epoch: String = redis::cmd("GET")
            .arg(keys::EPOCH)
            .query_async(&mut conn)
            .await
            .map_err(unreachable)?;
        let boot = random_hex();
        let node = match settings.node_id {
            Some(n) => claim_configured(&mut conn, n, &boot)
                .await
                .map_err(|e| match e {
                    Claim::Redis(e) => unreachable(e),
                    Claim::Taken => ClusterError::NodeIdTaken {
                        node: n,
                        secs: 2 * NODE_TTL.as_secs(),
                    },
                })?,
            None => claim_any(&mut conn, &boot).await.map_err(|e| match e {
                Claim::Redis(e) => unreachable(e),
                Claim::Taken => ClusterError::NoFreeNodeId,
            })?,
        };
        metrics.cluster.enable(node);
        metrics.cluster.set_up(true);
        let (tx, rx) = replicate::channel();
        Ok(Cluster {
            inner: Arc::new(Inner {
                node,
                boot,
                url,
                client,
                conn,
                epoch: Mutex::new(epoch),
                up: AtomicBool::new(true),
                metrics,
                options,
                replicator: tx,
                replicator_rx: Mutex::new(Some(rx)),
                pending: Mutex::new(HashMap::new()),
                inbox: OnceLock::new(),
                started: AtomicBool::new(false),
                failures: AtomicU64::new(0),
                verified: AtomicU64::new(0),
                engine: OnceLock::new(),
                readers: Mutex::new(Vec::new()),
            }),
        })
    }

    /// This node's number (the node field of the event ids it mints).
    pub fn node(&self) -> u16 {
        self.inner.node
    }

    /// Whether the last command sent to Redis succeeded.
    pub fn redis_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    /// Starts the node's tasks: heartbeat and cluster-epoch watch (ending
    /// `engine`'s sessions when the epoch changes), the replicator, and the
    /// listener for forwarded requests (run by `inbox`) and their replies.
    /// Runs once; later calls do nothing. Needs a Tokio runtime.
    pub(crate) fn start(
        &self,
        engine: Engine,
        inbox: Arc<InboxHandler>,
        shutdown: CancellationToken,
    ) {
        if self.inner.started.swap(true, Ordering::Relaxed) {
            return;
        }
        let _ = self.inner.inbox.set(inbox);
        let _ = self.inner.engine.set(engine);
        tokio::spawn(heartbeat(self.clone(), shutdown.clone()));
        if let Some(rx) = self
            .inner
            .replicator_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            tokio::spawn(replicate::run(self.clone(), rx, shutdown.clone()));
        }
        tokio::spawn(forward::listen(self.clone(), shutdown));
    }

    /// The replication state of a session this node owns.
    pub(crate) fn replica(&self, handle: &SessionHandle) -> Arc<SessionReplica> {
        SessionReplica::new(handle, self.inner.replicator.clone())
    }

    /// Records whether Redis answered, logging the changes.
    pub(crate) fn note(&self, ok: bool) {
        if !ok {
            self.inner.failures.fetch_add(1, Ordering::AcqRel);
            // Idle reader connections may be to a Redis that is gone.
            self.inner
                .readers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
        let was = self.inner.up.swap(ok, Ordering::Relaxed);
        if was != ok {
            self.inner.metrics.cluster.set_up(ok);
            if ok {
                tracing::info!(url = %self.inner.url, "cluster: Redis reachable again");
            } else {
                tracing::warn!(
                    url = %self.inner.url,
                    "cluster: Redis unreachable; local sessions go on, requests for other \
                     nodes' sessions get 503 until it answers"
                );
            }
        }
    }

    /// Runs a command on the shared connection, noting the outcome.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut conn = self.inner.conn.clone();
        let r = cmd.query_async(&mut conn).await;
        self.note(
            r.as_ref()
                .map_or_else(|e| !is_connection_error(e), |_| true),
        );
        r
    }

    /// Runs a pipeline on the shared connection, noting the outcome.
    pub(crate) async fn query_pipe<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        let mut conn = self.inner.conn.clone();
        let r = pipe.query_async(&mut conn).await;
        self.note(
            r.as_ref()
                .map_or_else(|e| !is_connection_error(e), |_| true),
        );
        r
    }

    /// A connection for one remote reader's `XREAD BLOCK`: an idle one an
    /// ended reader gave back, or a new one.
    /// Also says whether the connection was idle (it may have been closed
    /// by Redis since).
    pub(crate) async fn reader(
        &self,
    ) -> redis::RedisResult<(redis::aio::MultiplexedConnection, bool)> {
        let idle = self
            .inner
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        match idle {
            Some(c) => Ok((c, true)),
            None => Ok((self.dedicated().await?, false)),
        }
    }

    /// Keeps the connection of a reader that ended between two commands
    /// for the next reader (a connection dropped while an `XREAD BLOCK`
    /// was pending is never given back: its answer is still to come).
    pub(crate) fn give_back(&self, conn: redis::aio::MultiplexedConnection) {
        let mut idle = self.inner.readers.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_READERS {
            idle.push(conn);
        }
    }

    /// A connection of its own, for a command that blocks (`XREAD BLOCK`).
    pub(crate) async fn dedicated(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(None);
        let r = self
            .inner
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await;
        self.note(r.is_ok());
        r
    }

    /// Adds the refresh of this node's heartbeat key to `pipe`.
    fn heartbeat_into(&self, pipe: &mut redis::Pipeline) {
        pipe.cmd("SET")
            .arg(keys::node(self.inner.node))
            .arg(&self.inner.boot)
            .arg("PX")
            .arg(ms(NODE_TTL))
            .ignore();
    }

    /// The cluster epoch this node's sessions belong to.
    pub(crate) fn epoch(&self) -> String {
        self.inner
            .epoch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How long a record (and a session's events) outlive the owner's last
    /// write to them.
    pub(crate) fn record_ttl(&self) -> Duration {
        self.inner.options.idle_ttl.saturating_mul(2)
    }

    /// Writes the record of a session this node just opened (or
    /// re-opened: `previous` is the epoch it had, whose events are
    /// dropped). Awaited before the client learns the session id, so every
    /// node knows the session by the time the client can name it.
    pub(crate) async fn write_record(
        &self,
        handle: &SessionHandle,
        previous: Option<u64>,
    ) -> redis::RedisResult<()> {
        let id = handle.id();
        let key = keys::record(id);
        let tag = handle.cursor_now(0).tag;
        let mut pipe = redis::pipe();
        pipe.atomic();
        // The owner is alive for whoever reads the record.
        self.heartbeat_into(&mut pipe);
        if let Some(old) = previous {
            pipe.cmd("DEL").arg(keys::events(id, old)).ignore();
        }
        pipe.cmd("DEL").arg(&key).ignore();
        let mut hset = redis::cmd("HSET");
        hset.arg(&key)
            .arg("owner")
            .arg(self.inner.node)
            .arg("boot")
            .arg(&self.inner.boot)
            .arg("tag")
            .arg(format!("{tag:x}"))
            .arg("epoch")
            .arg(format!("{:x}", handle.epoch()))
            .arg("cepoch")
            .arg(self.epoch());
        if let Some(p) = handle.principal() {
            hset.arg("principal").arg(p);
        }
        pipe.add_command(hset).ignore();
        pipe.cmd("PEXPIRE")
            .arg(&key)
            .arg(ms(self.record_ttl()))
            .ignore();
        self.query_pipe(&pipe).await
    }

    /// Deletes the record of session `id` (epoch `epoch`) if this node
    /// owns it: a `DELETE` answered 204 is gone on every node from then on
    /// (its end entry follows through the replicator).
    pub(crate) async fn drop_record(&self, id: SessionId, epoch: u64) -> redis::RedisResult<()> {
        DROP_RECORD
            .key(keys::record(id))
            .arg(&self.inner.boot)
            .arg(format!("{epoch:x}"))
            .invoke_async::<i64>(&mut self.inner.conn.clone())
            .await
            .inspect_err(|e| self.note(!is_connection_error(e)))
            .map(|_| self.note(true))
    }

    /// Ends session `id` (epoch `epoch`) in Redis: its record and events
    /// go.
    pub(crate) async fn forget(&self, id: SessionId, epoch: u64) {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL")
            .arg(keys::record(id))
            .arg(keys::events(id, epoch))
            .ignore();
        let _: redis::RedisResult<()> = self.query_pipe(&pipe).await;
    }

    /// The record of session `id`, if Redis has one of this cluster epoch.
    pub(crate) async fn record(&self, id: SessionId) -> redis::RedisResult<Option<Record>> {
        let fields: HashMap<String, Vec<u8>> = self
            .query(redis::cmd("HGETALL").arg(keys::record(id)))
            .await?;
        Ok(Record::parse(&fields).filter(|r| r.cepoch == self.epoch()))
    }

    /// The record of session `id` (if Redis has one of this cluster
    /// epoch) and whether its owner is alive, in one round trip.
    pub(crate) async fn record_and_owner(
        &self,
        id: SessionId,
    ) -> redis::RedisResult<Option<(Record, bool)>> {
        let r: Option<(Fields, Option<String>)> = RECORD_AND_OWNER
            .key(keys::record(id))
            .invoke_async(&mut self.inner.conn.clone())
            .await
            .inspect_err(|e| self.note(!is_connection_error(e)))?;
        self.note(true);
        Ok(r.and_then(|(fields, heartbeat)| {
            let record = Record::parse(&fields).filter(|r| r.cepoch == self.epoch())?;
            let alive = heartbeat.as_deref() == Some(record.boot.as_str());
            Some((record, alive))
        }))
    }
}

/// What a node that took a session over finds in Redis.
#[derive(Debug)]
pub(crate) struct Claimed {
    /// The stored blob of `initialize` parameters and requests in flight.
    pub(crate) init: Option<Vec<u8>>,
    /// The newest event Redis holds: the adopted session numbers on after
    /// it.
    pub(crate) high_water: u64,
    /// Every event Redis holds (id, payload), oldest first.
    pub(crate) events: Vec<(rewind_engine::EventId, Vec<u8>)>,
    /// Request streams whose close Redis holds.
    pub(crate) closed: std::collections::HashSet<u32>,
}

/// Makes this node the owner of a session whose owner had boot `old_boot`,
/// unless another node did first; returns the stored `init` field.
static CLAIM: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('HGET', KEYS[1], 'boot') ~= ARGV[1] then return false end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'boot', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local init = redis.call('HGET', KEYS[1], 'init')
if not init then return '' end
return init
",
    )
});

impl Cluster {
    /// Takes session `id` (record `record`, whose owner is gone) over:
    /// this node becomes its owner in Redis. `None` if another node took
    /// it first (or the record changed meanwhile).
    pub(crate) async fn claim(
        &self,
        id: SessionId,
        record: &Record,
    ) -> redis::RedisResult<Option<Claimed>> {
        let init: Option<Vec<u8>> = CLAIM
            .key(keys::record(id))
            .arg(&record.boot)
            .arg(self.inner.node)
            .arg(&self.inner.boot)
            .arg(ms(self.record_ttl()))
            .invoke_async(&mut self.inner.conn.clone())
            .await?;
        let Some(init) = init else {
            return Ok(None);
        };
        let key = keys::events(id, record.epoch);
        let all: redis::streams::StreamRangeReply = self
            .query(redis::cmd("XRANGE").arg(&key).arg("-").arg("+"))
            .await?;
        let mut claimed = Claimed {
            init: (!init.is_empty()).then_some(init),
            high_water: 0,
            events: Vec::new(),
            closed: std::collections::HashSet::new(),
        };
        for e in &all.ids {
            let Some((seq, k)) =
                e.id.split_once('-')
                    .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
            else {
                continue;
            };
            claimed.high_water = claimed.high_water.max(seq);
            let field = |name: &str| match e.map.get(name) {
                Some(redis::Value::BulkString(b)) => Some(b.clone()),
                _ => None,
            };
            if k == 0 {
                let ev = field("i")
                    .and_then(|i| String::from_utf8(i).ok())
                    .and_then(|i| rewind_engine::EventId::parse(&i).ok());
                if let (Some(ev), Some(d)) = (ev, field("d")) {
                    claimed.events.push((ev, d));
                }
            } else if field("c").as_deref() == Some(b"close") {
                if let Some(s) = field("s")
                    .and_then(|s| String::from_utf8(s).ok())
                    .and_then(|s| s.parse().ok())
                {
                    claimed.closed.insert(s);
                }
            }
        }
        self.inner.metrics.cluster.took_over();
        Ok(Some(claimed))
    }
}

/// A session's record and its owner's heartbeat (a key outside `KEYS`:
/// one Redis, or a proxy that routes by the first key; see
/// `docs/cluster.md` for Redis Cluster).
static RECORD_AND_OWNER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local f = redis.call('HGETALL', KEYS[1])
if #f == 0 then return false end
local owner
for i = 1, #f, 2 do if f[i] == 'owner' then owner = f[i + 1] end end
local hb = false
if owner then hb = redis.call('GET', 'rewind:node:' .. owner) end
return {f, hb}
",
    )
});

/// Deletes a record if it names this node's boot and the epoch given.
static DROP_RECORD: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('HGET', KEYS[1], 'boot') == ARGV[1]
  and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// A Redis hash as read back.
type Fields = HashMap<String, Vec<u8>>;

/// A session's record, as read back.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) owner: u16,
    pub(crate) boot: String,
    pub(crate) tag: u64,
    pub(crate) epoch: u64,
    pub(crate) principal: Option<String>,
    cepoch: String,
}

impl Record {
    fn parse(f: &HashMap<String, Vec<u8>>) -> Option<Record> {
        let text = |k: &str| f.get(k).and_then(|v| std::str::from_utf8(v).ok());
        Some(Record {
            owner: text("owner")?.parse().ok()?,
            boot: text("boot")?.to_owned(),
            tag: u64::from_str_radix(text("tag")?, 16).ok()?,
            epoch: u64::from_str_radix(text("epoch")?, 16).ok()?,
            principal: text("principal").map(str::to_owned),
            cepoch: text("cepoch")?.to_owned(),
        })
    }
}

/// Whether `e` says Redis could not be reached (rather than that it
/// refused one command).
pub(crate) fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

enum Claim {
    Redis(redis::RedisError),
    Taken,
}

async fn try_claim(conn: &mut ConnectionManager, n: u16, boot: &str) -> Result<bool, Claim> {
    let set: Option<String> = redis::cmd("SET")
        .arg(keys::node(n))
        .arg(boot)
        .arg("NX")
        .arg("PX")
        .arg(ms(NODE_TTL))
        .query_async(conn)
        .await
        .map_err(Claim::Redis)?;
    Ok(set.is_some())
}

/// Claims node id `n`, waiting out the heartbeat of an earlier process
/// with the same id (a restart after a crash).
async fn claim_configured(conn: &mut ConnectionManager, n: u16, boot: &str) -> Result<u16, Claim> {
    let deadline = tokio::time::Instant::now() + 2 * NODE_TTL;
    loop {
        if try_claim(conn, n, boot).await? {
            return Ok(n);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Claim::Taken);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Claims the next node id without a live heartbeat.
async fn claim_any(conn: &mut ConnectionManager, boot: &str) -> Result<u16, Claim> {
    for _ in 0..65535 {
        let v: u64 = redis::cmd("INCR")
            .arg(keys::NODE_COUNTER)
            .query_async(conn)
            .await
            .map_err(Claim::Redis)?;
        let n = u16::try_from((v.saturating_sub(1)) % 65535 + 1).unwrap_or(1);
        if try_claim(conn, n, boot).await? {
            return Ok(n);
        }
    }
    Err(Claim::Taken)
}

impl Cluster {
    /// Whether Redis was unreachable since the cluster epoch was last
    /// checked: it may have lost its data meanwhile.
    pub(crate) fn suspect(&self) -> bool {
        self.inner.failures.load(Ordering::Acquire) != self.inner.verified.load(Ordering::Acquire)
    }

    /// Before serving a local session: if Redis was unreachable since the
    /// cluster epoch was last checked, checks it now, so that a session of
    /// an epoch Redis lost is ended before anything of it is replayed. If
    /// Redis is still unreachable, nothing can be checked and local
    /// sessions go on.
    pub(crate) async fn verify_if_suspect(&self) {
        // The shared connection may still be the one Redis dropped: its
        // first command fails and it reconnects; the second one checks.
        for _ in 0..2 {
            if !self.suspect() || self.check_epoch().await {
                return;
            }
        }
    }

    /// Refreshes this node's heartbeat and reads the cluster epoch
    /// (creating it if Redis lost it), in one round trip; if the epoch
    /// changed, ends every session of this node. The heartbeat goes first:
    /// a Redis that lost its data must learn that this node lives before
    /// anything of its new sessions is asked of it.
    async fn check_epoch(&self) -> bool {
        let failures = self.inner.failures.load(Ordering::Acquire);
        let mut pipe = redis::pipe();
        self.heartbeat_into(&mut pipe);
        pipe.cmd("SET")
            .arg(keys::EPOCH)
            .arg(random_hex())
            .arg("NX")
            .ignore();
        pipe.cmd("GET").arg(keys::EPOCH);
        let Ok((epoch,)) = self.query_pipe::<(String,)>(&pipe).await else {
            return false;
        };
        let changed = {
            let mut mine = self.inner.epoch.lock().unwrap_or_else(|e| e.into_inner());
            let changed = *mine != epoch;
            *mine = epoch;
            changed
        };
        if changed {
            let ended = self.inner.engine.get().map_or(0, Engine::close_all);
            self.inner.metrics.cluster.epoch_changed();
            tracing::warn!(
                sessions = ended,
                "cluster: the cluster epoch changed (Redis lost its data); every session this \
                 node held has ended, and no cursor minted before is ever replayed"
            );
        }
        self.inner.verified.fetch_max(failures, Ordering::AcqRel);
        true
    }
}

/// Refreshes this node's heartbeat and watches the cluster epoch.
async fn heartbeat(cluster: Cluster, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let node_key = keys::node(cluster.inner.node);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        cluster.check_epoch().await;
    }
    // A clean stop: the node is gone now, not in three seconds.
    let _: redis::RedisResult<()> = cluster.query(redis::cmd("DEL").arg(&node_key)).await;
}
