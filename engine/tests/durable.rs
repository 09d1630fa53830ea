//! Durable pools: a data directory that survives the engine, refusals of
//! directories that cannot be trusted, and recovery of damaged ones.

use std::path::Path;

use rewind_engine::durable::DataDirError;
use rewind_engine::{
    Config, ConfigError, Engine, Replay, ReplayError, ResumeAction, ResumeRequest, SessionFact,
    SessionHandle, SessionId, Verdict,
};

fn config(dir: &Path) -> Config {
    let mut c = Config::default();
    c.global_bytes = 4 << 20;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 16 * 1024;
    c.session_events = 10_000;
    c.session_bytes = 1 << 30;
    c.data_dir = Some(dir.to_owned());
    c
}

fn payload(session: usize, seq: u64) -> Vec<u8> {
    let len = 5 + (seq as usize * 37) % 300;
    let unit = format!("s{session}e{seq}|");
    unit.bytes().cycle().take(len).collect()
}

/// Every event of `stream` still held, from the oldest: (seq, payload).
fn replay_all(h: &SessionHandle, stream: u32) -> Vec<(u64, Vec<u8>)> {
    let mut r = h.subscribe_from_start(stream);
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

/// Reads `r` to its end: the events, and the sequence numbers of the gaps
/// it was told about (each `Lagged` moved past with `skip_gap`).
fn read_with_gaps(r: &mut Replay) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
    let (mut events, mut gaps) = (Vec::new(), Vec::new());
    let mut buf = Vec::new();
    for _ in 0..10_000 {
        match r.next_into(&mut buf) {
            Ok(Some(id)) => events.push((id.seq, buf.clone())),
            Ok(None) => return (events, gaps),
            Err(ReplayError::Lagged { missing_seq, .. }) => {
                gaps.push(missing_seq);
                r.skip_gap();
            }
            Err(e) => panic!("replay failed: {e}"),
        }
    }
    panic!("a replay that never ends");
}

fn data_dir_error(c: Config) -> DataDirError {
    match Engine::new(c).unwrap_err() {
        ConfigError::DataDir(e) => e,
        other => panic!("expected a data_dir error, got {other}"),
    }
}

#[test]
fn a_new_directory_is_made_and_every_reopen_has_a_larger_boot_counter_and_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let mut last_boot = 0;
    let mut last_epoch = 0;
    for round in 0..4 {
        let e = Engine::new(config(dir.path())).unwrap();
        let report = e.recovery().expect("durable").clone();
        assert_eq!(report.created, round == 0);
        assert!(report.boot_counter > last_boot, "{report:?}");
        last_boot = report.boot_counter;
        assert!(e.boot_epoch() > last_epoch);
        let s = e.open(None).unwrap();
        assert!(s.epoch() >= e.boot_epoch());
        assert!(s.epoch() > last_epoch);
        last_epoch = s.epoch();
    }
}

#[test]
fn a_second_engine_on_an_open_directory_is_refused_as_locked() {
    let dir = tempfile::tempdir().unwrap();
    let first = Engine::new(config(dir.path())).unwrap();
    let e = data_dir_error(config(dir.path()));
    assert!(matches!(e, DataDirError::Locked { .. }), "{e}");
    assert!(e.to_string().contains("locked by another process"));
    drop(first);
    Engine::new(config(dir.path())).expect("the lock goes with the engine");
}

#[test]
fn a_pool_file_of_another_layout_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    drop(Engine::new(config(dir.path())).unwrap());
    let before = std::fs::read(dir.path().join("pool")).unwrap();
    let mut other = config(dir.path());
    other.global_bytes = 8 << 20;
    let e = data_dir_error(other);
    assert!(matches!(e, DataDirError::LayoutMismatch { .. }), "{e}");
    assert!(e.to_string().contains("global_bytes"), "{e}");
    assert_eq!(std::fs::read(dir.path().join("pool")).unwrap(), before);
}

#[test]
fn truncated_foreign_and_other_version_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(Engine::new(config(dir.path())).unwrap());
    let pool = dir.path().join("pool");
    let good = std::fs::read(&pool).unwrap();

    std::fs::write(&pool, &good[..good.len() - 4096]).unwrap();
    let e = data_dir_error(config(dir.path()));
    assert!(matches!(e, DataDirError::Truncated { .. }), "{e}");
    std::fs::write(&pool, &good[..100]).unwrap();
    let e = data_dir_error(config(dir.path()));
    assert!(matches!(e, DataDirError::Truncated { .. }), "{e}");

    let mut foreign = good.clone();
    foreign[..8].copy_from_slice(b"NOTAPOOL");
    foreign[2048..2056].copy_from_slice(b"NOTAPOOL");
    std::fs::write(&pool, &foreign).unwrap();
    let e = data_dir_error(config(dir.path()));
    assert!(matches!(e, DataDirError::BadMagic { .. }), "{e}");

    // Another version in both copies, with checksums that match it: a
    // newer one and one older than anything this build reads are refused.
    let with_version = |v: u32| {
        let mut file = good.clone();
        stamp_version(&mut file, v);
        file
    };
    for v in [1, 6] {
        std::fs::write(&pool, with_version(v)).unwrap();
        let e = data_dir_error(config(dir.path()));
        assert!(
            matches!(e, DataDirError::Version { found, expected: 5, .. } if found == v),
            "{e}"
        );
    }
    // Version 2 (before the allocation mark) is still read: its mark word
    // is 0, so recovery reads every unit, and the file stays version 2.
    let mut v2 = with_version(2);
    v2[4088..4096].fill(0);
    std::fs::write(&pool, &v2).unwrap();
    {
        let e = Engine::new(config(dir.path())).expect("a version-2 file opens");
        let report = e.recovery().unwrap();
        // Every unit: 512 bytes of data and two words of stamp and state.
        assert_eq!(report.scanned_units, (4u64 << 20) / 528, "{report:?}");
    }
    let reopened = std::fs::read(&pool).unwrap();
    assert_eq!(&reopened[8..12], &2u32.to_le_bytes());
    assert_eq!(
        &reopened[4088..4096],
        &[0u8; 8],
        "no mark appears in a version-2 file"
    );

    // A bit flipped in both copies: damaged, not misread.
    let mut flipped = good.clone();
    flipped[30] ^= 4;
    flipped[2048 + 30] ^= 4;
    std::fs::write(&pool, &flipped).unwrap();
    let e = data_dir_error(config(dir.path()));
    assert!(matches!(e, DataDirError::HeaderDamaged { .. }), "{e}");

    // One copy flipped: the other one carries on.
    let mut one = good.clone();
    one[30] ^= 4;
    std::fs::write(&pool, &one).unwrap();
    Engine::new(config(dir.path())).expect("one intact header copy is enough");
}

/// Writes format version `v` into both header copies of a pool file's
/// bytes, with checksums that match it.
fn stamp_version(file: &mut [u8], v: u32) {
    for at in [0, 2048] {
        file[at + 8..at + 12].copy_from_slice(&v.to_le_bytes());
        let crc = crc32fast::hash(&file[at..at + 64]);
        file[at + 64..at + 72].copy_from_slice(&u64::from(crc).to_le_bytes());
    }
}

/// [`stamp_version`] on `dir`'s pool file.
fn set_version(dir: &Path, v: u32) {
    let pool = dir.join("pool");
    let mut file = std::fs::read(&pool).unwrap();
    stamp_version(&mut file, v);
    std::fs::write(&pool, &file).unwrap();
}

fn version_of(dir: &Path) -> u32 {
    let file = std::fs::read(dir.join("pool")).unwrap();
    u32::from_le_bytes(file[8..12].try_into().unwrap())
}

#[test]
fn a_format_3_file_keeps_its_format_and_its_frames_checks_cover_their_payload_alone() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let e = Engine::new(config(dir.path())).unwrap();
        e.open(None).unwrap().id()
    };
    assert_eq!(version_of(dir.path()), 5, "a new file is made in format 5");
    // The same directory as a build of format 3 left it (its session has
    // no event yet, so nothing in it depends on the frame check).
    set_version(dir.path(), 3);
    {
        let e = Engine::new(config(dir.path())).unwrap();
        let s = e.session(id).expect("restored");
        let stream = s.new_stream().unwrap();
        for seq in 1..=30 {
            s.append(if seq % 2 == 0 { 0 } else { stream }, &payload(0, seq))
                .unwrap();
        }
    }
    assert_eq!(version_of(dir.path()), 3, "the file keeps its format");
    // Appended in format 3, the frames prove in format 3.
    {
        let e = Engine::new(config(dir.path())).unwrap();
        let report = e.recovery().unwrap().clone();
        assert_eq!(
            (report.events, report.damaged_frames),
            (30, 0),
            "{report:?}"
        );
        let s = e.session(id).unwrap();
        let evens: Vec<u64> = replay_all(&s, 0).into_iter().map(|(seq, _)| seq).collect();
        assert_eq!(evens, (2..=30).step_by(2).collect::<Vec<_>>());
    }
    // Checked as format 4 would check them (stream id included), every
    // frame fails: the two checks differ, and the file's format decides.
    set_version(dir.path(), 4);
    {
        let e = Engine::new(config(dir.path())).unwrap();
        let report = e.recovery().unwrap().clone();
        assert_eq!(
            (report.events, report.damaged_frames),
            (0, 30),
            "{report:?}"
        );
    }
    // Formats 3 and 4 keep the allocation mark as the plain unit; it
    // stays so (format 5's carries a check of itself in its high half).
    assert_eq!(version_of(dir.path()), 4);
    let mark = mark_of(dir.path());
    assert!(mark >> 32 == 0 && mark > 0, "{mark:#x}");
}

/// The allocation mark's word: the header page's last.
fn mark_of(dir: &Path) -> u64 {
    let file = std::fs::read(dir.join("pool")).unwrap();
    u64::from_le_bytes(file[4088..4096].try_into().unwrap())
}

#[test]
fn appended_events_replay_exactly_once_and_in_order_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    let mut cursors = Vec::new();
    let closed;
    {
        let e = Engine::new(config(dir.path())).unwrap();
        for i in 0..5 {
            let principal = format!("user-{i}");
            let s = e.open(Some(&principal)).unwrap();
            s.store_init(format!("{{\"client\":{i}}}").as_bytes())
                .unwrap();
            let mut last = None;
            for seq in 1..=200 {
                last = Some(s.append(0, &payload(i, seq)).unwrap());
            }
            ids.push(s.id());
            cursors.push(last.unwrap());
        }
        let gone = e.open(None).unwrap();
        gone.append(0, b"never again").unwrap();
        closed = gone.id();
        assert!(gone.close());
        // Sweeps give no file pages back: they are the data a restart reads.
        e.sweep();
        e.sweep();
        assert_eq!(e.metrics().bytes_released, 0);
    }
    let e = Engine::new(config(dir.path())).unwrap();
    let report = e.recovery().unwrap().clone();
    assert_eq!((report.sessions, report.events), (5, 1000), "{report:?}");
    assert_eq!(report.damaged_frames, 0);
    for (i, id) in ids.iter().enumerate() {
        let s = e.session(*id).expect("restored");
        assert!(s.is_restored());
        assert_eq!(s.principal(), Some(format!("user-{i}").as_str()));
        assert_eq!(
            s.stored_init(),
            Some(format!("{{\"client\":{i}}}").as_bytes())
        );
        let events = replay_all(&s, 0);
        let want: Vec<_> = (1..=200).map(|seq| (seq, payload(i, seq))).collect();
        assert_eq!(events, want, "session {i}");
        // Appends continue after the restored ones.
        assert_eq!(s.append(0, b"after").unwrap().seq, 201);
    }
    assert!(e.session(closed).is_none(), "a closed session stays closed");
    let fresh = e.open(None).unwrap();
    fresh.append(0, b"new").unwrap();
    let (fid, fcur) = (fresh.id().to_string(), fresh.cursor_now(0).to_string());
    let f = e.facts(ResumeRequest {
        session_id: Some(&fid),
        last_event_id: Some(&fcur),
        principal: None,
    });
    assert_eq!(f.session_fact(), Some(SessionFact::Live));

    // A cursor from before the restart resumes on the restored session, for
    // the principal it is bound to only.
    let sid = ids[2].to_string();
    let cursor = cursors[2].to_string();
    let d = e.resume(ResumeRequest {
        session_id: Some(&sid),
        last_event_id: Some(&cursor),
        principal: Some("user-2"),
    });
    assert_eq!(d.verdict, Verdict::Resume, "{:?}", d.facts);
    assert_eq!(d.facts.session_fact(), Some(SessionFact::Restored));
    let ResumeAction::Replay(mut r) = d.action else {
        panic!("expected a replay")
    };
    let mut buf = Vec::new();
    assert_eq!(r.next_into(&mut buf).unwrap().map(|id| id.seq), Some(201));
    assert_eq!(buf, b"after");
    let d = e.resume(ResumeRequest {
        session_id: Some(&sid),
        last_event_id: Some(&cursor),
        principal: Some("user-3"),
    });
    assert_ne!(d.verdict, Verdict::Resume);
    let closed = closed.to_string();
    let d = e.resume(ResumeRequest {
        session_id: Some(&closed),
        last_event_id: Some(&cursor),
        principal: None,
    });
    assert_eq!(d.verdict, Verdict::Gone);
}

#[test]
fn restored_sessions_never_hand_out_a_stream_id_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (id, mut seen) = {
        let e = Engine::new(config(dir.path())).unwrap();
        let s = e.open(None).unwrap();
        let seen: Vec<u32> = (0..300).map(|_| s.new_stream().unwrap()).collect();
        (s.id(), seen)
    };
    let e = Engine::new(config(dir.path())).unwrap();
    let s = e.session(id).unwrap();
    seen.extend((0..300).map(|_| s.new_stream().unwrap()));
    let n = seen.len();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), n, "a stream id was handed out twice");
}

/// Flips one byte in the middle of the only occurrence of `needle` in `file`.
fn flip_inside(file: &Path, needle: &[u8]) {
    let mut bytes = std::fs::read(file).unwrap();
    let at: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "needle must occur once");
    bytes[at[0] + needle.len() / 2] ^= 0x20;
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn a_frame_with_a_mark_but_a_wrong_checksum_becomes_a_told_gap_and_its_neighbours_are_kept() {
    // The damaged frame sits in a sealed segment (segments grow 512 B, 1 KiB,
    // ...; 40 events of up to 300 bytes fill several).
    let dir = tempfile::tempdir().unwrap();
    let (damaged, intact, cursor) = {
        let e = Engine::new(config(dir.path())).unwrap();
        let a = e.open(None).unwrap();
        let b = e.open(None).unwrap();
        let mut cursor = None;
        for seq in 1..=40 {
            b.append(0, &payload(1, seq)).unwrap();
            if seq == 20 {
                a.append(0, b"TORN-TARGET-PAYLOAD-0123456789").unwrap();
            } else {
                let id = a.append(0, &payload(0, seq)).unwrap();
                if seq == 19 {
                    cursor = Some(id);
                }
            }
        }
        assert!(
            a.high_water() == 40 && a.held_bytes() > 1024,
            "a chain of segments"
        );
        (a.id(), b.id(), cursor.unwrap())
    };
    flip_inside(&dir.path().join("pool"), b"TORN-TARGET-PAYLOAD-0123456789");
    let check = rewind_engine::durable::check(dir.path()).unwrap();
    assert!(!check.is_clean(), "{check}");
    assert!(check.damaged_frames >= 1, "{check}");

    let e = Engine::new(config(dir.path())).unwrap();
    let report = e.recovery().unwrap().clone();
    assert_eq!(report.damaged_frames, 1, "{report:?}");
    // The other session lost nothing.
    let b = e.session(intact).unwrap();
    let want: Vec<_> = (1..=40).map(|seq| (seq, payload(1, seq))).collect();
    assert_eq!(replay_all(&b, 0), want);
    // The damaged one never delivers the torn event and never reuses its
    // number; every reader that passes it is told (a gap at 20); every
    // other event, older or newer, is kept intact.
    let a = e.session(damaged).unwrap();
    let (events, gaps) = read_with_gaps(&mut a.subscribe_from_start(0));
    let want: Vec<_> = (1..=40)
        .filter(|&seq| seq != 20)
        .map(|seq| (seq, payload(0, seq)))
        .collect();
    assert_eq!(events, want);
    assert_eq!(gaps, vec![20]);
    assert_eq!(a.high_water(), 40, "sequence numbers are not reused");
    // A reader of another stream is told too: the damaged frame's stream
    // cannot be known for sure.
    assert_eq!(read_with_gaps(&mut a.subscribe_from_start(7)).1, vec![20]);
    // A client resuming from just before the damage resumes: the gap
    // first, then the rest.
    let sid = damaged.to_string();
    let cursor = cursor.to_string();
    let d = e.resume(ResumeRequest {
        session_id: Some(&sid),
        last_event_id: Some(&cursor),
        principal: None,
    });
    assert_eq!(d.verdict, Verdict::Resume, "{:?}", d.facts);
    let ResumeAction::Replay(mut r) = d.action else {
        panic!("a resume without a reader");
    };
    let (events, gaps) = read_with_gaps(&mut r);
    assert_eq!(gaps, vec![20]);
    assert_eq!(events, want[19..].to_vec());
    // A second restart finds the marker again and counts no new damage.
    drop((a, b, r, e));
    let e = Engine::new(config(dir.path())).unwrap();
    assert_eq!(e.recovery().unwrap().damaged_frames, 0);
    let a = e.session(damaged).unwrap();
    assert_eq!(
        read_with_gaps(&mut a.subscribe_from_start(0)),
        (want, vec![20])
    );
}

#[test]
fn a_damaged_journal_record_drops_only_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<SessionId> = {
        let e = Engine::new(config(dir.path())).unwrap();
        (0..3)
            .map(|i| {
                let s = e.open(Some(&format!("principal-{i}-xyz"))).unwrap();
                for seq in 1..=10 {
                    s.append(0, &payload(i, seq)).unwrap();
                }
                s.id()
            })
            .collect()
    };
    let journal = dir.path().join("sessions.journal");
    flip_inside(&journal, b"principal-1-xyz");
    // And a torn last record, as a crash of the machine mid-write leaves.
    let mut bytes = std::fs::read(&journal).unwrap();
    bytes.extend_from_within(..20);
    std::fs::write(&journal, bytes).unwrap();

    let check = rewind_engine::durable::check(dir.path()).unwrap();
    assert_eq!(check.torn_records, 2, "{check}");
    assert_eq!(check.sessions.len(), 2, "{check}");

    let e = Engine::new(config(dir.path())).unwrap();
    let report = e.recovery().unwrap().clone();
    assert_eq!(report.torn_records, 2, "{report:?}");
    assert_eq!(report.sessions, 2);
    assert!(
        report.dropped_segments >= 1,
        "the lost session's segments are freed"
    );
    assert!(e.session(ids[1]).is_none());
    for i in [0, 2] {
        let s = e.session(ids[i]).unwrap();
        let want: Vec<_> = (1..=10).map(|seq| (seq, payload(i, seq))).collect();
        assert_eq!(replay_all(&s, 0), want);
    }
    drop(e);
    // The journal was rewritten clean.
    assert!(rewind_engine::durable::check(dir.path())
        .unwrap()
        .is_clean());
}

#[test]
fn the_check_of_a_healthy_directory_lists_its_sessions_and_sees_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::new(config(dir.path())).unwrap();
    let s = e.open(Some("carol")).unwrap();
    for seq in 1..=7 {
        s.append(0, &payload(0, seq)).unwrap();
    }
    let live = rewind_engine::durable::check(dir.path()).unwrap();
    assert!(live.locked);
    drop((s, e));
    let report = rewind_engine::durable::check(dir.path()).unwrap();
    assert!(!report.locked);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.sessions.len(), 1);
    assert_eq!(report.sessions[0].high_water, 7);
    assert_eq!(report.sessions[0].principal.as_deref(), Some("carol"));
    assert_eq!(report.events, 7);
    // Checking changed nothing: a second check sees the same boot counter.
    let again = rewind_engine::durable::check(dir.path()).unwrap();
    assert_eq!(again.boot_counter, report.boot_counter);
}

#[test]
fn sync_policies_are_validated_and_every_append_sync_works() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.sync = rewind_engine::SyncPolicy::EveryMs(0);
    assert_eq!(Engine::new(c).unwrap_err(), ConfigError::ZeroSyncInterval);
    let mut c = config(dir.path());
    c.boot_epoch = Some(7);
    assert_eq!(
        Engine::new(c).unwrap_err(),
        ConfigError::BootEpochWithDataDir
    );
    for policy in [
        rewind_engine::SyncPolicy::EveryAppend,
        rewind_engine::SyncPolicy::EveryMs(5),
    ] {
        let mut c = config(dir.path());
        c.sync = policy;
        let e = Engine::new(c).unwrap();
        let s = e.open(None).unwrap();
        for seq in 1..=20 {
            s.append(0, &payload(0, seq)).unwrap();
        }
        e.sync().unwrap();
        assert_eq!(e.storage_errors(), 0);
    }
}

#[test]
fn a_damaged_frame_in_the_head_segment_is_never_delivered_and_its_number_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (id, cursor) = {
        let e = Engine::new(config(dir.path())).unwrap();
        let a = e.open(None).unwrap();
        let first = a.append(0, b"first").unwrap();
        a.append(0, b"HEAD-TARGET-PAYLOAD-0123456789").unwrap();
        a.append(0, b"third").unwrap();
        (a.id(), first)
    };
    flip_inside(&dir.path().join("pool"), b"HEAD-TARGET-PAYLOAD-0123456789");
    let e = Engine::new(config(dir.path())).unwrap();
    assert_eq!(e.recovery().unwrap().damaged_frames, 1);
    let a = e.session(id).unwrap();
    let (events, gaps) = read_with_gaps(&mut a.subscribe_from_start(0));
    assert_eq!(events, vec![(1, b"first".to_vec()), (3, b"third".to_vec())]);
    assert_eq!(gaps, vec![2]);
    assert_eq!(a.high_water(), 3, "the damaged number is not reused");
    assert_eq!(a.append(0, b"fourth").unwrap().seq, 4);
    let sid = id.to_string();
    let cursor = cursor.to_string();
    let d = e.resume(ResumeRequest {
        session_id: Some(&sid),
        last_event_id: Some(&cursor),
        principal: None,
    });
    assert_eq!(d.verdict, Verdict::Resume, "{:?}", d.facts);
    let ResumeAction::Replay(mut r) = d.action else {
        panic!("a resume without a reader");
    };
    assert_eq!(
        read_with_gaps(&mut r),
        (
            vec![(3, b"third".to_vec()), (4, b"fourth".to_vec())],
            vec![2]
        )
    );
}

#[test]
fn a_damaged_last_frame_of_the_head_keeps_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let e = Engine::new(config(dir.path())).unwrap();
        let a = e.open(None).unwrap();
        a.append(0, b"first").unwrap();
        a.append(0, b"LAST-TARGET-PAYLOAD-0123456789").unwrap();
        a.id()
    };
    flip_inside(&dir.path().join("pool"), b"LAST-TARGET-PAYLOAD-0123456789");
    let e = Engine::new(config(dir.path())).unwrap();
    assert_eq!(e.recovery().unwrap().damaged_frames, 1);
    let a = e.session(id).unwrap();
    assert_eq!(
        a.high_water(),
        2,
        "a number that may have been acknowledged"
    );
    assert_eq!(a.append(0, b"third").unwrap().seq, 3);
    assert_eq!(
        read_with_gaps(&mut a.subscribe_from_start(0)),
        (
            vec![(1, b"first".to_vec()), (3, b"third".to_vec())],
            vec![2]
        )
    );
}

#[test]
fn the_sweep_rewrites_a_grown_journal_and_a_restart_still_finds_exactly_the_live_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("sessions.journal");
    let (kept, streams) = {
        let e = Engine::new(config(dir.path())).unwrap();
        let kept = e.open(Some("erin")).unwrap();
        kept.store_init(b"{\"protocolVersion\":\"2025-06-18\"}")
            .unwrap();
        kept.append(0, b"kept").unwrap();
        let streams: Vec<u32> = (0..10).map(|_| kept.new_stream().unwrap()).collect();
        // Enough sessions coming and going to grow the journal past 1 MiB.
        for _ in 0..12_000 {
            let s = e.open(Some("churn")).unwrap();
            s.store_init(b"{}").unwrap();
            assert!(s.close());
        }
        let grown = std::fs::metadata(&journal).unwrap().len();
        assert!(grown > 1 << 20, "{grown}");
        e.sweep();
        let compacted = std::fs::metadata(&journal).unwrap().len();
        assert!(compacted < 4096, "{compacted}");
        // Records appended after the rewrite land in the new file.
        let later = e.open(None).unwrap();
        later.append(0, b"later").unwrap();
        ((kept.id(), later.id()), streams)
    };
    let e = Engine::new(config(dir.path())).unwrap();
    assert_eq!(e.recovery().unwrap().sessions, 2);
    let s = e.session(kept.0).unwrap();
    assert_eq!(s.principal(), Some("erin"));
    assert_eq!(
        s.stored_init(),
        Some(&b"{\"protocolVersion\":\"2025-06-18\"}"[..])
    );
    assert_eq!(replay_all(&s, 0), vec![(1, b"kept".to_vec())]);
    let next = s.new_stream().unwrap();
    assert!(next > *streams.iter().max().unwrap(), "stream ids go on");
    let later = e.session(kept.1).unwrap();
    assert_eq!(replay_all(&later, 0), vec![(1, b"later".to_vec())]);
}

/// A 64 MiB pool: room for a mark far above a few small sessions.
fn big_config(dir: &Path) -> Config {
    let mut c = config(dir);
    c.global_bytes = 64 << 20;
    c
}

/// Its units: 512 bytes of data and two words of stamp and state each.
const BIG_UNITS: u64 = (64 << 20) / 528;

#[test]
fn recovery_reads_only_the_units_the_pool_ever_used() {
    // A 64 MiB pool (127,100 units) holding a few small sessions: recovery
    // reads the stamps of the units at and above the allocation mark, the
    // most the pool ever held, not of the whole pool.
    let dir = tempfile::tempdir().unwrap();
    let big = || big_config(dir.path());
    let units = BIG_UNITS;
    let ids: Vec<_> = {
        let e = Engine::new(big()).unwrap();
        assert_eq!(e.recovery().unwrap().scanned_units, 0, "a new pool");
        (0..4)
            .map(|s| {
                let h = e.open(None).unwrap();
                for seq in 1..=50 {
                    h.append(0, &payload(s, seq)).unwrap();
                }
                h.id()
            })
            .collect()
    };
    // Format 5: the unit in the low half, its check in the high half.
    let mark = mark_of(dir.path()) & 0xffff_ffff;
    assert!(mark > 0 && mark < units, "mark {mark} of {units} units");
    let e = Engine::new(big()).unwrap();
    let report = e.recovery().unwrap().clone();
    assert_eq!(report.scanned_units, units - mark, "{report:?}");
    assert!(
        report.scanned_units * 100 < units,
        "{} of {units} units read for four small sessions",
        report.scanned_units
    );
    assert_eq!(report.sessions, 4);
    for (s, id) in ids.iter().enumerate() {
        let h = e.session(*id).unwrap();
        let want: Vec<_> = (1..=50).map(|seq| (seq, payload(s, seq))).collect();
        assert_eq!(replay_all(&h, 0), want);
    }
    // Appending after the restart allocates from the free lists the
    // recovery rebuilt; a third start still finds everything.
    for id in &ids {
        let h = e.session(*id).unwrap();
        for seq in 51..=80 {
            h.append(0, &payload(9, seq)).unwrap();
        }
    }
    drop(e);
    let e = Engine::new(big()).unwrap();
    assert_eq!(e.recovery().unwrap().events, 4 * 80);
    drop(e);

    // A flipped bit in the mark would once have read as a higher unit,
    // hiding the segments below it (their sessions restored empty, their
    // numbers handed out again). Format 5's mark checks itself: damaged,
    // it is unknown, every unit is read, and the mark is settled again.
    let path = dir.path().join("pool");
    let good = mark_of(dir.path());
    for bit in [3, 20, 40] {
        let mut file = std::fs::read(&path).unwrap();
        file[4088..4096].copy_from_slice(&(good ^ (1 << bit)).to_le_bytes());
        std::fs::write(&path, &file).unwrap();
        let e = Engine::new(big()).unwrap();
        let report = e.recovery().unwrap().clone();
        assert_eq!(report.scanned_units, units, "bit {bit}: {report:?}");
        assert_eq!((report.sessions, report.events), (4, 4 * 80), "bit {bit}");
        drop(e);
        assert_eq!(mark_of(dir.path()), good, "bit {bit}: settled again");
    }
}

#[test]
fn a_single_writers_events_survive_a_reopen_and_the_session_then_takes_any_appender() {
    let dir = tempfile::tempdir().unwrap();
    let (kept, closed);
    {
        let e = Engine::new(config(dir.path())).unwrap();
        let mut w = e.open_single_writer(None).unwrap();
        for seq in 1..=300 {
            assert_eq!(w.append(0, &payload(7, seq)).unwrap().seq, seq);
        }
        kept = w.handle().id();
        // Closed while its writer lives: the close leaves the head to the
        // writer, which is dropped with the engine.
        let mut gone = e.open_single_writer(None).unwrap();
        gone.append(0, b"never again").unwrap();
        closed = gone.handle().id();
        assert!(gone.handle().close());
        // The writer is still live when the engine goes away.
        drop(e);
        drop((w, gone));
    }
    let e = Engine::new(config(dir.path())).unwrap();
    let report = e.recovery().unwrap().clone();
    assert_eq!((report.sessions, report.events), (1, 300), "{report:?}");
    assert_eq!(report.damaged_frames, 0);
    let s = e.session(kept).expect("restored");
    let want: Vec<_> = (1..=300).map(|seq| (seq, payload(7, seq))).collect();
    assert_eq!(replay_all(&s, 0), want);
    assert_eq!(s.append(0, b"after").unwrap().seq, 301);
    assert!(e.session(closed).is_none(), "a closed session stays closed");
}

/// Where `needle` starts in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("the bytes are in the file")
}

#[test]
fn after_a_machine_restart_a_frame_whose_mark_never_reached_the_disk_is_told_as_a_gap() {
    // Five events; then the last one's completion mark is zeroed, as a
    // crash leaves it whether the writer died mid-append (same machine:
    // never acknowledged) or the machine lost the page after the append
    // returned (maybe delivered). Only the boot record says which.
    for restarted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let e = Engine::new(config(dir.path())).unwrap();
            assert!(!e.recovery().unwrap().machine_restarted, "a new directory");
            let h = e.open(None).unwrap();
            for seq in 1..=5 {
                h.append(0, &payload(0, seq)).unwrap();
            }
            e.sync().unwrap();
            h.id()
        };
        let path = dir.path().join("pool");
        let mut pool = std::fs::read(&path).unwrap();
        // A frame is its mark, meta and time words, then its payload.
        let mark = find(&pool, &payload(0, 5)) - 24;
        assert_ne!(pool[mark..mark + 8], [0; 8]);
        pool[mark..mark + 8].fill(0);
        if restarted {
            // The boot record (header page, bytes 1024..1064) as another
            // kernel boot leaves it for this one: naming no boot of ours.
            pool[1024..1064].fill(0);
        }
        std::fs::write(&path, &pool).unwrap();

        let e = Engine::new(config(dir.path())).unwrap();
        let report = e.recovery().unwrap().clone();
        assert_eq!(report.machine_restarted, restarted);
        assert_eq!(report.unconfirmed_frames, u64::from(restarted));
        assert_eq!(report.damaged_frames, 0);
        assert_eq!(
            report.to_string().contains("the machine restarted"),
            restarted,
            "{report}"
        );
        let h = e
            .session(SessionId::parse(&id.to_string()).unwrap())
            .unwrap();
        let (events, gaps) = read_with_gaps(&mut h.subscribe_from_start(0));
        let want: Vec<_> = (1..=4).map(|s| (s, payload(0, s))).collect();
        assert_eq!(events, want);
        if restarted {
            // Event 5 may have reached a client: told, and its number is
            // never given to another event.
            assert_eq!(gaps, vec![5]);
            assert_eq!(h.append(0, b"next").unwrap().seq, 6);
        } else {
            // Its append never returned: nobody saw it, its number is free.
            assert!(gaps.is_empty());
            assert_eq!(h.append(0, b"next").unwrap().seq, 5);
        }
        // The offline check of the same files says the same.
        drop(h);
        drop(e);
        let check = rewind_engine::durable::check(dir.path()).unwrap();
        assert!(!check.machine_restarted, "the reopen recorded this boot");
    }
}

/// The boot record's bytes in the header page: magic, kernel boot id,
/// closed-cleanly word, check.
const BOOT_RECORD: std::ops::Range<usize> = 1024..1064;

/// The boot record of `dir`'s pool file as another kernel boot would find
/// it: its boot id changed, its check recomputed, its clean word kept.
fn as_after_a_reboot(dir: &Path) {
    let path = dir.join("pool");
    let mut file = std::fs::read(&path).unwrap();
    let r = &mut file[BOOT_RECORD];
    assert_eq!(&r[..8], b"RWNDBOOT");
    r[8] ^= 0xff;
    let check = u64::from(crc32fast::hash(&r[..32]));
    r[32..].copy_from_slice(&check.to_le_bytes());
    std::fs::write(&path, &file).unwrap();
}

fn closed_cleanly(dir: &Path) -> u64 {
    let file = std::fs::read(dir.join("pool")).unwrap();
    u64::from_le_bytes(file[BOOT_RECORD][24..32].try_into().unwrap())
}

#[test]
fn a_clean_close_spares_the_next_boot_a_full_scan_and_a_crash_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let big = || big_config(dir.path());
    let units = BIG_UNITS;
    {
        let e = Engine::new(big()).unwrap();
        let h = e.open(None).unwrap();
        for seq in 1..=20 {
            h.append(0, &payload(0, seq)).unwrap();
        }
        assert_eq!(closed_cleanly(dir.path()), 0, "open");
    }
    assert_eq!(closed_cleanly(dir.path()), 1, "closed cleanly");
    // Rebooted since a clean close: everything was on the device when it
    // closed, so recovery reads only what the mark says.
    as_after_a_reboot(dir.path());
    let e = Engine::new(big()).unwrap();
    let report = e.recovery().unwrap().clone();
    assert!(!report.machine_restarted, "{report:?}");
    assert!(report.scanned_units * 100 < units, "{report:?}");
    assert_eq!(report.events, 20);
    assert_eq!(closed_cleanly(dir.path()), 0, "open again");
    // A crash (the engine never dropped), then a reboot: every unit is read.
    std::mem::forget(e);
    as_after_a_reboot(dir.path());
    // The crashed engine's lock is a file lock held by this process: a
    // second open in the same process is refused, so read what a new
    // process would by checking the directory offline.
    let check = rewind_engine::durable::check(dir.path()).unwrap();
    assert!(check.machine_restarted, "{check}");
    assert_eq!(check.events, 20);
}
