//! Little-endian words out of byte strings, for the word-at-a-time code
//! (event-id parsing, payload copies into the pool).

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

#[cfg(test)]
mod tests {
    use super::tail_word;

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
