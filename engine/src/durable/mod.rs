//! Durable pools: the segment pool in a memory-mapped file, a journal of
//! sessions beside it, and recovery of both after a restart or a crash.
//!
//! A data directory holds three files:
//!
//! - `LOCK`: held with an exclusive advisory lock (`flock`) while an engine
//!   has the directory open; a second opener is refused
//!   ([`DataDirError::Locked`]). The lock is what lets the mapping be
//!   treated as memory only this process writes.
//! - `pool`: a header page (`header.rs`) and then exactly the words a heap
//!   pool would hold (stamps, states, segments), mapped shared and
//!   writable. Appends write into the page cache; a crash of the process
//!   loses nothing that was written, a crash of the machine loses what was
//!   not yet written back (see [`SyncPolicy`]).
//! - `sessions.journal`: the journal of session incarnations (`journal.rs`).
//!
//! Opening a directory takes the lock, validates the header against the
//! configured pool shape, increments the boot counter (epochs of this boot
//! are `boot_counter << 40` onwards, so they never repeat across restarts,
//! whatever the clock does), reads and compacts the journal, and then
//! recovers every journaled session's window from the pool's segment
//! headers (`storage::recover`).
//!
//! [`SyncPolicy`]: crate::SyncPolicy

mod check;
mod error;
pub(crate) mod header;
pub(crate) mod journal;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

pub use check::{check, CheckReport};
pub use error::DataDirError;

use crate::storage::pool::MarkFormat;
use crate::storage::PoolShape;
use header::{FileHeader, HEADER_BYTES, MARK_OFFSET, OLDEST_READABLE, VERSION};
use journal::{Journal, Journaled};

/// Epochs of boot `n` start at `n << EPOCH_SHIFT`: a boot can open 2^40
/// sessions, a directory can be opened 2^24 times.
pub(crate) const EPOCH_SHIFT: u32 = 40;
const MAX_BOOTS: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;

pub(crate) const LOCK_FILE: &str = "LOCK";
pub(crate) const POOL_FILE: &str = "pool";
pub(crate) const JOURNAL_FILE: &str = "sessions.journal";

/// What recovery found and restored when an engine opened its data
/// directory: what a server logs at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// The data directory.
    pub dir: PathBuf,
    /// Whether the directory was new (nothing to recover).
    pub created: bool,
    /// This boot's counter (1 for a new directory).
    pub boot_counter: u64,
    /// Sessions restored live.
    pub sessions: usize,
    /// Events restored, over all sessions.
    pub events: u64,
    /// Payload bytes of those events.
    pub bytes: u64,
    /// Frames found damaged: their mark was there but their checksum
    /// failed. Each is replaced by a gap marker (readers get a `gap` at its
    /// number), or, where the segment's frames could not be laid out
    /// again, dropped with its segment and the older ones.
    pub damaged_frames: u64,
    /// Segments that were dropped: unreachable from a journaled session,
    /// or behind damage.
    pub dropped_segments: u64,
    /// Owned segments among them whose header did not verify: allocated
    /// but not yet written when the process died (normal after a crash),
    /// or damaged since.
    pub unverified_headers: u64,
    /// Journal records skipped as torn or damaged.
    pub torn_records: usize,
    /// Whether the machine may have restarted since the directory was last
    /// open (its boot record names another kernel boot, or none): writes
    /// the kernel had not yet put on the device may be lost, so recovery
    /// tells every frame it finds unfinished as a gap.
    pub machine_restarted: bool,
    /// Frames found without their completion mark after a machine restart:
    /// an append that never returned, or an acknowledged event whose words
    /// never reached the device — the two look the same, so each became a
    /// gap marker (readers get a `gap` at its number, and the number is
    /// not handed out again). After a crash of the process alone such
    /// frames are known to be unacknowledged and are skipped instead.
    pub unconfirmed_frames: u64,
    /// Pool units whose stamps recovery read: those at and above the
    /// pool's allocation mark, i.e. the most the pool ever held, not its
    /// configured size (every unit for a pool file made before the mark).
    pub scanned_units: u64,
    /// Milliseconds recovery took.
    pub ms: u64,
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.created {
            return write!(f, "{}: new data directory", self.dir.display());
        }
        write!(
            f,
            "{}: boot {}, restored {} sessions, {} events, {} bytes in {} ms",
            self.dir.display(),
            self.boot_counter,
            self.sessions,
            self.events,
            self.bytes,
            self.ms
        )?;
        if self.machine_restarted {
            write!(
                f,
                "; the machine restarted since the last open: {} unfinished frames told as gaps",
                self.unconfirmed_frames
            )?;
        }
        if self.damaged_frames + self.dropped_segments + self.torn_records as u64 > 0 {
            write!(
                f,
                " ({} damaged frames, {} dropped segments of which {} with unverified headers, \
                 {} torn journal records)",
                self.damaged_frames,
                self.dropped_segments,
                self.unverified_headers,
                self.torn_records
            )?;
        }
        Ok(())
    }
}

/// An open data directory: the lock, the journal, the boot's numbers.
#[derive(Debug)]
pub(crate) struct DataDir {
    /// Held (locked) for as long as the directory is open.
    _lock: File,
    pub(crate) journal: Journal,
    pub(crate) boot_counter: u64,
    /// The pool file's format, which it keeps.
    pub(crate) version: u32,
    /// Unix milliseconds the engine clock counts from.
    pub(crate) clock_base_ms: u64,
}

/// An opened directory and what it holds, before recovery.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) dir: DataDir,
    /// The pool file's mapping.
    pub(crate) map: memmap2::MmapMut,
    /// The live session incarnations of the journal.
    pub(crate) live: BTreeMap<u128, Journaled>,
    pub(crate) torn_records: usize,
    pub(crate) created: bool,
    /// Whether the machine may have restarted since the file was last
    /// open (`header::machine_restarted`): then a frame without its mark
    /// may be an acknowledged one whose page never reached the device.
    pub(crate) machine_restarted: bool,
}

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Takes the directory's lock.
pub(crate) fn lock(dir: &Path) -> Result<File, DataDirError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| DataDirError::io(&path, "open", e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(DataDirError::Locked { path }),
        Err(std::fs::TryLockError::Error(e)) => Err(DataDirError::io(&path, "lock", e)),
    }
}

/// Opens (or creates) the data directory `dir` for a pool of `shape`.
pub(crate) fn open(dir: &Path, shape: PoolShape, sync_each: bool) -> Result<Opened, DataDirError> {
    std::fs::create_dir_all(dir).map_err(|e| DataDirError::io(dir, "create directory", e))?;
    let lock = lock(dir)?;
    let path = dir.join(POOL_FILE);
    let created = !path.exists();
    if created {
        create_pool(&path, shape)?;
        journal::sync_dir(dir)?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| DataDirError::io(&path, "open", e))?;
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
    // SAFETY: mapping a file is unsafe because another process could change
    // or truncate it under us. The directory's lock (taken above and held
    // for as long as the mapping lives) excludes every other Rewind; the
    // file is this program's own, inside its data directory.
    let mut map = unsafe { memmap2::MmapOptions::new().map_mut(&file) }
        .map_err(|e| DataDirError::io(&path, "map", e))?;
    let header = validate(&path, &map, shape, len)?;
    let (mut current, which) = header;
    if current.boot_counter >= MAX_BOOTS {
        return Err(DataDirError::BootsExhausted { path });
    }
    current.boot_counter += 1;
    current.seal();
    // Into the other copy: a torn write leaves the one we read intact.
    current.write(&mut map[..HEADER_BYTES], 1 - which);
    // Which kernel boot opened the file last, and whether it closed it
    // cleanly; then this boot, open.
    let now = header::current_boot();
    let machine_restarted =
        !created && header::machine_restarted(header::read_boot(&map[..HEADER_BYTES]), now);
    // Open, not closed cleanly, until a clean close says otherwise; on
    // the device (the flush below) before anything is appended, so a
    // crash of this run can never be read as a clean close of an earlier
    // one.
    header::write_boot(
        &mut map[..HEADER_BYTES],
        header::Boot {
            id: now.unwrap_or_default(),
            closed_cleanly: false,
        },
    );
    map.flush_range(0, HEADER_BYTES)
        .map_err(|e| DataDirError::io(&path, "write header", e))?;

    let journal_path = dir.join(JOURNAL_FILE);
    let bytes = match std::fs::read(&journal_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(DataDirError::io(&journal_path, "read", e)),
    };
    let scan = journal::scan(&bytes);
    let live = journal::live(&scan.records);
    let journal = Journal::rewrite(&journal_path, &live, sync_each)?;
    Ok(Opened {
        dir: DataDir {
            _lock: lock,
            journal,
            boot_counter: current.boot_counter,
            version: current.version,
            clock_base_ms: current.clock_base_ms,
        },
        map,
        live,
        torn_records: scan.torn,
        created,
        machine_restarted,
    })
}

/// The newest valid header of a mapped pool file, checked against
/// `shape` and the file's length.
pub(crate) fn validate(
    path: &Path,
    map: &[u8],
    shape: PoolShape,
    len: u64,
) -> Result<(FileHeader, usize), DataDirError> {
    let (h, which) = read_header(path, map)?;
    if !h.has_shape(shape) {
        return Err(DataDirError::LayoutMismatch {
            path: path.to_owned(),
            found: h.describe(),
            wanted: header::describe(
                u64::from(shape.units),
                shape.unit_words as u64,
                u64::from(shape.top_class),
            ),
        });
    }
    check_length(path, &h, len)?;
    Ok((h, which))
}

/// The newest valid header of a pool file, whatever its shape.
pub(crate) fn read_header(path: &Path, map: &[u8]) -> Result<(FileHeader, usize), DataDirError> {
    let page = &map[..HEADER_BYTES];
    let (h, which) = header::newest(page).map_err(|foreign| match foreign {
        Some(found) => DataDirError::BadMagic {
            path: path.to_owned(),
            found,
        },
        None => DataDirError::HeaderDamaged {
            path: path.to_owned(),
        },
    })?;
    if !(OLDEST_READABLE..=VERSION).contains(&h.version) || h.header_bytes as usize != HEADER_BYTES
    {
        return Err(DataDirError::Version {
            path: path.to_owned(),
            found: h.version,
            expected: VERSION,
        });
    }
    Ok((h, which))
}

pub(crate) fn check_length(path: &Path, h: &FileHeader, len: u64) -> Result<(), DataDirError> {
    let needed = HEADER_BYTES as u64 + h.pool_bytes;
    if len < needed {
        return Err(DataDirError::Truncated {
            path: path.to_owned(),
            len,
            needed,
        });
    }
    Ok(())
}

/// Makes a new pool file: zeroed words (the filesystem's holes, allocated
/// up front so a full disk is an error now, not a `SIGBUS` at some later
/// append) and a header with boot counter 0.
fn create_pool(path: &Path, shape: PoolShape) -> Result<(), DataDirError> {
    let tmp = path.with_extension("new");
    let at = &tmp;
    let io = |op| move |e| DataDirError::io(at, op, e);
    let len = HEADER_BYTES as u64 + shape.total_words() as u64 * 8;
    let mut file = File::create(&tmp).map_err(io("create"))?;
    file.set_len(len).map_err(io("set length"))?;
    #[cfg(target_os = "linux")]
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len)
        .map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))
        .map_err(io("allocate"))?;
    let mut page = vec![0u8; HEADER_BYTES];
    FileHeader::new(shape, unix_ms()).write(&mut page, 0);
    // Nothing allocated yet: the allocation mark is past the last unit.
    page[MARK_OFFSET..].copy_from_slice(
        &MarkFormat::for_version(VERSION)
            .encode(shape.units)
            .to_le_bytes(),
    );
    use std::io::Write;
    file.write_all(&page).map_err(io("write header"))?;
    file.sync_all().map_err(io("fsync"))?;
    drop(file);
    // Renamed into place only once complete: a crash while creating leaves
    // no half-made pool file behind (only a `pool.new` the next create
    // overwrites).
    std::fs::rename(&tmp, path).map_err(|e| DataDirError::io(path, "rename", e))
}
