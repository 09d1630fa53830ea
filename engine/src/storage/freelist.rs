//! A lock-free stack of free segments of one size class (Treiber, with a
//! tag against ABA).
//!
//! The head word packs `tag << 32 | (unit + 1)`; 0 in the low half is the
//! empty stack. Each free segment's in-band `link` word holds the next
//! segment's `unit + 1`. Every successful push and pop increments the tag,
//! so a pop that read `head = A, A.link = B` and was delayed while `A` was
//! popped, reused and pushed back cannot install the stale `B`: the head it
//! compares against has a newer tag. (The tag is 32 bits: a pop would have
//! to sleep through exactly 2^32 other pushes and pops of this class.)
//!
//! A delayed pop may read the `link` word of a segment that another thread
//! has popped and is already writing: that read is a plain atomic load of
//! pool memory (never freed, always in bounds), its value is discarded when
//! the CAS fails, and the unit index it could yield is range-checked.
//!
//! # Orderings
//!
//! - `push`: the segment's link store is `Relaxed`; the head CAS is
//!   `Release` on success, so a popper that acquires the head sees the link
//!   and every write the pusher made to the segment before (its stamp bump).
//! - `pop`: the head load and the success CAS are `Acquire`; the link load
//!   is `Relaxed` (it is ordered after the head load's acquire of the push
//!   that wrote it). Failure orderings are `Relaxed`: a failed CAS only
//!   reloads.
//! - `take_all` swaps the head to empty (`AcqRel`): the whole chain becomes
//!   the caller's.
//!
//! Each push or pop is one CAS (one locked RMW) when uncontended.

use crate::sync::{spin_wait, AtomicU64, Ordering};

/// The free segments of one class.
#[derive(Debug)]
pub(crate) struct FreeList {
    head: AtomicU64,
}

const UNIT_MASK: u64 = 0xffff_ffff;

impl FreeList {
    pub(crate) fn new() -> FreeList {
        FreeList {
            head: AtomicU64::new(0),
        }
    }

    /// Pushes `unit`, whose link word is `link`.
    pub(crate) fn push(&self, unit: u32, link: &AtomicU64) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            link.store(head & UNIT_MASK, Ordering::Relaxed);
            let new = next_tag(head) | (u64::from(unit) + 1);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => {
                    head = now;
                    spin_wait();
                }
            }
        }
    }

    /// Pops a segment; `link_of(unit)` gives a unit's link word, `units` is
    /// the number of units in the pool.
    pub(crate) fn pop<'a>(
        &self,
        units: u32,
        link_of: impl Fn(u32) -> &'a AtomicU64,
    ) -> Option<u32> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let top = head & UNIT_MASK;
            if top == 0 {
                return None;
            }
            let unit = (top - 1) as u32;
            // Possibly stale (see the module docs); only used if the CAS wins.
            let next = link_of(unit).load(Ordering::Relaxed) & UNIT_MASK;
            let next = if next > u64::from(units) { 0 } else { next };
            let new = next_tag(head) | next;
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(unit),
                Err(now) => {
                    head = now;
                    spin_wait();
                }
            }
        }
    }

    /// Takes the whole stack: returns the first unit (the rest follow by
    /// links), or `None` if it was empty.
    pub(crate) fn take_all(&self) -> Option<u32> {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            if head & UNIT_MASK == 0 {
                return None;
            }
            match self.head.compare_exchange_weak(
                head,
                next_tag(head),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(((head & UNIT_MASK) - 1) as u32),
                Err(now) => head = now,
            }
        }
    }

    /// Whether the stack looked empty just now.
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed) & UNIT_MASK == 0
    }
}

fn next_tag(head: u64) -> u64 {
    (head & !UNIT_MASK).wrapping_add(1 << 32)
}
