//! The memory a pool lives in: zeroed heap memory, or the same words in a
//! memory-mapped file for durable pools.
//!
//! Either way the pool sees one `&[AtomicU64]`; a backing only owns the
//! memory and, for a file, knows how to write its dirty pages back
//! ([`Backing::sync`]).

use std::ptr::NonNull;

use crate::sync::AtomicU64;

/// Owns the pool's words.
pub(crate) struct Backing {
    /// First word. Valid for `len` words for as long as `owner` lives;
    /// neither a `Box` nor a mapping moves its memory when moved itself.
    ptr: NonNull<AtomicU64>,
    len: usize,
    owner: Owner,
}

enum Owner {
    /// `ptr`/`len` came from `Box::into_raw` of a `Box<[AtomicU64]>`;
    /// [`Drop`] gives it back.
    Heap,
    #[cfg(not(loom))]
    Mapped(memmap2::MmapMut),
}

// SAFETY: a `Backing` is a `[AtomicU64]` that it owns; sharing and sending
// it is sharing and sending atomics, which are `Send + Sync`. The raw
// pointer only stands for the owned memory.
unsafe impl Send for Backing {}
// SAFETY: as above; every access through `words` is an atomic access.
unsafe impl Sync for Backing {}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.owner {
            Owner::Heap => "heap",
            #[cfg(not(loom))]
            Owner::Mapped(_) => "mapped",
        };
        f.debug_struct("Backing")
            .field("kind", &kind)
            .field("words", &self.len)
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
        let words: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let raw = Box::into_raw(words);
        Backing {
            ptr: NonNull::new(raw.cast::<AtomicU64>()).expect("Box::into_raw is never null"),
            len: n,
            owner: Owner::Heap,
        }
    }

    /// The `n` words at byte `offset` of a writable shared mapping of a
    /// pool file. The caller holds the data directory's lock, so no other
    /// process maps the file for writing while this backing lives.
    ///
    /// # Panics
    ///
    /// If `offset` is not a multiple of 8 or the words do not fit in the
    /// mapping (the caller has validated the file's length against its
    /// header).
    #[cfg(not(loom))]
    pub(crate) fn mapped(mut map: memmap2::MmapMut, offset: usize, n: usize) -> Backing {
        assert!(offset.is_multiple_of(std::mem::align_of::<AtomicU64>()));
        assert!(offset
            .checked_add(n.checked_mul(8).expect("word count overflows"))
            .is_some_and(|end| end <= map.len()));
        let base = map.as_mut_ptr();
        // A mapping starts on a page boundary, and `offset` is a multiple of
        // 8, so the first word is 8-aligned (asserted again below).
        // SAFETY: `offset <= map.len()` (asserted above), so the result is
        // inside the mapping or one past its end.
        let first = unsafe { base.add(offset) }.cast::<AtomicU64>();
        assert!(first.is_aligned());
        let ptr = NonNull::new(first).expect("a mapping is never at address 0");
        Backing {
            ptr,
            len: n,
            owner: Owner::Mapped(map),
        }
    }

    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is non-null, 8-aligned (the heap box is a slice of
        // `AtomicU64`; a mapping's words were checked in `mapped`) and valid
        // for `len` words, which `owner` keeps allocated (or mapped) for as
        // long as `self` lives; neither moves its memory when moved. Every
        // bit pattern is a valid `AtomicU64`, and all access goes through
        // atomics, so concurrent use from threads is sound. For a mapping,
        // the only other writer could be another process with the same file
        // mapped: the data directory's lock excludes it (and the file is
        // mapped once per open directory), so the memory behaves like
        // process-private memory shared with the page cache.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Writes the dirty pages of a mapped backing back to its file and waits
    /// for the device (`msync(MS_SYNC)`). A no-op on the heap.
    pub(crate) fn sync(&self) -> std::io::Result<()> {
        match &self.owner {
            Owner::Heap => Ok(()),
            #[cfg(not(loom))]
            Owner::Mapped(map) => map.flush(),
        }
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Owner::Heap = self.owner {
            let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: for `Owner::Heap`, `ptr` and `len` are exactly what
            // `Box::into_raw` returned in `heap`, and nothing else frees it.
            drop(unsafe { Box::from_raw(raw) });
        }
        // A mapping unmaps itself when `owner` drops.
    }
}
