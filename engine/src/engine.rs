//! The engine: opens sessions, appends events, ends sessions, keeps budgets.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, ConfigError};
use crate::id::{EventId, SessionId, TagKey};
use crate::metrics::{Counter, Metrics, MetricsSnapshot};
use crate::policy::{NativePolicy, Policy};
use crate::replay::Replay;
use crate::ring::{AppendError as RingAppendError, SessionRing};
use crate::session::{Registry, Session};

/// The engine: a registry of sessions, each with its own replay ring.
///
/// Cheap to clone (an `Arc`); all methods take `&self` and may be called
/// from any thread. No method blocks on a lock; none needs an async runtime.
#[derive(Clone)]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) tag_key: TagKey,
    /// The first epoch of this engine; any epoch below it was minted by an
    /// earlier incarnation of the process.
    pub(crate) boot_epoch: u64,
    /// Next epoch to hand out. Only grows.
    next_epoch: AtomicU64,
    pub(crate) registry: Registry,
    pub(crate) metrics: Metrics,
    pub(crate) policy: Arc<dyn Policy>,
    clock_origin: coarsetime::Instant,
    ring_bytes: u64,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("boot_epoch", &self.shared.boot_epoch)
            .field("policy", &self.shared.policy.name())
            .field("registry", &self.shared.registry)
            .finish_non_exhaustive()
    }
}

/// Why a session could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenError {
    /// The global byte budget is full and no session could be evicted.
    OverBudget {
        /// Bytes held now.
        held: u64,
        /// The configured budget.
        budget: u64,
    },
    /// A session with this id is already live (only [`Engine::reopen`] of
    /// the same id racing with itself, or a broken random source).
    IdTaken,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::OverBudget { held, budget } => {
                write!(
                    f,
                    "global byte budget full ({held} of {budget} bytes) and nothing to evict"
                )
            }
            OpenError::IdTaken => f.write_str("a session with this id is already live"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Why an append was refused. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppendError {
    /// The payload can never fit the session's ring.
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The largest payload the ring accepts.
        max: usize,
    },
    /// The session has ended (closed, expired or evicted).
    SessionEnded,
    /// The stream id is reserved.
    BadStream,
}

impl fmt::Display for AppendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppendError::TooLarge { len, max } => {
                write!(
                    f,
                    "event of {len} bytes exceeds the per-event limit of {max} bytes"
                )
            }
            AppendError::SessionEnded => f.write_str("the session has ended"),
            AppendError::BadStream => f.write_str("stream id u32::MAX is reserved"),
        }
    }
}

impl std::error::Error for AppendError {}

/// Why a session ended; reported by [`Engine::sweep`] and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReason {
    Closed,
    Expired,
    Evicted,
}

impl Engine {
    /// An engine with `config` and the native reference policy.
    pub fn new(config: Config) -> Result<Engine, ConfigError> {
        Engine::with_policy(config, Arc::new(NativePolicy))
    }

    /// An engine that asks `policy` on every resume.
    pub fn with_policy(config: Config, policy: Arc<dyn Policy>) -> Result<Engine, ConfigError> {
        config.validate()?;
        let boot_epoch = config.boot_epoch.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_micros() as u64)
        });
        let ring_bytes = SessionRing::memory_bytes_for(config.ring()) as u64;
        Ok(Engine {
            shared: Arc::new(Shared {
                tag_key: config.tag_key.unwrap_or_else(TagKey::random),
                boot_epoch,
                next_epoch: AtomicU64::new(boot_epoch),
                registry: Registry::new(),
                metrics: Metrics::new(),
                policy,
                clock_origin: coarsetime::Instant::now_without_cache_update(),
                ring_bytes,
                config,
            }),
        })
    }

    /// The configuration this engine runs with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The policy this engine asks.
    pub fn policy(&self) -> &Arc<dyn Policy> {
        &self.shared.policy
    }

    /// The first epoch of this engine: epochs below it come from an earlier
    /// incarnation of the process.
    pub fn boot_epoch(&self) -> u64 {
        self.shared.boot_epoch
    }

    /// Opens a session with a fresh id, optionally bound to a principal.
    pub fn open(&self, principal: Option<&str>) -> Result<SessionHandle, OpenError> {
        self.shared.open(SessionId::generate(), principal)
    }

    /// Starts a new incarnation of the session `id`: the old one (if live)
    /// ends and its events are gone; the new one has a new epoch, so cursors
    /// of the old one are recognised as an older epoch.
    pub fn reopen(
        &self,
        id: SessionId,
        principal: Option<&str>,
    ) -> Result<SessionHandle, OpenError> {
        if let Some(old) = self.shared.registry.get(id) {
            self.shared.end(&old, EndReason::Closed);
        }
        self.shared.open(id, principal)
    }

    /// The live session `id`, if there is one. Counts as activity.
    pub fn session(&self, id: SessionId) -> Option<SessionHandle> {
        let now = self.shared.now_ms();
        let session = self.shared.live(id, now)?;
        session.touch(now);
        Some(SessionHandle {
            session,
            shared: self.shared.clone(),
        })
    }

    /// Ends the session `id`: its buffer is released (once the last reader
    /// lets go) and its id can never resume. Returns whether it was live.
    pub fn close(&self, id: SessionId) -> bool {
        match self.shared.registry.get(id) {
            Some(s) => self.shared.end(&s, EndReason::Closed),
            None => false,
        }
    }

    /// Ends every session idle for longer than the TTL; returns how many.
    /// Call it periodically (the server does, once a second); lookups also
    /// treat an expired session as gone even before a sweep removes it.
    pub fn sweep(&self) -> usize {
        let now = self.shared.now_ms();
        let mut expired = Vec::new();
        self.shared.registry.for_each(|s| {
            if self.shared.is_expired(s, now) {
                expired.push(s.clone());
            }
        });
        expired
            .iter()
            .filter(|s| self.shared.end(s, EndReason::Expired))
            .count()
    }

    /// The counters, summed now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }
}

impl Shared {
    /// Milliseconds since the engine started, from a coarse clock (a few ns
    /// to read, ~1–4 ms resolution): fine for TTLs and ages, cheap enough
    /// for every append. `now_without_cache_update`: plain `now()` also
    /// stores into a process-wide atomic, which would make every append on
    /// every core write one shared cache line.
    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        coarsetime::Instant::now_without_cache_update()
            .duration_since(self.clock_origin)
            .as_millis()
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.config.idle_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn is_expired(&self, s: &Session, now_ms: u64) -> bool {
        now_ms.saturating_sub(s.last_active_ms.load(Ordering::Relaxed)) > self.ttl_ms()
    }

    /// The session `id` if it is live and not past its TTL (an expired one
    /// is ended on the spot).
    /// `now_ms` is the caller's clock reading, so one request reads the
    /// clock once.
    pub(crate) fn live(&self, id: SessionId, now_ms: u64) -> Option<Arc<Session>> {
        let s = self.registry.get(id)?;
        if s.is_ended() {
            return None;
        }
        if self.is_expired(&s, now_ms) {
            self.end(&s, EndReason::Expired);
            return None;
        }
        Some(s)
    }

    fn open(
        self: &Arc<Self>,
        id: SessionId,
        principal: Option<&str>,
    ) -> Result<SessionHandle, OpenError> {
        self.reserve_bytes()?;
        // Relaxed: uniqueness comes from the RMW itself; nothing else is
        // published through this counter.
        let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let ring = SessionRing::new(self.config.ring());
        let session = Arc::new(Session::new(
            id,
            self.tag_key.tag(id),
            epoch,
            principal,
            now,
            ring,
        ));
        if !self.registry.insert(session.clone()) {
            self.metrics
                .bytes_held
                .fetch_sub(self.ring_bytes, Ordering::Relaxed);
            return Err(OpenError::IdTaken);
        }
        self.metrics.sessions_live.fetch_add(1, Ordering::Relaxed);
        self.metrics.add(Counter::SessionsOpened, 1);
        Ok(SessionHandle {
            session,
            shared: self.clone(),
        })
    }

    /// Accounts one more ring against the global budget, evicting the least
    /// recently active sessions if it would not fit.
    fn reserve_bytes(&self) -> Result<(), OpenError> {
        let budget = self.config.global_bytes;
        let need = self.ring_bytes;
        let reserved = |held: u64| (held + need <= budget).then_some(held + need);
        for _ in 0..4 {
            let held = self.metrics.bytes_held.load(Ordering::Relaxed);
            match reserved(held) {
                Some(new) => {
                    if self
                        .metrics
                        .bytes_held
                        .compare_exchange(held, new, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Ok(());
                    }
                }
                None => {
                    if self.evict_for(need) == 0 {
                        break;
                    }
                }
            }
        }
        // Last attempt after evictions (or under heavy contention).
        self.metrics
            .bytes_held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, reserved)
            .map(|_| ())
            .map_err(|held| OpenError::OverBudget { held, budget })
    }

    /// Evicts least recently active sessions until `need` bytes are free
    /// (plus a sixteenth of the budget of slack, so the O(sessions) scan is
    /// amortised over many opens). Returns how many sessions it ended.
    fn evict_for(&self, need: u64) -> usize {
        let budget = self.config.global_bytes;
        let target_free = (need + budget / 16).min(budget);
        let mut candidates = Vec::new();
        self.registry
            .for_each(|s| candidates.push((s.last_active_ms.load(Ordering::Relaxed), s.clone())));
        candidates.sort_unstable_by_key(|(t, _)| *t);
        let mut ended = 0;
        for (_, s) in candidates {
            let held = self.metrics.bytes_held.load(Ordering::Relaxed);
            if budget.saturating_sub(held) >= target_free {
                break;
            }
            if self.end(&s, EndReason::Evicted) {
                ended += 1;
            }
        }
        ended
    }

    /// Ends `s` once; the first caller unregisters it and returns its bytes
    /// to the budget. Returns whether this call ended it.
    pub(crate) fn end(&self, s: &Arc<Session>, why: EndReason) -> bool {
        if !s.end() {
            return false;
        }
        self.registry.remove(s);
        self.metrics
            .bytes_held
            .fetch_sub(self.ring_bytes, Ordering::Relaxed);
        self.metrics.sessions_live.fetch_sub(1, Ordering::Relaxed);
        self.metrics.add(
            match why {
                EndReason::Closed => Counter::SessionsClosed,
                EndReason::Expired => Counter::SessionsExpired,
                EndReason::Evicted => Counter::SessionsEvicted,
            },
            1,
        );
        true
    }
}

/// A live session: append to it, open streams on it, read it.
///
/// Holding a handle keeps the session's memory alive but not the session:
/// after it ends (closed, expired, evicted) appends fail with
/// [`AppendError::SessionEnded`] and readers stop.
#[derive(Clone)]
pub struct SessionHandle {
    pub(crate) session: Arc<Session>,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.session, f)
    }
}

impl SessionHandle {
    /// The session's id (the credential clients present).
    pub fn id(&self) -> SessionId {
        self.session.id
    }

    /// The session's epoch (incarnation).
    pub fn epoch(&self) -> u64 {
        self.session.epoch
    }

    /// Whether the session has ended.
    pub fn is_ended(&self) -> bool {
        self.session.is_ended()
    }

    /// A new stream id, unique within the session (stream 0 is the
    /// session's standalone stream and is never returned). `None` after
    /// 2³² − 2 streams.
    pub fn new_stream(&self) -> Option<u32> {
        self.session.new_stream()
    }

    /// Appends an event to `stream` and returns its id. Takes no lock; any
    /// number of threads may append to one session at once. Wakes readers
    /// waiting on the session.
    #[inline]
    pub fn append(&self, stream: u32, payload: &[u8]) -> Result<EventId, AppendError> {
        let s = &*self.session;
        let refused = |e| {
            self.shared.metrics.add(Counter::AppendsRefused, 1);
            Err(e)
        };
        if stream == crate::session::NO_STREAM {
            return refused(AppendError::BadStream);
        }
        if s.is_ended() {
            return refused(AppendError::SessionEnded);
        }
        let now = self.shared.now_ms();
        let seq = match s.ring.append(stream, now, payload) {
            Ok(seq) => seq,
            Err(RingAppendError::TooLarge { len, max }) => {
                return refused(AppendError::TooLarge { len, max })
            }
        };
        s.touch(now);
        s.appended.notify(usize::MAX);
        self.shared.metrics.add_pair(
            Counter::Appends,
            1,
            Counter::AppendedBytes,
            payload.len() as u64,
        );
        Ok(s.event_id(stream, seq))
    }

    /// Marks the session active now (resets its idle TTL), e.g. while a
    /// client holds a stream open with nothing to send.
    pub fn touch(&self) {
        self.session.touch(self.shared.now_ms());
    }

    /// Opens a reader of `stream` that starts after everything appended so
    /// far: the live part of a fresh stream. Its [`Replay::position`] is the
    /// id to send as the stream's priming event; a client resuming from it
    /// gets exactly the events this reader would have delivered.
    pub fn subscribe(&self, stream: u32) -> Replay {
        let from = self.session.ring.high_water();
        Replay::new(self.session.clone(), self.shared.clone(), stream, from)
    }

    /// Opens a reader of `stream` positioned after `after`, an id this
    /// session incarnation issued (e.g. the position where an earlier
    /// reader of the stream stopped). `None` if `after` names another
    /// session, another incarnation, or a sequence number not issued yet:
    /// the engine never positions a reader by a cursor it did not mint for
    /// this session. Events after `after` that are no longer retained make
    /// the reader's first read [`ReplayError::Lagged`](crate::ReplayError).
    pub fn subscribe_from(&self, stream: u32, after: EventId) -> Option<Replay> {
        let s = &self.session;
        let mine = after.tag == s.tag && after.epoch == s.epoch && after.stream == stream;
        (mine && after.seq <= s.ring.high_water())
            .then(|| Replay::new(s.clone(), self.shared.clone(), stream, after.seq))
    }

    /// Opens a reader of `stream` from the first event the session ever
    /// appended: everything on the stream that is still retained, then live
    /// events. If older events of the session are gone, the first read is
    /// [`ReplayError::Lagged`](crate::ReplayError).
    pub fn subscribe_from_start(&self, stream: u32) -> Replay {
        Replay::new(self.session.clone(), self.shared.clone(), stream, 0)
    }

    /// The id of the newest event on the session (on any stream) as if it
    /// were on `stream`: a cursor meaning "everything after now".
    pub fn cursor_now(&self, stream: u32) -> EventId {
        self.session
            .event_id(stream, self.session.ring.high_water())
    }

    /// Ends the session (as [`Engine::close`]).
    pub fn close(&self) -> bool {
        self.shared.end(&self.session, EndReason::Closed)
    }

    /// Time since the session was opened.
    pub fn age(&self) -> Duration {
        Duration::from_millis(self.shared.now_ms().saturating_sub(self.session.opened_ms))
    }
}
