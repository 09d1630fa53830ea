//! The pool file's header: its own first page, holding two copies of a
//! small `Pod` record (magic, format version, pool shape, boot counter,
//! checksum).
//!
//! The copies make the boot counter's update crash-safe without a rename:
//! an open reads both, takes the valid one with the larger counter, and
//! writes counter + 1 into the *other* copy, then `msync`s the page before
//! any epoch of the new boot is minted. A write torn by a crash leaves one
//! copy failing its checksum and the other intact, so the counter never
//! goes back and never repeats.

use bytemuck::{Pod, Zeroable};

use crate::storage::PoolShape;

/// The first eight bytes of every pool file.
pub(crate) const MAGIC: [u8; 8] = *b"RWNDPOOL";
/// The format this build writes (4: a frame's check covers its stream id
/// as well as its payload; 3: the header page ends with the pool's
/// allocation mark; 2: segment headers carry a check bound to their
/// allocation). A file keeps the format it was made with; its frames are
/// checked as that format says (`FrameCheck::for_version`).
pub(crate) const VERSION: u32 = 4;
/// The oldest format this build reads: a version-2 file has no allocation
/// mark (its word is 0, "unknown"), so its recovery reads every unit, and
/// it stays version 2, so the builds that made it can still open it. A
/// version-3 file is refused by those builds: they would allocate below
/// the mark without lowering it. A version-4 file is refused by builds of
/// format 3: they would find every frame's check wrong.
pub(crate) const OLDEST_READABLE: u32 = 2;
/// Bytes before the pool's words: one page.
pub(crate) const HEADER_BYTES: usize = 4096;
/// Where the allocation mark sits: the header page's last word, right
/// before the pool's words (see `Pool::over_marked`).
pub(crate) const MARK_OFFSET: usize = HEADER_BYTES - 8;
/// Where the second copy starts.
const SECOND_COPY: usize = HEADER_BYTES / 2;

/// One copy of the header. All fields little-endian on disk (the engine
/// only runs on little-endian targets where this matters: the words of the
/// pool are native `u64`s too).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct FileHeader {
    pub(crate) magic: [u8; 8],
    pub(crate) version: u32,
    /// [`HEADER_BYTES`]: where the pool's words start.
    pub(crate) header_bytes: u32,
    pub(crate) unit_words: u64,
    pub(crate) units: u64,
    pub(crate) top_class: u64,
    /// Bytes of the pool's words (stamps, states, data).
    pub(crate) pool_bytes: u64,
    /// Opens of this file so far, this one included; never 0 once opened.
    pub(crate) boot_counter: u64,
    /// Unix milliseconds when the file was made: the engine clock of a
    /// durable pool counts from here, so event times stay comparable
    /// across restarts.
    pub(crate) clock_base_ms: u64,
    /// CRC-32 of the bytes before this field, in the low half.
    pub(crate) checksum: u64,
}

const SIZE: usize = std::mem::size_of::<FileHeader>();
const _: () = assert!(SIZE == 72 && SIZE <= SECOND_COPY);

/// What reading one copy found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Copy {
    Valid(FileHeader),
    /// The magic is there but the checksum fails.
    Damaged,
    /// Not a header at all; the first eight bytes.
    Foreign([u8; 8]),
}

impl FileHeader {
    pub(crate) fn new(shape: PoolShape, clock_base_ms: u64) -> FileHeader {
        let mut h = FileHeader {
            magic: MAGIC,
            version: VERSION,
            header_bytes: HEADER_BYTES as u32,
            unit_words: shape.unit_words as u64,
            units: u64::from(shape.units),
            top_class: u64::from(shape.top_class),
            pool_bytes: shape.total_words() as u64 * 8,
            boot_counter: 0,
            clock_base_ms,
            checksum: 0,
        };
        h.seal();
        h
    }

    fn computed_checksum(&self) -> u64 {
        u64::from(crc32fast::hash(&bytemuck::bytes_of(self)[..SIZE - 8]))
    }

    /// Recomputes the checksum after a change.
    pub(crate) fn seal(&mut self) {
        self.checksum = self.computed_checksum();
    }

    /// Whether the file's pool has `shape`.
    pub(crate) fn has_shape(&self, shape: PoolShape) -> bool {
        self.unit_words == shape.unit_words as u64
            && self.units == u64::from(shape.units)
            && self.top_class == u64::from(shape.top_class)
            && self.pool_bytes == shape.total_words() as u64 * 8
    }

    /// The shape in words, for messages.
    pub(crate) fn describe(&self) -> String {
        describe(self.units, self.unit_words, self.top_class)
    }

    /// Reads copy `which` (0 or 1) of the header page.
    pub(crate) fn read(page: &[u8], which: usize) -> Copy {
        let at = which * SECOND_COPY;
        let h: FileHeader = bytemuck::pod_read_unaligned(&page[at..at + SIZE]);
        if h.magic != MAGIC {
            return Copy::Foreign(h.magic);
        }
        if h.checksum != h.computed_checksum() {
            return Copy::Damaged;
        }
        Copy::Valid(h)
    }

    /// Writes this header as copy `which` of the header page.
    pub(crate) fn write(&self, page: &mut [u8], which: usize) {
        let at = which * SECOND_COPY;
        page[at..at + SIZE].copy_from_slice(bytemuck::bytes_of(self));
    }
}

/// A pool shape in words, for messages.
pub(crate) fn describe(units: u64, unit_words: u64, top_class: u64) -> String {
    format!(
        "{units} units of {} bytes, segments up to {} bytes",
        unit_words * 8,
        (unit_words * 8) << top_class
    )
}

/// The valid copy with the largest boot counter, and which copy it is; or,
/// when neither is valid, the first copy's magic if neither copy is a header
/// at all (`None`: damaged).
pub(crate) fn newest(page: &[u8]) -> Result<(FileHeader, usize), Option<[u8; 8]>> {
    let copies = [FileHeader::read(page, 0), FileHeader::read(page, 1)];
    let best = copies
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c {
            Copy::Valid(h) => Some((*h, i)),
            _ => None,
        })
        .max_by_key(|(h, _)| h.boot_counter);
    best.ok_or(match copies {
        [Copy::Foreign(found), Copy::Foreign(_)] => Some(found),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> PoolShape {
        PoolShape {
            units: 64,
            unit_words: 64,
            top_class: 3,
        }
    }

    #[test]
    fn the_newest_valid_copy_wins_and_a_torn_copy_is_passed_over() {
        let mut page = vec![0u8; HEADER_BYTES];
        let mut h = FileHeader::new(shape(), 7);
        h.boot_counter = 4;
        h.seal();
        h.write(&mut page, 0);
        h.boot_counter = 5;
        h.seal();
        h.write(&mut page, 1);
        assert_eq!(newest(&page).map(|(h, i)| (h.boot_counter, i)), Ok((5, 1)));
        // A torn write of copy 1: one byte of the counter changed.
        page[SECOND_COPY + 48] ^= 0x40;
        assert_eq!(FileHeader::read(&page, 1), Copy::Damaged);
        assert_eq!(newest(&page).map(|(h, i)| (h.boot_counter, i)), Ok((4, 0)));
        page[3] = b'X';
        assert!(matches!(FileHeader::read(&page, 0), Copy::Foreign(_)));
        assert!(newest(&page).is_err());
    }
}
