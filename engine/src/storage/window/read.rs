//! The read side of a window: placing a reader, reading one event or a
//! batch, following seals, and telling pending, lagged and ended apart.

use super::*;

impl Window {
    /// The highest sequence number claimed (0 before the first append).
    pub(crate) fn high_water(&self, pool: &Pool) -> u64 {
        let spin = Spin::new();
        loop {
            let Some(head) = SegRef::unpack(self.head.load(Ordering::Acquire)) else {
                return 0;
            };
            let words = pool.segment(head.unit, 0);
            let first_seq = words[FIRST_SEQ].load(Ordering::Relaxed);
            match State::decode(pool.state(head.unit).load(Ordering::Acquire), head.stamp) {
                Some(State::Open { count, .. } | State::Last { count, .. }) => {
                    return first_seq + u64::from(count) - 1;
                }
                // Sealed, head not swung yet: its successor starts right
                // after its last frame.
                Some(State::Next { next, .. }) => {
                    let n = SegRef {
                        unit: next,
                        stamp: pool.stamp_now(next, Ordering::Acquire),
                    };
                    if let Some(h) = read_header(pool, n) {
                        return h.first_seq - 1;
                    }
                }
                None => {}
            }
            spin.snooze();
        }
    }

    /// The sequence number of the oldest frame still held; `high_water + 1`
    /// when nothing is held.
    pub(crate) fn oldest_retained(&self, pool: &Pool) -> u64 {
        match current_header(pool, &self.oldest) {
            (_, Some((_, h))) => h.first_seq,
            _ => self.high_water(pool) + 1,
        }
    }

    /// A cursor whose first read returns the frame after `after`.
    pub(crate) fn cursor_after(&self, after: u64) -> Cursor {
        Cursor::after(after)
    }

    /// Everything a resume asks of the window, read in one pass: the high
    /// water mark, the oldest retained sequence number, and — for a cursor
    /// `after` in the window — when frame `after` was appended; `cursor` is
    /// then moved to the frame after it, placed in the segment that holds
    /// it (so the replay does not walk the chain again). When frame `after`
    /// is not found, `cursor` is left as it was.
    ///
    /// The cursor is written where the caller keeps it rather than
    /// returned: a placed cursor returned through the placement and moved
    /// on into the reader was copied in wider loads than its fields were
    /// stored with, and each such copy waited for the stores to drain
    /// (BENCHMARKS.md, runs AL and AS).
    ///
    /// One pass reads the head's header and state, the oldest segment's
    /// header (the head's, when they are one), and for a cursor in a sealed
    /// segment near the oldest end one state and one successor header —
    /// each header once, where asking `high_water`, `oldest_retained` and
    /// `locate` in turn reads the head and the oldest twice. When the pass
    /// meets anything unusual (the head sealed but not swung yet, a segment
    /// released under it), it answers the slow way, with those calls.
    ///
    /// If the cursor's segment is released before the first read, that
    /// read validates its stamp and reports `Lagged`, as a fresh walk would.
    pub(crate) fn place(
        &self,
        pool: &Pool,
        owner: Owner,
        after: Option<u64>,
        cursor: &mut Cursor,
    ) -> Placement {
        self.place_fast(pool, owner, after, cursor)
            .unwrap_or_else(|| self.place_slow(pool, owner, after, cursor))
    }

    /// [`Window::place`] in one pass, or `None` to take the slow way.
    #[inline(always)]
    fn place_fast(
        &self,
        pool: &Pool,
        owner: Owner,
        after: Option<u64>,
        cursor: &mut Cursor,
    ) -> Option<Placement> {
        let head_word = self.head.load(Ordering::Acquire);
        let Some(head) = SegRef::unpack(head_word) else {
            // Nothing appended yet, or closed: nothing to place.
            return None;
        };
        let hh = read_header(pool, head).filter(|h| is_owner(h, owner))?;
        let head_count =
            match State::decode(pool.state(head.unit).load(Ordering::Acquire), head.stamp)? {
                State::Open { count, .. } | State::Last { count, .. } => count,
                // Sealed, head not swung yet: rare, and `high_water` knows it.
                State::Next { .. } => return None,
            };
        let high_water = hh.first_seq + u64::from(head_count) - 1;
        let oldest_word = self.oldest.load(Ordering::Acquire);
        let (oldest_seg, oh) = if oldest_word == head_word {
            (head, hh)
        } else {
            let seg = SegRef::unpack(oldest_word)?;
            (seg, read_header(pool, seg).filter(|h| is_owner(h, owner))?)
        };
        let mut placement = Placement {
            high_water,
            oldest: oh.first_seq,
            appended_ms: None,
        };
        let Some(seq) = after.filter(|&s| s >= oh.first_seq && s <= high_water) else {
            return Some(placement);
        };
        let pos = if seq >= hh.first_seq {
            Pos {
                known: head_count,
                ..Pos::at(head, &hh, seq)
            }
        } else if seq - oh.first_seq < hh.first_seq - seq {
            // Nearer the oldest end: its successor's first number bounds it.
            match walk_forward(pool, owner, seq, oldest_seg, oh)? {
                Locate::At(pos) => pos,
                _ => return None,
            }
        } else {
            return None;
        };
        placement.appended_ms = frame_after(pool, seq, pos, cursor);
        Some(placement)
    }

    /// [`Window::place`] by separate calls, each retrying on its own.
    pub(in crate::storage) fn place_slow(
        &self,
        pool: &Pool,
        owner: Owner,
        after: Option<u64>,
        cursor: &mut Cursor,
    ) -> Placement {
        let high_water = self.high_water(pool);
        let oldest = self.oldest_retained(pool);
        let mut placement = Placement {
            high_water,
            oldest,
            appended_ms: None,
        };
        if let Some(seq) = after.filter(|&s| s >= 1 && s <= high_water) {
            if let Locate::At(pos) = self.locate(pool, owner, seq) {
                placement.appended_ms = frame_after(pool, seq, pos, cursor);
            }
        }
        placement
    }

    /// Reads the next frame of `stream` (or of any stream) at `cursor`,
    /// copying its payload into `buf` (cleared first). Never blocks, never
    /// spins; frames of other streams are passed over.
    pub(crate) fn read(
        &self,
        pool: &Pool,
        owner: Owner,
        cursor: &mut Cursor,
        stream: Option<u32>,
        buf: &mut Vec<u8>,
    ) -> Read {
        buf.clear();
        if let Some(event) = read_placed(pool, cursor, stream, buf) {
            return Read::Event(event);
        }
        self.read_slow(pool, owner, cursor, stream, buf)
    }

    /// Reads the frames of `stream` at `cursor` that are ready into `buf`,
    /// pushing `(seq, start, end)` — where each payload lies in `buf` — to
    /// `events`, until `events` holds `max_events` or `buf` at least
    /// `max_bytes` (then `None`: more may be ready) or a read finds no
    /// event (then what it found: pending, lagged or ended).
    ///
    /// The frames of one segment are copied in one piece, their headers
    /// with them (a payload is where `events` says, not back to back with
    /// the next), and the run's stamp is validated once: this is what makes
    /// a replay copy-bound. A run whose stamp changed is taken back (`buf`
    /// and `events` truncated) and read again by the general path, which
    /// reports it as lost.
    #[allow(
        clippy::too_many_arguments,
        reason = "the reader's state and its two output buffers, once per batch"
    )]
    pub(crate) fn read_many(
        &self,
        pool: &Pool,
        owner: Owner,
        cursor: &mut Cursor,
        stream: u32,
        buf: &mut Vec<u8>,
        events: &mut Vec<(u64, u32, u32)>,
        max_events: usize,
        max_bytes: usize,
    ) -> Option<Read> {
        loop {
            if events.len() >= max_events || buf.len() >= max_bytes {
                return None;
            }
            // A run that ended at the claims the reader had seen has nothing
            // more to copy: go straight to learning more.
            if !at_seen_claims_end(cursor)
                && run_placed(pool, cursor, stream, buf, events, max_events, max_bytes)
            {
                continue;
            }
            // The run stopped at the claims the reader had seen or at the
            // end of a sealed segment: learn more claims, or move on to the
            // successor, and run again without the single-frame path.
            match self.claimed(pool, owner, cursor) {
                Claimed::Not(read) => return Some(read),
                Claimed::At { changed } => {
                    if changed
                        && run_placed(pool, cursor, stream, buf, events, max_events, max_bytes)
                    {
                        continue;
                    }
                }
            }
            let start = buf.len() as u32;
            match self.read_slow(pool, owner, cursor, Some(stream), buf) {
                Read::Event(event) => events.push((event.seq, start, buf.len() as u32)),
                other => return Some(other),
            }
        }
    }

    /// The general case of a read: places the cursor, follows seals, and
    /// tells pending, lagged and ended apart. Appends the payload to `buf`;
    /// on anything but an event `buf` is as it was.
    fn read_slow(
        &self,
        pool: &Pool,
        owner: Owner,
        cursor: &mut Cursor,
        stream: Option<u32>,
        buf: &mut Vec<u8>,
    ) -> Read {
        let base = buf.len();
        loop {
            let mut pos = match self.claimed(pool, owner, cursor) {
                Claimed::At { .. } => cursor.at.expect("a claimed frame has a position"),
                Claimed::Not(read) => return read,
            };
            let index = (cursor.seq - pos.first_seq) as u32;
            let segment = pool.segment(pos.seg.unit, pos.class);
            let Some(offset) = frame_offset(segment, pos.seg.stamp, index, pos.offset) else {
                return self.pending_or_lost(pool, cursor, pos);
            };
            pos.offset = offset;
            // Acquire pairs with the appender's Release of the mark: its
            // meta, time and payload stores are visible below.
            let Some(len) = mark_len(
                segment[offset as usize].load(Ordering::Acquire),
                pos.seg.stamp,
            ) else {
                return self.pending_or_lost(pool, cursor, pos);
            };
            let len = len as usize;
            let start = offset as usize + FRAME_HEADER_WORDS;
            let end = start + len.div_ceil(WORD_BYTES);
            if end > segment.len() - (index as usize + 1) {
                // A mark of this allocation never announces that; only a
                // released and reused segment could show it.
                return self.gone(cursor);
            }
            let meta_word = segment[offset as usize + 1].load(Ordering::Relaxed);
            let appended_ms = segment[offset as usize + 2].load(Ordering::Relaxed);
            let frame_stream = (meta_word >> 32) as u32;
            if is_gap_marker(meta_word, appended_ms) {
                // Recovery found this frame damaged: its event is lost to
                // every reader, which must be told. The reader moves past
                // it, so a `skip_gap` goes on after it.
                fence(Ordering::Acquire);
                if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
                    return self.gone(cursor);
                }
                let missing = cursor.seq;
                cursor.seq += 1;
                pos.offset = end as u32;
                cursor.at = Some(pos);
                return Read::Lagged { missing };
            }
            let wanted = stream.is_none_or(|s| s == frame_stream);
            if wanted {
                copy_out(&segment[start..end], len, buf);
            }
            // Pairs with the fence(Release) after every stamp change: if any
            // word above came from a later owner, the stamp has changed.
            fence(Ordering::Acquire);
            if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
                buf.truncate(base);
                return self.gone(cursor);
            }
            let seq = cursor.seq;
            cursor.seq += 1;
            pos.offset = (start + len.div_ceil(WORD_BYTES)) as u32;
            cursor.at = Some(pos);
            if wanted {
                return Read::Event(FrameMeta {
                    seq,
                    stream: frame_stream,
                    appended_ms,
                    len,
                });
            }
        }
    }

    /// Where frame `cursor.seq` is, once it is known to be claimed: the
    /// cursor's position (located first if it has none), with the
    /// segment's claims loaded again when the reader has passed those it
    /// saw, and a sealed segment left for its successor once the reader has
    /// passed its last frame. `Not` is why there is no such frame to read
    /// yet: pending, ended, or lost under the reader.
    ///
    /// The position is updated where it is, in `cursor.at`, never copied
    /// out whole: the batch path calls this right after storing one field
    /// of it, and a whole-struct load of those bytes would wait for that
    /// store to reach the cache (a store-forwarding stall at every segment
    /// boundary of a batch).
    #[inline]
    fn claimed(&self, pool: &Pool, owner: Owner, cursor: &mut Cursor) -> Claimed {
        let mut relocations = 0;
        let mut changed = false;
        macro_rules! lost {
            () => {
                match self.lost(pool, owner, cursor) {
                    Some(read) => return Claimed::Not(read),
                    None => {
                        relocations += 1;
                        if relocations > MAX_RELOCATIONS {
                            cursor.at = None;
                            return Claimed::Not(Read::Lagged {
                                missing: cursor.seq,
                            });
                        }
                        continue;
                    }
                }
            };
        }
        loop {
            let seq = cursor.seq;
            let pos = match &mut cursor.at {
                Some(pos) => pos,
                at @ None => match self.locate(pool, owner, seq) {
                    Locate::At(pos) => {
                        changed = true;
                        at.insert(pos)
                    }
                    Locate::NotYet => return Claimed::Not(Read::Pending),
                    Locate::Gone => return Claimed::Not(Read::Lagged { missing: seq }),
                    Locate::Ended => return Claimed::Not(Read::Ended),
                },
            };
            let index = (seq - pos.first_seq) as u32;
            if index < pos.known {
                return Claimed::At { changed };
            }
            changed = true;
            // Past the last frame of a segment seen sealed: on to the
            // successor kept when its header was loaded (the state is final
            // once sealed). None is kept when the count came from the state
            // word alone: the state load below loads the header then, and
            // finds the successor lost to the reader if that header is not
            // this owner's or does not start where the count says.
            if pos.sealed_count != UNKNOWN && index == pos.sealed_count {
                if let Some(next) = pos.successor() {
                    *pos = next;
                    continue;
                }
            }
            let state = State::decode(
                pool.state(pos.seg.unit).load(Ordering::Acquire),
                pos.seg.stamp,
            );
            let count = match state {
                None => lost!(),
                Some(State::Open { count, .. } | State::Last { count, .. }) => count,
                Some(State::Next { next, count }) => {
                    if let Some(count) = count {
                        pos.sealed_count = count;
                    }
                    // The successor is needed to learn the count, or to
                    // move on to it.
                    if pos.successor().is_none()
                        && (pos.sealed_count == UNKNOWN || index >= pos.sealed_count)
                    {
                        let n = SegRef {
                            unit: next,
                            stamp: pool.stamp_now(next, Ordering::Acquire),
                        };
                        match read_header(pool, n) {
                            Some(h)
                                if h.owner_epoch == owner.epoch
                                    && h.prev == pos.seg.pack()
                                    && (pos.sealed_count == UNKNOWN
                                        || h.first_seq
                                            == pos.first_seq + u64::from(pos.sealed_count)) =>
                            {
                                pos.sealed((h.first_seq - pos.first_seq) as u32, n, &h, owner);
                            }
                            _ => lost!(),
                        }
                    }
                    pos.sealed_count
                }
            };
            if index < count {
                pos.known = count;
                return Claimed::At { changed };
            }
            match state {
                // The count was just learnt, the successor kept with it:
                // the top of the loop moves on to it.
                Some(State::Next { .. }) if index == count => {}
                Some(State::Last { .. }) => return Claimed::Not(Read::Ended),
                _ => return Claimed::Not(Read::Pending),
            }
        }
    }

    /// Frame `cursor.seq` is claimed (the state said so) but its table
    /// entry or mark is not this allocation's: either its writer is still
    /// copying (pending), or the segment was released and reused under the
    /// reader, whose new owner's words are what it loaded. The stamp tells
    /// them apart — a reader that loaded a later owner's word and then
    /// fenced sees the later stamp — and it must be checked here: a reader
    /// that has already seen the frame claimed does not load the state word
    /// again (`Pos::known`), so without it a reader of a reused segment
    /// would report pending forever instead of lost.
    fn pending_or_lost(&self, pool: &Pool, cursor: &mut Cursor, pos: Pos) -> Read {
        fence(Ordering::Acquire);
        if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
            return self.gone(cursor);
        }
        cursor.at = Some(pos);
        Read::Pending
    }

    /// The segment holding the cursor's frame was released (or the window
    /// closed) under the reader: that frame is lost to it.
    fn gone(&self, cursor: &mut Cursor) -> Read {
        cursor.at = None;
        if self.head.load(Ordering::Acquire) == CLOSED {
            Read::Ended
        } else {
            Read::Lagged {
                missing: cursor.seq,
            }
        }
    }

    /// The segment under the cursor was released (or the window closed)
    /// before the reader learnt that its frame is there. That loses the
    /// frame only if it was in that segment: a reader that had read all of
    /// it and waited at its end — the usual place of a reader that keeps
    /// up — wants the first frame of the successor, which the window may
    /// well still hold. So the cursor is placed again by its sequence
    /// number: `None` means it was, and the caller reads on; otherwise the
    /// answer (lagged only if the window no longer holds that sequence
    /// number).
    fn lost(&self, pool: &Pool, owner: Owner, cursor: &mut Cursor) -> Option<Read> {
        cursor.at = None;
        // Most often the frame was in the released segment, and the oldest
        // one held starts after it: no need to walk.
        if let Some(oldest) = SegRef::unpack(self.oldest.load(Ordering::Acquire)) {
            if let Some(h) = read_header(pool, oldest) {
                if is_owner(&h, owner) && cursor.seq < h.first_seq {
                    return Some(Read::Lagged {
                        missing: cursor.seq,
                    });
                }
            }
        }
        match self.locate(pool, owner, cursor.seq) {
            Locate::At(pos) => {
                cursor.at = Some(pos);
                None
            }
            Locate::NotYet => Some(Read::Pending),
            Locate::Gone => Some(Read::Lagged {
                missing: cursor.seq,
            }),
            Locate::Ended => Some(Read::Ended),
        }
    }

    /// Finds the segment holding `seq` (or where `seq` will be appended):
    /// the head if `seq` is in it, else by walking the chain from whichever
    /// end is nearer in sequence numbers (back from the head along the
    /// back links, or forward from the oldest along the seals' links).
    /// Each step reads one segment header.
    fn locate(&self, pool: &Pool, owner: Owner, seq: u64) -> Locate {
        let (head_word, found) = current_header(pool, &self.head);
        let Some((head, head_header)) = found else {
            return match head_word {
                CLOSED => Locate::Ended,
                0 => Locate::NotYet,
                _ => Locate::Gone,
            };
        };
        if !is_owner(&head_header, owner) {
            return Locate::Gone;
        }
        if seq >= head_header.first_seq {
            return Locate::At(Pos::at(head, &head_header, seq));
        }
        // A cursor older than the oldest segment is refused up front rather
        // than after walking the whole chain.
        if let Some(oldest) = SegRef::unpack(self.oldest.load(Ordering::Acquire)) {
            if let Some(h) = read_header(pool, oldest) {
                if is_owner(&h, owner) {
                    if seq < h.first_seq {
                        return Locate::Gone;
                    }
                    if seq - h.first_seq < head_header.first_seq - seq {
                        if let Some(found) = walk_forward(pool, owner, seq, oldest, h) {
                            return found;
                        }
                        // The chain moved under the walk: fall back to the
                        // walk from the head, which only ever meets
                        // segments released *before* `seq`'s.
                    }
                }
            }
        }
        // Each valid link leads to an older segment (a first sequence
        // number no higher), and a chain holds at most one segment per
        // pool unit, so a walk longer than that met a stale link.
        let mut above = head_header.first_seq;
        let mut link = head_header.prev;
        for _ in 0..=pool.shape().units {
            let Some(seg) = SegRef::unpack(link) else {
                return Locate::Gone;
            };
            let Some(header) = read_header(pool, seg) else {
                return Locate::Gone;
            };
            if !is_owner(&header, owner) || header.first_seq > above {
                return Locate::Gone;
            }
            if seq >= header.first_seq {
                return Locate::At(Pos::at(seg, &header, seq));
            }
            above = header.first_seq;
            link = header.prev;
        }
        Locate::Gone
    }
}

/// The segment a window word (its head or its oldest) names, with its
/// header: `(word, Some(..))`, or `(word, None)` when the word names none
/// (0, `CLOSED`) or the window no longer holds the segment.
///
/// A segment met released was overtaken, not lost: appends linked new
/// segments and retention released this one (the head and the oldest
/// word are swung before their segment is freed), and answering "gone"
/// or "nothing held" would tell a reader of a gap that is not there. So
/// the word is read again with an RMW that changes nothing — unlike a
/// load, it reads the latest value (a load may return the stale word
/// again under the memory model, as the loom model
/// `loom_a_batch_reader_racing_release_and_reuse_never_sees_the_new_owner`
/// showed) — and only the same word again means the window itself no
/// longer holds that segment. Rare: once per placement that races a
/// release, never on a placed reader's path.
fn current_header(pool: &Pool, word: &AtomicU64) -> (u64, Option<(SegRef, SegmentHeader)>) {
    let mut w = word.load(Ordering::Acquire);
    for _ in 0..=MAX_RELOCATIONS {
        let Some(seg) = SegRef::unpack(w) else {
            return (w, None);
        };
        if let Some(h) = read_header(pool, seg) {
            return (w, Some((seg, h)));
        }
        let again = word.fetch_add(0, Ordering::Acquire);
        if again == w {
            break;
        }
        w = again;
    }
    (w, None)
}

/// [`Window::locate`] from the oldest end: follows the seals' forward links
/// from `seg` (whose header `h` has `first_seq <= seq`) until the next
/// segment starts after `seq`.
///
/// `None` when a segment on the way was released (or a link did not hold)
/// before the walk reached `seq`'s segment. That says nothing about `seq`:
/// retention releases from the oldest end, so segments *behind* the walk
/// can go while `seq`'s is still held. Reporting it as gone would tell a
/// reader of a gap that is not there; the caller walks from the head
/// instead.
#[inline(always)]
pub(in crate::storage) fn walk_forward(
    pool: &Pool,
    owner: Owner,
    seq: u64,
    mut seg: SegRef,
    mut h: SegmentHeader,
) -> Option<Locate> {
    for _ in 0..=pool.shape().units {
        let next = match State::decode(pool.state(seg.unit).load(Ordering::Acquire), seg.stamp)? {
            // Not sealed: the chain ends here, and so does `seq`'s search.
            State::Open { count, .. } | State::Last { count, .. } => {
                return Some(Locate::At(Pos {
                    known: count,
                    ..Pos::at(seg, &h, seq)
                }));
            }
            State::Next { next, count } => {
                // Sealed with its count kept: a `seq` inside needs nothing
                // from the successor yet (a reader that reaches the end
                // loads it then, validated as any segment is).
                if let Some(count) = count.filter(|&c| seq - h.first_seq < u64::from(c)) {
                    return Some(Locate::At(Pos {
                        known: count,
                        sealed_count: count,
                        ..Pos::at(seg, &h, seq)
                    }));
                }
                next
            }
        };
        let n = SegRef {
            unit: next,
            stamp: pool.stamp_now(next, Ordering::Acquire),
        };
        let nh = read_header(pool, n)?;
        if !is_owner(&nh, owner) || nh.prev != seg.pack() || nh.first_seq < h.first_seq {
            return None;
        }
        if seq < nh.first_seq {
            // Sealed: its frames are exactly those before its successor's.
            let count = (nh.first_seq - h.first_seq) as u32;
            let mut pos = Pos {
                known: count,
                ..Pos::at(seg, &h, seq)
            };
            pos.sealed(count, n, &nh, owner);
            return Some(Locate::At(pos));
        }
        (seg, h) = (n, nh);
    }
    None
}

/// What [`Window::claimed`] found.
enum Claimed {
    /// The frame is claimed; `cursor.at` is the reader's position, claims
    /// up to date. `changed`: the position or its claims moved.
    At { changed: bool },
    /// No frame to read: this is the answer.
    Not(Read),
}

pub(in crate::storage) enum Locate {
    At(Pos),
    NotYet,
    Gone,
    Ended,
}

/// Times one read places its cursor again after the segment under it was
/// released (each time another release came between): past this it
/// reports a gap rather than chase a chain released faster than it reads.
const MAX_RELOCATIONS: u32 = 4;

/// When frame `seq`, which `pos` places in its segment, was appended, with
/// `cursor` placed right after it; `None` (and `cursor` untouched) if the
/// frame is not published or the segment was released meanwhile.
#[inline(always)]
fn frame_after(pool: &Pool, seq: u64, pos: Pos, cursor: &mut Cursor) -> Option<u64> {
    let segment = pool.segment(pos.seg.unit, pos.class);
    let index = (seq - pos.first_seq) as u32;
    let offset = frame_offset(segment, pos.seg.stamp, index, pos.offset)?;
    // Acquire pairs with the appender's Release of the mark.
    let len = mark_len(
        segment.get(offset as usize)?.load(Ordering::Acquire),
        pos.seg.stamp,
    )?;
    let end = offset as usize + FRAME_HEADER_WORDS + (len as usize).div_ceil(WORD_BYTES);
    if end > segment.len() - (index as usize + 1) {
        return None;
    }
    let ms = segment[offset as usize + 2].load(Ordering::Relaxed);
    // As in a read: a word from a later owner shows as a changed stamp.
    fence(Ordering::Acquire);
    if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
        return None;
    }
    // Frame `seq + 1` starts where frame `seq` ends. Below the claims
    // `pos` already knows of, a read takes it without loading the state;
    // past them (or past a sealed segment's last frame) the general read
    // loads the state or follows the seal.
    *cursor = Cursor {
        seq: seq + 1,
        at: Some(Pos {
            offset: end as u32,
            ..pos
        }),
    };
    Some(ms)
}

/// The word offset of frame `index`: `known` if the reader already knows
/// it, else from the table (`None` until the frame's writer stored it).
pub(super) fn frame_offset(
    segment: &[AtomicU64],
    stamp: u32,
    index: u32,
    known: u32,
) -> Option<u32> {
    if known != UNKNOWN {
        return Some(known);
    }
    let slot = segment.len().checked_sub(index as usize + 1)?;
    let offset = table_offset(segment[slot].load(Ordering::Acquire), stamp)?;
    ((offset as usize) < slot).then_some(offset)
}

/// The common case of [`Window::read`], kept small so it stays in
/// registers: the cursor is placed in a segment at a known offset, below
/// the claims it has already seen there, and the frame is published. Any
/// other case — offset or claims unknown, frame not published, stamp
/// changed — returns `None` and the caller takes the general path, which
/// re-checks from the state word (and reports a changed stamp as lost).
///
/// Per event: the mark load (Acquire), the meta and time loads, the copy,
/// `fence(Acquire)` and the stamp load. No RMW, no store to shared memory.
#[inline]
fn read_placed(
    pool: &Pool,
    cursor: &mut Cursor,
    stream: Option<u32>,
    buf: &mut Vec<u8>,
) -> Option<FrameMeta> {
    let Cursor { seq, at } = cursor;
    let pos = at.as_mut()?;
    let base = buf.len();
    let segment = pool.segment(pos.seg.unit, pos.class);
    loop {
        let index = (*seq - pos.first_seq) as u32;
        if pos.offset == UNKNOWN || index >= pos.known {
            return None;
        }
        let at = pos.offset as usize;
        // Acquire pairs with the appender's Release of the mark.
        let len = mark_len(segment.get(at)?.load(Ordering::Acquire), pos.seg.stamp)? as usize;
        let start = at + FRAME_HEADER_WORDS;
        let end = start + len.div_ceil(WORD_BYTES);
        if end > segment.len() - (index as usize + 1) {
            return None;
        }
        let frame_stream = (segment[at + 1].load(Ordering::Relaxed) >> 32) as u32;
        if frame_stream == RESERVED_STREAM {
            // A placeholder or a gap marker (recovery's): the general
            // path tells them apart.
            return None;
        }
        let appended_ms = segment[at + 2].load(Ordering::Relaxed);
        let wanted = stream.is_none_or(|s| s == frame_stream);
        if wanted {
            copy_out(&segment[start..end], len, buf);
        }
        // As in `Window::read`: a word from a later owner shows as a
        // changed stamp after this fence.
        fence(Ordering::Acquire);
        if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
            buf.truncate(base);
            return None;
        }
        let this = *seq;
        *seq += 1;
        pos.offset = end as u32;
        if wanted {
            return Some(FrameMeta {
                seq: this,
                stream: frame_stream,
                appended_ms,
                len,
            });
        }
    }
}

/// The run of [`Window::read_many`]: frames of the cursor's placed segment
/// below the claims already seen, while published and within the limits.
/// Returns whether it moved the cursor.
///
/// Per frame: the table entry load, the mark load (Acquire), the meta load
/// and the entry written. Per run: one copy of the words from the first
/// frame's payload to the end of the last wanted one (marks acquired
/// first, so every word copied was published), then `fence(Acquire)` and
/// one stamp load.
///
/// Each frame is found through its table entry rather than at the end of
/// the frame before it: the entries' addresses depend on the frame's index
/// alone, so the loads of successive frames overlap instead of each
/// waiting for the previous mark's length (that chain of dependent loads
/// bounded the loop). An entry of this allocation is only ever its frame's
/// offset (a later owner's words show as a changed stamp after the fence);
/// a frame that starts before the end of the one before stops the run.
fn run_placed(
    pool: &Pool,
    cursor: &mut Cursor,
    stream: u32,
    buf: &mut Vec<u8>,
    events: &mut Vec<(u64, u32, u32)>,
    max_events: usize,
    max_bytes: usize,
) -> bool {
    let Cursor { seq, at } = cursor;
    let Some(pos) = at.as_mut() else {
        return false;
    };
    if pos.offset == UNKNOWN {
        return false;
    }
    let segment = pool.segment(pos.seg.unit, pos.class);
    let stamp = pos.seg.stamp;
    let (buf_base, events_base) = (buf.len(), events.len());
    // The frames below the claims seen, at most as many as the limit
    // leaves room for; their entries are made room for once and written
    // in place, so the loop keeps its state in registers instead of
    // re-checking and storing the vector's length per frame. (A run that
    // passes frames of other streams may stop short of the limit; the
    // batch then runs again.)
    let claimed = (pos.first_seq + u64::from(pos.known)).saturating_sub(*seq);
    let frames =
        (claimed.min(usize::MAX as u64) as usize).min(max_events.saturating_sub(events_base));
    events.reserve(frames);
    let out = &mut events.spare_capacity_mut()[..frames];
    let mut at = pos.offset as usize;
    // Words [copy_from, copy_to) of the segment go to `buf` at `buf_base`:
    // from the first frame's payload to the end of the last wanted one
    // (frames of other streams in between are copied and passed over).
    // The payload of a frame at word `a` lands at `bias + a * WORD_BYTES`.
    let copy_from = at + FRAME_HEADER_WORDS;
    let mut copy_to = copy_from;
    let bias = buf_base.wrapping_sub(at * WORD_BYTES);
    // No frame starts at or past `copy_limit`: the byte limit, checked
    // before each frame, so a batch may end one frame past it.
    let max_words = max_bytes.saturating_sub(buf_base).div_ceil(WORD_BYTES);
    let copy_limit = copy_from.saturating_add(max_words);
    // Frame `next` must end by `frame_limit`, below its table entry (one
    // per frame, from the segment's end down).
    let first_index = (*seq - pos.first_seq) as usize;
    let mut frame_limit = segment.len().saturating_sub(first_index + 1);
    let mut next = *seq;
    let run_end = *seq + frames as u64;
    let mut wanted = 0;
    while next < run_end && at < copy_limit {
        // The frame's table entry is the word at `frame_limit`; one of
        // another allocation, or not written yet, stops the run.
        let Some(entry) = segment.get(frame_limit) else {
            break;
        };
        let Some(offset) = table_offset(entry.load(Ordering::Relaxed), stamp) else {
            break;
        };
        let offset = offset as usize;
        let Some(mark) = segment.get(offset) else {
            break;
        };
        // Acquire pairs with the appender's Release of the mark.
        let Some(len) = mark_len(mark.load(Ordering::Acquire), stamp) else {
            break;
        };
        let len = len as usize;
        let end = offset + FRAME_HEADER_WORDS + len.div_ceil(WORD_BYTES);
        if offset < at || end > frame_limit {
            break;
        }
        let frame_stream = (segment[offset + 1].load(Ordering::Relaxed) >> 32) as u32;
        if frame_stream == stream {
            let payload = bias.wrapping_add(offset * WORD_BYTES);
            out[wanted].write((next, payload as u32, (payload + len) as u32));
            wanted += 1;
            copy_to = end;
        } else if frame_stream == RESERVED_STREAM {
            // Possibly a gap marker: the general path reports it.
            break;
        }
        next += 1;
        at = end;
        frame_limit -= 1;
    }
    if next == *seq {
        return false;
    }
    // SAFETY: the loop initialised `out[..wanted]`, the `wanted` entries
    // after the vector's `events_base`, within the capacity `reserve` made.
    unsafe { events.set_len(events_base + wanted) };
    if copy_to > copy_from {
        copy_out(
            &segment[copy_from..copy_to],
            (copy_to - copy_from) * WORD_BYTES,
            buf,
        );
    }
    // As in `Window::read`, once for the run: a word from a later owner
    // shows as a changed stamp after this fence.
    fence(Ordering::Acquire);
    if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != stamp {
        buf.truncate(buf_base);
        events.truncate(events_base);
        return false;
    }
    *seq = next;
    pos.offset = at as u32;
    true
}

/// Whether `cursor` is placed just past the last claim its position has
/// seen (where [`run_placed`] would copy nothing). Reads the fields where
/// they are: the run has just stored one of them.
#[inline(always)]
fn at_seen_claims_end(cursor: &Cursor) -> bool {
    cursor
        .at
        .as_ref()
        .is_some_and(|p| cursor.seq >= p.first_seq + u64::from(p.known))
}

/// Appends `len` payload bytes out of `words` to `buf`, copied into its
/// spare capacity (no zeroing first; see [`load_words`]).
fn copy_out(words: &[AtomicU64], len: usize, buf: &mut Vec<u8>) {
    let bytes = words.len() * WORD_BYTES;
    debug_assert!(len <= bytes);
    let old = buf.len();
    buf.reserve(bytes);
    load_words(words, &mut buf.spare_capacity_mut()[..bytes]);
    // SAFETY: `load_words` initialised the first `bytes >= len` bytes of
    // the spare capacity, which `reserve` made at least that long, so the
    // first `old + len` bytes of the vector are initialised.
    unsafe { buf.set_len(old + len) };
}
