//! kill -9 at random moments: after every restart, each session replays
//! every acknowledged event exactly once and in order — never a torn,
//! foreign or duplicated one.
//!
//! The test re-executes its own binary as the child (selected by an
//! environment variable): four threads, one per session, append in a loop
//! and print `ack SESSION SEQ` after each `append` returns. The parent
//! SIGKILLs the child after a random delay (sometimes before it has even
//! finished recovering), then opens the directory itself and checks every
//! session against the acknowledgements, then starts the next child on the
//! same directory.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rewind_engine::{Config, Engine, ReplayError, SessionHandle, SessionId};

const CHILD_DIR: &str = "REWIND_CRASH_CHILD_DIR";
const CHILD_SESSIONS: &str = "REWIND_CRASH_CHILD_SESSIONS";
/// Writers per session; with more than one, payloads name their writer
/// (`CHILD_RUN` tells runs apart) instead of their sequence number.
const CHILD_WRITERS: &str = "REWIND_CRASH_CHILD_WRITERS";
const CHILD_RUN: &str = "REWIND_CRASH_CHILD_RUN";
const SESSIONS: usize = 4;
const ITERATIONS: usize = 60;

fn config(dir: &Path) -> Config {
    let mut c = Config::default();
    c.global_bytes = 4 << 20;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 16 * 1024;
    // Small retention: segments are released (and reused) all the time.
    c.session_events = 64;
    c.session_bytes = 1 << 30;
    c.data_dir = Some(dir.to_owned());
    c
}

fn payload(session: usize, seq: u64) -> Vec<u8> {
    let len = 5 + (seq as usize * 37 + session * 11) % 600;
    let unit = format!("s{session}e{seq}|");
    unit.bytes().cycle().take(len).collect()
}

/// The payload of writer `writer`'s `n`th append of run `run`.
fn writer_payload(session: usize, writer: usize, run: usize, n: u64) -> Vec<u8> {
    let len = 12 + (n as usize * 53 + writer * 7) % 500;
    let unit = format!("s{session}w{writer}r{run}n{n}|");
    unit.bytes().cycle().take(len).collect()
}

/// Who wrote a payload of [`writer_payload`]: `(session, writer, run, n)`.
fn parse_writer_payload(bytes: &[u8]) -> Option<(usize, usize, usize, u64)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let unit = text.split('|').next()?;
    let rest = unit.strip_prefix('s')?;
    let (s, rest) = rest.split_once('w')?;
    let (w, rest) = rest.split_once('r')?;
    let (r, n) = rest.split_once('n')?;
    let who = (
        s.parse().ok()?,
        w.parse().ok()?,
        r.parse().ok()?,
        n.parse().ok()?,
    );
    (writer_payload(who.0, who.1, who.2, who.3) == bytes).then_some(who)
}

/// The child: appends until killed. Runs only when re-executed by the test.
#[test]
fn crash_child_appends_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    // The harness has printed "test NAME ... " without a newline.
    println!();
    let engine = Engine::new(config(Path::new(&dir))).expect("child opens the data dir");
    let ids = std::env::var(CHILD_SESSIONS).unwrap_or_default();
    let handles: Vec<SessionHandle> = if ids.is_empty() {
        (0..SESSIONS)
            .map(|i| {
                let s = engine.open(None).unwrap();
                println!("open {i} {}", s.id());
                s
            })
            .collect()
    } else {
        ids.split(',')
            .enumerate()
            .map(|(i, id)| {
                let id = SessionId::parse(id).unwrap();
                let s = engine.session(id).expect("restored session");
                // The parent holds this to what it verified before: the
                // child's own recovery must not lose anything either.
                println!("restored {i} {}", s.high_water());
                s
            })
            .collect()
    };
    println!("ready");
    let writers: usize = std::env::var(CHILD_WRITERS).map_or(1, |w| w.parse().unwrap());
    let run: usize = std::env::var(CHILD_RUN).map_or(0, |r| r.parse().unwrap());
    std::thread::scope(|scope| {
        for (i, s) in handles.iter().enumerate() {
            if writers == 1 {
                scope.spawn(move || loop {
                    let seq = s.high_water() + 1;
                    let id = s.append(0, &payload(i, seq)).unwrap();
                    assert_eq!(id.seq, seq, "one writer per session");
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {i} {seq}").unwrap();
                });
                continue;
            }
            for w in 0..writers {
                scope.spawn(move || {
                    for n in 0.. {
                        let id = s.append(0, &writer_payload(i, w, run, n)).unwrap();
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ack {i} {} {w} {n}", id.seq).unwrap();
                    }
                });
            }
        }
    });
}

/// One crash test at a time in this process. Each opens its directory
/// in process between two children; a child another test spawns at that
/// moment holds a copy of the lock's descriptor until it execs (longer
/// than one might think on a loaded machine), and the next child of the
/// first test then finds the directory "locked by another process".
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A small xorshift: the delays only need to be spread, not secure.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every event of stream 0 still held, from the oldest.
fn replay_all(h: &SessionHandle) -> Vec<(u64, Vec<u8>)> {
    let mut r = h.subscribe_from_start(0);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    loop {
        match r.next_into(&mut buf) {
            Ok(Some(id)) => out.push((id.seq, buf.clone())),
            Ok(None) => return out,
            Err(ReplayError::Lagged { .. }) => {
                r.skip_gap();
            }
            Err(e) => panic!("replay failed: {e}"),
        }
    }
}

#[test]
fn sigkilled_appenders_lose_only_unacknowledged_events_and_never_expose_a_torn_one() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let seed = std::env::var("REWIND_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    println!("seed {seed}");
    let mut rng = Rng(seed);
    let mut ids: Vec<SessionId> = Vec::new();
    let mut acked = [0u64; SESSIONS];
    let mut verified = [0u64; SESSIONS];
    let started = Instant::now();
    let mut early_kills = 0;
    for iteration in 0..ITERATIONS {
        let joined: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_appends_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir.path())
            .env(CHILD_SESSIONS, joined.join(","))
            .env(CHILD_WRITERS, "1")
            .stdout(Stdio::piped())
            // A child that dies on its own says why in the test output.
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // One kill in five lands while the child is still opening (and
        // recovering) the directory; the others during appends.
        let early = !ids.is_empty() && rng.below(5) == 0;
        let mut lines = Vec::new();
        if early {
            early_kills += 1;
            std::thread::sleep(Duration::from_millis(rng.below(15)));
        } else {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let line = rx
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .expect("child got ready");
                let ready = line == "ready";
                lines.push(line);
                if ready {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1 + rng.below(30)));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());

        for line in &lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["open", i, id] => {
                    let i: usize = i.parse().unwrap();
                    assert_eq!(i, ids.len());
                    ids.push(SessionId::parse(id).unwrap());
                }
                ["ack", i, seq] => {
                    let (i, seq): (usize, u64) = (i.parse().unwrap(), seq.parse().unwrap());
                    assert_eq!(seq, acked[i] + 1, "acks of a session come in order");
                    acked[i] = seq;
                }
                ["restored", i, high] => {
                    let (i, high): (usize, u64) = (i.parse().unwrap(), high.parse().unwrap());
                    assert!(
                        high >= verified[i],
                        "iteration {iteration}: the child restored session {i} at high \
                         water {high}, below the {} verified before",
                        verified[i]
                    );
                }
                _ => {}
            }
        }
        if ids.len() < SESSIONS {
            // Killed before it announced all its sessions: start over with
            // new ones (the unannounced ones stay in the directory,
            // restored each time, harmlessly).
            ids.clear();
            continue;
        }

        let engine = Engine::new(config(dir.path())).expect("reopen after SIGKILL");
        for (i, id) in ids.iter().enumerate() {
            let s = engine
                .session(*id)
                .unwrap_or_else(|| {
                    panic!(
                        "iteration {iteration}: session {i} is gone; recovery: {:?}; restored: {}; metrics: {:?}",
                        engine.recovery(),
                        engine.restored_sessions().len(),
                        engine.metrics()
                    )
                });
            let events = replay_all(&s);
            let high = s.high_water();
            assert!(
                high >= acked[i],
                "iteration {iteration}: session {i} lost acknowledged events \
                 (high water {high}, acked {})",
                acked[i]
            );
            assert!(
                high <= acked[i] + 1 && high >= verified[i],
                "iteration {iteration}: session {i} has events nobody appended \
                 (high water {high}, acked {}, verified before {})",
                acked[i],
                verified[i]
            );
            let first = events.first().map_or(high + 1, |(seq, _)| *seq);
            let seqs: Vec<u64> = events.iter().map(|(seq, _)| *seq).collect();
            assert_eq!(
                seqs,
                (first..=high).collect::<Vec<_>>(),
                "iteration {iteration}: session {i} replays out of order, twice or with a hole"
            );
            assert!(
                high + 1 - first >= 64.min(high),
                "iteration {iteration}: session {i} keeps less than its retention \
                 ({first}..={high}); recovery: {:?}",
                engine.recovery()
            );
            for (seq, bytes) in &events {
                assert!(
                    *bytes == payload(i, *seq),
                    "iteration {iteration}: session {i} event {seq} is torn or foreign"
                );
            }
            // An event that was stored but not acknowledged is kept: it
            // counts as acknowledged from now on.
            acked[i] = high;
            verified[i] = high;
        }
        drop(engine);
    }
    let total: u64 = acked.iter().sum();
    println!(
        "{ITERATIONS} kills ({early_kills} during open), {total} events, {:?}",
        started.elapsed()
    );
    assert!(total > 0);
    assert!(started.elapsed() < Duration::from_secs(90));
}

/// What the parent knows of one session of the concurrent test: every event
/// it has seen acknowledged or replayed, by sequence number.
#[derive(Default)]
struct Known {
    events: std::collections::BTreeMap<u64, (usize, usize, u64)>,
    acked: std::collections::BTreeSet<u64>,
}

#[test]
fn sigkilled_concurrent_writers_of_one_session_lose_only_unacknowledged_events() {
    let _serial = serial();
    const WRITERS: usize = 2;
    const RUNS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("seed {seed}");
    let mut rng = Rng(seed);
    let mut ids: Vec<SessionId> = Vec::new();
    let mut known: Vec<Known> = (0..SESSIONS).map(|_| Known::default()).collect();
    let mut placeholders = 0usize;
    let started = Instant::now();
    for run in 0..RUNS {
        let joined: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        let sessions_env = if ids.is_empty() {
            String::new()
        } else {
            joined.join(",")
        };
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_appends_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir.path())
            .env(CHILD_SESSIONS, sessions_env)
            .env(CHILD_WRITERS, WRITERS.to_string())
            .env(CHILD_RUN, run.to_string())
            .stdout(Stdio::piped())
            // A child that dies on its own says why in the test output.
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut lines = Vec::new();
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("child got ready");
            let ready = line == "ready";
            lines.push(line);
            if ready {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1 + rng.below(25)));
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        let mut opened = Vec::new();
        for line in &lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["open", _, id] => opened.push(SessionId::parse(id).unwrap()),
                ["restored", i, high] => {
                    let (i, high): (usize, u64) = (i.parse().unwrap(), high.parse().unwrap());
                    let verified = known[i].acked.last().copied().unwrap_or(0);
                    assert!(
                        high >= verified,
                        "run {run}: the child restored session {i} at high water {high}, \
                         below the {verified} known before"
                    );
                }
                ["ack", i, seq, w, n] => {
                    let i: usize = i.parse().unwrap();
                    let seq: u64 = seq.parse().unwrap();
                    let who = (w.parse().unwrap(), run, n.parse().unwrap());
                    let k = &mut known[i];
                    assert!(k.acked.insert(seq), "run {run}: seq {seq} acked twice");
                    assert_eq!(*k.events.entry(seq).or_insert(who), who);
                }
                _ => {}
            }
        }
        if ids.is_empty() {
            ids = opened;
            assert_eq!(ids.len(), SESSIONS, "the child announced its sessions");
        }

        let engine = Engine::new(config(dir.path())).expect("reopen after SIGKILL");
        for (i, id) in ids.iter().enumerate() {
            let s = engine.session(*id).unwrap_or_else(|| {
                panic!(
                    "run {run}: session {i} is gone; recovery: {:?}; restored: {}",
                    engine.recovery(),
                    engine.restored_sessions().len()
                )
            });
            let events = replay_all(&s);
            let high = s.high_water();
            let k = &mut known[i];
            let max_acked = k.acked.last().copied().unwrap_or(0);
            assert!(
                high >= max_acked,
                "run {run}: session {i} lost its newest acked event"
            );
            let first = events.first().map_or(high + 1, |(seq, _)| *seq);
            assert!(
                high + 1 - first
                    >= 64
                        .min(high)
                        .saturating_sub((WRITERS as u64 * (run as u64 + 1)).min(64)),
                "run {run}: session {i} keeps too little ({first}..={high})"
            );
            let mut last_n = std::collections::HashMap::new();
            let mut prev = 0;
            for (seq, bytes) in &events {
                assert!(*seq > prev, "run {run}: session {i} replays out of order");
                prev = *seq;
                let (si, w, r, n) = parse_writer_payload(bytes)
                    .unwrap_or_else(|| panic!("run {run}: session {i} event {seq} is torn"));
                assert_eq!(si, i, "run {run}: event {seq} of session {i} is foreign");
                if let Some(&before) = last_n.get(&(w, r)) {
                    assert!(
                        n > before,
                        "run {run}: writer {w}/{r} out of order or twice"
                    );
                }
                last_n.insert((w, r), n);
                let who = (w, r, n);
                assert_eq!(
                    *k.events.entry(*seq).or_insert(who),
                    who,
                    "run {run}: session {i} event {seq} changed"
                );
            }
            let present: std::collections::BTreeSet<u64> =
                events.iter().map(|(seq, _)| *seq).collect();
            for seq in first..=high {
                if !present.contains(&seq) {
                    assert!(
                        !k.acked.contains(&seq),
                        "run {run}: session {i} lost acknowledged event {seq}"
                    );
                    assert!(
                        !k.events.contains_key(&seq),
                        "run {run}: session {i} lost event {seq} replayed before"
                    );
                    placeholders += 1;
                }
            }
            // Replayed once, kept forever: later runs must agree.
            k.acked.extend(present);
        }
        drop(engine);
    }
    println!(
        "{RUNS} kills of {WRITERS} writers per session, {placeholders} unfinished numbers skipped, {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(90));
}
