//! The engine: the public face of [`Shared`]. Opens sessions, finds them,
//! ends them, reports on them.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::config::{Config, ConfigError, SyncPolicy};
use crate::durable::RecoveryReport;
use crate::handle::{SessionHandle, SessionWriter};
use crate::id::SessionId;
use crate::metrics::{MetricsSnapshot, PoolReading};
use crate::policy::{NativePolicy, Policy};
use crate::session::EndReason;
use crate::shared::{OpenError, Shared};

/// The engine: a registry of sessions whose events live in one shared
/// segment pool.
///
/// Cheap to clone (an `Arc`); all methods take `&self` and may be called
/// from any thread. No method blocks on a lock on the append, replay or
/// resume paths; none needs an async runtime.
#[derive(Clone)]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("shared", &self.shared)
            .finish()
    }
}

impl Engine {
    /// An engine with `config` and the native reference policy.
    pub fn new(config: Config) -> Result<Engine, ConfigError> {
        Engine::with_policy(config, Arc::new(NativePolicy))
    }

    /// An engine that asks `policy` on every resume.
    ///
    /// With [`Config::data_dir`] set, opens (or creates) the directory,
    /// recovers the sessions it holds ([`Engine::recovery`] says what was
    /// found) and keeps it locked until the engine and every handle of it
    /// are dropped.
    pub fn with_policy(config: Config, policy: Arc<dyn Policy>) -> Result<Engine, ConfigError> {
        let shared = Arc::new(Shared::new(config, policy)?);
        if let (Some(_), SyncPolicy::EveryMs(ms)) = (&shared.durable, shared.config.sync) {
            spawn_syncer(Arc::downgrade(&shared), Duration::from_millis(ms));
        }
        Ok(Engine { shared })
    }

    /// What opening the data directory recovered; `None` for a heap
    /// engine.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.shared.durable.as_ref().map(|d| &d.report)
    }

    /// Journal writes and `msync`/`fdatasync` calls of the data directory
    /// that failed so far (0 for a heap engine).
    pub fn storage_errors(&self) -> u64 {
        self.shared.durable.as_ref().map_or(0, |d| {
            d.io_errors.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// Forces the data directory's pool and journal to the device now,
    /// whatever the sync policy (a no-op for a heap engine).
    pub fn sync(&self) -> std::io::Result<()> {
        self.shared.sync_durable()
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
    /// Refused when a session cap is reached ([`OpenError::retry_after`]
    /// says when to try again).
    pub fn open(&self, principal: Option<&str>) -> Result<SessionHandle, OpenError> {
        self.shared.open(SessionId::generate(), principal, false)
    }

    /// Opens a session, as [`open`](Self::open) does, whose events come
    /// from one writer: the returned [`SessionWriter`] (for an embedding
    /// whose output for a session is one task). Its appends skip the claim
    /// CAS that appends from any thread need; see [`SessionWriter`] for
    /// what else changes.
    pub fn open_single_writer(&self, principal: Option<&str>) -> Result<SessionWriter, OpenError> {
        self.shared
            .open(SessionId::generate(), principal, true)
            .map(SessionWriter::new)
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
        self.shared.open(id, principal, false)
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

    /// The live sessions restored from the data directory at start (none
    /// for a heap engine), so the embedding can rebuild its own state for
    /// each from [`SessionHandle::stored_init`]. Does not count as
    /// activity.
    pub fn restored_sessions(&self) -> Vec<SessionHandle> {
        let now = self.shared.now_ms();
        let mut out = Vec::new();
        self.shared.registry.for_each(|s| {
            if s.restored.is_some() && !self.shared.is_expired(s, now) {
                out.push(SessionHandle {
                    session: s.clone(),
                    shared: self.shared.clone(),
                });
            }
        });
        out
    }

    /// Ends the session `id`: its events are released and its id can never
    /// resume. Returns whether it was live.
    pub fn close(&self, id: SessionId) -> bool {
        match self.shared.registry.get(id) {
            Some(s) => self.shared.end(&s, EndReason::Closed),
            None => false,
        }
    }

    /// Opens session `id` with the owner tag and epoch it had on another
    /// engine, its events numbered after `after_seq`: a cluster node taking
    /// over the session of a node that died, whose events up to
    /// `after_seq` the shared tier holds. Ids this engine mints for it
    /// carry this engine's [`Config::node`], so a cursor names which node
    /// appended its event; cursors at or below `after_seq` are before this
    /// engine's window (the embedding serves them from the shared tier).
    /// [`OpenError::IdTaken`] if the engine holds the id already;
    /// [`OpenError::PoolFull`] if the pool has no room for a first segment.
    pub fn adopt(
        &self,
        id: SessionId,
        tag: u64,
        epoch: u64,
        principal: Option<&str>,
        after_seq: u64,
    ) -> Result<SessionHandle, OpenError> {
        self.shared.adopt(id, tag, epoch, principal, after_seq)
    }

    /// Ends every live session (as [`Engine::close`] each); returns how
    /// many ended. For an embedding whose sessions were all invalidated at
    /// once, e.g. a cluster whose shared tier lost its data.
    pub fn close_all(&self) -> usize {
        let mut all = Vec::new();
        self.shared.registry.for_each(|s| all.push(s.clone()));
        all.iter()
            .filter(|s| self.shared.end(s, EndReason::Closed))
            .count()
    }

    /// This engine's node number ([`Config::node`]; 0 for a single engine).
    pub fn node(&self) -> u16 {
        self.shared.config.node
    }

    /// Ends every session idle for longer than the TTL, frees segments
    /// whose last writer has finished since their session ended, makes
    /// room ahead of need when the pool is nearly full, and gives back to
    /// the operating system the memory of pool segments that stayed free
    /// since the previous sweep (so after a burst, resident memory falls
    /// back to what sessions hold within two sweeps; a durable pool's file
    /// pages are left alone). Returns how many sessions expired. Call it
    /// periodically (the server does, once a second); lookups also treat an
    /// expired session as gone even before a sweep ends it.
    pub fn sweep(&self) -> usize {
        self.shared.sweep()
    }

    /// The counters, summed now. Walks the live sessions (to derive the
    /// number of events appended), so it costs O(sessions): fine for a
    /// metrics scrape, not for a hot loop.
    pub fn metrics(&self) -> MetricsSnapshot {
        let pool = &self.shared.pool;
        self.shared.metrics.snapshot(
            self.shared.live_appends(),
            PoolReading {
                capacity_bytes: pool.capacity_bytes(),
                free_bytes: pool.free_bytes(),
                released_bytes: pool.released_bytes(),
                append_stalls: pool.append_stalls(),
            },
        )
    }
}

/// The `EveryMs` sync policy: a thread that forces the pool and the journal
/// to the device every `period`, until the engine is gone.
fn spawn_syncer(shared: Weak<Shared>, period: Duration) {
    let spawned = std::thread::Builder::new()
        .name("rewind-sync".to_owned())
        .spawn(move || loop {
            std::thread::sleep(period);
            let Some(shared) = shared.upgrade() else {
                return;
            };
            // Counted by `sync_durable` on failure.
            let _ = shared.sync_durable();
        });
    // Without the thread the policy degrades to `None`; the data is still
    // written back by the kernel.
    drop(spawned);
}
