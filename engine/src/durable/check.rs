//! `rewind data check`: what a data directory holds, verified offline.
//!
//! The check runs the same recovery an engine runs at start, but on a
//! private copy-on-write mapping of the pool file: nothing it repairs
//! reaches the file, and the boot counter is not incremented.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::header::{self, HEADER_BYTES, MARK_OFFSET};
use super::{journal, DataDirError, JOURNAL_FILE, POOL_FILE};
use crate::storage::backing::Backing;
use crate::storage::pool::MarkFormat;
use crate::storage::{recover, Owner, Pool, PoolShape};

/// What [`check`] found in a data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckReport {
    /// The directory.
    pub dir: PathBuf,
    /// Whether another process holds the directory's lock (a running
    /// server): then the files may change while they are read, and what
    /// the check reports is a snapshot at best.
    pub locked: bool,
    /// The boot counter in the header (opens so far).
    pub boot_counter: u64,
    /// The pool's shape, in words.
    pub shape: String,
    /// The sessions a restart would restore.
    pub sessions: Vec<SessionSummary>,
    /// Journaled sessions whose segments could not be proven (a restart
    /// would not restore them).
    pub unprovable_sessions: usize,
    /// Events a restart would restore.
    pub events: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Frames whose mark was there but whose checksum failed (and the
    /// frames after them in their segment).
    pub damaged_frames: u64,
    /// Owned segments a restart would free (unreachable or behind damage).
    pub dropped_segments: u64,
    /// Owned segments among them whose header did not verify: allocated
    /// but not yet written when the process died (normal after a crash),
    /// or damaged since.
    pub unverified_headers: u64,
    /// Journal records skipped as torn or damaged.
    pub torn_records: usize,
    /// Whether writes of the directory's last open may have been lost with
    /// the machine (its boot record says it was not closed cleanly and
    /// names another kernel boot, or there is none): a restart now would
    /// read every unit and tell every unfinished frame as a gap.
    pub machine_restarted: bool,
    /// Unfinished frames a restart would tell as gaps (after a machine
    /// restart; see [`RecoveryReport::unconfirmed_frames`](super::RecoveryReport::unconfirmed_frames)).
    pub unconfirmed_frames: u64,
}

/// One session a restart would restore.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionSummary {
    /// Its id.
    pub id: String,
    /// Its epoch.
    pub epoch: u64,
    /// The principal it is bound to.
    pub principal: Option<String>,
    /// The oldest sequence number retained (`high_water + 1` when none).
    pub oldest: u64,
    /// The highest sequence number issued.
    pub high_water: u64,
    /// Whether the embedding stored initialize parameters with it.
    pub has_init: bool,
}

impl CheckReport {
    /// Whether nothing was damaged: no failed checksum, no torn journal
    /// record, no unprovable session.
    pub fn is_clean(&self) -> bool {
        self.damaged_frames == 0 && self.torn_records == 0 && self.unprovable_sessions == 0
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "data directory {}", self.dir.display())?;
        if self.locked {
            writeln!(
                f,
                "  locked: in use by another process (what follows may be changing)"
            )?;
        }
        writeln!(
            f,
            "  pool: {}; boot counter {}",
            self.shape, self.boot_counter
        )?;
        writeln!(
            f,
            "  {} sessions, {} events, {} bytes restorable",
            self.sessions.len(),
            self.events,
            self.bytes
        )?;
        if self.machine_restarted {
            writeln!(
                f,
                "  the machine restarted since the last open: {} unfinished frames would be told as gaps",
                self.unconfirmed_frames
            )?;
        }
        writeln!(
            f,
            "  damage: {} frames, {} torn journal records, {} unprovable sessions; \
             {} segments to free ({} with unverified headers)",
            self.damaged_frames,
            self.torn_records,
            self.unprovable_sessions,
            self.dropped_segments,
            self.unverified_headers
        )?;
        for s in &self.sessions {
            writeln!(
                f,
                "  session {} epoch {:x}{} events {}..={}{}",
                s.id,
                s.epoch,
                s.principal
                    .as_deref()
                    .map(|p| format!(" principal {p:?}"))
                    .unwrap_or_default(),
                s.oldest,
                s.high_water,
                if s.has_init { " (init stored)" } else { "" }
            )?;
        }
        f.write_str(if self.is_clean() { "ok" } else { "DAMAGED" })
    }
}

/// Verifies the data directory `dir` without changing it: header, lock,
/// journal records, segment chains and frame checksums.
///
/// An error means the directory cannot be used at all (no pool file, a
/// foreign or damaged header, a truncated file); damage a restart would
/// skip is reported in [`CheckReport`] ([`CheckReport::is_clean`]).
pub fn check(dir: &Path) -> Result<CheckReport, DataDirError> {
    let locked = match super::lock(dir) {
        Ok(lock) => {
            drop(lock);
            false
        }
        Err(DataDirError::Locked { .. }) => true,
        Err(e) => return Err(e),
    };
    let path = dir.join(POOL_FILE);
    let file = File::open(&path).map_err(|e| DataDirError::io(&path, "open", e))?;
    let len = file
        .metadata()
        .map_err(|e| DataDirError::io(&path, "stat", e))?
        .len();
    if len < HEADER_BYTES as u64 {
        return Err(DataDirError::Truncated {
            path,
            len,
            needed: HEADER_BYTES as u64,
        });
    }
    // SAFETY: a private (copy-on-write) mapping: our writes never reach the
    // file. Another process writing the file meanwhile (a running server;
    // reported as `locked`) can change what we read, never make it unsound
    // to read: every access goes through atomics of plain integers.
    let map = unsafe { memmap2::MmapOptions::new().map_copy(&file) }
        .map_err(|e| DataDirError::io(&path, "map", e))?;
    let (header, _) = super::read_header(&path, &map)?;
    let restarted = header::machine_restarted(
        header::read_boot(&map[..HEADER_BYTES]),
        header::current_boot(),
    );
    super::check_length(&path, &header, len)?;
    let shape = PoolShape {
        units: u32::try_from(header.units).unwrap_or(u32::MAX),
        unit_words: header.unit_words as usize,
        top_class: header.top_class.min(31) as u8,
    };
    let sane = shape.unit_words.is_power_of_two()
        && shape.unit_words >= 16
        && shape.total_words() as u64 * 8 == header.pool_bytes;
    if !sane {
        return Err(DataDirError::HeaderDamaged { path });
    }
    let journal_path = dir.join(JOURNAL_FILE);
    let bytes = match std::fs::read(&journal_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(DataDirError::io(&journal_path, "read", e)),
    };
    let scan = journal::scan(&bytes);
    let live: Vec<_> = journal::live(&scan.records).into_values().collect();
    let owners: Vec<Owner> = live
        .iter()
        .map(|j| Owner {
            tag: j.tag,
            epoch: j.epoch,
        })
        .collect();
    let pool = Pool::over_marked(
        Backing::mapped(map, MARK_OFFSET, shape.total_words() + 1),
        shape,
        MarkFormat::for_version(header.version),
    );
    let recovery = recover::recover(
        &pool,
        &owners,
        crate::storage::FrameCheck::for_version(header.version),
        restarted,
    );
    let mut sessions = Vec::new();
    let mut unprovable = 0;
    for (j, w) in live.iter().zip(&recovery.windows) {
        let Some(w) = w else {
            unprovable += 1;
            continue;
        };
        sessions.push(SessionSummary {
            id: format!("{:032x}", j.id),
            epoch: j.epoch,
            principal: j.principal.as_deref().map(str::to_owned),
            oldest: w.oldest_retained(&pool),
            high_water: w.high_water(&pool),
            has_init: j.init.is_some(),
        });
    }
    Ok(CheckReport {
        dir: dir.to_owned(),
        locked,
        boot_counter: header.boot_counter,
        shape: header.describe(),
        sessions,
        unprovable_sessions: unprovable,
        events: recovery.events,
        bytes: recovery.bytes,
        damaged_frames: recovery.damaged_frames,
        dropped_segments: recovery.dropped_segments,
        unverified_headers: recovery.unverified_headers,
        torn_records: scan.torn,
        machine_restarted: restarted,
        unconfirmed_frames: recovery.unconfirmed_frames,
    })
}
