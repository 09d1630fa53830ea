//! The segment pool: one allocation, cut into buddy-aligned segments of a
//! few size classes, handed out and taken back through lock-free free
//! lists.
//!
//! Allocating class `c` pops class `c`'s free list; when it is empty, the
//! smallest larger class that has a segment is split down: each split
//! pushes the upper half onto the list of the class below (a buddy
//! allocator, Knuth vol. 1 §2.5). Freeing pushes the segment back onto its
//! own class. Free buddies are merged again only by [`Pool::coalesce`],
//! which runs when an allocation finds no segment of its class or larger:
//! merging on every free would need the buddy's state, i.e. a lock or a
//! multi-word CAS, on a path that is otherwise one CAS.
//!
//! # Stamps
//!
//! Every allocation makes its first unit's stamp odd (the next odd value),
//! every release makes it even (+1), and a merge bumps the upper buddy's
//! stamp by 2, retiring it: a `(unit, stamp)` pair never names two
//! allocations. Each bump is followed by `fence(Release)` before the
//! segment's memory is handed on, so a reader that loads a byte written by
//! a later owner and then issues `fence(Acquire)` sees the bump (see the
//! storage module docs, "Reuse is detected").
//!
//! Marks and table entries carry a stamp but no unit, and a segment's
//! memory may still hold the words of a larger segment that covered it
//! before a split, or of smaller ones merged into it. So stamps also grow
//! across the segments that cover a unit: a split raises the upper half's
//! stamp to the lower's, a merge raises the lower buddy's to the retired
//! upper's. A free segment's stamp is then at least the stamp of every
//! allocation that ever covered any of its units, and its next allocation's
//! is above them all: no word an earlier owner left carries the stamp of
//! the segment that now holds it. (Stamps are 32 bits: that holds for 2^31
//! allocations of a unit's memory, after which a stale word would also
//! have to survive at the place a new frame is looked for.)
//!
//! # Giving memory back
//!
//! Freed segments go back on their list with their pages still resident
//! (the next allocation of the class reuses them at once). [`Pool::trim`],
//! run by the engine's sweep, gives back the pages of segments that stayed
//! free from one pass to the next. A pass marks every free segment it finds
//! as *seen* (a bit above the stamp in its stamp word, cleared by the next
//! allocation or release, which rewrite the word); a segment still marked
//! at the next pass has been free a whole interval. Two such buddies merge
//! first (the pass's turn at the next class up takes the merged segment
//! on), so the small segments of a burst end up in a few large ones; then
//! a segment of two pages or more has its pages after the first (which
//! holds the free list's link) released (`madvise(MADV_DONTNEED)` on an
//! anonymous mapping: they read as zeros and cost nothing until written
//! again) and goes on its class's *cold* list, which allocation takes from
//! after the warm one. Segments freed since the last pass are not touched,
//! so a busy pool's reuse stays warm.
//!
//! A pass owns the segments it works on (taken off the lists), so no
//! allocation can write into memory being released; an allocation that
//! finds nothing while a pass holds segments waits for the pass and looks
//! again, so a pass never makes the pool look full. A durable pool's file
//! pages are not released.
//!
//! # Costs
//!
//! `alloc` of a class that has a free segment: one CAS (the pop) and one
//! `fetch_sub` of the free counter; a split adds one CAS per level (an
//! empty warm list adds one load, of the cold list).
//! `free`: one store, one CAS (the push), one `fetch_add`.
//! `reuse` (a free and an allocation of the same segment by its owner):
//! two stamp stores and a load, no RMW, no free list.
//! A trim pass (off the hot paths, once per sweep): per class one swap
//! (the take), then per free segment one load and one CAS (back on a
//! list), a stamp store for a newly marked one, and per released segment
//! one `madvise` system call; two RMWs of the pass counter in all.

use crossbeam_utils::CachePadded;

use super::backing::Backing;
use super::freelist::FreeList;
use super::layout::{SegRef, HEADER_WORDS};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering, Spin};

/// In a free unit's stamp word, above the stamp: a trim pass found the
/// segment free (see the module docs, "Giving memory back"). Allocation
/// and release rewrite the word, clearing it.
const SEEN: u64 = 1 << 32;

/// Segments one trim pass releases at most, so a pass holds few segments
/// off the lists at a time and ends in a bounded number of system calls.
pub(crate) const TRIM_PER_PASS: usize = 1024;

/// In [`Pool::trims`]: passes under way (low half), one pass started
/// (high half, wrapping).
const TRIMS_UNDER_WAY: u64 = 0xffff_ffff;
const TRIM_STARTED: u64 = 1 << 32;

/// The shape of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolShape {
    /// Units in the pool.
    pub(crate) units: u32,
    /// Words per unit (a power of two, at least 16).
    pub(crate) unit_words: usize,
    /// The largest class (segments of `2^top_class` units).
    pub(crate) top_class: u8,
}

impl PoolShape {
    /// The shape for `bytes` of memory in all: the data area plus the two
    /// per-unit words, with classes up to `top_class`.
    pub(crate) fn for_budget(bytes: u64, unit_words: usize, top_class: u8) -> PoolShape {
        let per_unit = (unit_words as u64 + 2) * 8;
        let units = (bytes / per_unit).min(u64::from(u32::MAX - 1)) as u32;
        let fits = if units == 0 {
            0
        } else {
            (31 - units.leading_zeros()) as u8
        };
        PoolShape {
            units,
            unit_words,
            top_class: top_class.min(fits),
        }
    }

    /// Words of a segment of `class`.
    pub(crate) fn class_words(&self, class: u8) -> usize {
        self.unit_words << class
    }

    /// Words the backing must hold: stamps, states, data.
    pub(crate) fn total_words(&self) -> usize {
        self.units as usize * (self.unit_words + 2)
    }
}

/// The free segments of one class.
struct ClassLists {
    /// Freed as they were: their pages still resident.
    warm: FreeList,
    /// Their pages after the first given back to the operating system
    /// ([`Pool::trim`]); taken after the warm ones. On the warm list's
    /// cache line: an allocation that finds the warm list empty loads no
    /// other line to look here.
    cold: FreeList,
}

/// The pool. See the module docs.
pub(crate) struct Pool {
    backing: Backing,
    shape: PoolShape,
    /// The free lists of each class `0..=top_class`. Padded: allocation in
    /// one class must not slow another class's pops.
    free: Box<[CachePadded<ClassLists>]>,
    /// Units on the free lists (or being moved between them). This and
    /// the other counters each have a cache line of their own: on the line
    /// of the fields every append reads (`backing`, `shape`, `data_base`),
    /// a segment roll's update by one session's writer would take that
    /// line from every other core (BENCHMARKS.md, run AM).
    free_units: CachePadded<AtomicU64>,
    /// Units on the cold lists.
    cold_units: CachePadded<AtomicU64>,
    /// Trim passes: under way (low half; each may hold segments off the
    /// lists) and started so far (high half).
    trims: CachePadded<AtomicU64>,
    /// Appends that waited for a writer stalled in the middle of a frame
    /// ([`Pool::count_append_stall`]).
    append_stalls: CachePadded<AtomicU64>,
    data_base: usize,
    /// Where the pool's own words start in the backing: 1 when the word
    /// before them is the allocation mark (a durable pool), else 0.
    words_at: usize,
    /// How the allocation mark is written (by the file's format).
    mark_format: MarkFormat,
    /// Units `0..untouched` are free, never written, and on no free list:
    /// a new heap pool's whole top-class blocks, or a recovered pool's part
    /// below its allocation mark, handed out as top-class blocks from its
    /// upper end once the free lists are empty (so neither a start nor a
    /// restart touches a page of it).
    untouched: CachePadded<AtomicU32>,
    /// Whether segment headers carry their check
    /// ([`SegmentHeader::check_for`]), which only recovery reads: set for
    /// a pool over a backing that outlives the process (and for tests that
    /// recover a heap pool's words), not for a fresh heap pool, whose
    /// headers nothing ever verifies.
    header_checks: bool,
}

/// How a pool file keeps its allocation mark, by its format version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MarkFormat {
    /// Formats 2 to 4: the unit itself (0 in format 2, whose files have
    /// no mark: "unknown", and never lowered).
    Plain,
    /// Format 5 on: the unit in the low half, a check of it in the high
    /// half, so a flipped bit or a word written over it reads as
    /// "unknown" (recovery reads every unit) instead of as a higher unit
    /// (recovery would not read the segments below it, and their
    /// sessions' numbers would be handed out again).
    Checked,
}

/// Mixed into a checked mark's high half, so that no run of equal or
/// zero bytes is a valid mark.
const MARK_KEY: u32 = 0x6D41_524B;

impl MarkFormat {
    /// The mark format of pool files of format `version`.
    pub(crate) fn for_version(version: u32) -> MarkFormat {
        if version >= 5 {
            MarkFormat::Checked
        } else {
            MarkFormat::Plain
        }
    }

    /// The word that says `unit`.
    pub(crate) fn encode(self, unit: u32) -> u64 {
        match self {
            MarkFormat::Plain => u64::from(unit),
            MarkFormat::Checked => (u64::from(!unit ^ MARK_KEY) << 32) | u64::from(unit),
        }
    }

    /// The unit `word` says, if it is a mark of this format.
    pub(crate) fn decode(self, word: u64) -> Option<u32> {
        match self {
            MarkFormat::Plain => u32::try_from(word).ok(),
            MarkFormat::Checked => {
                ((word >> 32) as u32 == !(word as u32) ^ MARK_KEY).then_some(word as u32)
            }
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("shape", &self.shape)
            .field("free_units", &self.free_units.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool over fresh zeroed memory, every unit free; fails if the
    /// operating system will not map that much.
    pub(crate) fn new(shape: PoolShape) -> std::io::Result<Pool> {
        let mut pool = Pool::over(Backing::in_memory(shape.total_words())?, shape);
        pool.header_checks = false;
        pool.free_untouched();
        Ok(pool)
    }

    /// Makes every unit of a new pool free without writing to it: the
    /// whole top-class blocks from unit 0 up become the untouched region
    /// (carved from its upper end once the lists are empty, as a
    /// recovered pool's part below its mark), and only the units above
    /// the last whole block go on the lists. Pushing every block instead
    /// writes its link word — a page per block, 37 pages of a default
    /// 1 GiB pool — and every trim pass then marks each block's stamp
    /// word, another page each.
    fn free_untouched(&self) {
        let low = self.make_untouched_below(self.shape.units);
        self.push_blocks_from(low, self.shape.top_class);
    }

    /// Makes the whole top-class blocks below unit `below` the untouched
    /// region (free, counted as such, on no list) and returns where it
    /// ends: `below` rounded down to a top-class block.
    fn make_untouched_below(&self, below: u32) -> u32 {
        let top = 1u32 << self.shape.top_class;
        let low = below / top * top;
        self.free_units.fetch_add(u64::from(low), Ordering::Relaxed);
        self.untouched.store(low, Ordering::Relaxed);
        low
    }

    /// Pushes the units from `unit` to the end onto the free lists as
    /// buddy-aligned blocks of the largest classes below `below` that fit
    /// (`unit` aligned to a block of class `below - 1`).
    fn push_blocks_from(&self, mut unit: u32, below: u8) {
        for class in (0..below).rev() {
            let size = 1u32 << class;
            while self.shape.units - unit >= size {
                self.push(unit, class);
                unit += size;
            }
        }
    }

    /// A new pool with every unit on the free lists (none untouched), as
    /// buddy-aligned blocks of the largest classes that fit: the start
    /// the loom models of the lists and of trimming were written for.
    #[cfg(all(test, loom))]
    pub(crate) fn new_on_lists(shape: PoolShape) -> std::io::Result<Pool> {
        // Not through `Pool::new`: the few atomic operations of its
        // untouched region would count against loom's branch limit.
        let mut pool = Pool::over(Backing::in_memory(shape.total_words())?, shape);
        pool.header_checks = false;
        pool.push_blocks_from(0, shape.top_class + 1);
        Ok(pool)
    }

    /// [`Pool::new_on_lists`] with a checked allocation mark before its
    /// words, as a new pool file of this build has (every unit above it).
    #[cfg(all(test, loom))]
    pub(crate) fn new_on_lists_marked(shape: PoolShape) -> std::io::Result<Pool> {
        let backing = Backing::in_memory(shape.total_words() + 1)?;
        backing
            .word(0)
            .store(MarkFormat::Checked.encode(shape.units), Ordering::Relaxed);
        let mut pool = Pool::over_marked(backing, shape, MarkFormat::Checked);
        pool.header_checks = false;
        pool.push_blocks_from(0, shape.top_class + 1);
        Ok(pool)
    }

    /// This pool, writing the check of every segment header it
    /// initialises from now on (a pool over a backing is created so; a
    /// fresh heap pool whose words a test will recover needs it).
    #[cfg(test)]
    pub(crate) fn with_header_checks(mut self) -> Pool {
        self.header_checks = true;
        self
    }

    /// Whether segment headers get their check (see the field).
    #[inline]
    pub(crate) fn header_checks(&self) -> bool {
        self.header_checks
    }

    /// A pool over `backing` (zeroed or recovered); its free lists start
    /// empty.
    pub(crate) fn over(backing: Backing, shape: PoolShape) -> Pool {
        Pool::with_words_at(backing, shape, 0)
    }

    /// A pool over `backing` whose first word is the *allocation mark*
    /// and whose pool words follow it (a durable pool: the mark is the
    /// last word of the file's header page). The mark is the lowest unit
    /// ever allocated from the file (`units` for a new file; 0, "unknown",
    /// for a file made before the mark existed). Allocation takes the
    /// pool's highest free block first, so the units at and above the
    /// mark are the most the pool ever held, and recovery reads only them.
    pub(crate) fn over_marked(backing: Backing, shape: PoolShape, format: MarkFormat) -> Pool {
        let mut pool = Pool::with_words_at(backing, shape, 1);
        pool.mark_format = format;
        pool
    }

    fn with_words_at(backing: Backing, shape: PoolShape, words_at: usize) -> Pool {
        assert!(shape.unit_words.is_power_of_two() && shape.unit_words >= 2 * HEADER_WORDS);
        assert!(backing.len() >= words_at + shape.total_words());
        Pool {
            backing,
            shape,
            free: (0..=shape.top_class)
                .map(|_| {
                    CachePadded::new(ClassLists {
                        warm: FreeList::new(),
                        cold: FreeList::new(),
                    })
                })
                .collect(),
            free_units: CachePadded::new(AtomicU64::new(0)),
            cold_units: CachePadded::new(AtomicU64::new(0)),
            trims: CachePadded::new(AtomicU64::new(0)),
            append_stalls: CachePadded::new(AtomicU64::new(0)),
            data_base: 2 * shape.units as usize,
            words_at,
            mark_format: MarkFormat::Plain,
            untouched: CachePadded::new(AtomicU32::new(0)),
            header_checks: true,
        }
    }

    /// Word `i` of the pool's own words (those after the allocation
    /// mark, if the pool has one).
    #[inline(always)]
    fn word(&self, i: usize) -> &AtomicU64 {
        self.backing.word(self.words_at + i)
    }

    /// The backing, to write beside the pool's words (a durable pool's
    /// header page at a clean close). Needs the pool unshared.
    #[cfg(not(loom))]
    pub(crate) fn backing_mut(&mut self) -> &mut Backing {
        &mut self.backing
    }

    /// The allocation mark's word, for a pool that has one.
    fn mark_word(&self) -> Option<&AtomicU64> {
        (self.words_at == 1).then(|| self.backing.word(0))
    }

    /// The lowest unit that may have been allocated: below it every unit
    /// is free and was never written (0 when the pool has no mark, or the
    /// mark is unknown: not a mark of the file's format, or beyond the
    /// last unit — damage, which must make recovery read more, never less).
    pub(crate) fn allocation_mark(&self) -> u32 {
        self.mark_word()
            .and_then(|m| self.valid_mark(m))
            .unwrap_or(0)
    }

    /// The unit `mark` says, if it is a mark of the file's format within
    /// the pool.
    fn valid_mark(&self, mark: &AtomicU64) -> Option<u32> {
        self.mark_format
            .decode(mark.load(Ordering::Relaxed))
            .filter(|&v| v <= self.shape.units)
    }

    /// After recovery: the mark becomes the lower of what it said (if it
    /// was valid) and `lowest_used`, the lowest unit recovery kept, so the
    /// next recovery reads every kept segment — also after one that read
    /// every unit because the mark was unknown or may have been written
    /// back stale (a machine restart). Runs before the pool is shared.
    pub(crate) fn settle_mark(&self, lowest_used: Option<u32>) {
        let Some(mark) = self.mark_word() else {
            return;
        };
        let units = self.shape.units;
        let said = self.valid_mark(mark).unwrap_or(units);
        let settled = said.min(lowest_used.unwrap_or(units));
        let word = self.mark_format.encode(settled);
        if mark.load(Ordering::Relaxed) != word {
            mark.store(word, Ordering::Relaxed);
        }
    }

    /// Puts every unit `used` does not mark on the free lists, as
    /// buddy-aligned blocks of the largest classes that fit (recovery of a
    /// durable pool). A unit left with an odd stamp (owned when the process
    /// died, and not recovered) gets the even stamp of a free unit first,
    /// so no later recovery mistakes its stale header for a live segment.
    ///
    /// Units below `untouched_below` were never allocated (the allocation
    /// mark): they are not looked at, not pushed, and so not touched — they
    /// become the untouched region that `take` carves top-class blocks from
    /// — so this costs time for the part of the pool that was ever used.
    pub(crate) fn free_unused(&self, used: &[bool], untouched_below: u32) {
        let units = self.shape.units as usize;
        assert_eq!(used.len(), units);
        // Below `low`: whole top-class blocks, never written; `take` carves
        // them when the lists run dry.
        let low = self.make_untouched_below(untouched_below) as usize;
        let mut unit = low;
        let mut before = Vec::with_capacity(units - low + 1);
        before.push(0u32);
        for (i, &u) in used[low..].iter().enumerate() {
            before.push(before[i] + u32::from(u));
            if !u {
                let stamp = self.stamp((low + i) as u32);
                let s = stamp.load(Ordering::Relaxed);
                if s & 1 == 1 {
                    stamp.store(s.wrapping_add(1), Ordering::Relaxed);
                }
            }
        }
        let all_free = |from: usize, n: usize| before[from - low + n] == before[from - low];
        while unit < units {
            if used[unit] {
                unit += 1;
                continue;
            }
            let class = (0..=self.shape.top_class)
                .rev()
                .find(|&c| {
                    let n = 1usize << c;
                    unit.is_multiple_of(n) && unit + n <= units && all_free(unit, n)
                })
                .expect("class 0 fits a free unit");
            // The block's memory holds what its units' earlier segments
            // wrote: its stamp goes up to the highest of theirs.
            let highest = (unit..unit + (1 << class))
                .map(|u| self.stamp_now(u as u32, Ordering::Relaxed))
                .max()
                .expect("a block has a unit");
            self.raise(unit as u32, highest);
            self.push(unit as u32, class);
            unit += 1 << class;
        }
        fence(Ordering::Release);
    }

    /// Forces a durable pool's dirty pages to its file (no-op on the heap).
    pub(crate) fn sync(&self) -> std::io::Result<()> {
        self.backing.sync()
    }

    pub(crate) fn shape(&self) -> PoolShape {
        self.shape
    }

    /// Bytes of segment memory on the free lists.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_units.load(Ordering::Relaxed) * self.unit_bytes()
    }

    /// Bytes of free segment memory that is not resident: given back to
    /// the operating system (on the cold lists; each cold segment keeps its
    /// first page), or, in memory (not a file), never touched (the
    /// untouched region). A durable pool's file pages are never given back.
    pub(crate) fn released_bytes(&self) -> u64 {
        let mut units = self.cold_units.load(Ordering::Relaxed);
        if self.backing.release_granule_words().is_some() {
            units += u64::from(self.untouched.load(Ordering::Relaxed));
        }
        units * self.unit_bytes()
    }

    /// Counts an append that waited for another writer of its window, one
    /// descheduled between its claim and its mark, instead of growing the
    /// window past twice its retention. Kept here, not in the engine's
    /// per-thread counters, because the window does the waiting; it is rare.
    pub(crate) fn count_append_stall(&self) {
        self.append_stalls.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends that waited so ([`count_append_stall`](Self::count_append_stall)).
    pub(crate) fn append_stalls(&self) -> u64 {
        self.append_stalls.load(Ordering::Relaxed)
    }

    /// Bytes of segment memory in all.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        u64::from(self.shape.units) * self.unit_bytes()
    }

    fn unit_bytes(&self) -> u64 {
        self.shape.unit_words as u64 * 8
    }

    /// The stamp word of `unit` (only its low 32 bits are used).
    #[inline]
    pub(crate) fn stamp(&self, unit: u32) -> &AtomicU64 {
        self.word(unit as usize)
    }

    /// The current stamp of `unit`. Always inlined: its callers pass the
    /// ordering as a constant, which an out-of-line copy would test at run
    /// time.
    #[inline(always)]
    pub(crate) fn stamp_now(&self, unit: u32, order: Ordering) -> u32 {
        self.stamp(unit).load(order) as u32
    }

    /// The state word of `unit`.
    #[inline]
    pub(crate) fn state(&self, unit: u32) -> &AtomicU64 {
        self.word(self.shape.units as usize + unit as usize)
    }

    /// Where the data of `unit` starts in the pool's words.
    #[inline]
    fn first_word(&self, unit: u32) -> usize {
        self.data_base + unit as usize * self.shape.unit_words
    }

    /// The header words of the segment at `unit`, as an array: one bounds
    /// check for all of them, where indexing the class-0 slice checked
    /// each word on its own (the header is read on every placement).
    #[inline(always)]
    pub(crate) fn header_words(&self, unit: u32) -> &[AtomicU64; HEADER_WORDS] {
        let start = self.first_word(unit);
        self.backing
            .range(self.words_at + start, HEADER_WORDS)
            .try_into()
            .expect("a range of HEADER_WORDS words")
    }

    /// The words of the segment of `class` at `unit`.
    #[inline]
    pub(crate) fn segment(&self, unit: u32, class: u8) -> &[AtomicU64] {
        let start = self.first_word(unit);
        self.backing
            .range(self.words_at + start, self.shape.class_words(class))
    }

    /// Whether `unit` can start a segment of `class` in this pool.
    pub(crate) fn valid(&self, unit: u32, class: u8) -> bool {
        class <= self.shape.top_class
            && unit.is_multiple_of(1 << class)
            && u64::from(unit) + (1u64 << class) <= u64::from(self.shape.units)
    }

    /// Allocates a segment of `class`: its stamp is odd and new; its other
    /// words hold whatever the previous owner left (the caller initialises
    /// the header and state before publishing it). `None` when no segment
    /// of `class` or larger is free.
    pub(crate) fn alloc(&self, class: u8) -> Option<SegRef> {
        let unit = self
            .take(class)
            .or_else(|| {
                self.coalesce();
                self.take(class)
            })
            .or_else(|| {
                // A trim pass may have held what we looked for.
                self.past_trims(|| {
                    self.take(class).or_else(|| {
                        self.coalesce();
                        self.take(class)
                    })
                })
            })?;
        Some(self.stamp_allocated(unit))
    }

    /// Gives `seg`, which its owner is releasing, straight back to that
    /// owner as a new allocation of the same class: what [`free`]
    /// and then an [`alloc`] that pops this very segment do (its stamp
    /// moves past the old allocation's twice, so a reader still holding a
    /// place in it sees it released), without the free list's CAS and
    /// counters. A window that releases its oldest segment as it opens the
    /// next one keeps writing into memory its own core has in cache; the
    /// free list would as likely hand that segment to another session on
    /// another core, and this one a segment still in that core's cache
    /// (BENCHMARKS.md, run AT).
    ///
    /// [`free`]: Self::free
    /// [`alloc`]: Self::alloc
    pub(crate) fn reuse(&self, seg: SegRef) -> SegRef {
        self.stamp_freed(seg);
        self.stamp_allocated(seg.unit)
    }

    /// The allocation of `unit`, taken off the free lists or reused: its
    /// stamp made odd and new, the allocation mark lowered to it.
    fn stamp_allocated(&self, unit: u32) -> SegRef {
        if let Some(mark) = self.mark_word() {
            // Lowered before the unit is stamped, so no owned unit is ever
            // below the mark. In the page cache at once (a process crash
            // keeps it); on the device with the next sync of the mapping,
            // which covers the header page too (`sync = every append`
            // syncs the whole mapping before the append returns).
            self.lower_mark(mark, unit);
        }
        let stamp_word = self.stamp(unit);
        // Only the allocator touches a free unit's stamp: load + store.
        let stamp = (stamp_word.load(Ordering::Relaxed) as u32).wrapping_add(1) | 1;
        stamp_word.store(u64::from(stamp), Ordering::Relaxed);
        // Every write the new owner makes to the segment comes after this
        // fence; a reader that loads one of them and then fences (Acquire)
        // sees the new stamp.
        fence(Ordering::Release);
        SegRef { unit, stamp }
    }

    /// Lowers the allocation mark to `unit` if it is above it. Rare: only
    /// an allocation below every earlier one lowers it.
    #[inline]
    fn lower_mark(&self, mark: &AtomicU64, unit: u32) {
        let mut word = mark.load(Ordering::Relaxed);
        loop {
            // A mark that is not valid stays so: recovery reads every unit
            // for it, and then settles it.
            match self.mark_format.decode(word) {
                Some(m) if unit < m => {}
                _ => return,
            }
            match mark.compare_exchange_weak(
                word,
                self.mark_format.encode(unit),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// Pops `class`, or splits the smallest larger class that has one.
    fn take(&self, class: u8) -> Option<u32> {
        let top = self.shape.top_class;
        if class > top {
            return None;
        }
        let (unit, mut have) = (class..=top)
            .find_map(|c| self.pop(c).map(|u| (u, c)))
            .or_else(|| self.carve().map(|u| (u, top)))?;
        while have > class {
            have -= 1;
            // Keep the lower half, free the upper one, whose memory the
            // lower's allocations covered: its stamp goes up to theirs.
            let upper = unit + (1 << have);
            self.raise(upper, self.stamp_now(unit, Ordering::Relaxed));
            self.push(upper, have);
        }
        Some(unit)
    }

    /// A top-class block from the upper end of the untouched region, if
    /// any is left.
    fn carve(&self) -> Option<u32> {
        let size = 1u32 << self.shape.top_class;
        let end = self
            .untouched
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_sub(size)
            })
            .ok()?;
        self.free_units
            .fetch_sub(u64::from(size), Ordering::Relaxed);
        Some(end - size)
    }

    /// Releases the segment `seg` of `class`. The caller guarantees no
    /// writer will touch it again (every claimed frame is published).
    pub(crate) fn free(&self, seg: SegRef, class: u8) {
        self.stamp_freed(seg);
        self.push(seg.unit, class);
    }

    /// Moves `seg`'s stamp past its allocation (even: free).
    fn stamp_freed(&self, seg: SegRef) {
        // Only the one owner frees; Relaxed + the fence below suffice.
        self.stamp(seg.unit)
            .store(u64::from(seg.stamp.wrapping_add(1)), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    fn link(&self, unit: u32) -> &AtomicU64 {
        self.word(self.first_word(unit))
    }

    fn push(&self, unit: u32, class: u8) {
        self.free_units.fetch_add(1 << class, Ordering::Relaxed);
        self.free[class as usize].warm.push(unit, self.link(unit));
    }

    fn pop(&self, class: u8) -> Option<u32> {
        let units = self.shape.units;
        let link = |u| self.link(u);
        let unit = match self.free[class as usize].warm.pop(units, link) {
            Some(unit) => unit,
            None => {
                let unit = self.free[class as usize].cold.pop(units, link)?;
                self.cold_units.fetch_sub(1 << class, Ordering::Relaxed);
                unit
            }
        };
        self.free_units.fetch_sub(1 << class, Ordering::Relaxed);
        Some(unit)
    }

    fn push_cold(&self, unit: u32, class: u8) {
        self.free_units.fetch_add(1 << class, Ordering::Relaxed);
        self.cold_units.fetch_add(1 << class, Ordering::Relaxed);
        self.free[class as usize].cold.push(unit, self.link(unit));
    }

    /// Appends the units of the chain that starts at `first` (taken whole
    /// off a list) to `units`.
    fn collect_chain(&self, first: u32, units: &mut Vec<u32>) {
        let limit = units.len() + self.shape.units as usize;
        let mut unit = first;
        loop {
            units.push(unit);
            let next = self.link(unit).load(Ordering::Relaxed);
            if next == 0 || next > u64::from(self.shape.units) || units.len() > limit {
                break;
            }
            unit = (next - 1) as u32;
        }
    }

    /// Looks again (`look`) once no trim pass holds segments off the
    /// lists, until a look finds something or fails with no pass started
    /// since the previous wait: then the failure is not a pass's doing.
    fn past_trims<T>(&self, mut look: impl FnMut() -> Option<T>) -> Option<T> {
        loop {
            // Acquire pairs with a pass's Release decrement, which follows
            // its pushes: after it, the lists hold what the pass held. A
            // pass counts itself in before it takes a list (and the take is
            // a Release RMW the pops acquire), so whoever found a list empty
            // because a pass had taken it sees the pass counted, or counted
            // out again after its pushes.
            // A pass makes up to `TRIM_PER_PASS` system calls: back off to
            // yielding the core rather than spin through them.
            let spin = Spin::new();
            let mut seen = self.trims.load(Ordering::Acquire);
            while seen & TRIMS_UNDER_WAY != 0 {
                spin.snooze();
                seen = self.trims.load(Ordering::Acquire);
            }
            if let Some(found) = look() {
                return Some(found);
            }
            if self.trims.load(Ordering::Acquire) == seen {
                return None;
            }
        }
    }

    /// Gives back to the operating system the pages of free segments that
    /// were already free at the previous pass (see the module docs),
    /// releasing at most `max_segments`. Returns the bytes released. Does
    /// nothing for a pool whose backing cannot release memory (a file).
    pub(crate) fn trim(&self, max_segments: usize) -> u64 {
        let Some(page_words) = self.backing.release_granule_words() else {
            return 0;
        };
        let mut budget = max_segments;
        let mut released = 0;
        let mut units = Vec::new();
        let mut seen = Vec::new();
        // Counted in before the first take (see `past_trims`).
        self.trims.fetch_add(TRIM_STARTED | 1, Ordering::Relaxed);
        let top = self.shape.top_class;
        for class in 0..=top {
            let Some(first) = self.free[class as usize].warm.take_all() else {
                continue;
            };
            units.clear();
            self.collect_chain(first, &mut units);
            self.free_units
                .fetch_sub((units.len() as u64) << class, Ordering::Relaxed);
            seen.clear();
            // Oldest first, so the newest go back on top, as they were.
            for &unit in units.iter().rev() {
                // The pass owns the unit now: only it touches the word.
                let stamp = self.stamp(unit);
                let word = stamp.load(Ordering::Relaxed);
                if word & SEEN != 0 {
                    seen.push(unit);
                } else {
                    stamp.store(word | SEEN, Ordering::Relaxed);
                    self.push(unit, class);
                }
            }
            // `seen` were free for a whole interval. Two of them that are
            // buddies merge, one class up and still marked, so this pass's
            // turn at that class takes them on (a burst's small segments
            // end up in a few large ones, each keeping one page); the rest
            // are released if they span two granules, else go back as they
            // were.
            seen.sort_unstable();
            let size = 1u32 << class;
            let releasable = self.shape.class_words(class) >= 2 * page_words;
            let mut i = 0;
            while i < seen.len() {
                let unit = seen[i];
                if class < top
                    && unit.is_multiple_of(2 * size)
                    && seen.get(i + 1) == Some(&(unit + size))
                {
                    self.merge(unit, unit + size);
                    self.push(unit, class + 1);
                    i += 2;
                    continue;
                }
                if releasable && budget > 0 {
                    budget -= 1;
                    // In the backing's words; the first word is the free
                    // list's link: kept.
                    let start = self.words_at + self.first_word(unit);
                    released += self
                        .backing
                        .release(start + 1..start + self.shape.class_words(class));
                    self.push_cold(unit, class);
                } else {
                    self.push(unit, class);
                }
                i += 1;
            }
        }
        self.trims.fetch_sub(1, Ordering::Release);
        released
    }

    /// Merges free buddies, class by class from the smallest. Each class's
    /// list is taken whole (one swap), sorted, and pairs of free buddies are
    /// pushed one class up; the rest go back. Allocations racing with it
    /// see a list empty for a moment and split a larger segment or report
    /// the pool full; they never see a segment twice.
    pub(crate) fn coalesce(&self) {
        let mut units = Vec::new();
        for class in 0..self.shape.top_class {
            units.clear();
            if let Some(first) = self.free[class as usize].warm.take_all() {
                self.collect_chain(first, &mut units);
            }
            let warm = units.len();
            if let Some(first) = self.free[class as usize].cold.take_all() {
                self.collect_chain(first, &mut units);
            }
            if units.is_empty() {
                continue;
            }
            let cold = (units.len() - warm) as u64;
            self.cold_units.fetch_sub(cold << class, Ordering::Relaxed);
            self.free_units
                .fetch_sub((units.len() as u64) << class, Ordering::Relaxed);
            units.sort_unstable();
            let size = 1u32 << class;
            let mut i = 0;
            while i < units.len() {
                let u = units[i];
                if u.is_multiple_of(2 * size) && units.get(i + 1) == Some(&(u + size)) {
                    self.merge(u, u + size);
                    self.push(u, class + 1);
                    i += 2;
                } else {
                    self.push(u, class);
                    i += 1;
                }
            }
        }
    }

    /// Merges the free buddies `lower` and `upper` (the caller owns both):
    /// the upper's stamp is retired — it disappears into the merged
    /// segment (even + 2 stays even, and names no allocation again) — and
    /// the lower's raised to it, so the merged segment's next stamp is
    /// above every stamp either half had (see "Stamps").
    fn merge(&self, lower: u32, upper: u32) {
        let word = self.stamp(upper);
        let retired = (word.load(Ordering::Relaxed) as u32).wrapping_add(2);
        word.store(u64::from(retired), Ordering::Relaxed);
        self.raise(lower, retired);
        fence(Ordering::Release);
    }

    /// Raises the stamp of the free unit `unit` (owned by the caller) to
    /// `floor` if it is below, keeping the rest of its word (the trim
    /// pass's mark). `floor` is a free unit's stamp, so even.
    fn raise(&self, unit: u32, floor: u32) {
        let word = self.stamp(unit);
        let w = word.load(Ordering::Relaxed);
        if (w as u32) < floor {
            word.store(
                w & !u64::from(u32::MAX) | u64::from(floor),
                Ordering::Relaxed,
            );
        }
    }

    /// The free list of `class` looked empty just now.
    #[cfg(test)]
    pub(crate) fn class_is_empty(&self, class: u8) -> bool {
        self.free[class as usize].warm.is_empty() && self.free[class as usize].cold.is_empty()
    }

    /// Whether an allocation of `class` would find a segment now (merging
    /// free buddies first if it would not).
    pub(crate) fn has_room_for(&self, class: u8) -> bool {
        let any = || {
            (class..=self.shape.top_class).any(|c| {
                !self.free[c as usize].warm.is_empty() || !self.free[c as usize].cold.is_empty()
            })
        };
        let untouched = || self.untouched.load(Ordering::Relaxed) >= 1 << self.shape.top_class;
        any()
            || untouched()
            || {
                self.coalesce();
                any()
            }
            || self.past_trims(|| any().then_some(())).is_some()
    }
}
