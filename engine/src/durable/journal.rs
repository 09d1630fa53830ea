//! The session journal: an append-only file of small records saying which
//! session incarnations exist (open, close), what the embedding stored with
//! them (its `initialize` parameters) and how many stream ids they may have
//! handed out.
//!
//! A record is `magic:u32 | len:u32 | crc:u32 | body[len]`, little-endian,
//! where `crc` is the CRC-32 of the body. Reading skips a record whose
//! length runs past the end or whose CRC fails (a write torn by a crash, or
//! damage) and looks for the next magic after it, so one bad record never
//! hides the ones after it. Each open of the data directory rewrites the
//! journal with only the records of live sessions (write a temporary file,
//! `fsync`, rename, `fsync` the directory), so it stays proportional to what
//! is live.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::DataDirError;

const MAGIC: u32 = u32::from_le_bytes(*b"RWJ1");
const HEAD: usize = 12;
/// Longest body accepted when reading (an `initialize` blob is a few KiB).
const MAX_BODY: usize = 16 << 20;

const OPEN: u8 = 1;
const INIT: u8 = 2;
const CLOSE: u8 = 3;
const STREAMS: u8 = 4;

/// One journal record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// A session incarnation was opened.
    Open {
        id: u128,
        tag: u64,
        epoch: u64,
        created_unix_ms: u64,
        principal: Option<Box<str>>,
    },
    /// The embedding stored its per-session blob.
    Init {
        id: u128,
        epoch: u64,
        blob: Box<[u8]>,
    },
    /// The incarnation ended.
    Close { id: u128, epoch: u64 },
    /// Stream ids below `below` may have been handed out.
    Streams { id: u128, epoch: u64, below: u32 },
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64);
        match self {
            Record::Open {
                id,
                tag,
                epoch,
                created_unix_ms,
                principal,
            } => {
                body.push(OPEN);
                body.extend_from_slice(&id.to_le_bytes());
                body.extend_from_slice(&epoch.to_le_bytes());
                body.extend_from_slice(&tag.to_le_bytes());
                body.extend_from_slice(&created_unix_ms.to_le_bytes());
                match principal {
                    None => body.push(0),
                    Some(p) => {
                        body.push(1);
                        body.extend_from_slice(&(p.len() as u32).to_le_bytes());
                        body.extend_from_slice(p.as_bytes());
                    }
                }
            }
            Record::Init { id, epoch, blob } => {
                body.push(INIT);
                body.extend_from_slice(&id.to_le_bytes());
                body.extend_from_slice(&epoch.to_le_bytes());
                body.extend_from_slice(&(blob.len() as u32).to_le_bytes());
                body.extend_from_slice(blob);
            }
            Record::Close { id, epoch } => {
                body.push(CLOSE);
                body.extend_from_slice(&id.to_le_bytes());
                body.extend_from_slice(&epoch.to_le_bytes());
            }
            Record::Streams { id, epoch, below } => {
                body.push(STREAMS);
                body.extend_from_slice(&id.to_le_bytes());
                body.extend_from_slice(&epoch.to_le_bytes());
                body.extend_from_slice(&below.to_le_bytes());
            }
        }
        let mut out = Vec::with_capacity(HEAD + body.len());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn decode(body: &[u8]) -> Option<Record> {
        let mut r = Reader(body);
        let kind = r.u8()?;
        let id = r.u128()?;
        let epoch = r.u64()?;
        let rec = match kind {
            OPEN => {
                let tag = r.u64()?;
                let created_unix_ms = r.u64()?;
                let principal = match r.u8()? {
                    0 => None,
                    1 => {
                        let n = r.u32()? as usize;
                        Some(Box::from(std::str::from_utf8(r.take(n)?).ok()?))
                    }
                    _ => return None,
                };
                Record::Open {
                    id,
                    tag,
                    epoch,
                    created_unix_ms,
                    principal,
                }
            }
            INIT => {
                let n = r.u32()? as usize;
                Record::Init {
                    id,
                    epoch,
                    blob: Box::from(r.take(n)?),
                }
            }
            CLOSE => Record::Close { id, epoch },
            STREAMS => Record::Streams {
                id,
                epoch,
                below: r.u32()?,
            },
            _ => return None,
        };
        r.0.is_empty().then_some(rec)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        (self.0.len() >= n).then(|| {
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            a
        })
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn u128(&mut self) -> Option<u128> {
        self.take(16)
            .map(|b| u128::from_le_bytes(b.try_into().expect("16 bytes")))
    }
}

/// What reading a journal found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Records that passed their CRC, in file order.
    pub(crate) records: Vec<Record>,
    /// Places where bytes were skipped (a torn or damaged record).
    pub(crate) torn: usize,
    /// Bytes skipped.
    pub(crate) torn_bytes: usize,
}

/// Reads every intact record of `bytes`.
pub(crate) fn scan(bytes: &[u8]) -> Scan {
    let mut out = Scan::default();
    let mut at = 0;
    let mut skipping_from = None;
    while at + HEAD <= bytes.len() {
        let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let intact = (word(at) == MAGIC)
            .then(|| {
                let len = word(at + 4) as usize;
                let body = bytes.get(at + HEAD..at + HEAD + len.min(MAX_BODY))?;
                (body.len() == len && crc32fast::hash(body) == word(at + 8))
                    .then(|| Record::decode(body))
                    .flatten()
                    .map(|r| (r, HEAD + len))
            })
            .flatten();
        match intact {
            Some((record, n)) => {
                if let Some(from) = skipping_from.take() {
                    out.torn += 1;
                    out.torn_bytes += at - from;
                }
                out.records.push(record);
                at += n;
            }
            None => {
                skipping_from.get_or_insert(at);
                at += 1;
            }
        }
    }
    let from = skipping_from.unwrap_or(at);
    if from < bytes.len() {
        out.torn += 1;
        out.torn_bytes += bytes.len() - from;
    }
    out
}

/// A session incarnation the journal says is live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Journaled {
    pub(crate) id: u128,
    pub(crate) tag: u64,
    pub(crate) epoch: u64,
    pub(crate) created_unix_ms: u64,
    pub(crate) principal: Option<Box<str>>,
    pub(crate) init: Option<Box<[u8]>>,
    /// Stream ids below this may have been handed out (0: no record).
    pub(crate) streams_below: u32,
}

/// The live incarnations `records` leave, by session id.
pub(crate) fn live(records: &[Record]) -> BTreeMap<u128, Journaled> {
    let mut live = BTreeMap::new();
    for r in records {
        match r {
            Record::Open {
                id,
                tag,
                epoch,
                created_unix_ms,
                principal,
            } => {
                live.insert(
                    *id,
                    Journaled {
                        id: *id,
                        tag: *tag,
                        epoch: *epoch,
                        created_unix_ms: *created_unix_ms,
                        principal: principal.clone(),
                        init: None,
                        streams_below: 0,
                    },
                );
            }
            Record::Init { id, epoch, blob } => {
                if let Some(s) = live.get_mut(id).filter(|s| s.epoch == *epoch) {
                    s.init = Some(blob.clone());
                }
            }
            Record::Streams { id, epoch, below } => {
                if let Some(s) = live.get_mut(id).filter(|s| s.epoch == *epoch) {
                    s.streams_below = s.streams_below.max(*below);
                }
            }
            Record::Close { id, epoch } => {
                if live.get(id).is_some_and(|s| s.epoch == *epoch) {
                    live.remove(id);
                }
            }
        }
    }
    live
}

/// The records that say exactly `s`.
fn records_of(s: &Journaled) -> Vec<Record> {
    let mut out = vec![Record::Open {
        id: s.id,
        tag: s.tag,
        epoch: s.epoch,
        created_unix_ms: s.created_unix_ms,
        principal: s.principal.clone(),
    }];
    if let Some(blob) = &s.init {
        out.push(Record::Init {
            id: s.id,
            epoch: s.epoch,
            blob: blob.clone(),
        });
    }
    if s.streams_below > 0 {
        out.push(Record::Streams {
            id: s.id,
            epoch: s.epoch,
            below: s.streams_below,
        });
    }
    out
}

/// The open journal, appended to as sessions come and go.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    file: Mutex<File>,
    /// `fdatasync` after every record.
    sync_each: bool,
    /// Bytes appended since the journal was last rewritten.
    appended: AtomicU64,
    /// Bytes the last rewrite kept.
    kept: AtomicU64,
}

/// A journal is rewritten by the sweep only past this size.
const COMPACT_AT_LEAST: u64 = 1 << 20;

impl Journal {
    /// Rewrites the journal at `path` to hold exactly `live` and opens it
    /// for appending.
    pub(crate) fn rewrite(
        path: &Path,
        live: &BTreeMap<u128, Journaled>,
        sync_each: bool,
    ) -> Result<Journal, DataDirError> {
        let records: Vec<Record> = live.values().flat_map(records_of).collect();
        let (file, kept) = replace(path, &records)?;
        Ok(Journal {
            path: path.to_owned(),
            file: Mutex::new(file),
            sync_each,
            appended: AtomicU64::new(0),
            kept: AtomicU64::new(kept),
        })
    }

    /// Whether the journal has grown enough since its last rewrite to be
    /// worth rewriting.
    pub(crate) fn wants_compaction(&self) -> bool {
        let appended = self.appended.load(Ordering::Relaxed);
        appended > COMPACT_AT_LEAST.max(4 * self.kept.load(Ordering::Relaxed))
    }

    /// Rewrites the journal to hold what `live` returns, called with the
    /// journal locked: a record appended meanwhile waits, and lands in the
    /// new file (a duplicate of what `live` wrote is harmless; reading
    /// keeps the last open of an id and matches closes by epoch).
    pub(crate) fn compact(&self, live: impl FnOnce() -> Vec<Record>) -> Result<(), DataDirError> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let (new, kept) = replace(&self.path, &live())?;
        *file = new;
        self.appended.store(0, Ordering::Relaxed);
        self.kept.store(kept, Ordering::Relaxed);
        Ok(())
    }

    /// Appends `record` (one `write`: a crash of the process cannot tear
    /// it; a crash of the machine can, and reading skips the torn record).
    pub(crate) fn append(&self, record: &Record) -> std::io::Result<()> {
        let bytes = record.encode();
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(&bytes)?;
        self.appended
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if self.sync_each {
            f.sync_data()?;
        }
        Ok(())
    }

    /// Forces what was appended to the device.
    pub(crate) fn sync(&self) -> std::io::Result<()> {
        self.file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sync_data()
    }
}

/// Replaces the journal at `path` by one holding `records`, durably, and
/// opens it for appending; returns it and its length.
fn replace(path: &Path, records: &[Record]) -> Result<(File, u64), DataDirError> {
    let tmp = path.with_extension("tmp");
    let bytes: Vec<u8> = records.iter().flat_map(Record::encode).collect();
    let at = &tmp;
    let io = |op| move |e| DataDirError::io(at, op, e);
    let mut f = File::create(&tmp).map_err(io("create"))?;
    f.write_all(&bytes).map_err(io("write"))?;
    f.sync_all().map_err(io("fsync"))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| DataDirError::io(path, "rename", e))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| DataDirError::io(path, "open", e))?;
    Ok((file, bytes.len() as u64))
}

/// `fsync` of a directory, so a rename or a new file in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), DataDirError> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| DataDirError::io(dir, "fsync directory", e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(id: u128, epoch: u64) -> Record {
        Record::Open {
            id,
            tag: 0xabc,
            epoch,
            created_unix_ms: 5,
            principal: Some(Box::from("alice")),
        }
    }

    #[test]
    fn records_round_trip_and_closes_match_their_incarnation() {
        let records = vec![
            open(1, 10),
            Record::Init {
                id: 1,
                epoch: 10,
                blob: Box::from(&b"{\"init\":1}"[..]),
            },
            open(2, 11),
            Record::Close { id: 2, epoch: 11 },
            open(3, 12),
            // A close of an older incarnation does not end the newer one.
            Record::Close { id: 3, epoch: 9 },
            Record::Streams {
                id: 3,
                epoch: 12,
                below: 512,
            },
        ];
        let bytes: Vec<u8> = records.iter().flat_map(Record::encode).collect();
        let scan = scan(&bytes);
        assert_eq!(scan.records, records);
        assert_eq!(scan.torn, 0);
        let live = live(&scan.records);
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(live[&1].init.as_deref(), Some(&b"{\"init\":1}"[..]));
        assert_eq!(live[&3].streams_below, 512);
    }

    #[test]
    fn a_torn_record_is_skipped_and_the_next_one_still_read() {
        let (a, b, c) = (
            open(1, 1).encode(),
            open(2, 2).encode(),
            open(3, 3).encode(),
        );
        let mut bytes = [a.clone(), b.clone(), c.clone()].concat();
        // A flipped bit in the middle record's body.
        bytes[a.len() + HEAD + 3] ^= 1;
        let s = scan(&bytes);
        assert_eq!(s.records, vec![open(1, 1), open(3, 3)]);
        assert_eq!((s.torn, s.torn_bytes), (1, b.len()));
        // A record cut short at the end (a torn last write).
        let cut = [a.clone(), c[..c.len() - 2].to_vec()].concat();
        let s = scan(&cut);
        assert_eq!(s.records, vec![open(1, 1)]);
        assert_eq!((s.torn, s.torn_bytes), (1, c.len() - 2));
    }
}
