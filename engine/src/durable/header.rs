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
//!
//! Between the copies, the page also holds a *boot record*: which boot of
//! the machine's kernel last opened the file (see [`read_boot`]).

use bytemuck::{Pod, Zeroable};

use crate::storage::PoolShape;

/// The first eight bytes of every pool file.
pub(crate) const MAGIC: [u8; 8] = *b"RWNDPOOL";
/// The format this build writes (5: the allocation mark carries a check of
/// itself, and a frame's check covers the session that appended it; 4: a frame's check covers its stream id as well as its payload;
/// 3: the header page ends with the pool's allocation mark; 2: segment
/// headers carry a check bound to their allocation). A file keeps the
/// format it was made with; its frames and mark are read as that format
/// says (`FrameCheck::for_version`, `MarkFormat::for_version`).
pub(crate) const VERSION: u32 = 5;
/// The oldest format this build reads: a version-2 file has no allocation
/// mark (its word is 0, "unknown"), so its recovery reads every unit, and
/// it stays version 2, so the builds that made it can still open it. A
/// version-3 file is refused by those builds: they would allocate below
/// the mark without lowering it. A version-4 file is refused by builds of
/// format 3: they would find every frame's check wrong. A version-5 file
/// is refused by builds of format 4: they would read its checked mark as
/// a unit past the pool's end and recover nothing.
pub(crate) const OLDEST_READABLE: u32 = 2;
/// Bytes before the pool's words: one page.
pub(crate) const HEADER_BYTES: usize = 4096;
/// Where the allocation mark sits: the header page's last word, right
/// before the pool's words (see `Pool::over_marked`).
pub(crate) const MARK_OFFSET: usize = HEADER_BYTES - 8;
/// Where the second copy starts.
const SECOND_COPY: usize = HEADER_BYTES / 2;
/// Where the boot record sits: past the first copy, in bytes every format
/// leaves zero (so older builds neither read nor disturb it).
const BOOT_RECORD_OFFSET: usize = 1024;
/// The boot record's first eight bytes.
const BOOT_MAGIC: [u8; 8] = *b"RWNDBOOT";

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

/// Which boot of the machine's kernel last opened the file (its
/// `boot_id`), and whether that open ended in a clean close: written at
/// every open (not clean), and again by a close that first forced
/// everything to the device (clean). Not part of the checksummed header
/// (its own check guards it), so files of every format carry it without
/// a format change.
///
/// Recovery needs it to read a frame without its completion mark: after a
/// crash of the *process* the kernel still held every word the process
/// wrote (the page cache outlives it), so a missing mark is an `append`
/// that never returned; after the *machine* restarted, a mark can also be
/// missing because its page never reached the device, and the event may
/// have been acknowledged and delivered.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
struct BootRecord {
    magic: [u8; 8],
    boot_id: [u8; 16],
    /// 1 when the engine that opened the file closed it after forcing the
    /// pool and the journal to the device; 0 while it is open.
    closed_cleanly: u64,
    /// CRC-32 of the bytes before this field, in the low half.
    check: u64,
}

/// What a boot record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Boot {
    /// The kernel boot that opened the file last (zeros if it had none).
    pub(crate) id: [u8; 16],
    /// Whether that open ended in a clean close.
    pub(crate) closed_cleanly: bool,
}

const BOOT_RECORD_SIZE: usize = std::mem::size_of::<BootRecord>();
const _: () =
    assert!(BOOT_RECORD_OFFSET >= SIZE && BOOT_RECORD_OFFSET + BOOT_RECORD_SIZE <= SECOND_COPY);

impl BootRecord {
    fn computed_check(&self) -> u64 {
        u64::from(crc32fast::hash(
            &bytemuck::bytes_of(self)[..BOOT_RECORD_SIZE - 8],
        ))
    }
}

/// What the header page's boot record says, if it holds a valid one
/// (none in a file no build with boot records has opened, or after a torn
/// write).
pub(crate) fn read_boot(page: &[u8]) -> Option<Boot> {
    let at = BOOT_RECORD_OFFSET;
    let r: BootRecord = bytemuck::pod_read_unaligned(&page[at..at + BOOT_RECORD_SIZE]);
    (r.magic == BOOT_MAGIC && r.check == r.computed_check()).then_some(Boot {
        id: r.boot_id,
        closed_cleanly: r.closed_cleanly == 1,
    })
}

/// Writes a boot record into the header page.
pub(crate) fn write_boot(page: &mut [u8], boot: Boot) {
    let mut r = BootRecord {
        magic: BOOT_MAGIC,
        boot_id: boot.id,
        closed_cleanly: u64::from(boot.closed_cleanly),
        check: 0,
    };
    r.check = r.computed_check();
    let at = BOOT_RECORD_OFFSET;
    page[at..at + BOOT_RECORD_SIZE].copy_from_slice(bytemuck::bytes_of(&r));
}

/// This machine's current kernel boot: `/proc/sys/kernel/random/boot_id`
/// (a random UUID the kernel draws at boot), or `None` where there is no
/// such file.
pub(crate) fn current_boot() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    parse_boot_id(&text)
}

/// The 16 bytes of a UUID written as 32 hex digits with or without dashes.
fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = text.trim().bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (byte, pair) in id.iter_mut().zip(digits.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(id)
}

/// Whether writes of the file's last open may have been lost with the
/// machine: its record says it was not closed cleanly and names another
/// boot than this one, or either is unknown (a file last opened by a
/// build without boot records, a torn record, a system without a boot
/// id). Unknown counts as restarted: that answer costs a full scan of the
/// pool's stamps and gap notices for frames found unfinished, never a
/// silent loss. A clean close forced everything to the device first, so
/// after one nothing was lost, whatever the machine did since.
pub(crate) fn machine_restarted(recorded: Option<Boot>, now: Option<[u8; 16]>) -> bool {
    match (recorded, now) {
        (Some(r), _) if r.closed_cleanly => false,
        (Some(r), Some(now)) => r.id != now,
        _ => true,
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

    #[test]
    fn the_boot_record_round_trips_beside_both_copies_and_a_torn_one_is_unknown() {
        let mut page = vec![0u8; HEADER_BYTES];
        let mut h = FileHeader::new(shape(), 7);
        h.boot_counter = 2;
        h.seal();
        h.write(&mut page, 0);
        h.write(&mut page, 1);
        assert_eq!(read_boot(&page), None, "a page without a record");
        let id = parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n").unwrap();
        assert_eq!(id[0], 0x0f);
        assert_eq!(id[15], 0xf0);
        let open = Boot {
            id,
            closed_cleanly: false,
        };
        write_boot(&mut page, open);
        assert_eq!(read_boot(&page), Some(open));
        // The header copies are untouched by it.
        assert_eq!(newest(&page).map(|(h, _)| h.boot_counter), Ok(2));
        assert!(!machine_restarted(read_boot(&page), Some(id)));
        let mut other = id;
        other[3] ^= 1;
        assert!(machine_restarted(read_boot(&page), Some(other)));
        assert!(machine_restarted(read_boot(&page), None));
        // Closed cleanly: nothing was left unwritten, whatever boot comes.
        write_boot(
            &mut page,
            Boot {
                closed_cleanly: true,
                ..open
            },
        );
        assert!(!machine_restarted(read_boot(&page), Some(other)));
        assert!(!machine_restarted(read_boot(&page), None));
        write_boot(&mut page, open);
        // A torn record (one byte of the id changed) is no record.
        page[BOOT_RECORD_OFFSET + 9] ^= 0x10;
        assert_eq!(read_boot(&page), None);
        assert!(machine_restarted(read_boot(&page), Some(id)));
        assert_eq!(parse_boot_id("not a uuid"), None);
        assert_eq!(parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fg"), None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads /proc, which miri's isolation forbids")]
    fn this_machine_has_a_boot_id() {
        // Linux, where the durable pool runs; elsewhere the answer is
        // "unknown", which recovery treats as a restart.
        if cfg!(target_os = "linux") {
            assert!(current_boot().is_some());
            assert_eq!(current_boot(), current_boot());
        }
    }
}
