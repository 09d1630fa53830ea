//! Little-endian words out of byte strings, for the word-at-a-time code
//! (event-id parsing, payload copies into the pool), and the copy of
//! shared pool words out to a reader's buffer.

use crate::sync::{AtomicU64, Ordering};
use std::mem::MaybeUninit;

/// Copies and zeroings below this many bytes go word by word: `rep movsb`
/// (and `rep stosb`) has a start-up cost of some tens of cycles, which a
/// short payload does not repay (at 64 bytes, one 100-byte event per call
/// from cold caches took twice as long: `replay/scattered/RewindPerEvent`).
#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
const BULK_COPY_MIN_BYTES: usize = 256;

/// Copies `src` — pool words other threads may be writing at the same time
/// — into `dst`, which is `8 * src.len()` bytes long, as bytes in memory
/// order (little-endian words). The caller validates the copy afterwards
/// (the segment's stamp, seqlock-style) and discards it if a writer raced
/// it: torn bytes may be copied, never used.
///
/// The copy has the semantics of C++'s byte-wise atomic memcpy (P1478):
/// every byte is read by a relaxed atomic load. Word by word that is
/// `AtomicU64::load(Relaxed)` per word, which the compiler cannot turn into
/// a vector copy (about 40 % of `memcpy` on a 4 KiB payload); on x86-64 a
/// long copy is one `rep movsb` instead, whose reads are single-copy
/// atomic per byte in hardware, so the block is exactly such a sequence of
/// relaxed byte loads and runs at `memcpy` speed.
#[inline]
pub(crate) fn load_words(src: &[AtomicU64], dst: &mut [MaybeUninit<u8>]) {
    assert_eq!(dst.len(), src.len() * 8, "destination must fit the words");
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    if dst.len() >= BULK_COPY_MIN_BYTES {
        // SAFETY: `src` is `dst.len()` readable bytes (atomics live as
        // long as the borrow), `dst` is `dst.len()` writable bytes that
        // cannot overlap `src` (a `&mut` and a `&` borrow at once). The
        // direction flag is clear on entry to an `asm!` block (the
        // language guarantees it), so `rep movsb` copies forwards, exactly
        // `rcx` bytes, and changes only rcx, rsi and rdi (declared
        // clobbered) and no flags. Racing writers only store to `src`
        // with atomic stores; the block's reads of it are hardware
        // byte-atomic loads, which is what the atomic loads of the
        // fallback below are too (see the function's docs). Bytes of
        // `MaybeUninit<u8>` may hold anything.
        unsafe {
            std::arch::asm!(
                "rep movsb",
                inout("rcx") dst.len() => _,
                inout("rsi") src.as_ptr() => _,
                inout("rdi") dst.as_mut_ptr() => _,
                options(nostack, preserves_flags)
            );
        }
        return;
    }
    for (word, out) in src.iter().zip(dst.chunks_exact_mut(8)) {
        let bytes = word.load(Ordering::Relaxed).to_le_bytes();
        for (o, b) in out.iter_mut().zip(bytes) {
            o.write(b);
        }
    }
}

/// Stores `src` — whole words, `8 * dst.len()` bytes — into the pool words
/// `dst`, as bytes in memory order (little-endian words). The dual of
/// [`load_words`]: every byte is stored by a relaxed atomic store, so a
/// reader racing the writer (one holding a stale position in a reused
/// segment, which validates the stamp afterwards and discards what it
/// read) races atomics only.
///
/// Word by word that is `AtomicU64::store(Relaxed)` per word, which the
/// compiler never merges: an append is bound by its stores, and a 100-byte
/// payload takes twelve where `memcpy` takes four to seven. On x86-64 the
/// words go two at a time as 16-byte `movdqu` stores instead, whose bytes
/// are single-copy atomic in hardware: exactly such a sequence of relaxed
/// byte stores, in half the store instructions.
#[inline]
pub(crate) fn store_words(dst: &[AtomicU64], src: &[u8]) {
    assert_eq!(src.len(), dst.len() * 8, "source must fill the words");
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    let dst = {
        let pairs = dst.len() / 2;
        if pairs > 0 {
            // SAFETY: `src` is `16 * pairs` readable bytes and `dst` (atomics,
            // which may be written through a shared reference) `16 * pairs`
            // writable bytes; they cannot overlap (`src` is a `&[u8]`, which
            // no one may write while it is borrowed). The loop stores
            // exactly those bytes of `dst`, reads exactly those of `src`,
            // and changes only the registers declared clobbered and the
            // flags (not preserved). Other threads access `dst` only
            // atomically; the block's stores are hardware byte-atomic
            // stores, which is what the relaxed stores of the fallback below
            // are too (see the function's docs).
            unsafe {
                std::arch::asm!(
                    "2:",
                    "movdqu {v}, xmmword ptr [{src}]",
                    "movdqu xmmword ptr [{dst}], {v}",
                    "add {src}, 16",
                    "add {dst}, 16",
                    "dec {n}",
                    "jnz 2b",
                    src = inout(reg) src.as_ptr() => _,
                    dst = inout(reg) dst.as_ptr() => _,
                    n = inout(reg) pairs => _,
                    v = out(xmm_reg) _,
                    options(nostack),
                );
            }
        }
        &dst[pairs * 2..]
    };
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    let src = &src[src.len() - dst.len() * 8..];
    let (words, _) = src.as_chunks::<8>();
    for (word, bytes) in dst.iter().zip(words) {
        word.store(u64::from_le_bytes(*bytes), Ordering::Relaxed);
    }
}

/// Zeroes the pool words `words` (relaxed stores; published by whatever
/// publishes the memory they belong to), as [`store_words`] would store
/// zeroes: a reader racing it (one holding a stale position, which
/// validates afterwards) races atomics only.
///
/// Preparing a segment for shared appends zeroes all of it, about one
/// store per word appended; word by word that is as many store
/// instructions as the frames themselves take. On x86-64 a long run is
/// one `rep stosb` instead (hardware byte-atomic stores, wide ones), with
/// the word loop, a cache line per round, for short runs and under miri
/// and loom.
#[inline]
pub(crate) fn zero_words(words: &[AtomicU64]) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    if words.len() * 8 >= BULK_COPY_MIN_BYTES {
        // SAFETY: `words` (atomics, which may be written through a shared
        // reference) is `8 * words.len()` writable bytes. The direction
        // flag is clear on entry to an `asm!` block (the language
        // guarantees it), so `rep stosb` stores `al` forwards into exactly
        // `rcx` bytes from `rdi`, and changes only rcx and rdi (declared
        // clobbered) and no flags. Other threads access the words only
        // atomically; the block's stores are hardware byte-atomic stores,
        // which is what the relaxed stores below are too.
        unsafe {
            std::arch::asm!(
                "rep stosb",
                inout("rcx") words.len() * 8 => _,
                inout("rdi") words.as_ptr() => _,
                in("al") 0u8,
                options(nostack, preserves_flags)
            );
        }
        return;
    }
    // A cache line per round: written as one loop over words, the
    // compiler emits one store per round, three times as slow.
    let (lines, rest) = words.as_chunks::<8>();
    for line in lines {
        for w in line {
            w.store(0, Ordering::Relaxed);
        }
    }
    for w in rest {
        w.store(0, Ordering::Relaxed);
    }
}

/// The bytes `rest` — the last `rest.len()` (1 to 7) bytes of `whole` —
/// as a little-endian word, zero-padded, assembled in registers.
///
/// The obvious way, copying `rest` into a zeroed `[u8; 8]` and loading it
/// back, stalls on store forwarding (the byte stores cannot forward to
/// the word load); on the append and resume paths that stall cost more
/// than the rest of the work on the word.
#[inline]
pub(crate) fn tail_word(whole: &[u8], rest: &[u8]) -> u64 {
    debug_assert!(whole.ends_with(rest) && rest.len() < 8);
    if let Some(last) = whole.last_chunk::<8>() {
        // The word ending at `whole`'s end, shifted so its first byte is
        // the first byte of `rest`.
        u64::from_le_bytes(*last) >> (8 * (8 - rest.len()))
    } else {
        rest.iter().rev().fold(0, |w, &b| w << 8 | u64::from(b))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{load_words, store_words, tail_word, zero_words};
    use crate::sync::AtomicU64;
    use std::mem::MaybeUninit;

    #[test]
    fn loaded_words_are_the_words_bytes_for_short_and_bulk_copies() {
        for n in [0, 1, 2, 13, 31, 32, 33, 100, 512, 1000] {
            let words: Vec<AtomicU64> = (0..n as u64)
                .map(|i| AtomicU64::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i))
                .collect();
            let mut out = vec![MaybeUninit::new(0xAAu8); n * 8];
            load_words(&words, &mut out);
            // SAFETY: every byte was initialised above.
            let out: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
            let want: Vec<u8> = words
                .iter()
                .flat_map(|w| w.load(crate::sync::Ordering::Relaxed).to_le_bytes())
                .collect();
            assert_eq!(out, want, "{n} words");
        }
    }

    /// Runs `f` on `n` words set to all ones, with one more such word on
    /// each side that `f` must leave alone; returns the `n` words after.
    fn guarded(n: usize, f: impl FnOnce(&[AtomicU64])) -> Vec<u64> {
        let words: Vec<AtomicU64> = (0..n + 2).map(|_| AtomicU64::new(u64::MAX)).collect();
        f(&words[1..=n]);
        let got: Vec<u64> = words
            .iter()
            .map(|w| w.load(crate::sync::Ordering::Relaxed))
            .collect();
        assert_eq!(got[0], u64::MAX, "{n} words: store before the first");
        assert_eq!(got[n + 1], u64::MAX, "{n} words: store after the last");
        got[1..=n].to_vec()
    }

    #[test]
    fn stored_words_hold_the_bytes_in_order_for_every_length() {
        for n in [0, 1, 2, 3, 12, 13, 64, 129] {
            let src: Vec<u8> = (0..n * 8).map(|i| (i * 7 + 3) as u8).collect();
            let got = guarded(n, |words| store_words(words, &src));
            let want: Vec<u64> = src
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            assert_eq!(got, want, "{n} words");
        }
    }

    #[test]
    fn zeroed_words_are_zero_and_only_they_for_short_and_bulk_runs() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 100, 1021] {
            let got = guarded(n, zero_words);
            assert!(got.iter().all(|&w| w == 0), "{n} words");
        }
    }

    #[test]
    fn the_tail_word_holds_the_last_bytes_zero_padded_for_every_length() {
        let whole: Vec<u8> = (1..=40u8).collect();
        for len in 1..=whole.len() {
            let w = &whole[..len];
            let rest = &w[len / 8 * 8..];
            if rest.is_empty() {
                continue;
            }
            let mut bytes = [0u8; 8];
            bytes[..rest.len()].copy_from_slice(rest);
            assert_eq!(
                tail_word(w, rest),
                u64::from_le_bytes(bytes),
                "length {len}"
            );
        }
    }
}
