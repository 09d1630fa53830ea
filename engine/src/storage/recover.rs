//! Recovery of a durable pool: rebuilds the windows of the sessions a
//! journal names from the segments their headers claim, keeps every frame
//! that proves itself, and hands everything else back to the free lists.
//!
//! # What proves a frame
//!
//! A frame is kept when its table entry and its completion mark carry its
//! segment's stamp (written before and as the frame's last store, so a
//! frame whose writer died mid-copy has no mark), it starts where the
//! claims put it (right after the frame before, when that one is proven),
//! no other table entry names the same place, its length fits the
//! segment, and its check — the CRC-32 of its payload bound to its stream
//! id (`FrameCheck`; of its payload alone in files of formats 2 and 3) —
//! matches the `check` half of its meta word (a mark written before the
//! payload reached the device after a power loss, or a flipped bit, fails
//! it).
//!
//! A frame whose mark word is zero is *unfinished*: its `append` never
//! returned, so nobody was told it exists — as long as the kernel that
//! held the process's writes is still the one running. After the machine
//! itself restarted (`restarted`: the file's boot record names another
//! kernel boot), a zero mark can also be a finished frame whose page never
//! reached the device, acknowledged and maybe delivered: then every
//! unfinished frame is *unconfirmed* and handled as damage is (below), a
//! told gap, never a silent skip. Segments are zeroed when
//! allocated, so anything else that fails — a table entry or a mark of
//! another allocation, a frame where the claims do not put it, a failed
//! check — is *damaged*: it may have been acknowledged and delivered. A
//! frame with no table entry that stands whole where the claims put it
//! lost only its entry (written first, so present whenever the mark is,
//! short of damage); the entry is written again and the frame kept. More
//! claims than a segment could hold are a damaged count.
//!
//! # What proves a chain
//!
//! A session's segments are the owned ones (odd stamp) whose header names
//! its owner tag and epoch. They link up where a segment's state says
//! *sealed → next* and `next`'s header names it as `prev`; a segment that
//! merely claims a predecessor (a spare prepared by an appender that lost
//! the race to seal) is not on the chain. Of the chains found whose last
//! segment is open (or closed while open), the one that reaches the highest
//! sequence number is the window.
//! A seal can be lost — the state word written back older than the
//! successor after a machine crash, or damaged — so an open chain end is
//! also linked to a segment that names it as predecessor and starts after
//! its claims, or holds frames (`relink_lost_seals`); and an open head's
//! table entries of this allocation past its count are claims too
//! (`claimed_by_entries`): the count is one unchecked word.
//! A sealed segment keeps its frame count in its state word for readers,
//! who trust it to know where the segment ends; recovery writes each kept
//! sealed segment's word again with the count the chain proves (its
//! successor's first number less its own), so a damaged count cannot hold
//! readers at the segment's end.
//!
//! Then, walking the chain from its oldest segment:
//!
//! - an unfinished frame with a readable frame after it (another writer of
//!   the session went on), or anywhere in a sealed segment, becomes a
//!   *placeholder*: a frame with a zero payload on the reserved stream
//!   `u32::MAX`, which no append may name and so no reader of a real stream
//!   delivers. Its number is skipped; nothing is lost that was acknowledged,
//!   and no reader stalls behind the hole;
//! - unfinished frames at the end of the head are dropped: the head's state
//!   is rewound to the last readable frame and the words after it are
//!   zeroed (so no stale mark or table entry of the same stamp survives to
//!   be read), and their numbers are handed out again;
//! - after a machine restart, an unfinished frame is unconfirmed, mid-chain
//!   or at the head's end alike: it becomes a gap marker (next item), so a
//!   client that was delivered it is told of the loss and its number is
//!   not handed out again;
//! - a damaged frame becomes a *gap marker*: a frame on the reserved stream
//!   whose time word is `GAP_MS`. It is never delivered; every reader that
//!   reaches it, on any stream, reports a gap at its number (`Lagged`) and
//!   moves past it; its number is never handed out again (in the head it
//!   counts as readable, so the claims restart after it); the frames
//!   before and after it are kept. A later recovery proves the marker like
//!   any frame (its check is the CRC of its zero payload);
//! - only when the holes cannot be laid out again (claims that do not fit
//!   the segment) is the damage structural: in a sealed segment, that
//!   segment and every older one are dropped (readers of what they held get
//!   a `gap`); in the head, the head is emptied and restarts after the last
//!   claimed number, alone.
//!
//! A session whose segments overlap another's, or whose head is sealed with
//! no successor, cannot be proven and is not restored.
//!
//! # What proves a segment
//!
//! Its stamp is odd (owned) and its header's check verifies for that
//! stamp (see [`SegmentHeader`]): a header damaged since, or one the
//! process died before writing (the unit's stamp is new, its words still
//! an earlier owner's), is no candidate. A session all of whose segments
//! fail so, while at least one names it, is not restored either: an empty
//! window would hand out again the numbers its events had.
//!
//! Cost: one pass over the stamps (two words per unit, outside the data)
//! of the units at and above the pool's allocation mark — the lowest unit
//! ever allocated; allocation takes the highest free block first, so that
//! is the most the pool ever held; every unit after a machine restart,
//! when the mark's page may be a stale one —, the headers of owned
//! segments, and the frames of the restored chains; the units below the
//! mark are neither
//! read nor written (the pool hands them out later, block by block, once
//! its free lists run dry). So recovery follows what the pool holds (at
//! most what it ever held), not its configured size.

use std::collections::{HashMap, HashSet};

use super::layout::{
    frame_words, mark, mark_len, meta, owner_hash, table_entry, table_offset, FrameCheck, SegRef,
    SegmentHeader, State, FRAME_HEADER_WORDS, GAP_MS, HEADER_WORDS, MAX_COUNT, RESERVED_STREAM,
    WORD_BYTES,
};
use super::pool::Pool;
use super::window::{Owner, Window};
use crate::sync::{AtomicU64, Ordering};

/// What recovery restored and dropped.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// One entry per owner asked for, in order: its window, or `None` when
    /// it could not be proven.
    pub(crate) windows: Vec<Option<Window>>,
    /// Frames kept, over all windows.
    pub(crate) events: u64,
    /// Units whose stamps were read: those at and above the pool's
    /// allocation mark (all of them for a pool without one).
    pub(crate) scanned_units: u64,
    /// Their payload bytes.
    pub(crate) bytes: u64,
    /// Frames with a mark that failed their check, plus the frames after
    /// them in their segment.
    pub(crate) damaged_frames: u64,
    /// Frames without a mark, after a machine restart: each became a gap
    /// marker (see the module docs).
    pub(crate) unconfirmed_frames: u64,
    /// Owned segments not kept (unreachable, or behind damage).
    pub(crate) dropped_segments: u64,
    /// Owned segments among them whose header did not verify: the process
    /// died between allocating one and writing its header (harmless), or
    /// the header was damaged since.
    pub(crate) unverified_headers: u64,
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    seg: SegRef,
    class: u8,
    header: SegmentHeader,
}

/// What a segment whose header failed its check still hints at: its
/// header's words, unproven. Used only to refuse, never to restore.
#[derive(Clone, Copy, Debug)]
struct Hint {
    owner: (u64, u64),
    first_seq: u64,
    prev: u64,
    /// Its first frame is marked for the unit's current allocation: the
    /// segment was linked into a chain and appended to.
    holds_frames: bool,
}

impl Hint {
    /// Whether the hinted segment may be the successor of the chain ending
    /// at `end`, of `owner`'s session: it names `end` as its predecessor,
    /// or it is `owner`'s and starts after `end` does. One damaged word of
    /// a header leaves one of the two intact.
    fn may_follow(&self, end: &Candidate, owner: Owner) -> bool {
        self.prev == end.seg.pack()
            || (self.owner == (owner.tag, owner.epoch) && self.first_seq > end.header.first_seq)
    }
}

/// What a segment's frames prove, once its holes are filled.
#[derive(Clone, Copy, Debug)]
struct Prefix {
    /// Frames claimed: the count [`prove`] was given, or more in an open
    /// head where whole frames stood past it (their claims lost).
    claims: u32,
    /// Frames readable from the segment's start: proven ones and the
    /// placeholders between them (and, in a sealed segment, after them).
    valid: u32,
    /// Proven frames among them.
    events: u32,
    /// Payload bytes of the proven frames.
    bytes: u64,
    /// Word offset right after the last readable frame.
    end: usize,
    /// Damaged frames (a mark, but a failed check) turned into gap
    /// markers.
    gaps: u32,
    /// Unconfirmed frames (no mark, after a machine restart) turned into
    /// gap markers.
    unconfirmed: u32,
    /// Whether the segment's frames could not be laid out again (a damaged
    /// frame whose room cannot be known): the caller drops the segment and
    /// everything older.
    damaged: bool,
}

/// One frame of a segment, as recovery finds it.
#[derive(Clone, Copy, Debug)]
enum Found {
    /// Its table entry and mark carry the segment's stamp and its payload
    /// passes its check: words `off..end`.
    Proven { off: usize, end: usize, len: u32 },
    /// Its writer had not finished (no mark, or no table entry): its
    /// `append` never returned.
    Unfinished,
    /// A mark, but a length that does not fit or a failed check.
    Damaged,
    /// Unfinished, after a machine restart: its `append` may have returned
    /// (its words lost with the page that held them), so it is told as
    /// damage is.
    Unconfirmed,
}

fn header_at(pool: &Pool, unit: u32) -> SegmentHeader {
    let words = pool.segment(unit, 0);
    let mut values = [0u64; HEADER_WORDS];
    for (v, w) in values.iter_mut().zip(&words[..HEADER_WORDS]) {
        *v = w.load(Ordering::Relaxed);
    }
    SegmentHeader::from_words(values)
}

/// The owner hash that the check of `unit`'s first frame leaves once its
/// payload's and stream's parts are taken off ([`FrameCheck::owner_hash_in`]),
/// if the frame carries a mark of this allocation (`stamp`) and a length
/// that fits a segment the unit can start. It equals a session's owner
/// hash when the frame stands whole as that session's (a damaged frame
/// leaves a hash no session is likely to have). `None` for formats before
/// 5, whose checks do not cover the session.
fn first_frame_owner(pool: &Pool, unit: u32, stamp: u32, check: FrameCheck) -> Option<u32> {
    let first = pool.segment(unit, 0);
    let len = mark_len(first[HEADER_WORDS].load(Ordering::Relaxed), stamp)? as usize;
    // The header's class may be damaged too: the smallest segment the unit
    // can start that holds the frame and one table entry.
    let end = HEADER_WORDS + frame_words(len);
    let class = (0..=pool.shape().top_class)
        .take_while(|&c| pool.valid(unit, c))
        .find(|&c| pool.segment(unit, c).len() > end)?;
    let segment = pool.segment(unit, class);
    let mut payload = Vec::with_capacity(len.next_multiple_of(WORD_BYTES));
    for w in &segment[HEADER_WORDS + FRAME_HEADER_WORDS..end] {
        payload.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let meta_word = segment[HEADER_WORDS + 1].load(Ordering::Relaxed);
    check.owner_hash_in(meta_word as u32, (meta_word >> 32) as u32, &payload[..len])
}

/// Rebuilds the windows of `owners` in `pool` (whose free lists must be
/// empty: recovery fills them) and frees everything else. `restarted`:
/// the machine may have restarted since the pool was last open, so a
/// frame without its mark may have been acknowledged. Runs before the
/// pool is shared: no other thread touches it.
pub(crate) fn recover(
    pool: &Pool,
    owners: &[Owner],
    check: FrameCheck,
    restarted: bool,
) -> Recovery {
    let units = pool.shape().units;
    let index: HashMap<(u64, u64), usize> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| ((o.tag, o.epoch), i))
        .collect();
    let mut by_owner: Vec<Vec<Candidate>> = vec![Vec::new(); owners.len()];
    let mut owned = 0u64;
    let mut out = Recovery::default();
    let mut unverified_claims = HashSet::new();
    let mut hints = Vec::new();
    // Every header's predecessor word, verified or not: a segment some
    // header names came before another one.
    let mut named = HashSet::new();
    // The owner hashes of the first frames of segments whose header
    // failed its check and that no header names: see below.
    let mut unnamed_frames_of = Vec::new();
    // Below the allocation mark no unit was ever allocated: nothing to read.
    // After a machine restart the mark's page may have reached the device
    // older (higher) than the stamps of units allocated below it: every
    // unit is read, and the mark settled below what is kept.
    let from = if restarted { 0 } else { pool.allocation_mark() };
    out.scanned_units = u64::from(units - from);
    for unit in from..units {
        let stamp = pool.stamp_now(unit, Ordering::Relaxed);
        if stamp & 1 == 0 {
            continue;
        }
        let header = header_at(pool, unit);
        owned += 1;
        named.insert(header.prev);
        if !header.verifies(stamp) || !pool.valid(unit, header.class()) {
            // Written partly or not at all when the process died (or
            // damaged since): nothing in it can be trusted, except as a
            // hint that its session may have had events.
            out.unverified_headers += 1;
            if let Some(&i) = index.get(&(header.owner_tag, header.owner_epoch)) {
                unverified_claims.insert(i);
            }
            let holds_frames = mark_len(
                pool.segment(unit, 0)[HEADER_WORDS].load(Ordering::Relaxed),
                stamp,
            )
            .is_some();
            if holds_frames {
                if let Some(hash) = first_frame_owner(pool, unit, stamp, check) {
                    unnamed_frames_of.push((SegRef { unit, stamp }.pack(), hash));
                }
            }
            hints.push(Hint {
                owner: (header.owner_tag, header.owner_epoch),
                first_seq: header.first_seq,
                prev: header.prev,
                holds_frames,
            });
            continue;
        }
        if let Some(&i) = index.get(&(header.owner_tag, header.owner_epoch)) {
            by_owner[i].push(Candidate {
                seg: SegRef { unit, stamp },
                class: header.class(),
                header,
            });
        }
    }
    // A segment whose header failed its check but whose first frame
    // stands whole, bound by its check (format 5) to a session, was that
    // session's: whatever its header's words now say (two of them
    // damaged, or the page of a header written back older than the unit's
    // stamp), the session's chain may go on there, its numbers handed out
    // already. Unless a header names it as predecessor (then it came
    // before another segment, as an older part of a chain does), the
    // session is not restored.
    unnamed_frames_of.retain(|(seg, _)| !named.contains(seg));
    let refused: HashSet<usize> = if unnamed_frames_of.is_empty() {
        HashSet::new()
    } else {
        let hashes: HashSet<u32> = unnamed_frames_of.iter().map(|&(_, h)| h).collect();
        owners
            .iter()
            .enumerate()
            .filter(|(_, o)| hashes.contains(&owner_hash((o.tag, o.epoch))))
            .map(|(i, _)| i)
            .collect()
    };
    let mut used = vec![false; units as usize];
    let mut kept = 0u64;
    for (i, candidates) in by_owner.iter().enumerate() {
        let window = if refused.contains(&i) {
            None
        } else if candidates.is_empty() {
            // A session whose every segment failed its check had events:
            // an empty window would hand their numbers out again.
            (!unverified_claims.contains(&i)).then(Window::new)
        } else {
            restore(
                pool,
                owners[i],
                candidates,
                Proof {
                    check,
                    restarted,
                    hints: &hints,
                },
                &mut used,
                &mut out,
                &mut kept,
            )
        };
        out.windows.push(window);
    }
    out.dropped_segments = owned - kept;
    pool.free_unused(&used, from);
    pool.settle_mark(used.iter().position(|&u| u).map(|u| u as u32));
    out
}

/// How a session is proven: its frames' check, whether a missing mark may
/// hide an acknowledged frame (the machine restarted), and what the
/// headers that failed their checks hint at (reasons to refuse a chain).
#[derive(Clone, Copy, Debug)]
struct Proof<'a> {
    check: FrameCheck,
    restarted: bool,
    hints: &'a [Hint],
}

/// A frame check bound to the session whose segment is proven (format 5
/// checks cover it).
#[derive(Clone, Copy, Debug)]
struct Checker {
    check: FrameCheck,
    owner: (u64, u64),
}

impl Checker {
    fn of(self, stream: u32, payload: &[u8]) -> u32 {
        self.check.of(self.owner, stream, payload)
    }
}

/// Restores one owner's window from its candidate segments.
fn restore(
    pool: &Pool,
    owner: Owner,
    candidates: &[Candidate],
    proof: Proof<'_>,
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
        if let Some(State::Next { next, .. }) = state {
            if let Some(&j) = at.get(&next) {
                if candidates[j].header.prev == c.seg.pack() {
                    successor[i] = Some(j);
                    pointed[j] = true;
                }
            }
        }
    }
    relink_lost_seals(pool, candidates, &mut successor, &mut pointed);
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
        // A chain that ends sealed (its successor unproven) or in a state
        // of another allocation cannot be restored: it must not win over
        // one that can because it claims to reach further (a unit whose
        // state the process had not yet written).
        let Some(claims) = claimed(pool, head) else {
            continue;
        };
        let reach = (head.header.first_seq + u64::from(claims.count), chain.len());
        if best.as_ref().is_none_or(|(r, _)| reach > *r) {
            best = Some((reach, chain));
        }
    }
    let (_, chain) = best?;
    let chain: Vec<Candidate> = chain.into_iter().map(|i| candidates[i]).collect();
    let end = chain.last().expect("non-empty");
    // The chain may go on in a segment whose header failed its check: its
    // end may be a seal lost (or damaged) along with the successor's
    // header, and the numbers after it handed out already. Restoring it
    // would hand them out again, so the session is not restored (its
    // clients are told it is gone). After a process crash the page cache
    // kept every write, so only a segment that holds frames says so: one
    // without is a spare whose header an appender had not finished (or a
    // unit allocated again whose new header was never written), which no
    // number reached. After a machine restart its first frame may be lost
    // too, and any such header says so.
    if proof
        .hints
        .iter()
        .any(|h| (proof.restarted || h.holds_frames) && h.may_follow(end, owner))
    {
        return None;
    }
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
        // A sealed segment's frames run to its successor's first number;
        // the head's are what its state word counts and any claims its
        // table shows past them.
        let open = if i < head_i { None } else { claimed(pool, c) };
        let count = if i < head_i {
            let n = chain[i + 1]
                .header
                .first_seq
                .checked_sub(c.header.first_seq)?;
            (n <= u64::from(MAX_COUNT)).then_some(n as u32)
        } else {
            open.map(|claims| claimed_by_entries(pool, c, claims.count))
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
        let p = prove(pool, c, count, open, proof);
        let count = p.claims;
        out.damaged_frames += u64::from(p.gaps);
        out.unconfirmed_frames += u64::from(p.unconfirmed);
        if p.damaged {
            out.damaged_frames += u64::from(count - p.valid);
            if i < head_i {
                start = i + 1;
            }
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
    // The new oldest segment may name a dropped one as its predecessor: it
    // is left so (no write that a crash could tear). The dropped one is
    // freed below, and the `(unit, stamp)` it names is never allocated
    // again, so that link leads nowhere, as after a release by retention.
    let mut held = 0u32;
    for (i, c) in kept.iter().enumerate() {
        let span = c.seg.unit as usize..c.seg.unit as usize + (1usize << c.class);
        used[span].iter_mut().for_each(|u| *u = true);
        held += 1 << c.class;
        if let Some((count, p)) = prefixes[start + i] {
            if !(p.damaged && start + i == head_i) {
                out.events += u64::from(p.events);
                out.bytes += p.bytes;
            }
            // A sealed segment's word keeps its count for readers, who
            // trust it to know where the segment ends; the chain proved
            // the count (its successor's first number), so the word is
            // written again with it — a damaged count would hold every
            // reader at the segment's end for good.
            if start + i < head_i {
                let next = State::Next {
                    next: kept[i + 1].seg.unit,
                    count: Some(count),
                };
                pool.state(c.seg.unit)
                    .store(next.encode(c.seg.stamp), Ordering::Relaxed);
            }
        }
    }
    Some(Window::restored(kept[0].seg, head.seg, held))
}

/// A segment's seal (its state word saying *sealed → next*) can be lost:
/// after a machine restart its page may have reached the device older
/// than its successor's header and frames, and a damaged state word of
/// the same stamp can read as "open" too. The successor, which names it as
/// predecessor, would then be dropped with every event in it, its numbers
/// handed out again. So a chain's open end is linked to a candidate that
/// names it as predecessor and starts at or after the numbers it claims
/// (the one with the most frames, if several do) — or, if the candidate
/// holds frames, wherever it starts: it was the head once, so it was
/// sealed onto this one — taking the successor's
/// first number as the end of its own: recovery then proves it as a
/// sealed segment (frames it holds past its stale count are kept if
/// whole, told as gaps if not — skipped, after a process crash) and
/// writes the seal again. Without such a loss the same shape is a spare
/// whose appender died after preparing it and before sealing, with no
/// append since (one since would claim the spare's first number): linking
/// it keeps the same frames and makes the empty spare the head.
fn relink_lost_seals(
    pool: &Pool,
    candidates: &[Candidate],
    successor: &mut [Option<usize>],
    pointed: &mut [bool],
) {
    // Candidates no seal points to, by the predecessor they name: one
    // pass, so a session of many segments costs no more than its scan.
    let mut naming: HashMap<u64, Vec<usize>> = HashMap::new();
    for (j, c) in candidates.iter().enumerate() {
        if !pointed[j] {
            naming.entry(c.header.prev).or_default().push(j);
        }
    }
    for (i, c) in candidates.iter().enumerate() {
        if successor[i].is_some() {
            continue;
        }
        let Some(named) = naming.get(&c.seg.pack()) else {
            continue;
        };
        let Some(claims) = claimed(pool, c) else {
            continue;
        };
        let reach = c.header.first_seq + u64::from(claims.count);
        let next = named
            .iter()
            .copied()
            .filter(|&j| {
                let h = &candidates[j].header;
                let state = State::decode(
                    pool.state(candidates[j].seg.unit).load(Ordering::Relaxed),
                    candidates[j].seg.stamp,
                );
                // A segment that holds frames (or has a successor) was the
                // session's head once, so it was sealed onto its
                // predecessor, and its verified header says where that
                // one ended, whatever the predecessor's unchecked state
                // word says now. An empty one may be a spare prepared
                // before more frames went into the head: only if it
                // starts after them.
                let was_head = matches!(
                    state,
                    Some(State::Open { count: 1.., .. } | State::Last { count: 1.., .. })
                        | Some(State::Next { .. })
                );
                j != i
                    && !pointed[j]
                    && h.first_seq > c.header.first_seq
                    && (h.first_seq >= reach || was_head)
                    && h.first_seq - c.header.first_seq <= u64::from(MAX_COUNT)
                    && state.is_some()
            })
            .max_by_key(|&j| {
                (
                    claimed(pool, &candidates[j]).map_or(0, |claims| claims.count),
                    candidates[j].header.first_seq,
                )
            });
        if let Some(j) = next {
            successor[i] = Some(j);
            pointed[j] = true;
        }
    }
}

/// The frames an open head's table says were claimed, when it says more
/// than its state word's `count`. The count is one unchecked word: after
/// a machine restart its page may have reached the device older than the
/// table's (the pool keeps state words apart from the segments, and the
/// kernel writes pages back in no particular order), a single writer
/// publishes it after the frame (and can die between the two), and damage
/// can make it read smaller. A table entry is written only by the writer
/// of a claimed frame, so entries of this allocation past the count, one
/// after another from the table's top, are claims: recovery proves them
/// with the rest — a whole frame is kept, an unfinished one is dropped
/// after a process crash (its append never returned) and told as a gap
/// after a machine restart, a damaged one is told — instead of zeroing
/// them and handing their numbers out again.
fn claimed_by_entries(pool: &Pool, c: &Candidate, count: u32) -> u32 {
    let segment = pool.segment(c.seg.unit, c.class);
    // As many as could fit, each frame taking its header and an entry.
    let most = (segment.len() - HEADER_WORDS) / (FRAME_HEADER_WORDS + 1);
    let mut n = count as usize;
    while n < most
        && table_offset(
            segment[segment.len() - 1 - n].load(Ordering::Relaxed),
            c.seg.stamp,
        )
        .is_some_and(|off| off as usize >= HEADER_WORDS)
    {
        n += 1;
    }
    n as u32
}

/// What an open (or closed-open) segment's state word says its writers
/// claimed.
#[derive(Clone, Copy, Debug)]
struct Claims {
    /// Frames.
    count: u32,
    /// Frame bytes, from the end of the header on.
    used: u32,
}

/// The claims of an open (or closed-open) segment; `None` if it is
/// sealed or its state belongs to another allocation.
fn claimed(pool: &Pool, c: &Candidate) -> Option<Claims> {
    match State::decode(pool.state(c.seg.unit).load(Ordering::Relaxed), c.seg.stamp)? {
        State::Open { count, used } | State::Last { count, used } => Some(Claims { count, used }),
        State::Next { .. } => None,
    }
}

/// Classifies the first `count` frames of `c` and fills the holes between
/// readable frames, so no reader stalls behind a hole and none is silent
/// about a loss:
///
/// - an *unfinished* frame (no mark: its `append` never returned) that has
///   a readable frame after it, or any in a sealed segment (`open` is
///   `None`; for the head it is what the head's state word claims), becomes a
///   placeholder: a frame on the reserved stream with a zero payload, which
///   no reader of a real stream delivers — its number is skipped, and
///   nothing acknowledged was lost;
/// - a *damaged* frame (a mark, so maybe acknowledged and delivered, but a
///   failed check) becomes a gap marker: every reader that reaches it
///   reports a gap at its number, and its number is never handed out
///   again. The frames around it are kept;
/// - after a machine restart (`proof.restarted`), an unfinished frame is
///   *unconfirmed* and becomes a gap marker too, wherever it is — at the
///   head's end as well, so its number is not handed out again.
///
/// Unfinished frames after the last readable one of an open head are left
/// for the caller to drop. Only when the holes' room cannot be laid out
/// again (the claims do not fit the segment) is the result `damaged`.
fn prove(pool: &Pool, c: &Candidate, count: u32, open: Option<Claims>, proof: Proof<'_>) -> Prefix {
    let sealed = open.is_none();
    let check = Checker {
        check: proof.check,
        owner: (c.header.owner_tag, c.header.owner_epoch),
    };
    let segment = pool.segment(c.seg.unit, c.class);
    let stamp = c.seg.stamp;
    // Each frame takes its header words and a table entry: more claims
    // than that could fit are a damaged count, not frames.
    if count as usize > (segment.len() - HEADER_WORDS) / (FRAME_HEADER_WORDS + 1) {
        return Prefix {
            claims: count,
            valid: 0,
            events: 0,
            bytes: 0,
            end: HEADER_WORDS,
            gaps: 0,
            unconfirmed: 0,
            damaged: true,
        };
    }
    let mut table_low = segment.len() - count as usize;
    // The offsets the table gives, and which of them more than one entry
    // gives: a frame's words are its own, so an offset named twice (an
    // entry copied over another) proves neither frame.
    let entries: Vec<u64> = (0..count as usize)
        .map(|i| segment[segment.len() - 1 - i].load(Ordering::Relaxed))
        .collect();
    let offsets: Vec<Option<usize>> = entries
        .iter()
        .map(|&e| table_offset(e, stamp).map(|o| o as usize))
        .collect();
    let mut sorted: Vec<usize> = offsets.iter().flatten().copied().collect();
    sorted.sort_unstable();
    let named_twice = |off: usize| {
        let at = sorted.partition_point(|&o| o < off);
        sorted.get(at + 1) == Some(&off)
    };
    let mut found = Vec::with_capacity(count as usize);
    let mut payload = Vec::new();
    // End of the last proven frame: every later frame starts at or after it.
    let mut low = HEADER_WORDS;
    // Where frame `i` starts when every frame before it was proven: claims
    // are contiguous (frame `i` takes the room right after frame `i - 1`),
    // so a table entry that says otherwise was damaged.
    let mut expected = Some(HEADER_WORDS);
    // The room an open segment's state word says its counted frames
    // claimed (a frame's room is claimed before its entry is written): an
    // entry of one of them that names a place past it, where nothing was
    // written, is damaged — not a frame its writer had yet to fill.
    let claimed_room = open.map(|o| {
        (
            o.count as usize,
            HEADER_WORDS + o.used as usize / WORD_BYTES,
        )
    });
    for (i, &entry_off) in offsets.iter().enumerate() {
        let slot = segment.len() - 1 - i;
        let f = match entry_off {
            Some(off) if expected.is_some_and(|e| e != off) || named_twice(off) => Found::Damaged,
            Some(off) => match frame_at(segment, stamp, check, off, low, table_low, &mut payload) {
                Found::Unfinished if claimed_room.is_some_and(|(n, end)| i < n && off >= end) => {
                    Found::Damaged
                }
                f => f,
            },
            // No entry of this allocation. If the frame stands whole where
            // the claims put it (its mark, written after its entry, and its
            // check verify), only the entry was lost or damaged, and it is
            // written again. Otherwise: a zero entry is a writer that died
            // between its claim and its first store; anything else, in a
            // segment zeroed when it was allocated, is damage.
            None => {
                let f = match expected {
                    Some(off) => frame_at(segment, stamp, check, off, low, table_low, &mut payload),
                    None => Found::Unfinished,
                };
                match f {
                    Found::Proven { off, .. } => {
                        segment[slot].store(table_entry(stamp, off as u32), Ordering::Relaxed);
                        f
                    }
                    _ if entries[i] != 0 => Found::Damaged,
                    f => f,
                }
            }
        };
        let f = match f {
            Found::Unfinished if proof.restarted => Found::Unconfirmed,
            f => f,
        };
        (expected, low) = match f {
            Found::Proven { end, .. } => (Some(end), end),
            _ => (None, low),
        };
        found.push(f);
    }
    // Past the claims of an open head, frames may stand whole where the
    // next claims would have put them: their claims lost with the state
    // word (zero or stale after a machine restart, or damaged) and their
    // table entries (damaged, or never written back). A frame whose mark
    // — its writer's last store — and check (owner, stream and payload)
    // verify was appended, and its append may have returned: it is kept
    // and its entry written again, so its number is not handed out again.
    // Anything less (no mark, a failed check) is no evidence of a claim.
    if !sealed {
        let most = (segment.len() - HEADER_WORDS) / (FRAME_HEADER_WORDS + 1);
        while let Some(off) = expected.filter(|_| found.len() < most) {
            let i = found.len();
            let below_table = segment.len() - (i + 1);
            let f = frame_at(segment, stamp, check, off, low, below_table, &mut payload);
            let Found::Proven { end, .. } = f else {
                break;
            };
            segment[segment.len() - 1 - i].store(table_entry(stamp, off as u32), Ordering::Relaxed);
            found.push(f);
            (expected, low, table_low) = (Some(end), end, below_table);
        }
    }
    let claims = found.len() as u32;
    let last_readable = found.iter().rposition(|f| {
        matches!(
            f,
            Found::Proven { .. } | Found::Damaged | Found::Unconfirmed
        )
    });
    let valid = if sealed {
        claims as usize
    } else {
        last_readable.map_or(0, |i| i + 1)
    };
    let mut p = Prefix {
        claims,
        valid: 0,
        events: 0,
        bytes: 0,
        end: HEADER_WORDS,
        gaps: 0,
        unconfirmed: 0,
        damaged: false,
    };
    let mut i = 0;
    while i < valid {
        if let Found::Proven { end, len, .. } = found[i] {
            p.events += 1;
            p.bytes += u64::from(len);
            p.end = end;
            i += 1;
            continue;
        }
        // A run of lost frames i..j, then a proven one at `limit` (or the
        // end of the segment's readable part).
        let j = (i..valid)
            .find(|&k| matches!(found[k], Found::Proven { .. }))
            .unwrap_or(valid);
        let n = j - i;
        let limit = match found.get(j) {
            Some(Found::Proven { off, .. }) if j < valid => *off,
            _ => p.end + n * FRAME_HEADER_WORDS,
        };
        if limit < p.end + n * FRAME_HEADER_WORDS || limit > table_low {
            p.damaged = true;
            return p;
        }
        // The first filler takes the room the others leave.
        let mut at = p.end;
        for (k, lost) in found.iter().enumerate().take(j).skip(i) {
            let words = if k == i {
                limit - at - (n - 1) * FRAME_HEADER_WORDS
            } else {
                FRAME_HEADER_WORDS
            };
            let ms = match lost {
                Found::Damaged => {
                    p.gaps += 1;
                    GAP_MS
                }
                Found::Unconfirmed => {
                    p.unconfirmed += 1;
                    GAP_MS
                }
                _ => c.header.opened_ms,
            };
            placeholder(segment, stamp, check, k, at, words, ms);
            at += words;
        }
        p.end = at;
        i = j;
    }
    p.valid = valid as u32;
    p
}

/// Classifies the frame whose table entry says it starts at word `off`,
/// where no frame may start before `low` (the end of the last proven one)
/// and none may reach into the table (from `table_low`).
///
/// Segments are zeroed when allocated and a mark is a frame's last store,
/// so a mark word still zero is a write that never finished; any other
/// word that is not a mark of this allocation is damage.
fn frame_at(
    segment: &[AtomicU64],
    stamp: u32,
    check: Checker,
    off: usize,
    low: usize,
    table_low: usize,
    payload: &mut Vec<u8>,
) -> Found {
    if off < low || off + FRAME_HEADER_WORDS > table_low {
        return Found::Damaged;
    }
    let word = segment[off].load(Ordering::Relaxed);
    if word == 0 {
        return Found::Unfinished;
    }
    let Some(len) = mark_len(word, stamp) else {
        return Found::Damaged;
    };
    let end = off + frame_words(len as usize);
    if end > table_low {
        return Found::Damaged;
    }
    payload.clear();
    for w in &segment[off + FRAME_HEADER_WORDS..end] {
        payload.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let meta_word = segment[off + 1].load(Ordering::Relaxed);
    if check.of((meta_word >> 32) as u32, &payload[..len as usize]) != meta_word as u32 {
        return Found::Damaged;
    }
    Found::Proven { off, end, len }
}

/// Writes a frame on the reserved stream with a zero payload, `index` of
/// `words` words at word `at`: a placeholder, or with `ms` =
/// [`GAP_MS`] a gap marker. Its check is the CRC of its zero payload, so a
/// later recovery proves it like any frame.
fn placeholder(
    segment: &[AtomicU64],
    stamp: u32,
    check: Checker,
    index: usize,
    at: usize,
    words: usize,
    ms: u64,
) {
    let len = (words - FRAME_HEADER_WORDS) * WORD_BYTES;
    for w in &segment[at + FRAME_HEADER_WORDS..at + words] {
        w.store(0, Ordering::Relaxed);
    }
    let zeros = vec![0u8; len];
    segment[at + 1].store(
        meta(RESERVED_STREAM, check.of(RESERVED_STREAM, &zeros)),
        Ordering::Relaxed,
    );
    segment[at + 2].store(ms, Ordering::Relaxed);
    segment[segment.len() - 1 - index].store(table_entry(stamp, at as u32), Ordering::Relaxed);
    segment[at].store(mark(stamp, len as u32), Ordering::Relaxed);
}

/// Rewinds the head `c` to its valid prefix: state, and zeroed words
/// everywhere after it — the unfinished frames, their table entries, and
/// the room no frame had claimed yet (appends go on there, and a reader
/// must find zeros where the next marks will be, as in a new segment; a
/// file written before segments were zeroed may hold anything there).
fn rewind(pool: &Pool, c: &Candidate, count: u32, p: &Prefix) {
    let segment = pool.segment(c.seg.unit, c.class);
    let table_low = segment.len() - count as usize;
    for w in &segment[p.end..table_low.max(p.end)] {
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
    write_header(pool, c.seg, header);
    pool.state(c.seg.unit).store(
        State::Open { count: 0, used: 0 }.encode(c.seg.stamp),
        Ordering::Relaxed,
    );
}

/// Rewrites the header of `seg` (its check recomputed; the check word is
/// written last, so a recovery that dies midway leaves a header that does
/// not verify rather than a wrong one that does).
fn write_header(pool: &Pool, seg: SegRef, header: SegmentHeader) {
    let words = header.checked(seg.stamp).to_words();
    for (w, v) in pool.segment(seg.unit, 0)[..HEADER_WORDS].iter().zip(words) {
        w.store(v, Ordering::Relaxed);
    }
}
