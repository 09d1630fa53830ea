//! Recovery from a data directory damaged at random.
//!
//! Whatever a bad disk, a stray write or an operator's tool leaves in
//! `pool` and `sessions.journal`, opening the directory either refuses it
//! with an error or restores sessions of which every delivered event is
//! exactly the event appended at that number, to that session and stream:
//! damage shows as told gaps or lost sessions, never as a wrong byte, a
//! session that was not there, or an event of another session. The engine
//! then appends and replays as usual, without handing a segment that one
//! session still holds to another.
//!
//! The targeted damage tests (one flipped byte in a known frame or
//! header) are in `durable.rs`; this one aims at every word the pool and
//! the journal hold: segment headers, state words, frame tables, marks,
//! stamps, the file header, journal records.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;
use rewind_engine::{Config, Engine, Replay, ReplayError, SessionHandle, SessionId};

const SESSIONS: usize = 3;
const EVENTS_PER_SESSION: u64 = 60;
const POOL_FILE: &str = "pool";
/// Where the pool file's header page keeps its boot record (which kernel
/// boot last opened the file), and its length.
const BOOT_RECORD: std::ops::Range<usize> = 1024..1064;
const JOURNAL_FILE: &str = "sessions.journal";

fn config(dir: &Path) -> Config {
    let mut c = Config::default();
    c.global_bytes = 1 << 20;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 16 * 1024;
    c.session_events = 10_000;
    c.session_bytes = 1 << 30;
    c.data_dir = Some(dir.to_owned());
    c
}

/// The payload of event `seq` of `session` on `stream`: says whose it is
/// in every few bytes, so a byte of another event cannot pass for it.
fn payload(session: usize, stream: u32, seq: u64) -> Vec<u8> {
    let len = 5 + (seq as usize * 37 + session * 11) % 300;
    format!("s{session}t{stream}e{seq}|")
        .bytes()
        .cycle()
        .take(len)
        .collect()
}

/// What the undamaged directory holds.
struct Baseline {
    pool: Vec<u8>,
    /// The pool two thirds of the way through the appends: what a word
    /// the kernel wrote back then, and not since, holds after a power loss.
    earlier_pool: Vec<u8>,
    journal: Vec<u8>,
    /// Offsets of the pool's non-zero words: where the damage is aimed.
    written_words: Vec<usize>,
    ids: Vec<SessionId>,
    /// Per session, its streams.
    streams: Vec<Vec<u32>>,
    /// (session, seq) → (stream, payload).
    events: HashMap<(usize, u64), (u32, Vec<u8>)>,
}

fn baseline() -> &'static Baseline {
    static BASELINE: OnceLock<Baseline> = OnceLock::new();
    BASELINE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut events = HashMap::new();
        let (ids, streams, earlier_pool) = {
            let e = Engine::new(config(dir.path())).unwrap();
            // Past the clock's first milliseconds: no time word is zero, so
            // which words are written (and so where a case's damage lands)
            // is the same in every run.
            std::thread::sleep(std::time::Duration::from_millis(5));
            let handles: Vec<SessionHandle> =
                (0..SESSIONS).map(|_| e.open(None).unwrap()).collect();
            let streams: Vec<Vec<u32>> = handles
                .iter()
                .map(|h| vec![0, h.new_stream().unwrap()])
                .collect();
            let mut earlier_pool = Vec::new();
            for n in 0..EVENTS_PER_SESSION {
                if n == EVENTS_PER_SESSION * 2 / 3 {
                    e.sync().unwrap();
                    earlier_pool = std::fs::read(dir.path().join(POOL_FILE)).unwrap();
                }
                for (i, h) in handles.iter().enumerate() {
                    let stream = streams[i][(n % 2) as usize];
                    // The sequence number is the session's next one.
                    let seq = h.high_water() + 1;
                    let p = payload(i, stream, seq);
                    let id = h.append(stream, &p).unwrap();
                    assert_eq!(id.seq, seq);
                    events.insert((i, seq), (stream, p));
                }
            }
            e.sync().unwrap();
            (
                handles.iter().map(SessionHandle::id).collect(),
                streams,
                earlier_pool,
            )
        };
        let pool = std::fs::read(dir.path().join(POOL_FILE)).unwrap();
        let journal = std::fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
        let written_words = (0..pool.len() / 8)
            .map(|w| w * 8)
            .filter(|&at| pool[at..at + 8].iter().any(|&b| b != 0))
            .collect();
        Baseline {
            pool,
            earlier_pool,
            journal,
            written_words,
            ids,
            streams,
            events,
        }
    })
}

/// One change to one word of a file.
#[derive(Clone, Debug)]
enum Damage {
    /// Flip one bit of a word the pool holds.
    FlipPoolBit { word: usize, bit: u32 },
    /// Overwrite a pool word with another word of the pool (a plausible
    /// header, state or mark from elsewhere).
    CopyPoolWord { from: usize, to: usize },
    /// Overwrite a pool word with an arbitrary value.
    SetPoolWord { word: usize, value: u64 },
    /// Zero a pool word (a write that never reached the disk).
    ZeroPoolWord { word: usize },
    /// Put back a pool word's value from two thirds of the way through
    /// the appends (its page written back then and not since).
    OlderPoolWord { word: usize },
    /// Flip one bit anywhere in the journal.
    FlipJournalBit { at: usize, bit: u32 },
    /// Cut the journal short.
    TruncateJournal { keep: usize },
}

fn damage() -> impl Strategy<Value = Damage> {
    // Mostly the pool, whose words recovery must judge one by one; the
    // journal's records carry CRCs, so a few cases there suffice.
    prop_oneof![
        4 => (any::<usize>(), 0u32..64).prop_map(|(word, bit)| Damage::FlipPoolBit { word, bit }),
        3 => (any::<usize>(), any::<usize>()).prop_map(|(from, to)| Damage::CopyPoolWord { from, to }),
        2 => (any::<usize>(), 1..=u64::MAX).prop_map(|(word, value)| Damage::SetPoolWord { word, value }),
        2 => any::<usize>().prop_map(|word| Damage::ZeroPoolWord { word }),
        2 => any::<usize>().prop_map(|word| Damage::OlderPoolWord { word }),
        1 => (any::<usize>(), 0u32..8).prop_map(|(at, bit)| Damage::FlipJournalBit { at, bit }),
        1 => any::<usize>().prop_map(|keep| Damage::TruncateJournal { keep }),
    ]
}

/// Applies `damage` to copies of the baseline's files; says also whether
/// a pool word was left as a lost write leaves it: zero where it held
/// something, or holding an earlier value.
fn damaged(b: &Baseline, damage: &[Damage]) -> (Vec<u8>, Vec<u8>, bool) {
    let (mut pool, mut journal) = (b.pool.clone(), b.journal.clone());
    let word = |i: usize| b.written_words[i % b.written_words.len()];
    let put = |pool: &mut Vec<u8>, at: usize, v: u64| {
        pool[at..at + 8].copy_from_slice(&v.to_le_bytes());
    };
    let get = |pool: &Vec<u8>, at: usize| u64::from_le_bytes(pool[at..at + 8].try_into().unwrap());
    let mut zeroed = false;
    let mut older_word = false;
    for d in damage {
        let at = match *d {
            Damage::FlipPoolBit { word: w, bit } => {
                let at = word(w);
                let v = get(&pool, at) ^ (1 << bit);
                put(&mut pool, at, v);
                Some(at)
            }
            Damage::CopyPoolWord { from, to } => {
                let v = get(&pool, word(from));
                put(&mut pool, word(to), v);
                Some(word(to))
            }
            Damage::SetPoolWord { word: w, value } => {
                put(&mut pool, word(w), value);
                Some(word(w))
            }
            Damage::ZeroPoolWord { word: w } => {
                put(&mut pool, word(w), 0);
                Some(word(w))
            }
            Damage::OlderPoolWord { word: w } => {
                let older = get(&b.earlier_pool, word(w));
                put(&mut pool, word(w), older);
                older_word |= older != get(&b.pool, word(w));
                Some(word(w))
            }
            Damage::FlipJournalBit { at, bit } => {
                if !journal.is_empty() {
                    let n = journal.len();
                    journal[at % n] ^= 1 << bit;
                }
                None
            }
            Damage::TruncateJournal { keep } => {
                let n = journal.len() + 1;
                journal.truncate(keep % n);
                None
            }
        };
        zeroed |= at.is_some_and(|at| get(&pool, at) == 0);
    }
    (pool, journal, zeroed || older_word)
}

/// What a reader delivered: an event, or a gap it was told about.
enum Got {
    Event(u64, Vec<u8>),
    Gap,
}

/// Reads `r` to its end, moving past every told gap.
fn read_all(r: &mut Replay) -> Vec<Got> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    // Bounded: a session holds at most a few hundred events here.
    for _ in 0..10_000 {
        match r.next_into(&mut buf) {
            Ok(Some(id)) => out.push(Got::Event(id.seq, buf.clone())),
            Ok(None) => return out,
            Err(ReplayError::Lagged { .. }) => {
                out.push(Got::Gap);
                r.skip_gap();
            }
            Err(e) => panic!("replay of a restored session failed: {e}"),
        }
    }
    panic!("a replay that never ends");
}

/// Every event `h` delivers on each of its streams is one `expected`
/// holds for it, in rising order, and an event of the stream that is
/// missing between two delivered ones was told as a gap — unless
/// `silent_loss_possible`: a zeroed word can make a finished frame look
/// like one whose writer died before its mark (an append that never
/// returned, whose number recovery skips without a gap), and the two leave
/// the same words behind — unless the machine restarted, when recovery
/// tells every unfinished frame as a gap. Returns how many were delivered.
fn check_session(
    h: &SessionHandle,
    streams: &[u32],
    expected: &dyn Fn(u64) -> Option<(u32, Vec<u8>)>,
    silent_loss_possible: bool,
) -> Result<usize, TestCaseError> {
    let mut delivered = 0;
    for &stream in streams {
        let mut last = None;
        let mut told = false;
        for got in read_all(&mut h.subscribe_from_start(stream)) {
            let (seq, bytes) = match got {
                Got::Gap => {
                    told = true;
                    continue;
                }
                Got::Event(seq, bytes) => (seq, bytes),
            };
            let Some((want_stream, want)) = expected(seq) else {
                return Err(TestCaseError::fail(format!(
                    "session {} delivered seq {seq} on stream {stream}, which was never appended: {:?}",
                    h.id(),
                    String::from_utf8_lossy(&bytes)
                )));
            };
            prop_assert_eq!(want_stream, stream, "seq {} on the wrong stream", seq);
            prop_assert!(
                bytes == want,
                "session {} seq {seq}: delivered {:?}, appended {:?}",
                h.id(),
                String::from_utf8_lossy(&bytes),
                String::from_utf8_lossy(&want)
            );
            if let Some(prev) = last {
                prop_assert!(seq > prev, "seq {seq} after {prev} on stream {stream}");
                let skipped =
                    (prev + 1..seq).find(|&s| expected(s).is_some_and(|(t, _)| t == stream));
                prop_assert!(
                    told || skipped.is_none() || silent_loss_possible,
                    "session {} stream {stream}: seq {:?} missing between {prev} and {seq} without a gap",
                    h.id(),
                    skipped
                );
            }
            last = Some(seq);
            told = false;
            delivered += 1;
        }
    }
    Ok(delivered)
}

proptest! {
    // A few seconds per run; `REWIND_DAMAGE_CASES=100000` for a campaign.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("REWIND_DAMAGE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_damaged_directory_is_refused_or_restores_only_what_was_appended(
        damage in prop::collection::vec(damage(), 1..6),
        wipe_boot_record in any::<bool>(),
    ) {
        let b = baseline();
        let (mut pool, journal, lost_write) = damaged(b, &damage);
        // Half the cases as if the machine had restarted since the files
        // were written: a boot record that names no boot (as one another
        // kernel boot wrote does not name this one). Damage to the record
        // says the same.
        if wipe_boot_record {
            pool[BOOT_RECORD].fill(0);
        }
        let restarted = pool[BOOT_RECORD] != b.pool[BOOT_RECORD];
        let silent_loss_possible = lost_write && !restarted;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(POOL_FILE), &pool).unwrap();
        std::fs::write(dir.path().join(JOURNAL_FILE), &journal).unwrap();

        // The offline check reads the same bytes: an answer, never a panic.
        match rewind_engine::durable::check(dir.path()) {
            Ok(report) => drop(report.to_string()),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }

        let engine = match Engine::new(config(dir.path())) {
            Ok(e) => e,
            Err(e) => {
                // Refused, with a reason.
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };

        if let Some(report) = engine.recovery() {
            prop_assert_eq!(report.machine_restarted, restarted);
        }

        // Only sessions that were there come back.
        for h in engine.restored_sessions() {
            prop_assert!(b.ids.contains(&h.id()), "restored {} was never opened", h.id());
        }
        // Each restored session delivers only its own events.
        let mut restored = Vec::new();
        for (i, &id) in b.ids.iter().enumerate() {
            let Some(h) = engine.session(id) else { continue };
            check_session(
                &h,
                &b.streams[i],
                &|seq| b.events.get(&(i, seq)).cloned(),
                silent_loss_possible,
            )?;
            // No number is handed out again: a client that was delivered
            // event n and resumes from it must not find a new event n
            // (and those before it) taken for the one it saw.
            prop_assert!(
                h.high_water() >= EVENTS_PER_SESSION || silent_loss_possible,
                "session {} restored with high water {}: numbers up to {} would be handed out again",
                h.id(),
                h.high_water(),
                EVENTS_PER_SESSION
            );
            restored.push((i, h));
        }

        // The engine goes on: more events for every restored session and
        // for a new one, then every session reads back only its own — a
        // segment still held is never handed out again.
        let fresh = engine.open(None).unwrap();
        let fresh_stream = fresh.new_stream().unwrap();
        let mut after: HashMap<(usize, u64), (u32, Vec<u8>)> = HashMap::new();
        for n in 0..40u64 {
            for (i, h) in &restored {
                let stream = b.streams[*i][(n % 2) as usize];
                let seq = h.high_water() + 1;
                let p = payload(*i + 10, stream, seq);
                match h.append(stream, &p) {
                    Ok(id) => {
                        prop_assert_eq!(id.seq, seq);
                        after.insert((*i, seq), (stream, p));
                    }
                    Err(e) => prop_assert!(!e.to_string().is_empty()),
                }
            }
            let seq = fresh.high_water() + 1;
            let p = payload(99, fresh_stream, seq);
            let id = fresh.append(fresh_stream, &p).unwrap();
            after.insert((99, id.seq), (fresh_stream, p));
        }
        for (i, h) in &restored {
            let i = *i;
            check_session(
                h,
                &b.streams[i],
                &|seq| after.get(&(i, seq)).or_else(|| b.events.get(&(i, seq))).cloned(),
                silent_loss_possible,
            )?;
        }
        let n = check_session(&fresh, &[fresh_stream], &|seq| after.get(&(99, seq)).cloned(), false)?;
        prop_assert_eq!(n, 40, "the new session lost events");
    }
}
