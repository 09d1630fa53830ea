//! The memory a pool lives in: zeroed heap memory today; the same words in
//! a memory-mapped file for durable pools.

use crate::sync::AtomicU64;

/// Owns the pool's words.
pub(crate) struct Backing {
    words: Box<[AtomicU64]>,
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backing")
            .field("words", &self.words.len())
            .finish()
    }
}

impl Backing {
    /// `n` zeroed words on the heap. The allocation is zeroed by the
    /// allocator (`calloc`), so pages the pool never touches are never
    /// committed: a 1 GiB pool costs what its sessions hold, not 1 GiB.
    pub(crate) fn heap(n: usize) -> Backing {
        #[cfg(not(loom))]
        let words = bytemuck::zeroed_slice_box::<AtomicU64>(n);
        #[cfg(loom)]
        let words = (0..n).map(|_| AtomicU64::new(0)).collect();
        Backing { words }
    }

    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        &self.words
    }
}
