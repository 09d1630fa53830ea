//! The payload arena: word-wise race-free copies, and the chunk table that
//! keeps a lapped writer from scribbling over a newer event's bytes.

use std::cmp::Ordering as Cmp;

use super::config::{Layout, WORD_BYTES};
use crate::sync::{spin_wait, AtomicU64, Ordering};

/// Low bits of a chunk word: writers currently registered in the chunk.
const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// High bits of a chunk word: the lap those writers write in, modulo 2^44.
const LAP_MASK: u64 = u64::MAX >> COUNT_BITS;

/// How the lap a writer wants compares to the lap a chunk word holds, with
/// wrapping arithmetic on the 44-bit lap field (laps more than 2^43 apart
/// compare wrongly; the post-registration claim check in `append` turns that
/// into a lost event, never a wrong byte).
fn compare_laps(mine: u64, theirs: u64) -> Cmp {
    let ahead = mine.wrapping_sub(theirs) & LAP_MASK;
    if ahead == 0 {
        Cmp::Equal
    } else if ahead <= LAP_MASK / 2 {
        Cmp::Greater
    } else {
        Cmp::Less
    }
}

/// The arena words and the chunk table of one ring.
#[derive(Clone, Copy)]
pub(super) struct Arena<'a> {
    /// One word per chunk: `lap << COUNT_BITS | writers`. Starts at 0 (lap 0,
    /// no writers). The lap only moves forward, and only when no writer is
    /// registered.
    pub(super) chunks: &'a [AtomicU64],
    /// The payload bytes, little-endian packed, a power of two of words.
    words: &'a [AtomicU64],
    layout: &'a Layout,
}

impl<'a> Arena<'a> {
    pub(super) fn new(chunks: &'a [AtomicU64], words: &'a [AtomicU64], layout: &'a Layout) -> Self {
        Arena {
            chunks,
            words,
            layout,
        }
    }

    /// Logical chunk positions covered by `[offset, offset + rounded)`.
    fn positions(&self, offset: u64, rounded: u64) -> std::ops::RangeInclusive<u64> {
        (offset >> self.layout.chunk_shift)..=((offset + rounded - 1) >> self.layout.chunk_shift)
    }

    fn chunk(&self, position: u64) -> &'a AtomicU64 {
        &self.chunks[(position & self.layout.chunk_mask) as usize]
    }

    /// Registers a writer in every chunk its bytes `[offset, offset + rounded)`
    /// (`rounded > 0`) touch, in ascending logical order. `false` if a newer
    /// lap already owns one of them: the bytes belong to a later event, this
    /// writer must not write them, and nothing stays registered.
    pub(super) fn enter(&self, offset: u64, rounded: u64) -> bool {
        for position in self.positions(offset, rounded) {
            if !self.enter_chunk(position) {
                let start = offset >> self.layout.chunk_shift;
                for entered in start..position {
                    self.leave_chunk(entered);
                }
                return false;
            }
        }
        true
    }

    /// Ends what a successful [`Arena::enter`] with the same range began.
    pub(super) fn leave(&self, offset: u64, rounded: u64) {
        for position in self.positions(offset, rounded) {
            self.leave_chunk(position);
        }
    }

    fn enter_chunk(&self, position: u64) -> bool {
        let chunk = self.chunk(position);
        let lap = (position >> self.layout.chunk_count_shift) & LAP_MASK;
        let mut current = chunk.load(Ordering::Relaxed);
        loop {
            let count = current & COUNT_MASK;
            let next = match compare_laps(lap, current >> COUNT_BITS) {
                Cmp::Less => return false,
                Cmp::Equal if count < COUNT_MASK => current + 1,
                Cmp::Greater if count == 0 => (lap << COUNT_BITS) | 1,
                // Writers of an older lap are still copying into this chunk
                // (the arena lapped them mid-append), or the count is
                // saturated: wait for them, as `slot::take` does.
                _ => {
                    spin_wait();
                    current = chunk.load(Ordering::Relaxed);
                    continue;
                }
            };
            // Acquire pairs with the `Release` in `leave_chunk` of every
            // older-lap writer (each heads a release sequence this RMW
            // continues): their payload stores happen-before ours, so ours
            // win in each word's modification order. Release lets a writer
            // whose lap compares wrongly (see `compare_laps`) see the
            // arena claim of whoever wrote this word, so it gives up.
            match chunk.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    fn leave_chunk(&self, position: u64) {
        // Release: our payload stores happen-before the next lap's writers
        // (their `Acquire` in `enter_chunk`).
        self.chunk(position).fetch_sub(1, Ordering::Release);
    }

    /// The arena words holding `count` words from a logical word on, as
    /// at most two contiguous runs (the second after wrapping to the start).
    /// Slicing once keeps bounds checks out of the copy loops.
    fn runs(&self, logical_word: u64, count: usize) -> (&'a [AtomicU64], &'a [AtomicU64]) {
        let start = (logical_word & self.layout.arena_word_mask) as usize;
        let first = count.min(self.words.len() - start);
        (
            &self.words[start..start + first],
            &self.words[..count - first],
        )
    }

    /// Copies `payload` to the logical offset, wrapping at the arena's end;
    /// the last word is zero padded. Relaxed: ordered by the caller's fences.
    pub(super) fn write(&self, offset: u64, payload: &[u8]) {
        let (first, second) = self.runs(
            offset / WORD_BYTES as u64,
            payload.len().div_ceil(WORD_BYTES),
        );
        let mut whole = payload.chunks_exact(WORD_BYTES);
        let mut words = first.iter().chain(second);
        for (bytes, word) in (&mut whole).zip(&mut words) {
            let value = u64::from_le_bytes(bytes.try_into().expect("exact chunk"));
            word.store(value, Ordering::Relaxed);
        }
        let tail = whole.remainder();
        if let Some(word) = words.next() {
            let mut last = [0u8; WORD_BYTES];
            last[..tail.len()].copy_from_slice(tail);
            word.store(u64::from_le_bytes(last), Ordering::Relaxed);
        }
    }

    /// Copies `len` bytes from the logical offset into `buf` (replacing its
    /// contents). Relaxed: the caller validates the copy afterwards.
    pub(super) fn read(&self, offset: u64, len: usize, buf: &mut Vec<u8>) {
        buf.clear();
        buf.resize(len, 0);
        let (first, second) = self.runs(offset / WORD_BYTES as u64, len.div_ceil(WORD_BYTES));
        let split = (first.len() * WORD_BYTES).min(len);
        let (head, rest) = buf.split_at_mut(split);
        copy_out(first, head);
        copy_out(second, rest);
    }
}

/// Copies words into `dst` (`dst.len()` ≤ 8 × `src.len()`), the last one
/// possibly partially.
#[inline]
fn copy_out(src: &[AtomicU64], dst: &mut [u8]) {
    let mut whole = dst.chunks_exact_mut(WORD_BYTES);
    for (bytes, word) in (&mut whole).zip(src) {
        bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    let tail = whole.into_remainder();
    if !tail.is_empty() {
        let last = src[src.len() - 1].load(Ordering::Relaxed).to_le_bytes();
        let n = tail.len();
        tail.copy_from_slice(&last[..n]);
    }
}
