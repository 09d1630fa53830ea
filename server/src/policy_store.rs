//! The policy directory: where `rewind serve` keeps every policy swapped in
//! through the admin surface, so that a restart comes back with the policy
//! that was live.
//!
//! ```text
//! DIR/000001-strict.wasm    one file per module pushed and swapped in
//! DIR/000002-mine.wasm        (a sequence number, then the policy's name)
//! DIR/LIVE                  which of them was live last, or `start`
//! ```
//!
//! `start` means the policy `rewind serve` starts with (`--policy`, or the
//! embedded default). At start, `rewind serve` loads its start policy as
//! generation 1, then swaps in the module `LIVE` names, validated like any
//! swap, as generation 2 — so `rewind policy rollback` after a restart
//! returns to the start policy.
//!
//! A push either ends live *and* recorded, or changes nothing: the module
//! is written before the swap and removed if the swap is refused, and if
//! `LIVE` cannot be written after the swap, the swap is rolled back. Every
//! file is written under a temporary name, flushed, and renamed into place,
//! so a crash leaves the old state or the new one, never half a file.
//! Rollbacks (on command, or automatic ones the host decides by itself)
//! are recorded by [`PolicyStore::sync`], which the admin surface calls
//! after every command and `rewind serve` every few seconds and at exit.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rewind_engine::policy::wasm::{LoadError, PolicyHost, SwapError};

/// The file naming the live module.
pub const LIVE_FILE: &str = "LIVE";
/// What [`LIVE_FILE`] holds when the start policy is live.
pub const START: &str = "start";
/// Module files kept; older ones are removed (the host keeps fewer
/// rollback targets than this, so no rollback can need a removed file).
pub const KEEP_MODULES: usize = 16;

/// A policy directory that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Reading, writing or listing the directory failed.
    #[error("policy directory {}: {action}: {source}", dir.display())]
    Io {
        /// The directory.
        dir: PathBuf,
        /// What was being done.
        action: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// `LIVE` names a file that is not a module of this directory.
    #[error(
        "policy directory {}: {LIVE_FILE} names `{named}`, which is not a module file there; \
         put `{START}` in it (or remove it) to start with the start policy",
        dir.display()
    )]
    BadLive {
        /// The directory.
        dir: PathBuf,
        /// What `LIVE` holds.
        named: String,
    },
}

/// Why a push through the store changed nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum PushError {
    /// The name is not one [`valid_name`] accepts.
    Name(String),
    /// The module does not load.
    Load(LoadError),
    /// The module loaded but the host refused to swap it in.
    Swap(SwapError),
    /// The directory could not record it.
    Store(StoreError),
}

/// The module `LIVE` names, read back.
#[derive(Debug, Clone)]
pub struct StoredPolicy {
    /// Its file.
    pub path: PathBuf,
    /// The name it was pushed under.
    pub name: String,
    /// The module.
    pub wasm: Vec<u8>,
}

/// A push that went live and was recorded.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// The generation now live.
    pub generation: u64,
    /// The file it was recorded in.
    pub path: PathBuf,
}

/// What one generation of this process was, on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// The start policy.
    Start,
    /// A module file of the directory.
    File(String),
}

impl Entry {
    fn as_live(&self) -> &str {
        match self {
            Entry::Start => START,
            Entry::File(file) => file,
        }
    }
}

#[derive(Debug)]
struct State {
    next_seq: u64,
    /// Generations of this process's host that the directory knows.
    by_generation: HashMap<u64, Entry>,
    /// What `LIVE` holds now.
    live: Entry,
    /// The live generation `live` was last synced with.
    synced_generation: Option<u64>,
}

/// A policy directory (see the module documentation).
#[derive(Debug)]
pub struct PolicyStore {
    dir: PathBuf,
    state: Mutex<State>,
}

impl PolicyStore {
    /// Opens `dir`, creating it if needed, and reads what `LIVE` says.
    pub fn open(dir: impl Into<PathBuf>) -> Result<PolicyStore, StoreError> {
        let dir = dir.into();
        let io = |action: &str| {
            let dir = dir.clone();
            let action = action.to_owned();
            move |source| StoreError::Io {
                dir,
                action,
                source,
            }
        };
        fs::create_dir_all(&dir).map_err(io("cannot create it"))?;
        let mut max_seq = 0;
        for entry in fs::read_dir(&dir).map_err(io("cannot list it"))? {
            let entry = entry.map_err(io("cannot list it"))?;
            if let Some((seq, _)) = parse_module_file(&entry.file_name().to_string_lossy()) {
                max_seq = max_seq.max(seq);
            }
        }
        let live = match fs::read_to_string(dir.join(LIVE_FILE)) {
            Ok(text) => {
                let named = text.trim();
                if named == START {
                    Entry::Start
                } else if parse_module_file(named).is_some() && dir.join(named).is_file() {
                    Entry::File(named.to_owned())
                } else {
                    return Err(StoreError::BadLive {
                        dir,
                        named: named.to_owned(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Entry::Start,
            Err(e) => return Err(io(&format!("cannot read {LIVE_FILE}"))(e)),
        };
        Ok(PolicyStore {
            dir,
            state: Mutex::new(State {
                next_seq: max_seq + 1,
                by_generation: HashMap::new(),
                live,
                synced_generation: None,
            }),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The module `LIVE` names, if it names one (else the start policy is
    /// what was live).
    pub fn live_policy(&self) -> Result<Option<StoredPolicy>, StoreError> {
        let Entry::File(file) = self.state().live.clone() else {
            return Ok(None);
        };
        let path = self.dir.join(&file);
        let wasm = fs::read(&path).map_err(|source| StoreError::Io {
            dir: self.dir.clone(),
            action: format!("cannot read {file}"),
            source,
        })?;
        let name = parse_module_file(&file).map_or(file.clone(), |(_, name)| name.to_owned());
        Ok(Some(StoredPolicy { path, name, wasm }))
    }

    /// The file `LIVE` names, or `None` for the start policy.
    pub fn live_file(&self) -> Option<PathBuf> {
        match &self.state().live {
            Entry::Start => None,
            Entry::File(file) => Some(self.dir.join(file)),
        }
    }

    /// Records that `generation` of this process's host is the start policy.
    pub fn record_start(&self, generation: u64) {
        self.state().by_generation.insert(generation, Entry::Start);
    }

    /// Records that `generation` is the module [`live_policy`](Self::live_policy)
    /// returned (swapped in at start), and that it is live.
    pub fn record_restored(&self, generation: u64, stored: &StoredPolicy) {
        let mut state = self.state();
        if let Some(file) = stored.path.file_name() {
            let entry = Entry::File(file.to_string_lossy().into_owned());
            state.by_generation.insert(generation, entry);
        }
        state.synced_generation = Some(generation);
    }

    /// Loads `wasm`, writes it to the directory, swaps it into `host` and
    /// records it as live — or, on any refusal or failure, changes nothing
    /// (see the module documentation). Pushes are serialised: each runs
    /// validation, which takes about a millisecond.
    pub fn push(&self, host: &PolicyHost, name: &str, wasm: &[u8]) -> Result<Pushed, PushError> {
        if !valid_name(name) {
            return Err(PushError::Name(name.to_owned()));
        }
        let mut state = self.state();
        let module = host.load(name, wasm).map_err(PushError::Load)?;
        let file = format!("{:06}-{name}.wasm", state.next_seq);
        let path = self.dir.join(&file);
        self.write_atomically(&file, wasm)
            .map_err(PushError::Store)?;
        state.next_seq += 1;
        let generation = match host.swap(&module) {
            Ok(generation) => generation,
            Err(e) => {
                let _ = fs::remove_file(&path);
                return Err(PushError::Swap(e));
            }
        };
        let entry = Entry::File(file);
        if let Err(e) = self.write_live(&mut state, &entry) {
            // Live but unrecorded would come back as something else after
            // a restart: undo the swap instead.
            let _ = host.rollback();
            let _ = fs::remove_file(&path);
            return Err(PushError::Store(e));
        }
        state.by_generation.insert(generation, entry);
        state.synced_generation = Some(generation);
        self.prune(&state);
        Ok(Pushed { generation, path })
    }

    /// Records in `LIVE` whatever `host` runs now (after a rollback on
    /// command or an automatic one). Cheap when nothing changed.
    pub fn sync(&self, host: &PolicyHost) -> Result<(), StoreError> {
        let mut state = self.state();
        let generation = host.live_generation();
        if state.synced_generation == Some(generation) {
            return Ok(());
        }
        let Some(entry) = state.by_generation.get(&generation).cloned() else {
            // Not swapped in through this directory (an embedder's own
            // swap): nothing to record it as.
            tracing::warn!(
                generation,
                dir = %self.dir.display(),
                "the live policy generation was not swapped in through the policy directory; \
                 a restart will not bring it back"
            );
            state.synced_generation = Some(generation);
            return Ok(());
        };
        if entry != state.live {
            self.write_live(&mut state, &entry)?;
        }
        state.synced_generation = Some(generation);
        Ok(())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is valid after any panic (every field is replaced whole).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_live(&self, state: &mut State, entry: &Entry) -> Result<(), StoreError> {
        let mut text = entry.as_live().to_owned();
        text.push('\n');
        self.write_atomically(LIVE_FILE, text.as_bytes())?;
        state.live = entry.clone();
        Ok(())
    }

    /// Writes `bytes` to a temporary file in the directory, flushes it to
    /// disk and renames it to `file`.
    fn write_atomically(&self, file: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let io = |action: String| {
            let dir = self.dir.clone();
            move |source| StoreError::Io {
                dir,
                action,
                source,
            }
        };
        let mut temp = tempfile::Builder::new()
            .prefix(".incoming-")
            .tempfile_in(&self.dir)
            .map_err(io(format!("cannot create a temporary file for {file}")))?;
        temp.write_all(bytes)
            .and_then(|()| temp.as_file().sync_all())
            .map_err(io(format!("cannot write {file}")))?;
        temp.persist(self.dir.join(file))
            .map_err(|e| io(format!("cannot rename into {file}"))(e.error))?;
        Ok(())
    }

    /// Removes module files beyond the newest [`KEEP_MODULES`], never the
    /// live one. Failures only cost disk space, so they are logged.
    fn prune(&self, state: &State) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(u64, String)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let file = e.file_name().to_string_lossy().into_owned();
                let seq = parse_module_file(&file)?.0;
                Some((seq, file))
            })
            .collect();
        files.sort_unstable();
        let excess = files.len().saturating_sub(KEEP_MODULES);
        for (_, file) in files.into_iter().take(excess) {
            if state.live == Entry::File(file.clone()) {
                continue;
            }
            if let Err(e) = fs::remove_file(self.dir.join(&file)) {
                tracing::warn!(%file, dir = %self.dir.display(), "cannot remove an old policy file: {e}");
            }
        }
    }
}

/// A name a module may be pushed under: 1 to 64 characters of A-Z, a-z,
/// 0-9, `-`, `_` and `.`, so a module file is one path component.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `000012-name.wasm` → (12, "name").
fn parse_module_file(file: &str) -> Option<(u64, &str)> {
    let stem = file.strip_suffix(".wasm")?;
    let (seq, name) = stem.split_once('-')?;
    if seq.len() < 6 || !seq.bytes().all(|b| b.is_ascii_digit()) || !valid_name(name) {
        return None;
    }
    Some((seq.parse().ok()?, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewind_engine::policy::wasm::plugins::{self, fixtures};

    fn temp_dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn modules(dir: &Path) -> Vec<String> {
        let mut files: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| parse_module_file(f).is_some())
            .collect();
        files.sort();
        files
    }

    fn live_text(dir: &Path) -> String {
        fs::read_to_string(dir.join(LIVE_FILE))
            .unwrap()
            .trim()
            .to_owned()
    }

    #[test]
    fn a_push_is_written_swapped_in_and_named_live() {
        let dir = temp_dir();
        let host = PolicyHost::with_default_policy().unwrap();
        let store = PolicyStore::open(dir.path()).unwrap();
        store.record_start(1);
        assert!(store.live_policy().unwrap().is_none());

        let pushed = store.push(&host, "strict", plugins::STRICT).unwrap();
        assert_eq!(pushed.generation, 2);
        assert_eq!(host.live_name(), "strict");
        assert_eq!(modules(dir.path()), ["000001-strict.wasm"]);
        assert_eq!(live_text(dir.path()), "000001-strict.wasm");
        assert_eq!(fs::read(&pushed.path).unwrap(), plugins::STRICT);

        // What a restart reads back.
        let reopened = PolicyStore::open(dir.path()).unwrap();
        let stored = reopened.live_policy().unwrap().unwrap();
        assert_eq!(stored.name, "strict");
        assert_eq!(stored.wasm, plugins::STRICT);
        // Numbering goes on after the existing files.
        let next = reopened
            .push(&host, "status-400", plugins::STATUS_400)
            .unwrap();
        assert!(next.path.ends_with("000002-status-400.wasm"));
    }

    #[test]
    fn a_refused_module_leaves_the_directory_and_the_host_as_they_were() {
        let dir = temp_dir();
        let host = PolicyHost::with_default_policy().unwrap();
        let store = PolicyStore::open(dir.path()).unwrap();
        store.record_start(1);
        assert!(matches!(
            store.push(&host, "trap", fixtures::TRAP),
            Err(PushError::Swap(SwapError::Validation(_)))
        ));
        assert!(matches!(
            store.push(&host, "imports", fixtures::IMPORTS),
            Err(PushError::Load(_))
        ));
        assert!(matches!(
            store.push(&host, "junk", b"\0asm not really"),
            Err(PushError::Load(_))
        ));
        assert_eq!(host.live_generation(), 1);
        assert!(modules(dir.path()).is_empty());
        assert!(!dir.path().join(LIVE_FILE).exists());
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_rollback_is_recorded_by_sync() {
        let dir = temp_dir();
        let host = PolicyHost::with_default_policy().unwrap();
        let store = PolicyStore::open(dir.path()).unwrap();
        store.record_start(1);
        store.push(&host, "strict", plugins::STRICT).unwrap();
        store
            .push(&host, "status-400", plugins::STATUS_400)
            .unwrap();
        assert_eq!(live_text(dir.path()), "000002-status-400.wasm");

        host.rollback().unwrap();
        store.sync(&host).unwrap();
        assert_eq!(live_text(dir.path()), "000001-strict.wasm");
        host.rollback().unwrap();
        store.sync(&host).unwrap();
        assert_eq!(live_text(dir.path()), START);
        assert!(PolicyStore::open(dir.path())
            .unwrap()
            .live_policy()
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_restored_module_is_a_rollback_target_of_its_own_generation() {
        let dir = temp_dir();
        {
            let host = PolicyHost::with_default_policy().unwrap();
            let store = PolicyStore::open(dir.path()).unwrap();
            store.record_start(1);
            store.push(&host, "strict", plugins::STRICT).unwrap();
        }
        // The restart: start policy, then the stored one.
        let host = PolicyHost::with_default_policy().unwrap();
        let store = PolicyStore::open(dir.path()).unwrap();
        store.record_start(1);
        let stored = store.live_policy().unwrap().unwrap();
        let module = host.load(&stored.name, &stored.wasm).unwrap();
        let generation = host.swap(&module).unwrap();
        store.record_restored(generation, &stored);
        assert_eq!(host.live_name(), "strict");

        host.rollback().unwrap();
        store.sync(&host).unwrap();
        assert_eq!(live_text(dir.path()), START);
    }

    #[test]
    fn old_modules_are_pruned_but_never_the_live_one() {
        let dir = temp_dir();
        let host = PolicyHost::with_default_policy().unwrap();
        let store = PolicyStore::open(dir.path()).unwrap();
        store.record_start(1);
        for _ in 0..KEEP_MODULES + 3 {
            store.push(&host, "strict", plugins::STRICT).unwrap();
        }
        let files = modules(dir.path());
        assert_eq!(files.len(), KEEP_MODULES);
        assert_eq!(files.first().unwrap(), "000004-strict.wasm");
        assert_eq!(live_text(dir.path()), "000019-strict.wasm");
    }

    #[test]
    fn a_live_file_naming_nothing_is_a_clear_error() {
        let dir = temp_dir();
        fs::write(dir.path().join(LIVE_FILE), "000007-gone.wasm\n").unwrap();
        let err = PolicyStore::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("000007-gone.wasm") && err.contains(START),
            "{err}"
        );
        fs::write(dir.path().join(LIVE_FILE), "../../etc/passwd\n").unwrap();
        assert!(matches!(
            PolicyStore::open(dir.path()),
            Err(StoreError::BadLive { .. })
        ));
    }

    #[test]
    fn module_file_names_parse_only_in_their_own_form() {
        assert_eq!(
            parse_module_file("000012-my.policy.wasm"),
            Some((12, "my.policy"))
        );
        assert_eq!(parse_module_file("1234567-x.wasm"), Some((1_234_567, "x")));
        for bad in [
            "LIVE",
            "000012-.wasm",
            "12-x.wasm",
            "00001x-x.wasm",
            "000012-x.wat",
            ".incoming-abc",
        ] {
            assert_eq!(parse_module_file(bad), None, "{bad}");
        }
    }
}
