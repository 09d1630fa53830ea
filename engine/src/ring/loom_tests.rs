//! Loom models of the ring protocol. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p rewind-engine
//! --no-default-features --release --lib --target-dir target/loom loom`.

use loom::thread;

use super::*;
use crate::sync::Arc;

/// The payload of the event appended on `stream` at `ms`: its bytes and its
/// length (1 to 2 words, some partial) follow from the pair alone, so a
/// reader can check an event without knowing who got which seq.
fn payload(stream: u32, ms: u64) -> Vec<u8> {
    let len = match (stream + ms as u32) % 3 {
        0 => 5,
        1 => 8,
        _ => 12,
    };
    (0..len)
        .map(|k| (stream as u64 * 64 + ms * 16 + k) as u8 | 1)
        .collect()
}

/// Reads `seq`; an event must carry exactly its appender's bytes.
fn check(ring: &SessionRing, seq: u64) -> Option<EventMeta> {
    let mut buf = Vec::new();
    match ring.read(seq, None, &mut buf) {
        SlotRead::Event(meta) => {
            assert_eq!(meta.seq, seq);
            assert_eq!(
                buf,
                payload(meta.stream, meta.appended_ms),
                "seq {seq}: {meta:?}"
            );
            Some(meta)
        }
        SlotRead::Pending | SlotRead::Overwritten => {
            assert!(buf.is_empty());
            None
        }
        SlotRead::OtherStream(meta) => panic!("no filter, yet OtherStream({meta:?})"),
    }
}

#[test]
fn loom_one_writer_two_readers_with_wraparound() {
    loom::model(|| {
        let ring = Arc::new(SessionRing::new(RingConfig {
            slots: 2,
            arena_bytes: 64,
        }));
        let writer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for ms in 1..=3 {
                    // Seq 3 takes seq 1's slot.
                    assert_eq!(ring.append(0, ms, &payload(0, ms)), Ok(ms));
                }
            })
        };
        let readers: Vec<_> = [1, 3]
            .into_iter()
            .map(|seq| {
                let ring = ring.clone();
                thread::spawn(move || {
                    if let Some(meta) = check(&ring, seq) {
                        assert_eq!(meta.appended_ms, seq);
                    }
                })
            })
            .collect();
        writer.join().unwrap();
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(check(&ring, 1).is_none());
        assert_eq!(check(&ring, 2).map(|m| m.appended_ms), Some(2));
        assert_eq!(check(&ring, 3).map(|m| m.appended_ms), Some(3));
    });
}

#[test]
fn loom_two_appenders_one_reader() {
    loom::model(|| {
        let ring = Arc::new(SessionRing::new(RingConfig {
            slots: 2,
            arena_bytes: 64,
        }));
        let appenders: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|stream| {
                let ring = ring.clone();
                thread::spawn(move || ring.append(stream, 1, &payload(stream, 1)).unwrap())
            })
            .collect();
        let reader = {
            let ring = ring.clone();
            thread::spawn(move || check(&ring, 1).map(|meta| meta.stream))
        };
        let seqs: Vec<u64> = appenders.into_iter().map(|a| a.join().unwrap()).collect();
        let read_stream = reader.join().unwrap();
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [1, 2]);
        let owner_of_1 = if seqs[0] == 1 { 1 } else { 2 };
        if let Some(stream) = read_stream {
            assert_eq!(stream, owner_of_1);
        }
        // Two events in 2 slots and 64 bytes: nothing is lapped.
        for (stream, seq) in [1u32, 2].into_iter().zip(seqs) {
            assert_eq!(check(&ring, seq).map(|m| m.stream), Some(stream));
        }
    });
}

/// The case the arena chunks exist for: one appender claims 8 bytes, the
/// other claims the whole 64-byte arena right after, so its last word is the
/// first one's word one lap later, possibly while the first is still
/// copying. Whatever the interleaving, no reader may see a mix.
#[test]
fn loom_arena_lap_during_a_slow_append() {
    loom::model(|| {
        let ring = Arc::new(SessionRing::new(RingConfig {
            slots: 4,
            arena_bytes: 64,
        }));
        let small = {
            let ring = ring.clone();
            thread::spawn(move || ring.append(1, 0, &[0x11; 8]).unwrap())
        };
        let big = {
            let ring = ring.clone();
            thread::spawn(move || ring.append(2, 0, &[0x22; 64]).unwrap())
        };
        let reader = {
            let ring = ring.clone();
            thread::spawn(move || {
                let mut buf = Vec::new();
                for seq in [2, 1] {
                    if let SlotRead::Event(meta) = ring.read(seq, None, &mut buf) {
                        let byte = if meta.stream == 1 { 0x11 } else { 0x22 };
                        assert!(buf.iter().all(|&b| b == byte), "seq {seq}: {buf:x?}");
                    }
                }
            })
        };
        let small_seq = small.join().unwrap();
        let big_seq = big.join().unwrap();
        reader.join().unwrap();
        let mut buf = Vec::new();
        let big_read = ring.read(big_seq, None, &mut buf);
        if let SlotRead::Event(_) = big_read {
            assert_eq!(buf, [0x22; 64]);
        }
        let small_read = ring.read(small_seq, None, &mut buf);
        if let SlotRead::Event(_) = small_read {
            assert_eq!(buf, [0x11; 8]);
        }
        // Exactly the payload claimed second survives: it lapped the first.
        if ring.load_header(small_seq).offset == 0 {
            assert_eq!(small_read, SlotRead::Overwritten);
            assert!(matches!(big_read, SlotRead::Event(_)));
        } else {
            assert_eq!(big_read, SlotRead::Overwritten);
            assert!(matches!(small_read, SlotRead::Event(_)));
        }
    });
}
