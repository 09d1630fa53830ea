//! The state every handle of an engine shares, and the operations that
//! change which sessions exist: open (with admission), end, expiry,
//! eviction under pool pressure. Defined and implemented here only.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Clock;
use crate::config::{Config, ConfigError, SyncPolicy};
use crate::durable::journal::Record;
use crate::durable::{DataDir, RecoveryReport};
use crate::handle::SessionHandle;
use crate::id::{SessionId, TagKey};
use crate::metrics::{Counter, Metrics};
use crate::policy::Policy;
use crate::session::{EndReason, Registry, Session};
use crate::storage::{Deferred, FrameCheck, Pool, Retention, TRIM_PER_PASS};
use crate::sync::Spin;

/// Why a session could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenError {
    /// As many sessions are live as [`Config::max_sessions`] allows.
    TooManySessions {
        /// The cap.
        cap: usize,
        /// A hint for the client (HTTP `Retry-After`).
        retry_after: Duration,
    },
    /// The principal holds as many sessions as
    /// [`Config::max_sessions_per_principal`] allows.
    PrincipalLimit {
        /// The cap.
        cap: usize,
        /// A hint for the client (HTTP `Retry-After`).
        retry_after: Duration,
    },
    /// A session with this id is already live (only [`Engine::reopen`] of
    /// the same id racing with itself, or a broken random source).
    ///
    /// [`Engine::reopen`]: crate::Engine::reopen
    IdTaken,
    /// The session journal of the data directory could not be written (a
    /// full disk, an I/O error): the session would not survive a restart,
    /// so it was not opened.
    Journal {
        /// The kind of the I/O error.
        kind: std::io::ErrorKind,
    },
    /// The pool had no room for the first segment of an adopted session
    /// ([`Engine::adopt`](crate::Engine::adopt)).
    PoolFull,
}

impl OpenError {
    /// How long a refused client should wait before trying again, if the
    /// refusal is about load.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            OpenError::TooManySessions { retry_after, .. }
            | OpenError::PrincipalLimit { retry_after, .. } => Some(*retry_after),
            OpenError::PoolFull => Some(*retry_after_pool()),
            OpenError::IdTaken | OpenError::Journal { .. } => None,
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::TooManySessions { cap, .. } => {
                write!(f, "{cap} sessions are live, the most max_sessions allows")
            }
            OpenError::PrincipalLimit { cap, .. } => write!(
                f,
                "this principal holds {cap} sessions, the most max_sessions_per_principal allows"
            ),
            OpenError::IdTaken => f.write_str("a session with this id is already live"),
            OpenError::Journal { kind } => {
                write!(f, "the session journal could not be written: {kind}")
            }
            OpenError::PoolFull => f.write_str("the event pool has no room for another session"),
        }
    }
}

impl std::error::Error for OpenError {}

/// What a refused client is told to wait: about how long sessions take to
/// come and go. A hint, not a promise.
const RETRY_AFTER: Duration = Duration::from_secs(5);

fn retry_after_pool() -> &'static Duration {
    &RETRY_AFTER
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
    pub(crate) clock: Clock,
    pub(crate) pool: Pool,
    pub(crate) keep: Retention,
    /// [`Config::idle_ttl`] in milliseconds, converted once: every lookup
    /// of a live session compares against it.
    ttl_ms: u64,
    /// [`Config::max_resume_age`] as the policy sees it (0: not set),
    /// converted once: every resume hands it to the policy.
    pub(crate) max_resume_age_ms: u64,
    /// Live sessions per principal (only principals that hold one).
    principals: Mutex<HashMap<Box<str>, usize>>,
    /// Segments of ended sessions that a writer was still filling.
    deferred: Mutex<Vec<Deferred>>,
    /// One reclaimer at a time; the others wait for it.
    reclaiming: AtomicBool,
    /// The data directory, for a durable pool.
    pub(crate) durable: Option<Durable>,
}

/// A durable engine's data directory and what opening it found.
#[derive(Debug)]
pub(crate) struct Durable {
    pub(crate) dir: DataDir,
    pub(crate) report: RecoveryReport,
    /// `msync` before every append returns.
    pub(crate) sync_each_append: bool,
    /// What each frame's check covers, by the pool file's format.
    pub(crate) frame_check: FrameCheck,
    /// Journal writes and syncs that failed.
    pub(crate) io_errors: AtomicU64,
    /// The blobs live sessions stored ([`SessionHandle::store_init`]), by
    /// session id: what a rewrite of the journal must carry over.
    pub(crate) inits: Mutex<HashMap<u128, Box<[u8]>>>,
    /// Unix milliseconds the engine clock counts from.
    pub(crate) clock_base_ms: u64,
}

/// Stream ids are journaled in blocks of this many: a session records
/// "ids below N may be in use" once per block, not once per stream.
pub(crate) const STREAM_BLOCK: u32 = 256;

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("boot_epoch", &self.boot_epoch)
            .field("policy", &self.policy.name())
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain maps and lists: consistent after any panic between statements.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Shared {
    /// A durable engine's clean close: the pool and the journal forced to
    /// the device, then the boot record marked closed cleanly (and that
    /// page forced too), so the next open — after a reboot as well — knows
    /// nothing was left unwritten and needs no full scan. If a sync fails,
    /// the record stays "open", and the next open after a machine restart
    /// is as careful as after a crash.
    fn drop(&mut self) {
        use crate::durable::header::{self, Boot, HEADER_BYTES};
        if self.durable.is_none() || self.sync_durable().is_err() {
            return;
        }
        let Some(map) = self.pool.backing_mut().mapped_file() else {
            return;
        };
        let page = &mut map[..HEADER_BYTES];
        if let Some(boot) = header::read_boot(page) {
            header::write_boot(
                page,
                Boot {
                    closed_cleanly: true,
                    ..boot
                },
            );
            let _ = map.flush_range(0, HEADER_BYTES);
        }
    }
}

impl Shared {
    pub(crate) fn new(config: Config, policy: Arc<dyn Policy>) -> Result<Shared, ConfigError> {
        config.validate()?;
        let Some(dir) = config.data_dir.clone() else {
            let boot_epoch = config.boot_epoch.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_micros() as u64)
            });
            let pool = Pool::new(config.pool_shape()).map_err(|e| ConfigError::PoolMemory {
                global_bytes: config.global_bytes,
                reason: e.to_string(),
            })?;
            return Ok(Shared::with(
                config,
                policy,
                pool,
                boot_epoch,
                Clock::new(),
                None,
            ));
        };
        let started = std::time::Instant::now();
        let shape = config.pool_shape();
        let sync_each_append = config.sync == SyncPolicy::EveryAppend;
        let opened =
            crate::durable::open(&dir, shape, sync_each_append).map_err(ConfigError::DataDir)?;
        // From the header page's last word: the allocation mark, then the
        // pool's words.
        let backing = crate::storage::backing::Backing::mapped(
            opened.map,
            crate::durable::header::MARK_OFFSET,
            shape.total_words() + 1,
        );
        let pool = Pool::over_marked(
            backing,
            shape,
            crate::storage::pool::MarkFormat::for_version(opened.dir.version),
        );
        let journaled: Vec<_> = opened.live.into_values().collect();
        let owners: Vec<_> = journaled
            .iter()
            .map(|j| crate::storage::Owner {
                tag: j.tag,
                epoch: j.epoch,
            })
            .collect();
        let frame_check = FrameCheck::for_version(opened.dir.version);
        let recovery =
            crate::storage::recover::recover(&pool, &owners, frame_check, opened.machine_restarted);
        let boot_epoch = opened.dir.boot_counter << crate::durable::EPOCH_SHIFT;
        let clock =
            Clock::starting_at(crate::durable::unix_ms().saturating_sub(opened.dir.clock_base_ms));
        let mut report = RecoveryReport {
            dir: dir.clone(),
            created: opened.created,
            boot_counter: opened.dir.boot_counter,
            events: recovery.events,
            bytes: recovery.bytes,
            damaged_frames: recovery.damaged_frames,
            dropped_segments: recovery.dropped_segments,
            unverified_headers: recovery.unverified_headers,
            torn_records: opened.torn_records,
            machine_restarted: opened.machine_restarted,
            unconfirmed_frames: recovery.unconfirmed_frames,
            scanned_units: recovery.scanned_units,
            ..RecoveryReport::default()
        };
        let durable = Durable {
            clock_base_ms: opened.dir.clock_base_ms,
            dir: opened.dir,
            report: RecoveryReport::default(),
            sync_each_append,
            frame_check,
            io_errors: AtomicU64::new(0),
            inits: Mutex::new(HashMap::new()),
        };
        let mut shared = Shared::with(config, policy, pool, boot_epoch, clock, Some(durable));
        let now = shared.now_ms();
        for (j, window) in journaled.into_iter().zip(recovery.windows) {
            let Some(window) = window else { continue };
            let Ok(id) = SessionId::parse(&format!("{:032x}", j.id)) else {
                continue;
            };
            if let (Some(blob), Some(d)) = (&j.init, &shared.durable) {
                lock(&d.inits).insert(j.id, blob.clone());
            }
            let session = Session::restored(
                id,
                j.tag,
                j.epoch,
                shared.config.node,
                j.principal,
                now,
                window,
                j.streams_below.saturating_add(STREAM_BLOCK),
                j.init,
            );
            if let Some(p) = session.principal.as_deref() {
                *lock(&shared.principals).entry(Box::from(p)).or_insert(0) += 1;
            }
            if shared.registry.insert(Arc::new(session)) {
                shared.metrics.sessions_live.fetch_add(1, Ordering::Relaxed);
                report.sessions += 1;
            }
        }
        report.ms = started.elapsed().as_millis() as u64;
        if let Some(d) = shared.durable.as_mut() {
            d.report = report;
        }
        Ok(shared)
    }

    fn with(
        config: Config,
        policy: Arc<dyn Policy>,
        pool: Pool,
        boot_epoch: u64,
        clock: Clock,
        durable: Option<Durable>,
    ) -> Shared {
        Shared {
            tag_key: config.tag_key.unwrap_or_else(TagKey::random),
            boot_epoch,
            next_epoch: AtomicU64::new(boot_epoch),
            registry: Registry::new(),
            metrics: Metrics::new(),
            policy,
            clock,
            pool,
            keep: config.retention(),
            ttl_ms: u64::try_from(config.idle_ttl.as_millis()).unwrap_or(u64::MAX),
            max_resume_age_ms: config.max_resume_age.map_or(0, |d| {
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
            }),
            principals: Mutex::new(HashMap::new()),
            deferred: Mutex::new(Vec::new()),
            reclaiming: AtomicBool::new(false),
            durable,
            config,
        }
    }

    /// Writes `record` to the journal of a durable engine (nothing for a
    /// heap engine).
    pub(crate) fn journal(&self, record: impl FnOnce() -> Record) -> std::io::Result<()> {
        let Some(d) = &self.durable else {
            return Ok(());
        };
        d.dir.journal.append(&record()).inspect_err(|_| {
            d.io_errors.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Forces the pool and the journal to the device (a durable engine's
    /// sync policy).
    pub(crate) fn sync_durable(&self) -> std::io::Result<()> {
        let Some(d) = &self.durable else {
            return Ok(());
        };
        let result = self.pool.sync().and_then(|()| d.dir.journal.sync());
        if result.is_err() {
            d.io_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn is_expired(&self, s: &Session, now_ms: u64) -> bool {
        now_ms.saturating_sub(s.last_active_ms.load(Ordering::Relaxed)) > self.ttl_ms
    }

    /// The session `id` if it is live and not past its TTL (an expired one
    /// is ended on the spot). `now_ms` is the caller's clock reading, so one
    /// request reads the clock once.
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

    pub(crate) fn open(
        self: &Arc<Self>,
        id: SessionId,
        principal: Option<&str>,
        single_writer: bool,
    ) -> Result<SessionHandle, OpenError> {
        self.admit(principal)?;
        // Relaxed: uniqueness comes from the RMW itself; nothing else is
        // published through this counter.
        let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
        let mut session = Session::new(
            id,
            self.tag_key.tag(id),
            epoch,
            self.config.node,
            principal,
            self.now_ms(),
        );
        if single_writer {
            session.window = crate::storage::Window::new_single();
        }
        self.register(session, principal)
    }

    /// Counts a session in against the caps (undone by `forget`).
    fn admit(&self, principal: Option<&str>) -> Result<(), OpenError> {
        let cap = self.config.max_sessions as u64;
        if self
            .metrics
            .sessions_live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            })
            .is_err()
        {
            self.metrics.add(Counter::SessionsRefused, 1);
            return Err(OpenError::TooManySessions {
                cap: self.config.max_sessions,
                retry_after: RETRY_AFTER,
            });
        }
        if let Some(p) = principal {
            let cap = self.config.max_sessions_per_principal;
            let mut map = lock(&self.principals);
            let n = map.entry(Box::from(p)).or_insert(0);
            if *n >= cap {
                drop(map);
                self.metrics.sessions_live.fetch_sub(1, Ordering::Relaxed);
                self.metrics.add(Counter::SessionsRefused, 1);
                return Err(OpenError::PrincipalLimit {
                    cap,
                    retry_after: RETRY_AFTER,
                });
            }
            *n += 1;
        }
        Ok(())
    }

    /// Opens session `id` with the tag and epoch it had on another engine
    /// (a cluster node that died), numbering its events after `after_seq`.
    pub(crate) fn adopt(
        self: &Arc<Self>,
        id: SessionId,
        tag: u64,
        epoch: u64,
        principal: Option<&str>,
        after_seq: u64,
    ) -> Result<SessionHandle, OpenError> {
        if self.registry.get(id).is_some() {
            return Err(OpenError::IdTaken);
        }
        self.admit(principal)?;
        let session = Session::new(id, tag, epoch, self.config.node, principal, self.now_ms());
        if session
            .window
            .start_after(
                &self.pool,
                session.owner(),
                self.keep.first_class,
                after_seq,
                session.opened_ms,
            )
            .is_err()
        {
            self.forget(principal);
            return Err(OpenError::PoolFull);
        }
        self.register(session, principal)
    }

    /// Puts an admitted session in the registry (and the journal).
    fn register(
        self: &Arc<Self>,
        session: Session,
        principal: Option<&str>,
    ) -> Result<SessionHandle, OpenError> {
        let (id, epoch) = (session.id, session.epoch);
        let session = Arc::new(session);
        if !self.registry.insert(session.clone()) {
            self.forget(principal);
            return Err(OpenError::IdTaken);
        }
        // Journaled before the handle exists, so before any append: a
        // session whose events reached the pool is always in the journal.
        let journaled = self.journal(|| Record::Open {
            id: id.bits(),
            tag: session.tag,
            epoch,
            created_unix_ms: crate::durable::unix_ms(),
            principal: principal.map(Box::from),
        });
        if let Err(e) = journaled {
            self.registry.remove(&session);
            self.forget(principal);
            return Err(OpenError::Journal { kind: e.kind() });
        }
        self.metrics.add(Counter::SessionsOpened, 1);
        Ok(SessionHandle {
            session,
            shared: self.clone(),
        })
    }

    /// Undoes the admission of a session that will not be live.
    fn forget(&self, principal: Option<&str>) {
        self.metrics.sessions_live.fetch_sub(1, Ordering::Relaxed);
        if let Some(p) = principal {
            let mut map = lock(&self.principals);
            if let Some(n) = map.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    map.remove(p);
                }
            }
        }
    }

    /// Ends `s` once: unregisters it, frees its segments, tells its
    /// attachment. Returns whether this call ended it.
    pub(crate) fn end(&self, s: &Arc<Session>, why: EndReason) -> bool {
        if !s.end() {
            return false;
        }
        self.registry.remove(s);
        // Before the segments are freed: a crash in between must not bring
        // back a session with part of its chain. A failed write is counted;
        // the session then comes back after a restart (with its events).
        let _ = self.journal(|| Record::Close {
            id: s.id.bits(),
            epoch: s.epoch,
        });
        if let Some(d) = &self.durable {
            lock(&d.inits).remove(&s.id.bits());
        }
        self.metrics
            .add(Counter::EndedAppends, s.window.high_water(&self.pool));
        let deferred = s.window.close(&self.pool);
        if !deferred.is_empty() {
            lock(&self.deferred).extend(deferred);
        }
        self.forget(s.principal.as_deref());
        self.metrics.add(
            match why {
                EndReason::Closed => Counter::SessionsClosed,
                EndReason::Expired => Counter::SessionsExpired,
                EndReason::Evicted => Counter::SessionsEvicted,
            },
            1,
        );
        s.tell_ended(why);
        true
    }

    /// Makes room in the pool for a segment of `class` (and some slack, a
    /// thirty-second of the pool, so the O(sessions) scan is amortised over
    /// many allocations): first ends sessions with no open reader and no
    /// call in flight, least recently active first; then, if that is not
    /// enough, releases the oldest segments of busy sessions (their lagging
    /// readers get a gap). Freed memory counts only once it can serve the
    /// class: a pool fragmented into small free segments is not room for a
    /// large one. Returns whether anything was freed.
    pub(crate) fn reclaim(&self, class: u8) -> bool {
        if self.reclaiming.swap(true, Ordering::Acquire) {
            // Someone else is at it: wait for them, then retry.
            let spin = Spin::new();
            while self.reclaiming.load(Ordering::Acquire) {
                spin.snooze();
            }
            return true;
        }
        self.retry_deferred();
        let pool = &self.pool;
        let slack = pool.capacity_bytes() / 32;
        let unit_bytes = pool.shape().unit_words as u64 * 8;
        let enough = |freed: u64| freed * unit_bytes >= slack && pool.has_room_for(class);
        // Units this pass freed; what it frees may be taken by other
        // appenders at once, so the pool's free count cannot tell.
        let mut freed = 0u64;
        let mut idle = Vec::new();
        self.registry.for_each(|s| {
            if s.busy.load(Ordering::Relaxed) == 0 && !s.window.is_empty() {
                idle.push((s.last_active_ms.load(Ordering::Relaxed), s.clone()));
            }
        });
        idle.sort_unstable_by_key(|(t, _)| *t);
        for (_, s) in idle {
            if enough(freed) {
                break;
            }
            let held = u64::from(s.window.held_units());
            if s.busy.load(Ordering::Relaxed) == 0 && self.end(&s, EndReason::Evicted) {
                freed += held;
            }
        }
        if !enough(freed) {
            let mut busy = Vec::new();
            self.registry.for_each(|s| {
                if s.window.held_units() > 1 {
                    busy.push((s.window.held_units(), s.clone()));
                }
            });
            busy.sort_unstable_by_key(|(units, _)| std::cmp::Reverse(*units));
            'all: for (_, s) in busy {
                loop {
                    let released = s.window.retain(pool, &self.keep, true);
                    if released == 0 {
                        break;
                    }
                    freed += u64::from(released);
                    if enough(freed) {
                        break 'all;
                    }
                }
            }
        }
        self.reclaiming.store(false, Ordering::Release);
        freed > 0
    }

    fn retry_deferred(&self) {
        let mut deferred = lock(&self.deferred);
        deferred.retain(|d| !d.try_free(&self.pool));
    }

    /// Ends expired sessions, brings windows kept for a reader back to
    /// their retention, frees deferred segments, makes room ahead of
    /// need when the pool is nearly full, and trims the pool (memory of
    /// segments free since the last sweep goes back to the OS). Returns the
    /// sessions ended.
    pub(crate) fn sweep(&self) -> usize {
        let now = self.now_ms();
        let mut expired = Vec::new();
        self.registry.for_each(|s| {
            if self.is_expired(s, now) {
                expired.push(s.clone());
            } else {
                // A window kept past its retention for a reader that held
                // its place goes back to its retention once the reader has
                // read on (or is gone), even if nothing is appended again.
                s.window.retain(&self.pool, &self.keep, false);
            }
        });
        let ended = expired
            .iter()
            .filter(|s| self.end(s, EndReason::Expired))
            .count();
        self.retry_deferred();
        if self.pool.free_bytes() < self.pool.capacity_bytes() / 32 {
            self.reclaim(0);
        }
        self.pool.trim(TRIM_PER_PASS);
        self.compact_journal();
        ended
    }

    /// Rewrites a durable engine's journal with only the live sessions once
    /// it has grown enough (see `journal::Journal::wants_compaction`).
    fn compact_journal(&self) {
        let Some(d) = &self.durable else { return };
        if !d.dir.journal.wants_compaction() {
            return;
        }
        let live = || {
            let inits = lock(&d.inits);
            let mut records = Vec::new();
            self.registry.for_each(|s| {
                if s.is_ended() {
                    return;
                }
                let id = s.id.bits();
                records.push(Record::Open {
                    id,
                    tag: s.tag,
                    epoch: s.epoch,
                    created_unix_ms: d.clock_base_ms + s.opened_ms,
                    principal: s.principal.clone(),
                });
                if let Some(blob) = inits.get(&id) {
                    records.push(Record::Init {
                        id,
                        epoch: s.epoch,
                        blob: blob.clone(),
                    });
                }
                // Every stream id handed out so far is below `next_stream`;
                // a restore starts a block above what this says.
                records.push(Record::Streams {
                    id,
                    epoch: s.epoch,
                    below: s.next_stream.load(Ordering::Relaxed),
                });
            });
            records
        };
        if d.dir.journal.compact(live).is_err() {
            d.io_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The sum of the live sessions' high-water marks.
    pub(crate) fn live_appends(&self) -> u64 {
        let mut total = 0;
        self.registry
            .for_each(|s| total += s.window.high_water(&self.pool));
        total
    }
}
