//! Unit and stress tests of the ring (std threads; see `loom_tests` for the
//! model-checked protocol).

use std::sync::atomic::AtomicBool;
use std::sync::Barrier;
use std::thread;

use super::*;
use crate::sync::Arc;

fn ring(slots: usize, arena_bytes: usize) -> SessionRing {
    SessionRing::new(RingConfig { slots, arena_bytes })
}

/// A payload that names its appender: a function of `(stream, ms)` only.
fn payload(stream: u32, ms: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (stream as u64 * 131 + ms * 31 + k as u64 * 7) as u8)
        .collect()
}

#[track_caller]
fn expect_event(ring: &SessionRing, seq: u64, stream: u32, ms: u64, bytes: &[u8]) {
    let mut buf = vec![0xEE; 3];
    let meta = EventMeta {
        seq,
        stream,
        appended_ms: ms,
        len: bytes.len(),
    };
    assert_eq!(ring.read(seq, None, &mut buf), SlotRead::Event(meta));
    assert_eq!(buf, bytes);
    assert_eq!(
        ring.read(seq, Some(stream), &mut buf),
        SlotRead::Event(meta)
    );
    assert_eq!(buf, bytes);
}

#[test]
fn public_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SessionRing>();
    assert_send_sync::<SlotRead>();
    assert_send_sync::<AppendError>();
    assert_send_sync::<RingConfigError>();
}

#[test]
fn idle_bookkeeping_stays_small() {
    // The budget: 256 bytes per idle session beyond the ring's words.
    assert!(
        size_of::<SessionRing>() <= 256,
        "{}",
        size_of::<SessionRing>()
    );
}

#[test]
fn round_trips_lengths_around_word_boundaries() {
    let ring = ring(16, 256);
    for (i, len) in [0usize, 1, 7, 8, 9, 15, 16, 17].into_iter().enumerate() {
        let bytes = payload(3, i as u64, len);
        let seq = ring.append(3, i as u64, &bytes).unwrap();
        assert_eq!(seq, i as u64 + 1);
        assert_eq!(ring.high_water(), seq);
        expect_event(&ring, seq, 3, i as u64, &bytes);
    }
}

#[test]
fn payloads_wrap_around_the_arena_end() {
    let ring = ring(8, 64);
    let first = payload(1, 1, 40);
    assert_eq!(ring.append(1, 1, &first).unwrap(), 1);
    // Logical bytes 40..80: the last 16 are arena words 0 and 1.
    let second = payload(1, 2, 37);
    assert_eq!(ring.append(1, 2, &second).unwrap(), 2);
    expect_event(&ring, 2, 1, 2, &second);
    // The second payload reused the first one's bytes.
    assert_eq!(ring.read(1, None, &mut Vec::new()), SlotRead::Overwritten);
    // Largest payload, starting mid-arena.
    let third = payload(1, 3, ring.max_payload());
    assert_eq!(ring.max_payload(), 64);
    assert_eq!(ring.append(1, 3, &third).unwrap(), 3);
    expect_event(&ring, 3, 1, 3, &third);
    assert_eq!(ring.read(2, None, &mut Vec::new()), SlotRead::Overwritten);
}

#[test]
fn other_streams_are_reported_without_copying() {
    let ring = ring(4, 128);
    let bytes = payload(7, 5, 12);
    ring.append(7, 5, &bytes).unwrap();
    let mut buf = vec![1, 2, 3];
    let meta = EventMeta {
        seq: 1,
        stream: 7,
        appended_ms: 5,
        len: 12,
    };
    assert_eq!(ring.read(1, Some(8), &mut buf), SlotRead::OtherStream(meta));
    assert!(buf.is_empty());
    assert_eq!(ring.read(1, Some(7), &mut buf), SlotRead::Event(meta));
    assert_eq!(buf, bytes);
}

#[test]
fn beyond_high_water_is_pending_and_zero_is_never_an_event() {
    let ring = ring(4, 64);
    let mut buf = Vec::new();
    assert_eq!(ring.high_water(), 0);
    assert_eq!(ring.read(1, None, &mut buf), SlotRead::Pending);
    assert_eq!(ring.read(0, None, &mut buf), SlotRead::Overwritten);
    ring.append(0, 0, b"x").unwrap();
    assert_eq!(ring.read(2, None, &mut buf), SlotRead::Pending);
    assert_eq!(ring.read(u64::MAX, None, &mut buf), SlotRead::Pending);
    assert_eq!(
        ring.read(u64::MAX / 2 + 1, None, &mut buf),
        SlotRead::Pending
    );
}

#[test]
fn claimed_but_unpublished_is_pending() {
    let ring = ring(4, 64);
    // A writer that claimed seq 1 and took its slot, but has not published.
    ring.cursors.head.fetch_add(1, Ordering::Relaxed);
    ring.stamp(1).store(slot::writing(1), Ordering::Relaxed);
    assert_eq!(ring.high_water(), 1);
    assert_eq!(ring.read(1, None, &mut Vec::new()), SlotRead::Pending);
}

#[test]
fn slot_laps_overwrite_old_events() {
    let ring = ring(4, 1024);
    for ms in 1..=6 {
        ring.append(0, ms, &payload(0, ms, 10)).unwrap();
    }
    assert_eq!(ring.oldest_retained(), 3);
    let mut buf = Vec::new();
    for seq in 1..=2 {
        assert_eq!(ring.read(seq, None, &mut buf), SlotRead::Overwritten);
        assert!(buf.is_empty());
    }
    for seq in 3..=6 {
        expect_event(&ring, seq, 0, seq, &payload(0, seq, 10));
    }
}

#[test]
fn arena_laps_overwrite_old_events_while_slots_remain() {
    let ring = ring(64, 64);
    for ms in 1..=5 {
        ring.append(2, ms, &payload(2, ms, 24)).unwrap();
    }
    // 5 * 24 = 120 bytes claimed: only the last 64 (seqs 4 and 5, offsets
    // 72 and 96) are intact, though every slot still holds its event.
    assert_eq!(ring.oldest_retained(), 1);
    for seq in 1..=3 {
        assert_eq!(
            ring.read(seq, None, &mut Vec::new()),
            SlotRead::Overwritten,
            "seq {seq}"
        );
    }
    // Metadata alone (another stream) is still answered.
    assert!(matches!(
        ring.read(3, Some(9), &mut Vec::new()),
        SlotRead::OtherStream(_)
    ));
    for seq in 4..=5 {
        expect_event(&ring, seq, 2, seq, &payload(2, seq, 24));
    }
}

#[test]
fn too_large_consumes_no_sequence_number() {
    let roomy = RingConfig {
        slots: 4,
        arena_bytes: 64 * 1024,
    };
    assert_eq!(
        Layout::new(roomy).unwrap().max_payload,
        64 * 1024 - 4096 + 8
    );
    let ring = ring(4, 4096);
    assert_eq!(ring.max_payload(), 4096 - 256 + 8);
    let max = ring.max_payload();
    assert_eq!(
        ring.append(0, 0, &vec![0; max + 1]),
        Err(AppendError::TooLarge { len: max + 1, max })
    );
    assert_eq!(ring.high_water(), 0);
    assert_eq!(ring.cursors.arena_claim.load(Ordering::Relaxed), 0);
    let big = payload(0, 1, max);
    assert_eq!(ring.append(0, 1, &big), Ok(1));
    expect_event(&ring, 1, 0, 1, &big);
    let err = AppendError::TooLarge { len: 9, max: 8 };
    assert!(err.to_string().contains("9 bytes"));
}

#[test]
fn memory_is_fixed_by_the_config() {
    let small = ring(4, 64);
    assert_eq!(small.memory_bytes(), 4 * 32 + 8 * 8 + 64);
    let big = RingConfig {
        slots: 1024,
        arena_bytes: 1 << 20,
    };
    assert_eq!(
        SessionRing::memory_bytes_for(big),
        1024 * 32 + 16 * 8 + (1 << 20)
    );
    let mid = RingConfig {
        slots: 64,
        arena_bytes: 4096,
    };
    assert_eq!(
        SessionRing::new(mid).memory_bytes(),
        64 * 32 + 16 * 8 + 4096
    );
    assert_eq!(
        SessionRing::new(mid).memory_bytes(),
        SessionRing::memory_bytes_for(mid)
    );
    assert_eq!(
        SessionRing::memory_bytes_for(RingConfig {
            slots: 3,
            arena_bytes: 64
        }),
        usize::MAX
    );
    assert_eq!(
        small.config(),
        RingConfig {
            slots: 4,
            arena_bytes: 64
        }
    );
    for ms in 0..20 {
        small.append(0, ms, &[1; 30]).unwrap();
    }
    assert_eq!(small.memory_bytes(), 4 * 32 + 8 * 8 + 64);
}

#[test]
fn config_validation_names_the_problem() {
    let check = |slots, arena_bytes| RingConfig { slots, arena_bytes }.validate();
    assert_eq!(check(2, 64), Ok(()));
    assert_eq!(
        check(0, 64),
        Err(RingConfigError::SlotsNotPowerOfTwo { slots: 0 })
    );
    assert_eq!(
        check(6, 64),
        Err(RingConfigError::SlotsNotPowerOfTwo { slots: 6 })
    );
    assert_eq!(
        check(1, 64),
        Err(RingConfigError::TooFewSlots { slots: 1, min: 2 })
    );
    assert_eq!(
        check(2, 100),
        Err(RingConfigError::ArenaNotPowerOfTwo { arena_bytes: 100 })
    );
    assert_eq!(
        check(2, 32),
        Err(RingConfigError::ArenaTooSmall {
            arena_bytes: 32,
            min: 64
        })
    );
    let huge = 1usize << (usize::BITS - 2);
    assert_eq!(
        check(huge, 64),
        Err(RingConfigError::TooLarge {
            slots: huge,
            arena_bytes: 64
        })
    );
    let err: Box<dyn std::error::Error> = Box::new(check(2, 32).unwrap_err());
    assert_eq!(
        err.to_string(),
        "ring arena bytes must be at least 64, got 32"
    );
}

#[test]
#[should_panic(expected = "invalid ring config")]
fn new_panics_on_a_bad_config() {
    ring(3, 64);
}

#[test]
fn a_writer_lapped_before_taking_its_slot_loses_its_event() {
    let ring = ring(2, 64);
    // Pretend seq 3 (same slot as seq 1) was already published.
    ring.stamp(1).store(slot::published(3), Ordering::Relaxed);
    assert_eq!(ring.append(0, 1, b"lost"), Ok(1));
    assert_eq!(ring.read(1, None, &mut Vec::new()), SlotRead::Overwritten);
    assert_eq!(ring.append(0, 2, b"kept"), Ok(2));
    expect_event(&ring, 2, 0, 2, b"kept");
}

#[test]
fn a_writer_whose_bytes_a_newer_lap_owns_publishes_a_lost_slot() {
    let ring = ring(4, 64);
    // Chunk 0 already belongs to lap 1 (logical bytes 64..72).
    ring.arena().chunks[0].store(1 << 20, Ordering::Relaxed);
    assert_eq!(ring.append(0, 1, b"lost"), Ok(1));
    assert_eq!(ring.read(1, None, &mut Vec::new()), SlotRead::Overwritten);
    assert_eq!(
        ring.read(1, Some(5), &mut Vec::new()),
        SlotRead::Overwritten
    );
    // Nothing stayed registered in chunk 0 and the next bytes are fine.
    assert_eq!(ring.arena().chunks[0].load(Ordering::Relaxed), 1 << 20);
    assert_eq!(ring.append(0, 2, b"kept"), Ok(2));
    expect_event(&ring, 2, 0, 2, b"kept");
}

/// What a reader saw: enough to check it against the writers' seqs later.
struct Seen {
    seq: u64,
    stream: u32,
    ms: u64,
}

/// `writers` threads append `per_writer` events each (stream = writer, ms =
/// index, payload lengths `0..=max_len`) while one reader sweeps the
/// retained window; every byte the reader gets must be the appended one.
/// `newest_survives`: the config is roomy enough that the last seq cannot be
/// lapped by the few appends that may claim after it.
fn stress(config: RingConfig, per_writer: u64, max_len: u64, newest_survives: bool) {
    const WRITERS: u32 = 2;
    let ring = Arc::new(SessionRing::new(config));
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WRITERS as usize + 1));
    let len_of =
        move |stream: u32, ms: u64| ((ms * 7 + stream as u64 * 3) % (max_len + 1)) as usize;
    let writers: Vec<_> = (0..WRITERS)
        .map(|stream| {
            let ring = Arc::clone(&ring);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                (0..per_writer)
                    .map(|ms| {
                        if ms.is_multiple_of(4) {
                            // Let the reader in: 3 threads share 2 cores.
                            thread::yield_now();
                        }
                        ring.append(stream, ms, &payload(stream, ms, len_of(stream, ms)))
                            .unwrap()
                    })
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let reader = {
        let ring = Arc::clone(&ring);
        let done = Arc::clone(&done);
        let start = Arc::clone(&start);
        thread::spawn(move || {
            start.wait();
            let mut seen = Vec::new();
            let mut events = 0u64;
            let mut buf = Vec::new();
            let mut last_pass = false;
            let mut passes = 0u64;
            while !last_pass {
                last_pass = done.load(std::sync::atomic::Ordering::Acquire);
                passes += 1;
                let filter = if passes.is_multiple_of(2) {
                    None
                } else {
                    Some(0)
                };
                for seq in ring.oldest_retained()..=ring.high_water() {
                    match ring.read(seq, filter, &mut buf) {
                        SlotRead::Event(m) => {
                            assert_eq!(m.seq, seq);
                            assert_eq!(m.len, len_of(m.stream, m.appended_ms));
                            assert_eq!(buf, payload(m.stream, m.appended_ms, m.len), "seq {seq}");
                            events += 1;
                            seen.push(Seen {
                                seq,
                                stream: m.stream,
                                ms: m.appended_ms,
                            });
                        }
                        SlotRead::OtherStream(m) => {
                            assert_ne!(Some(m.stream), filter);
                            assert!(buf.is_empty());
                            seen.push(Seen {
                                seq,
                                stream: m.stream,
                                ms: m.appended_ms,
                            });
                        }
                        SlotRead::Pending | SlotRead::Overwritten => assert!(buf.is_empty()),
                    }
                }
                thread::yield_now();
            }
            (seen, events)
        })
    };
    let seqs: Vec<Vec<u64>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    done.store(true, std::sync::atomic::Ordering::Release);
    let (seen, events) = reader.join().unwrap();

    let total = WRITERS as u64 * per_writer;
    let mut all: Vec<u64> = seqs.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (1..=total).collect::<Vec<_>>(),
        "seqs are unique and dense"
    );
    assert_eq!(ring.high_water(), total);
    for s in &seen {
        assert_eq!(
            seqs[s.stream as usize][s.ms as usize], s.seq,
            "meta belongs to its seq"
        );
    }
    assert!(events > 0 || !newest_survives);
    if newest_survives {
        // Nothing claimed a slot or arena bytes long after the last seq: it
        // must be readable, with the bytes of whoever got it.
        let mut buf = Vec::new();
        let SlotRead::Event(m) = ring.read(total, None, &mut buf) else {
            panic!("newest lost")
        };
        assert_eq!(seqs[m.stream as usize][m.appended_ms as usize], total);
        assert_eq!(buf, payload(m.stream, m.appended_ms, m.len));
    }
}

#[test]
fn stress_two_writers_one_reader_roomy() {
    let n = if cfg!(miri) { 20 } else { 20_000 };
    stress(
        RingConfig {
            slots: 64,
            arena_bytes: 1024,
        },
        n,
        40,
        true,
    );
}

#[test]
fn stress_two_writers_one_reader_tight_laps() {
    // Slots and arena both lap every few appends: exercises the slot and
    // chunk waits and lost appends.
    let n = if cfg!(miri) { 20 } else { 20_000 };
    stress(
        RingConfig {
            slots: 4,
            arena_bytes: 64,
        },
        n,
        40,
        false,
    );
}

#[test]
fn an_arena_lap_waits_for_the_lapped_writer_to_finish_copying() {
    let ring = Arc::new(ring(4, 64));
    // A writer that claimed bytes 0..8 and is still copying them.
    let slow = ring.cursors.arena_claim.fetch_add(8, Ordering::Relaxed);
    assert!(ring.arena().enter(slow, 8));
    // 64 more bytes: the last word is logical 64..72, the slow writer's word.
    let lapper = {
        let ring = Arc::clone(&ring);
        thread::spawn(move || ring.append(2, 0, &[0x22; 64]).unwrap())
    };
    while ring.high_water() == 0 {
        thread::yield_now();
    }
    thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(ring.read(1, None, &mut Vec::new()), SlotRead::Pending);
    // The slow writer's late copy, then it leaves.
    ring.arena().write(slow, &[0x11; 8]);
    ring.arena().leave(slow, 8);
    assert_eq!(lapper.join().unwrap(), 1);
    let mut buf = Vec::new();
    assert!(matches!(ring.read(1, None, &mut buf), SlotRead::Event(_)));
    assert_eq!(buf, [0x22; 64]);
}
