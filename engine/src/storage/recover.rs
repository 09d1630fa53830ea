//! Recovery of a durable pool: rebuilds the windows of the sessions a
//! journal names from the segments their headers claim, keeps every frame
//! that proves itself, and hands everything else back to the free lists.
//!
//! # What proves a frame
//!
//! A frame is kept when its table entry and its completion mark carry its
//! segment's stamp (written before and as the frame's last store, so a
//! frame whose writer died mid-copy has no mark), its length fits the
//! segment, and the CRC-32 of its payload matches the `check` half of its
//! meta word (a mark written before the payload reached the device after a
//! power loss, or a flipped bit, fails it). The first frame of a segment
//! that fails ends the segment's valid prefix.
//!
//! # What proves a chain
//!
//! A session's segments are the owned ones (odd stamp) whose header names
//! its owner tag and epoch. They link up where a segment's state says
//! *sealed → next* and `next`'s header names it as `prev`; a segment that
//! merely claims a predecessor (a spare prepared by an appender that lost
//! the race to seal) is not on the chain. Of the chains found, the one that
//! reaches the highest sequence number is the window.
//!
//! Then, walking the chain from its oldest segment:
//!
//! - a sealed segment whose valid prefix is shorter than its count (a frame
//!   claimed and never finished, or damage) cuts the chain: it and every
//!   older segment are dropped, and readers of what they held get a `gap`;
//! - the head keeps its valid prefix. Frames after it that carry no mark
//!   were never acknowledged (an `append` returns after its mark), so their
//!   sequence numbers are handed out again: the head's state is rewound to
//!   the prefix and the words after it are zeroed, so no stale mark or table
//!   entry of the same stamp survives to be read. If the first failing frame
//!   *has* a mark, it may have been acknowledged: its sequence numbers must
//!   not be reused, so the head is emptied and restarts after the last
//!   claimed number, and every older segment is dropped (`gap`).
//!
//! A session whose segments overlap another's, or whose head is sealed with
//! no successor, cannot be proven and is not restored.
//!
//! Cost: one pass over the stamps (two words per unit, outside the data),
//! the headers of owned segments, and the frames of the restored chains:
//! proportional to the pool's unit count plus what is retained.

use std::collections::HashMap;

use super::layout::{
    frame_words, mark_len, table_offset, SegRef, SegmentHeader, State, FRAME_HEADER_WORDS,
    HEADER_WORDS, MAX_COUNT, WORD_BYTES,
};
use super::pool::Pool;
use super::window::{Owner, Window};
use crate::sync::Ordering;

/// What recovery restored and dropped.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// One entry per owner asked for, in order: its window, or `None` when
    /// it could not be proven.
    pub(crate) windows: Vec<Option<Window>>,
    /// Frames kept, over all windows.
    pub(crate) events: u64,
    /// Their payload bytes.
    pub(crate) bytes: u64,
    /// Frames with a mark that failed their check, plus the frames after
    /// them in their segment.
    pub(crate) damaged_frames: u64,
    /// Owned segments not kept (unreachable, or behind damage).
    pub(crate) dropped_segments: u64,
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    seg: SegRef,
    class: u8,
    header: SegmentHeader,
}

/// How far a segment's frames prove themselves.
#[derive(Clone, Copy, Debug)]
struct Prefix {
    /// Frames kept.
    valid: u32,
    /// Payload bytes of those frames.
    bytes: u64,
    /// Word offset right after the last kept frame.
    end: usize,
    /// Whether the first failing frame had a mark (damage), not just an
    /// unfinished write.
    damaged: bool,
}

fn header_at(pool: &Pool, unit: u32) -> SegmentHeader {
    let words = pool.segment(unit, 0);
    let mut values = [0u64; HEADER_WORDS];
    for (v, w) in values.iter_mut().zip(&words[..HEADER_WORDS]) {
        *v = w.load(Ordering::Relaxed);
    }
    SegmentHeader::from_words(values)
}

/// Rebuilds the windows of `owners` in `pool` (whose free lists must be
/// empty: recovery fills them) and frees everything else. Runs before the
/// pool is shared: no other thread touches it.
pub(crate) fn recover(pool: &Pool, owners: &[Owner]) -> Recovery {
    let units = pool.shape().units;
    let index: HashMap<(u64, u64), usize> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| ((o.tag, o.epoch), i))
        .collect();
    let mut by_owner: Vec<Vec<Candidate>> = vec![Vec::new(); owners.len()];
    let mut owned = 0u64;
    for unit in 0..units {
        let stamp = pool.stamp_now(unit, Ordering::Relaxed);
        if stamp & 1 == 0 {
            continue;
        }
        let header = header_at(pool, unit);
        if !pool.valid(unit, header.class()) {
            continue;
        }
        owned += 1;
        if let Some(&i) = index.get(&(header.owner_tag, header.owner_epoch)) {
            by_owner[i].push(Candidate {
                seg: SegRef { unit, stamp },
                class: header.class(),
                header,
            });
        }
    }
    let mut used = vec![false; units as usize];
    let mut out = Recovery::default();
    let mut kept = 0u64;
    for (i, candidates) in by_owner.iter().enumerate() {
        let window = if candidates.is_empty() {
            Some(Window::new())
        } else {
            restore(pool, owners[i], candidates, &mut used, &mut out, &mut kept)
        };
        out.windows.push(window);
    }
    out.dropped_segments = owned - kept;
    pool.free_unused(&used);
    out
}

/// Restores one owner's window from its candidate segments.
fn restore(
    pool: &Pool,
    owner: Owner,
    candidates: &[Candidate],
    used: &mut [bool],
    out: &mut Recovery,
    kept_segments: &mut u64,
) -> Option<Window> {
    let at: HashMap<u32, usize> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| (c.seg.unit, i))
        .collect();
    // successor[i]: the candidate that follows candidate i, if proven.
    let mut successor = vec![None; candidates.len()];
    let mut pointed = vec![false; candidates.len()];
    for (i, c) in candidates.iter().enumerate() {
        let state = State::decode(pool.state(c.seg.unit).load(Ordering::Relaxed), c.seg.stamp);
        if let Some(State::Next { next }) = state {
            if let Some(&j) = at.get(&next) {
                if candidates[j].header.prev == c.seg.pack() {
                    successor[i] = Some(j);
                    pointed[j] = true;
                }
            }
        }
    }
    // Every chain starts at a candidate nothing points to and that names no
    // candidate as its predecessor (one that does is a spare an appender
    // prepared and lost: the segment it names was sealed to another, or not
    // at all). Keep the chain that reaches furthest, the longer on a tie.
    let packs: std::collections::HashSet<u64> = candidates.iter().map(|c| c.seg.pack()).collect();
    let mut best: Option<((u64, usize), Vec<usize>)> = None;
    let roots = (0..candidates.len())
        .filter(|&i| !pointed[i] && !packs.contains(&candidates[i].header.prev));
    for root in roots {
        let mut chain = vec![root];
        while let Some(next) = successor[*chain.last().expect("non-empty")] {
            if chain.len() > candidates.len() {
                return None;
            }
            chain.push(next);
        }
        let head = &candidates[*chain.last().expect("non-empty")];
        let reach = (
            head.header.first_seq + u64::from(claimed(pool, head).unwrap_or(0)),
            chain.len(),
        );
        if best.as_ref().is_none_or(|(r, _)| reach > *r) {
            best = Some((reach, chain));
        }
    }
    let (_, chain) = best?;
    let chain: Vec<Candidate> = chain.into_iter().map(|i| candidates[i]).collect();
    // The chain's memory must be its own.
    for c in &chain {
        let span = c.seg.unit as usize..c.seg.unit as usize + (1usize << c.class);
        if used[span.clone()].iter().any(|&u| u) {
            return None;
        }
    }
    let head_i = chain.len() - 1;
    let mut start = 0;
    let mut prefixes = Vec::with_capacity(chain.len());
    for (i, c) in chain.iter().enumerate() {
        let count = if i < head_i {
            let n = chain[i + 1]
                .header
                .first_seq
                .checked_sub(c.header.first_seq)?;
            (n <= u64::from(MAX_COUNT)).then_some(n as u32)
        } else {
            claimed(pool, c)
        };
        let Some(count) = count else {
            // A sealed head without successor, or nonsense counts.
            if i == head_i {
                return None;
            }
            start = i + 1;
            prefixes.push(None);
            continue;
        };
        let p = prefix(pool, c, count);
        if p.damaged {
            out.damaged_frames += u64::from(count - p.valid);
        }
        if i < head_i && p.valid < count {
            start = i + 1;
        }
        prefixes.push(Some((count, p)));
    }
    let head = chain[head_i];
    let (count, p) = prefixes[head_i].expect("the head's count is known");
    if p.damaged {
        // Sequence numbers up to the last claimed one may have been
        // acknowledged: restart the head after them, alone.
        reset(pool, &head, owner, head.header.first_seq + u64::from(count));
        start = head_i;
    } else {
        rewind(pool, &head, count, &p);
    }
    let kept = &chain[start..];
    *kept_segments += kept.len() as u64;
    if start > 0 {
        // The new oldest segment names no predecessor: what it named is
        // freed below and will be reused.
        pool.segment(kept[0].seg.unit, 0)[4].store(0, Ordering::Relaxed);
    }
    let mut held = 0u32;
    for (i, c) in kept.iter().enumerate() {
        let span = c.seg.unit as usize..c.seg.unit as usize + (1usize << c.class);
        used[span].iter_mut().for_each(|u| *u = true);
        held += 1 << c.class;
        if let Some((_, p)) = prefixes[start + i] {
            if !(p.damaged && start + i == head_i) {
                out.events += u64::from(p.valid);
                out.bytes += p.bytes;
            }
        }
    }
    Some(Window::restored(kept[0].seg, head.seg, held))
}

/// Frames claimed in an open (or closed-open) segment; `None` if it is
/// sealed or its state belongs to another allocation.
fn claimed(pool: &Pool, c: &Candidate) -> Option<u32> {
    match State::decode(pool.state(c.seg.unit).load(Ordering::Relaxed), c.seg.stamp)? {
        State::Open { count, .. } | State::Last { count, .. } => Some(count),
        State::Next { .. } => None,
    }
}

/// How far the first `count` frames of `c` prove themselves.
fn prefix(pool: &Pool, c: &Candidate, count: u32) -> Prefix {
    let segment = pool.segment(c.seg.unit, c.class);
    let stamp = c.seg.stamp;
    let mut p = Prefix {
        valid: 0,
        bytes: 0,
        end: HEADER_WORDS,
        damaged: false,
    };
    let mut payload = Vec::new();
    for i in 0..count {
        let Some(slot) = segment.len().checked_sub(i as usize + 1) else {
            p.damaged = true;
            return p;
        };
        let mark = segment.get(p.end).map(|w| w.load(Ordering::Relaxed));
        let len = mark.and_then(|m| mark_len(m, stamp));
        let entry = table_offset(segment[slot].load(Ordering::Relaxed), stamp);
        let Some(len) = len else {
            // No mark: the writer had not finished. Not damage.
            return p;
        };
        let end = p.end + frame_words(len as usize);
        if entry != Some(p.end as u32) || end > slot {
            p.damaged = true;
            return p;
        }
        let words = &segment[p.end + FRAME_HEADER_WORDS..end];
        payload.clear();
        for w in words {
            payload.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let check = segment[p.end + 1].load(Ordering::Relaxed) as u32;
        if crc32fast::hash(&payload[..len as usize]) != check {
            p.damaged = true;
            return p;
        }
        p.valid += 1;
        p.bytes += u64::from(len);
        p.end = end;
    }
    p
}

/// Rewinds the head `c` to its valid prefix: state, and zeroed words where
/// the unfinished frames and their table entries were.
fn rewind(pool: &Pool, c: &Candidate, count: u32, p: &Prefix) {
    let segment = pool.segment(c.seg.unit, c.class);
    let used_end = match State::decode(pool.state(c.seg.unit).load(Ordering::Relaxed), c.seg.stamp)
    {
        Some(State::Open { used, .. } | State::Last { used, .. }) => {
            HEADER_WORDS + used as usize / WORD_BYTES
        }
        _ => p.end,
    };
    let table_low = segment.len() - count as usize;
    for w in &segment[p.end..used_end.min(table_low).max(p.end)] {
        w.store(0, Ordering::Relaxed);
    }
    for w in &segment[table_low..segment.len() - p.valid as usize] {
        w.store(0, Ordering::Relaxed);
    }
    let used = ((p.end - HEADER_WORDS) * WORD_BYTES) as u32;
    pool.state(c.seg.unit).store(
        State::Open {
            count: p.valid,
            used,
        }
        .encode(c.seg.stamp),
        Ordering::Relaxed,
    );
}

/// Empties the head `c` and restarts it at `first_seq`, alone in its chain.
fn reset(pool: &Pool, c: &Candidate, owner: Owner, first_seq: u64) {
    let segment = pool.segment(c.seg.unit, c.class);
    for w in &segment[HEADER_WORDS..] {
        w.store(0, Ordering::Relaxed);
    }
    let header = SegmentHeader {
        owner_tag: owner.tag,
        owner_epoch: owner.epoch,
        first_seq,
        prev: 0,
        ..c.header
    };
    for (w, v) in segment[..HEADER_WORDS].iter().zip(header.to_words()) {
        w.store(v, Ordering::Relaxed);
    }
    pool.state(c.seg.unit).store(
        State::Open { count: 0, used: 0 }.encode(c.seg.stamp),
        Ordering::Relaxed,
    );
}
