//! The write side of a window: appends (shared and single-writer), new
//! segments, retention and close.

use super::*;

impl Window {
    /// Appends one frame; returns its sequence number.
    ///
    /// Any number of threads may append at once. Takes no lock; waits only
    /// for another appender that is installing the session's first segment.
    #[allow(
        clippy::too_many_arguments,
        reason = "one hot call; a struct would be built and torn down per event"
    )]
    pub(crate) fn append(
        &self,
        pool: &Pool,
        owner: Owner,
        keep: &Retention,
        stream: u32,
        now_ms: u64,
        payload: &[u8],
        check: u32,
    ) -> Result<u64, AppendFailure> {
        let frame_bytes = frame_words(payload.len()) * WORD_BYTES;
        let Some(need_class) = fit_class(pool, frame_bytes) else {
            return Err(AppendFailure::TooLarge {
                max: max_payload(pool),
            });
        };
        let mut spare: Option<(SegRef, u8)> = None;
        let spin = Spin::new();
        // Whether this append has waited for a stalled writer (counted once).
        let mut stalled = false;
        let result = loop {
            let head_word = self.head.load(Ordering::Acquire);
            let Some(head) = SegRef::unpack(head_word) else {
                if head_word == CLOSED {
                    break Err(AppendFailure::Ended);
                }
                let class = need_class.max(keep.first_class);
                match self.install_first(
                    pool,
                    owner,
                    class,
                    need_class,
                    1,
                    now_ms,
                    &mut spare,
                    Writers::Many,
                ) {
                    Ok(_) => continue,
                    Err(e) => break Err(e),
                }
            };
            let words = pool.segment(head.unit, 0);
            let class = words[INFO].load(Ordering::Relaxed) as u8;
            if !pool.valid(head.unit, class) {
                // A head word we read just before the head moved on.
                spin.snooze();
                continue;
            }
            let state_word = pool.state(head.unit).load(Ordering::Acquire);
            match State::decode(state_word, head.stamp) {
                None => spin.snooze(),
                Some(State::Last { .. }) => break Err(AppendFailure::Ended),
                Some(State::Next { next, .. }) => self.swing(pool, head_word, next),
                Some(State::Open { count, used }) => {
                    let seg_words = pool.shape().class_words(class);
                    if fits(seg_words, count, used, frame_bytes) {
                        let claimed = State::Open {
                            count: count + 1,
                            used: used + frame_bytes as u32,
                        }
                        .encode(head.stamp);
                        // The frame is published by its mark (Release), and
                        // the words read below were published with the head
                        // (Acquire). Acquire on the claim is for the wake-up
                        // check: it synchronises with a parking reader's
                        // announcement on this word (`announce`), so the
                        // plain load of the waiter count after the append
                        // sees that reader. On x86 the CAS is the same
                        // instruction either way.
                        if pool
                            .state(head.unit)
                            .compare_exchange(
                                state_word,
                                claimed,
                                Ordering::Acquire,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            let segment = pool.segment(head.unit, class);
                            let first_seq = segment[FIRST_SEQ].load(Ordering::Relaxed);
                            let offset = (HEADER_WORDS + used as usize / WORD_BYTES) as u32;
                            write_frame(
                                segment, head.stamp, count, offset, stream, check, now_ms, payload,
                            );
                            break Ok(first_seq + u64::from(count));
                        }
                        spin.snooze();
                        continue;
                    }
                    let wanted = need_class.max(keep.next_class(pool, class, frame_bytes));
                    let first_seq = words[FIRST_SEQ].load(Ordering::Relaxed) + u64::from(count);
                    // The head may have been sealed, released and reused by
                    // another session since its state was loaded: then the
                    // word just read is that session's. The seal below would
                    // fail anyway, but a spare prepared with it would carry
                    // a foreign first sequence number until it is freed —
                    // and into recovery if the process died meanwhile.
                    fence(Ordering::Acquire);
                    if pool.stamp_now(head.unit, Ordering::Relaxed) != head.stamp {
                        spin.snooze();
                        continue;
                    }
                    // A writer preempted between its claim and its mark
                    // holds back the release of its segment and of every
                    // one after it. The others grow the window past its
                    // retention meanwhile, up to twice it; then they wait
                    // for that writer, which is inside a copy that takes no
                    // lock and ends as soon as it runs again.
                    // The segment this releases, if of the class wanted,
                    // becomes the spare the next head is made of (unless a
                    // lost seal left one already).
                    let released = self.release_oldest(
                        pool,
                        keep,
                        false,
                        false,
                        spare.is_none().then_some(wanted),
                    );
                    if let Some(seg) = released.reused {
                        spare = Some((seg, wanted));
                    }
                    if released.stalled {
                        if !stalled {
                            stalled = true;
                            pool.count_append_stall();
                        }
                        spin.snooze();
                        continue;
                    }
                    let Some((seg, next_class)) = take_spare(pool, &mut spare, wanted, need_class)
                    else {
                        // Retention runs on every install, but a writer
                        // still copying into the oldest segment holds it
                        // back; by now it may have finished.
                        if self.retain(pool, keep, false) > 0 {
                            continue;
                        }
                        break Err(AppendFailure::PoolFull { class: need_class });
                    };
                    init_segment(
                        pool,
                        seg,
                        next_class,
                        owner,
                        first_seq,
                        head,
                        now_ms,
                        Writers::Many,
                    );
                    let sealed = State::Next {
                        next: seg.unit,
                        count: Some(count),
                    }
                    .encode(head.stamp);
                    // Release: whoever follows `next` (an appender swinging
                    // the head, a reader) sees the successor's header.
                    match pool.state(head.unit).compare_exchange(
                        state_word,
                        sealed,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => {
                            self.held_units
                                .fetch_add(1 << next_class, Ordering::Relaxed);
                            self.swing(pool, head_word, seg.unit);
                            self.retain(pool, keep, false);
                        }
                        Err(_) => spare = Some((seg, next_class)),
                    }
                }
            }
        };
        if let Some((seg, class)) = spare {
            pool.free(seg, class);
        }
        result
    }

    /// Appends one frame as the window's single writer; returns its
    /// sequence number. Only the holder of `w` may append to this window
    /// (see [`new_single`](Self::new_single)).
    ///
    /// Into a head segment with room this is one `Relaxed` load of `head`
    /// (has a close taken the window?), the frame, and the state word
    /// stored after it instead of CASed before it (no other thread writes
    /// the head's state while the writer is live): no locked instruction,
    /// and no word of the segment zeroed beforehand. A new segment costs
    /// the head CAS that tells the writer whether a close came first.
    #[inline]
    #[allow(
        clippy::too_many_arguments,
        reason = "one hot call; a struct would be built and torn down per event"
    )]
    pub(crate) fn append_single(
        &self,
        pool: &Pool,
        owner: Owner,
        keep: &Retention,
        w: &mut SingleWriter,
        stream: u32,
        now_ms: u64,
        payload: &[u8],
        check: u32,
    ) -> Result<u64, AppendFailure> {
        let frame_bytes = frame_words(payload.len()) * WORD_BYTES;
        loop {
            if let Some(h) = w.head.as_mut() {
                // Relaxed: only this writer moves the head, and a close that
                // this load misses leaves the head segment to it (the frame
                // below is then written into memory nobody else holds).
                if self.head.load(Ordering::Relaxed) == h.seg.pack()
                    && fits(h.words as usize, h.count, h.used, frame_bytes)
                {
                    let (count, used) = (h.count, h.used);
                    let offset = (HEADER_WORDS + used as usize / WORD_BYTES) as u32;
                    // The frame first, then its claim: a reader loads the
                    // words of claimed frames only, so it never loads one
                    // before this writer stored it — which is why a
                    // single writer's segment needs no zeroing
                    // (`Writers::One`).
                    write_frame(
                        pool.segment(h.seg.unit, h.class),
                        h.seg.stamp,
                        count,
                        offset,
                        stream,
                        check,
                        now_ms,
                        payload,
                    );
                    h.count += 1;
                    h.used += frame_bytes as u32;
                    // Release: a reader that loads this claim (Acquire)
                    // sees the whole frame and its table entry.
                    pool.state(h.seg.unit).store(
                        State::Open {
                            count: h.count,
                            used: h.used,
                        }
                        .encode(h.seg.stamp),
                        Ordering::Release,
                    );
                    return Ok(h.first_seq + u64::from(count));
                }
            }
            self.make_room_single(pool, owner, keep, w, frame_bytes, now_ms)?;
        }
    }

    /// Gives the single writer a head segment with room for a frame of
    /// `frame_bytes` (installs the first segment, or links the next one),
    /// or says why it cannot: the window was closed, the frame is larger
    /// than any segment, the pool is full.
    #[cold]
    #[inline(never)]
    fn make_room_single(
        &self,
        pool: &Pool,
        owner: Owner,
        keep: &Retention,
        w: &mut SingleWriter,
        frame_bytes: usize,
        now_ms: u64,
    ) -> Result<(), AppendFailure> {
        debug_assert!(self.single.load(Ordering::Relaxed) & SINGLE != 0);
        if w.done {
            return Err(AppendFailure::Ended);
        }
        let Some(need_class) = fit_class(pool, frame_bytes) else {
            return Err(AppendFailure::TooLarge {
                max: max_payload(pool),
            });
        };
        let Some(h) = w.head.as_mut() else {
            let class = need_class.max(keep.first_class);
            let mut spare = None;
            let installed = self.install_first(
                pool,
                owner,
                class,
                need_class,
                1,
                now_ms,
                &mut spare,
                Writers::One,
            );
            // Prepared for a window that was closed first.
            if let Some((seg, class)) = spare {
                pool.free(seg, class);
            }
            return match installed {
                // Only this writer installs: the head is its segment (or a
                // close has taken the head since and left it the segment,
                // which the next append finds).
                Ok(Some((seg, class))) => {
                    w.head = Some(WriterHead::new(pool, seg, class, 1));
                    Ok(())
                }
                Ok(None) => unreachable!("a single-writer window has one installer"),
                // Closed first; the closer freed what was installed.
                Err(AppendFailure::Ended) => {
                    self.writer_done(pool, w);
                    Err(AppendFailure::Ended)
                }
                Err(e) => Err(e),
            };
        };
        if self.head.load(Ordering::Relaxed) != h.seg.pack() {
            self.writer_done(pool, w);
            return Err(AppendFailure::Ended);
        }
        let wanted = need_class.max(keep.next_class(pool, h.class, frame_bytes));
        let first_seq = h.first_seq + u64::from(h.count);
        // Retention first: the segment it releases, if of the class wanted,
        // becomes the next head without a trip through the pool's lists.
        let reused = self.release_oldest(pool, keep, false, true, Some(wanted));
        let (seg, class) = match reused.reused {
            Some(seg) => (seg, wanted),
            None => loop {
                if let Some(got) = take_spare(pool, &mut None, wanted, need_class) {
                    break got;
                }
                if self.release_oldest(pool, keep, false, true, None).units == 0 {
                    return Err(AppendFailure::PoolFull { class: need_class });
                }
            },
        };
        init_segment(
            pool,
            seg,
            class,
            owner,
            first_seq,
            h.seg,
            now_ms,
            Writers::One,
        );
        // A store, not a CAS: nobody else writes the head's state.
        // Release: whoever follows `next` sees the successor's header.
        pool.state(h.seg.unit).store(
            State::Next {
                next: seg.unit,
                count: Some(h.count),
            }
            .encode(h.seg.stamp),
            Ordering::Release,
        );
        self.held_units.fetch_add(1 << class, Ordering::Relaxed);
        // Release publishes the successor to readers; the CAS fails only
        // on a close, which left the old head to this writer — and with it
        // the successor just linked.
        match self.head.compare_exchange(
            h.seg.pack(),
            seg.pack(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                *h = WriterHead::new(pool, seg, class, first_seq);
                self.release_oldest(pool, keep, false, true, None);
                Ok(())
            }
            Err(_) => {
                self.writer_done(pool, w);
                Err(AppendFailure::Ended)
            }
        }
    }

    /// The single writer is gone for good (dropped, or it saw the window
    /// closed). Whichever of it and a close comes second frees the head
    /// segment the close left to the writer, with whatever the writer
    /// linked after it.
    pub(crate) fn writer_done(&self, pool: &Pool, w: &mut SingleWriter) {
        if std::mem::replace(&mut w.done, true) {
            return;
        }
        // Shared appenders may take over the head (`takes_shared_appends`):
        // they claim before they write, so the words after this writer's
        // frames must no longer hold what an earlier owner left there
        // (`Writers::Many`). The writer still owns them: nobody else writes
        // the head until the `fetch_or` below, and nobody frees it before.
        if let Some(h) = &w.head {
            if self.single.load(Ordering::Acquire) & CLOSE_DONE == 0 {
                let segment = pool.segment(h.seg.unit, h.class);
                let frames_end = HEADER_WORDS + h.used as usize / WORD_BYTES;
                let table_low = segment.len() - h.count as usize;
                zero_words(&segment[frames_end..table_low]);
            }
        }
        // AcqRel: Release hands the writer's stores (the zeroes above
        // among them) to the close or to shared appenders; Acquire, when
        // the close came first, its walk to the writer's free.
        let before = self.single.fetch_or(WRITER_DONE, Ordering::AcqRel);
        if before & CLOSE_DONE != 0 {
            if let Some(h) = w.head.take() {
                free_chain(pool, h.seg);
            }
        }
    }

    /// Installs the first segment of a window nothing was appended to
    /// yet, numbered so that the first append gets `after + 1`: the window
    /// of a session that continues elsewhere-numbered events (a cluster
    /// node adopting a session whose events up to `after` are held by the
    /// shared tier). Its high-water mark is `after` from now on, and
    /// nothing is retained before `after + 1`.
    pub(crate) fn start_after(
        &self,
        pool: &Pool,
        owner: Owner,
        class: u8,
        after: u64,
        now_ms: u64,
    ) -> Result<(), AppendFailure> {
        self.install_first(
            pool,
            owner,
            class,
            0,
            after + 1,
            now_ms,
            &mut None,
            Writers::Many,
        )
        .map(|_| ())
    }

    /// Installs the first segment of the window, numbered from `first_seq`.
    #[allow(
        clippy::too_many_arguments,
        reason = "the append path's state, passed through once per window"
    )]
    fn install_first(
        &self,
        pool: &Pool,
        owner: Owner,
        class: u8,
        least: u8,
        first_seq: u64,
        now_ms: u64,
        spare: &mut Option<(SegRef, u8)>,
        writers: Writers,
    ) -> Result<Option<(SegRef, u8)>, AppendFailure> {
        let (seg, class) = take_spare(pool, spare, class, least)
            .ok_or(AppendFailure::PoolFull { class: least })?;
        init_segment(pool, seg, class, owner, first_seq, NO_SEG, now_ms, writers);
        // The segment enters the chain with `oldest`; from then on whoever
        // takes it out of the chain (retention, close) frees it.
        match self
            .oldest
            .compare_exchange(0, seg.pack(), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.held_units.fetch_add(1 << class, Ordering::Relaxed);
                // Release pairs with appenders' and readers' Acquire head
                // loads: the header and state above are visible to them.
                // Acquire synchronises with a parking reader's announcement
                // on the empty head word (`announce`), for the wake-up
                // check of this append and of every appender that loads
                // this head.
                match self
                    .head
                    .compare_exchange(0, seg.pack(), Ordering::AcqRel, Ordering::Relaxed)
                {
                    Ok(_) => Ok(Some((seg, class))),
                    // Closed in between; the closer owns the segment now.
                    Err(_) => Err(AppendFailure::Ended),
                }
            }
            Err(now) => {
                *spare = Some((seg, class));
                if now == CLOSED {
                    return Err(AppendFailure::Ended);
                }
                // Another appender is installing: wait for its head.
                let spin = Spin::new();
                while self.head.load(Ordering::Acquire) == 0 {
                    spin.snooze();
                }
                Ok(None)
            }
        }
    }

    /// A parking reader's half of the shared appenders' wake-up check
    /// ([`Session::listen`](crate::session::Session::listen) has the whole
    /// protocol): an RMW that leaves unchanged the word the window's next
    /// shared claim is made on — the head segment's state word, or the
    /// head word itself before the first segment and after a close.
    ///
    /// Whatever the reader announced before this call, a shared appender
    /// whose claim (or first-segment install) comes after this RMW in that
    /// word's modification order sees: its CAS reads this RMW's value (or
    /// a later RMW's) and synchronises with it. An appender whose claim
    /// came first has its frame counted in the state the reader loads
    /// next. On a sealed head it waits for the head to move to the
    /// successor and announces there, so the RMW lands where claims are
    /// made. It never moves the head itself, as shared appenders do: a
    /// single writer seals with a store and then swings with a CAS whose
    /// failure means a close to it (loom model
    /// `loom_a_reader_announcing_itself_leaves_a_single_writers_head_alone`).
    ///
    /// Returns `false` when the head did not settle (its sealer was
    /// descheduled between the seal and the swing, or the head kept
    /// moving); the reader must then not park (it reads again instead).
    pub(crate) fn announce(&self, pool: &Pool) -> bool {
        let spin = Spin::new();
        for _ in 0..ANNOUNCE_TRIES {
            let head_word = self.head.fetch_or(0, Ordering::AcqRel);
            let Some(head) = SegRef::unpack(head_word) else {
                // No segment yet (the install CAS is made on this word) or
                // closed (the close wakes every reader).
                return true;
            };
            let state = pool.state(head.unit).fetch_or(0, Ordering::AcqRel);
            match State::decode(state, head.stamp) {
                Some(State::Open { .. } | State::Last { .. }) => return true,
                // Sealed, not swung yet; or the head moved on and its old
                // segment was reused.
                Some(State::Next { .. }) | None => spin.snooze(),
            }
        }
        false
    }

    /// Moves the head from `head_word` to its sealed successor `next` (any
    /// appender may do it; the first CAS wins).
    fn swing(&self, pool: &Pool, head_word: u64, next: u32) {
        // `next` cannot be released while the head still points before it:
        // releases start at the oldest segment, and a close moves the head
        // to CLOSED first. So its stamp is the one it was installed with.
        let stamp = pool.stamp_now(next, Ordering::Acquire);
        let to = SegRef { unit: next, stamp }.pack();
        let _ = self
            .head
            .compare_exchange(head_word, to, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Releases the oldest segments while what follows them still meets
    /// `keep` (or, with `force`, releases one oldest segment that is not the
    /// head whatever `keep` says). Returns the units released.
    pub(crate) fn retain(&self, pool: &Pool, keep: &Retention, force: bool) -> u32 {
        self.release_oldest(pool, keep, force, false, None).units
    }

    /// [`retain`](Self::retain), told by a live single writer that every
    /// frame before the head is published (it finished each before it
    /// moved on): no need to check the marks of the segment released.
    /// With `reuse`, an appender about to open a segment of that class: the
    /// first released segment of the class is not freed but allocated
    /// again to it ([`Released::reused`]), and the pass ends there.
    fn release_oldest(
        &self,
        pool: &Pool,
        keep: &Retention,
        force: bool,
        written: bool,
        reuse: Option<u8>,
    ) -> Released {
        let mut released = Released::default();
        loop {
            let oldest_word = self.oldest.load(Ordering::Acquire);
            let head_word = self.head.load(Ordering::Acquire);
            if oldest_word == head_word {
                return released;
            }
            let (Some(oldest), Some(_)) = (SegRef::unpack(oldest_word), SegRef::unpack(head_word))
            else {
                return released;
            };
            let Some(old) = read_header(pool, oldest) else {
                return released;
            };
            let Some(State::Next { next, .. }) = State::decode(
                pool.state(oldest.unit).load(Ordering::Acquire),
                oldest.stamp,
            ) else {
                return released;
            };
            let next_ref = SegRef {
                unit: next,
                stamp: pool.stamp_now(next, Ordering::Acquire),
            };
            let Some(following) = read_header(pool, next_ref) else {
                return released;
            };
            let count = following.first_seq.saturating_sub(old.first_seq);
            if count > u64::from(crate::storage::layout::MAX_COUNT) {
                return released;
            }
            let old_units = 1u32 << old.class();
            // What would be left after the release; the pressure path
            // (`force`) does not ask.
            let (events_after, bytes_after) = if force {
                (0, 0)
            } else {
                (
                    (self.high_water(pool) + 1).saturating_sub(following.first_seq),
                    u64::from(self.held_units().saturating_sub(old_units))
                        * pool.shape().unit_words as u64
                        * WORD_BYTES as u64,
                )
            };
            if !force {
                if events_after < keep.max_events && bytes_after < keep.max_bytes {
                    return released;
                }
                // A reader holding its place still has to read some of the
                // oldest segment: keep it while the window is within
                // `hold_bytes`.
                if keep.hold_bytes > 0
                    && u64::from(self.held_units())
                        * pool.shape().unit_words as u64
                        * WORD_BYTES as u64
                        <= keep.hold_bytes
                    && self.lowest_hold() < following.first_seq
                {
                    return released;
                }
            }
            if !written && !all_published(pool, oldest, old.class(), count as u32) {
                // A writer that claimed a frame there has not finished; the
                // next install tries again. Past twice the retention, the
                // appenders wait for it (see `Released::stalled`).
                released.stalled = !force
                    && (events_after >= keep.max_events.saturating_mul(2)
                        || bytes_after >= keep.max_bytes.saturating_mul(2));
                return released;
            }
            if self
                .oldest
                .compare_exchange(
                    oldest_word,
                    next_ref.pack(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.held_units.fetch_sub(old_units, Ordering::Relaxed);
                released.units += old_units;
                if reuse == Some(old.class()) {
                    released.reused = Some(pool.reuse(oldest));
                    return released;
                }
                pool.free(oldest, old.class());
                if force {
                    return released;
                }
            }
        }
    }

    /// Closes the window: no append succeeds afterwards, readers end, and
    /// every segment is freed — except those with a frame still being
    /// written, returned for [`Deferred::try_free`] later.
    ///
    /// A single-writer window whose writer is live is closed up to its
    /// head segment, which is left to the writer: it may be writing there
    /// without a CAS. Whichever of the close and the writer's
    /// [`writer_done`](Self::writer_done) comes second frees it.
    pub(crate) fn close(&self, pool: &Pool) -> Vec<Deferred> {
        let mut deferred = Vec::new();
        // Acquire: a writer done before this load made its last stores
        // visible (the close may then seal and free its head as usual).
        let single = self.single.load(Ordering::Acquire);
        let writer_live = single & SINGLE != 0 && single & WRITER_DONE == 0;
        let head = self.head.swap(CLOSED, Ordering::AcqRel);
        let left = SegRef::unpack(head).filter(|_| writer_live);
        let oldest = self.oldest.swap(CLOSED, Ordering::AcqRel);
        let mut next = SegRef::unpack(oldest);
        let spin = Spin::new();
        while let Some(seg) = next {
            if Some(seg) == left {
                break;
            }
            let Some(header) = read_header(pool, seg) else {
                break;
            };
            let class = header.class();
            let count = loop {
                let word = pool.state(seg.unit).load(Ordering::Acquire);
                match State::decode(word, seg.stamp) {
                    Some(State::Open { count, used }) => {
                        let last = State::Last { count, used }.encode(seg.stamp);
                        if pool
                            .state(seg.unit)
                            .compare_exchange(word, last, Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                        {
                            next = None;
                            break count;
                        }
                        spin.snooze();
                    }
                    Some(State::Last { count, .. }) => {
                        next = None;
                        break count;
                    }
                    Some(State::Next { next: n, .. }) => {
                        let n = SegRef {
                            unit: n,
                            stamp: pool.stamp_now(n, Ordering::Acquire),
                        };
                        let count = read_header(pool, n)
                            .map_or(0, |h| h.first_seq.saturating_sub(header.first_seq));
                        next = Some(n);
                        break count.min(u64::from(crate::storage::layout::MAX_COUNT)) as u32;
                    }
                    None => {
                        next = None;
                        break 0;
                    }
                }
            };
            let d = Deferred { seg, class, count };
            if !d.try_free(pool) {
                deferred.push(d);
            }
        }
        if let Some(left) = left {
            // AcqRel: pairs with the writer's `fetch_or` either way round.
            if self.single.fetch_or(CLOSE_DONE, Ordering::AcqRel) & WRITER_DONE != 0 {
                free_chain(pool, left);
            }
        }
        self.held_units.store(0, Ordering::Relaxed);
        deferred
    }
}

#[cfg(loom)]
loom::thread_local! {
    /// Under loom only: the owner and first sequence number of every
    /// segment this thread prepared, so a model can check that none was
    /// given another session's numbers (spares are freed unseen).
    pub(in crate::storage) static PREPARED: std::cell::RefCell<Vec<(Owner, u64)>> =
        std::cell::RefCell::new(Vec::new());
}

/// Who writes the frames of a segment being prepared: what
/// [`init_segment`] must zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::storage) enum Writers {
    /// Any number of appenders: each claims a frame first and writes it
    /// after, so a reader may load an unwritten mark or table entry.
    Many,
    /// One writer that stores each frame whole before it claims it
    /// ([`Window::append_single`]): no reader loads a word of a frame
    /// before it is written, so what an earlier owner left is never read.
    One,
}

/// Writes the header and an empty open state into a fresh allocation.
#[allow(
    clippy::too_many_arguments,
    reason = "the header's fields, once per segment"
)]
pub(in crate::storage) fn init_segment(
    pool: &Pool,
    seg: SegRef,
    class: u8,
    owner: Owner,
    first_seq: u64,
    prev: SegRef,
    now_ms: u64,
    writers: Writers,
) {
    let header = SegmentHeader {
        link: 0,
        owner_tag: owner.tag,
        owner_epoch: owner.epoch,
        first_seq,
        prev: if prev == NO_SEG { 0 } else { prev.pack() },
        info: u64::from(class),
        opened_ms: now_ms,
        check: 0,
    };
    // The check is for recovery; a heap pool is never recovered, and a
    // CRC per segment is a few percent of a single writer's append.
    let header = if pool.header_checks() {
        header.checked(seg.stamp)
    } else {
        header
    };
    #[cfg(loom)]
    PREPARED.with(|p| p.borrow_mut().push((owner, first_seq)));
    // Relaxed: published by the CAS that links the segment (Release).
    let segment = pool.segment(seg.unit, class);
    for (w, v) in segment[..HEADER_WORDS].iter().zip(header.to_words()) {
        w.store(v, Ordering::Relaxed);
    }
    // For many writers the rest is zeroed: a reader that finds a frame
    // claimed loads its mark (and, not knowing its offset, its table
    // entry) before the writer may have stored them, and what it loads
    // then must not pass for them. A word an earlier owner left there
    // could — a meta word `stream << 32 | check`, or any payload, has the
    // same shape as a mark `stamp << 32 | len` — and the stamp check after
    // the copy cannot see it, since the stamp has not changed. Zero is
    // never a mark or an entry (stamps of owned segments are odd). So every
    // word a reader can load is either zero or written by this
    // allocation's writers, each word by the one writer whose frame or
    // table entry it is. A single writer's segment is zeroed only if it is
    // handed to many writers ([`Window::writer_done`]).
    if writers == Writers::Many {
        zero_words(&segment[HEADER_WORDS..]);
    }
    pool.state(seg.unit).store(
        State::Open { count: 0, used: 0 }.encode(seg.stamp),
        Ordering::Relaxed,
    );
}

/// A spare segment of `class` if there is one, else a new allocation of
/// `class` — or, when the pool has none that large, of the largest smaller
/// class down to `least` (a fragmented pool makes the chain grow in smaller
/// steps, it does not refuse the append). Returns the segment and its
/// class.
fn take_spare(
    pool: &Pool,
    spare: &mut Option<(SegRef, u8)>,
    class: u8,
    least: u8,
) -> Option<(SegRef, u8)> {
    match spare.take() {
        Some((seg, c)) if c == class => return Some((seg, c)),
        Some((seg, c)) => pool.free(seg, c),
        None => {}
    }
    (least..=class)
        .rev()
        .find_map(|c| pool.alloc(c).map(|seg| (seg, c)))
}

/// The smallest class whose empty segment holds a frame of `frame_bytes`.
fn fit_class(pool: &Pool, frame_bytes: usize) -> Option<u8> {
    let shape = pool.shape();
    (0..=shape.top_class).find(|&c| fits(shape.class_words(c), 0, 0, frame_bytes))
}

/// The largest payload the largest class holds.
pub(crate) fn max_payload(pool: &Pool) -> usize {
    let shape = pool.shape();
    let words = shape.class_words(shape.top_class);
    let room = (words - HEADER_WORDS - FRAME_HEADER_WORDS - 1) * WORD_BYTES;
    room.min(crate::storage::layout::MAX_USED as usize - FRAME_HEADER_WORDS * WORD_BYTES)
}

/// Writes one frame — claimed already by a shared appender, about to be
/// claimed by a single writer — and publishes it with its mark.
#[allow(
    clippy::too_many_arguments,
    reason = "the frame's fields, passed once on the hot path"
)]
fn write_frame(
    segment: &[AtomicU64],
    stamp: u32,
    index: u32,
    offset: u32,
    stream: u32,
    check: u32,
    now_ms: u64,
    payload: &[u8],
) {
    let at = offset as usize;
    // Relaxed: all published by the mark's Release below.
    segment[segment.len() - 1 - index as usize]
        .store(table_entry(stamp, offset), Ordering::Relaxed);
    segment[at + 1].store(meta(stream, check), Ordering::Relaxed);
    segment[at + 2].store(now_ms, Ordering::Relaxed);
    let whole = payload.len() / WORD_BYTES;
    let body = &segment[at + FRAME_HEADER_WORDS..][..payload.len().div_ceil(WORD_BYTES)];
    let (words, rest) = payload.split_at(whole * WORD_BYTES);
    store_words(&body[..whole], words);
    if !rest.is_empty() {
        body[whole].store(tail_word(payload, rest), Ordering::Relaxed);
    }
    segment[at].store(mark(stamp, payload.len() as u32), Ordering::Release);
}

/// Frees `seg` and the segments linked after it: the head a close left
/// to a single writer, once both are done with it (every frame in it is
/// published: its writer finished).
fn free_chain(pool: &Pool, seg: SegRef) {
    let mut next = Some(seg);
    while let Some(seg) = next {
        let Some(header) = read_header(pool, seg) else {
            return;
        };
        next = match State::decode(pool.state(seg.unit).load(Ordering::Acquire), seg.stamp) {
            Some(State::Next { next, .. }) => Some(SegRef {
                unit: next,
                stamp: pool.stamp_now(next, Ordering::Acquire),
            }),
            _ => None,
        };
        pool.free(seg, header.class());
    }
}

/// Whether all `count` frames of `seg` are published.
pub(super) fn all_published(pool: &Pool, seg: SegRef, class: u8, count: u32) -> bool {
    let segment = pool.segment(seg.unit, class);
    (0..count).all(|i| {
        frame_offset(segment, seg.stamp, i, UNKNOWN).is_some_and(|o| {
            mark_len(segment[o as usize].load(Ordering::Acquire), seg.stamp).is_some()
        })
    })
}
