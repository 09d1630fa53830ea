//! The memory a pool lives in: an anonymous mapping of zero pages, or the
//! same words in a memory-mapped file for durable pools.
//!
//! Either way the pool sees one `&[AtomicU64]`; a backing only owns the
//! memory and, for a file, knows how to write its dirty pages back
//! ([`Backing::sync`]).
//!
//! The in-memory pool is mapped from the operating system directly, not
//! taken from the global allocator: a 1 GiB pool must cost what its
//! sessions hold, and only the kernel's zero pages promise that. (An
//! allocator is free to commit, zero or pre-fault a large zeroed
//! allocation; under mimalloc, a `calloc`-style 1 GiB pool made 68 MiB
//! resident before the first session — `benches/tests/pool_commit.rs`.)
//! On Linux the mapping also opts out of transparent huge pages, so a host
//! set to `always` does not commit 2 MiB around every segment in use.

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
    /// [`Drop`] gives it back. Loom's atomics are not plain words, and
    /// Miri runs without `mmap`: both get the pool on the heap.
    #[cfg(any(loom, miri))]
    Heap,
    /// An anonymous mapping: the in-memory pool (unmapped on drop; pages
    /// given back with [`Backing::release`]).
    #[cfg(not(any(loom, miri)))]
    Anon { map: memmap2::MmapMut },
    /// A shared mapping of the pool file (durable).
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
            #[cfg(any(loom, miri))]
            Owner::Heap => "heap",
            #[cfg(not(any(loom, miri)))]
            Owner::Anon { .. } => "anonymous",
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
    /// `n` zeroed words in memory: an anonymous private mapping, so pages
    /// the pool never touches are never committed. Fails if the operating
    /// system refuses the mapping (more than it will promise, or address
    /// space exhausted).
    #[cfg(not(any(loom, miri)))]
    pub(crate) fn in_memory(n: usize) -> std::io::Result<Backing> {
        let bytes = n.checked_mul(8).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::OutOfMemory, "pool size overflows usize")
        })?;
        // A zero-length mapping is an error; an empty pool still gets a
        // page (it is never touched).
        let mut map = memmap2::MmapOptions::new().len(bytes.max(1)).map_anon()?;
        #[cfg(target_os = "linux")]
        {
            // Advice only: a kernel without transparent huge pages refuses
            // it, and the pool is correct either way.
            let _ = map.advise(memmap2::Advice::NoHugePage);
        }
        // A mapping starts on a page boundary: 8-aligned, never null.
        let ptr = NonNull::new(map.as_mut_ptr().cast::<AtomicU64>())
            .expect("a mapping is never at address 0");
        assert!(ptr.is_aligned());
        Ok(Backing {
            ptr,
            len: n,
            owner: Owner::Anon { map },
        })
    }

    /// `n` zeroed words on the heap (loom and Miri; an allocation failure
    /// aborts there).
    #[cfg(any(loom, miri))]
    pub(crate) fn in_memory(n: usize) -> std::io::Result<Backing> {
        #[cfg(not(loom))]
        let words = bytemuck::zeroed_slice_box::<AtomicU64>(n);
        #[cfg(loom)]
        let words: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let raw = Box::into_raw(words);
        Ok(Backing {
            ptr: NonNull::new(raw.cast::<AtomicU64>()).expect("Box::into_raw is never null"),
            len: n,
            owner: Owner::Heap,
        })
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

    /// The whole mapped file of a durable pool (its header page included),
    /// for the writes a clean close makes there; `None` for memory.
    #[cfg(not(loom))]
    pub(crate) fn mapped_file(&mut self) -> Option<&mut memmap2::MmapMut> {
        match &mut self.owner {
            Owner::Mapped(map) => Some(map),
            _ => None,
        }
    }

    /// How many words the backing holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// All the words (tests).
    #[cfg(test)]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        self.range(0, self.len)
    }

    /// Word `i`, checked against the backing's length (panics past it).
    ///
    /// A reference to that word only: under Miri, whose borrow tracker
    /// visits every `UnsafeCell` of a reference it retags, going through
    /// a slice of the whole backing made every word access cost as much as
    /// the whole pool (a test of a few thousand appends and reads ran for
    /// tens of minutes).
    #[inline(always)]
    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        &self.range(i, 1)[0]
    }

    /// Words `start..start + n`, checked against the backing's length
    /// (panics past it). A reference to those words only, for the reason
    /// given at [`Backing::word`].
    #[inline(always)]
    pub(crate) fn range(&self, start: usize, n: usize) -> &[AtomicU64] {
        assert!(
            start <= self.len && n <= self.len - start,
            "words {start}..+{n} of a {}-word backing",
            self.len
        );
        // SAFETY: `ptr` is non-null, 8-aligned (the heap box is a slice of
        // `AtomicU64`; a mapping's first word was checked in `in_memory` or
        // `mapped`) and valid for `len` words, which `owner` keeps allocated
        // (or mapped) for as long as `self` lives; none of them moves its
        // memory when moved. `start + n <= len` (asserted above), so the
        // `n` words from `ptr + start` are among them. Every bit pattern is
        // a valid `AtomicU64`, and all access goes through atomics, so
        // concurrent use from threads is sound. An anonymous private
        // mapping is this process's alone. For a file mapping, the only
        // other writer could be another process with the same file mapped:
        // the data directory's lock excludes it (and the file is mapped
        // once per open directory), so the memory behaves like
        // process-private memory shared with the page cache.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), n) }
    }

    /// The granule, in words, in which [`Backing::release`] gives memory
    /// back (the page size), or `None` if this backing never does: a file
    /// (its pages are the durable data) or a platform without
    /// `MADV_DONTNEED`'s zero-fill. The heap backing of loom and Miri runs
    /// "releases" by storing zeros, so the protocol around it is checked
    /// there too.
    pub(crate) fn release_granule_words(&self) -> Option<usize> {
        match &self.owner {
            #[cfg(any(loom, miri))]
            Owner::Heap => Some(8),
            #[cfg(all(not(any(loom, miri)), target_os = "linux"))]
            Owner::Anon { .. } => Some(rustix::param::page_size() / 8),
            #[cfg(all(not(any(loom, miri)), not(target_os = "linux")))]
            Owner::Anon { .. } => None,
            #[cfg(not(loom))]
            Owner::Mapped(_) => None,
        }
    }

    /// Gives the whole granules inside `words` back to the operating
    /// system: afterwards they read as zeros and are not resident until
    /// written. Returns the bytes released (0 when the backing does not
    /// release, or the range holds no whole granule).
    ///
    /// The caller owns `words`: no other thread writes them until it hands
    /// them on (readers may load them; any value is a valid word).
    pub(crate) fn release(&self, words: std::ops::Range<usize>) -> u64 {
        let Some(granule) = self.release_granule_words() else {
            return 0;
        };
        let start = words.start.next_multiple_of(granule);
        let end = words.end.min(self.len) / granule * granule;
        if end <= start {
            return 0;
        }
        match &self.owner {
            #[cfg(any(loom, miri))]
            Owner::Heap => {
                for word in self.range(start, end - start) {
                    word.store(0, crate::sync::Ordering::Relaxed);
                }
            }
            #[cfg(not(any(loom, miri)))]
            Owner::Anon { map } => {
                // The mapping starts on a page boundary and `start`, `end`
                // are whole pages into it, so the kernel sees exactly this
                // range (memmap2 widens an unaligned one down to a page).
                // SAFETY: the pages are words of this anonymous private
                // mapping that the caller owns (no thread writes them
                // until the caller hands them on) and that no reference
                // other than `&[AtomicU64]` points into; MADV_DONTNEED
                // makes them read as zeros, as if the owner had stored
                // zeros, and every bit pattern is a valid `AtomicU64`.
                // A racing reader's atomic loads see old words or zeros
                // and are validated by the segment's stamp afterwards.
                let done = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start * 8,
                        (end - start) * 8,
                    )
                };
                if done.is_err() {
                    return 0;
                }
            }
            #[cfg(not(loom))]
            Owner::Mapped(_) => return 0,
        }
        (end - start) as u64 * 8
    }

    /// Writes the dirty pages of a mapped backing back to its file and waits
    /// for the device (`msync(MS_SYNC)`). A no-op for an in-memory pool.
    pub(crate) fn sync(&self) -> std::io::Result<()> {
        match &self.owner {
            #[cfg(any(loom, miri))]
            Owner::Heap => Ok(()),
            #[cfg(not(any(loom, miri)))]
            Owner::Anon { .. } => Ok(()),
            #[cfg(not(loom))]
            Owner::Mapped(map) => map.flush(),
        }
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        #[cfg(any(loom, miri))]
        #[allow(
            irrefutable_let_patterns,
            reason = "under loom the heap is the only backing"
        )]
        if let Owner::Heap = self.owner {
            let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: for `Owner::Heap`, `ptr` and `len` are exactly what
            // `Box::into_raw` returned in `in_memory`, and nothing else frees it.
            drop(unsafe { Box::from_raw(raw) });
        }
        // A mapping unmaps itself when `owner` drops.
    }
}
