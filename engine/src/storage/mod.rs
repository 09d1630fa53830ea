//! Storage: one pool of segments per engine; each session's retained events
//! are a short chain of segments in it.
//!
//! Memory follows data. The pool is one mapping of zero pages (anonymous,
//! from the OS rather than the allocator, so only touched pages are
//! committed; [`backing`]) whose size is the engine's global byte budget,
//! cut into buddy-aligned segments of a few size classes ([`pool`]). A
//! session holds nothing until its first append;
//! then its *window* ([`window`]) is a chain of segments, the newest (the
//! *head*) taking appends, the oldest released once the newer ones hold the
//! session's retention. Events are written back to back into the head
//! segment, so a replay copies long runs of contiguous words. Segments are
//! addressed by unit index and word offset, never by pointer, and every
//! header is `Pod`: the same bytes can live in a memory-mapped file
//! ([`backing`]; `crate::durable` opens the file, [`recover`] rebuilds the
//! windows from it after a restart). [`layout`] draws the words.
//!
//! # Append (any number of writers per session)
//!
//! 1. Load the session's `head` (Acquire) and the head segment's *state*
//!    word, which packs `gen | count | used` (frames and frame bytes
//!    claimed, and generation bits of the segment's stamp).
//! 2. If the frame fits, CAS the state to `count + 1, used + frame` — the
//!    claim; the frame's sequence number is `first_seq + count` and its
//!    place is `header + used`. Write the table entry, meta, time and
//!    payload words (`Relaxed`), then the *mark* `gen32 << 32 | len`
//!    (`Release`): the completion mark that publishes the frame.
//! 3. If it does not fit, allocate the next segment (one class larger, up
//!    to the growth limit, or up to the roomy limit while the growth limit
//!    holds fewer than four such events; larger still if the event needs
//!    it: `Retention::next_class`), initialise
//!    its header with `first_seq = first_seq + count` and a back link, and
//!    CAS the old head's state from that exact `count` to *sealed → next*
//!    (`AcqRel`). The winner swings the session's `head` to the successor
//!    (CAS; any appender that sees a sealed head helps, as in a
//!    Michael–Scott queue) and then applies retention. A loser keeps its
//!    fresh segment as a spare for its next try. Before it allocates, an
//!    appender applies retention too, and waits if the window is twice
//!    over it behind an unfinished frame ("Release and retention" below).
//!
//! A session's first segment is installed by CAS on `oldest` (the winner
//! then publishes `head`; other appenders wait for it with backoff). That
//! and the bound just named are the two places an appender waits for
//! another.
//!
//! Cost of an append into a segment with room, uncontended: three loads,
//! one CAS (the only locked RMW), the frame's stores and one `Release`
//! store. No fence. (The engine adds its wake-up check: a plain load of
//! the session's waiter count, `Session::wake_after_claim`. The claim CAS,
//! `Acquire`, is what makes a plain load enough: a parking reader announces
//! itself with an RMW on the word claims are CASed on, `Window::announce`,
//! and a reader that then finds a frame claimed but not yet published
//! waits for it instead of parking. Loom model
//! `loom_a_shared_append_wakes_a_reader_that_announced_itself`.) Opening
//! the next segment adds
//! the allocation, the seal and head CASes, and the zeroing of the new
//! segment (below, "Reuse is detected"): about one more word written per
//! word appended (one `rep stosb` per segment on x86-64,
//! `words::zero_words`). A pool that recovery may read (a data
//! directory's) also gives each new segment header its CRC-32 check; a
//! heap pool, never recovered, does not (`Pool::header_checks`).
//!
//! The allocation is usually no trip through the free lists: retention
//! runs first, and when the segment it releases is of the class the next
//! head needs (a session past its first segments, at its retention), that
//! segment is stamped free and allocated again to the appender
//! (`Pool::reuse`: two stamp stores, no RMW) and becomes the next head. A
//! session's steady state is then a ring of its own segments, which stay
//! in the cache of the core that writes it; through the lists, a
//! segment freed on one core is as likely to be handed to a session
//! written on another, each of whose lines then moves between the cores
//! as it is written (on an Intel Xeon, two single writers on one pool
//! took 2.7× the time of two on pools of their own: BENCHMARKS.md, run
//! AT).
//!
//! The frame's stores: its table entry, meta and time words, the payload,
//! and the mark. The payload's whole words go two at a time (16-byte
//! stores on x86-64, `words::store_words`), its last partial word as one
//! zero-padded word: a 100-byte event is 7 payload stores, 11 in all.
//!
//! # Append by a single writer
//!
//! A session opened for one writer (`Engine::open_single_writer`) has a
//! window marked *single*; only its writer appends (`Window::append_single`;
//! shared appends are refused until the writer is gone). The writer keeps
//! its own copy of the head segment's place, claims and first sequence
//! number, so an append into a head with room is: one `Relaxed` load of
//! `head` (to see a close), the frame's stores and its mark, and then the
//! state word *stored* with the new claims (`Release`: a reader that loads
//! the claim sees the whole frame). No RMW, no fence. Because the writer
//! claims a frame only once it is written, no reader ever loads a word of
//! a single writer's segment that the writer has not stored, so its
//! segments are not zeroed when prepared (below, "Reuse is detected"); a
//! writer that hands the session back to shared appends zeroes what is
//! left of its head first. Loom model
//! `loom_a_reader_racing_a_single_writer_never_reads_an_earlier_owners_words`.
//! A full head costs the allocation (usually the reuse of the segment
//! retention releases, as above), the seal (a `Release` store: nobody
//! else writes a live writer's head state) and a CAS of `head`, which
//! fails only if a close came first.
//!
//! Plain stores into the head are safe because a close never frees a live
//! writer's head: it frees the chain up to the head it swapped out, then
//! sets `CLOSE_DONE` in the window's `single` word (`AcqRel` RMW); the
//! writer, once it sees the close (its next append) or is dropped, sets
//! `WRITER_DONE` the same way; whichever comes second frees the head (and
//! a successor the writer linked while the close ran). Loom model
//! `loom_a_single_writer_racing_a_close_never_writes_into_a_segment_given_away`.
//! A writer that is dropped before any close hands the session back to
//! shared appends (its `Release` RMW, their `Acquire` load of `single`).
//!
//! A single writer claims nothing, so the engine's wake-up check after its
//! append is an `AcqRel` RMW of the session's waiter count that leaves it
//! unchanged (`Session::wake`; loom model `loom_wake_ups_are_never_lost`):
//! a single-writer append costs one RMW, a shared one one (its claim).
//!
//! # Read (any number of readers, never waiting, never writing)
//!
//! A cursor is `(segment, stamp, index, offset)`. Reading frame `index`:
//! load the state (Acquire) to learn how many frames are claimed (or, once
//! sealed, the final count from the successor's `first_seq`); load the
//! frame's mark (Acquire) — a mark of another generation, or none, means
//! the writer has not finished (`Pending`) — unless the stamp has changed
//! meanwhile: a reader that saw the frame claimed does not load the state
//! again, so the stamp is what tells it the segment was reused (`Lagged`,
//! never a `Pending` no append will end); copy meta, time and payload
//! words (`Relaxed`); `fence(Acquire)`; the segment's stamp must still be
//! the cursor's, else the segment was released under the reader and the
//! bytes may belong to a later owner: `Lagged`, and the copy is
//! discarded. A segment released before the reader learnt that its frame
//! is there (its state word is no longer this allocation's) loses the
//! frame only if the frame was in it: a reader that had read all of it and
//! waited at its end wants the successor's first frame, which may still be
//! held. So that reader places its cursor again by sequence number and
//! reads on if the window still holds it (at most a few times per read,
//! should releases keep overtaking it); only then is it `Lagged`.
//! Placing a cursor starts at the head (and the oldest segment), and a
//! head or oldest segment met released was overtaken by appends, not
//! lost: the placement reads the word again — with an RMW that changes
//! nothing, which reads the latest value where a load may not — and goes
//! on from there; only the same word again means the window lost it.
//! Within one allocation nothing is ever overwritten, so a frame whose mark
//! was acquired and whose stamp held is exactly what its writer wrote. A
//! cursor is positioned from whichever end of the chain is nearer (back
//! from the head along the back links, or forward from the oldest along
//! the seals' links; chains are short), then `table[index]` gives the
//! frame's offset in O(1); a sequential reader just adds the frame's
//! length. A resume asks for the high-water mark, the oldest retained
//! number and the cursor's place at once (`Window::place`): one pass reads
//! the head's header and state and the oldest segment's header once each,
//! and leaves the reader after the cursor's frame with its offset and the
//! segment's claims known, so its first read needs no state load. A seal
//! keeps the sealed segment's final count in its state word (when below
//! 1,023 frames), so a cursor inside a sealed segment is placed from that
//! word alone, without its successor's header.
//!
//! Cost of a read, no RMW and no store to shared memory in any case: a
//! placed reader loads the segment's state word only when it passes the
//! claims it saw at its last load (a reader of a busy session does not
//! keep pulling the line every appender writes); per frame one `Acquire`
//! mark load, the meta and time loads and the payload copy; then
//! `fence(Acquire)` and the stamp load — once per frame for a single read
//! (`Replay::next_into`), once per run of frames in one segment for a
//! batch (`Replay::next_batch`), which acquires the run's marks first and
//! then copies the whole run, headers included, in one copy, and takes it
//! back whole if the stamp changed. A batch finds each frame through its
//! table entry (one more plain load per frame), so the loads of
//! successive frames do not wait on each other's lengths. A reader reads
//! each successor's header once: the state load that finds a segment
//! sealed reads it (for the segment's final count, when the seal did not
//! keep it; else when the reader reaches the segment's end), and the
//! reader keeps where it is and moves on to it at the segment's end with
//! no further load (a successor released in between shows as a changed stamp at its
//! first read, as any released segment does; unit test
//! `a_successor_released_after_the_reader_found_it_is_reported_lost`).
//! Loom models of the batch path:
//! `loom_a_batch_reader_across_segment_boundaries_reads_every_event` and
//! `loom_a_batch_reader_racing_release_and_reuse_never_sees_the_new_owner`.
//! A read that finds nothing published adds one `fence(Acquire)` and stamp
//! load before it answers `Pending`.
//! Copies of 256 bytes or more are one `rep movsb` on x86-64
//! (`crate::words::load_words`).
//!
//! Every segment header names its owner session (tag and epoch); a reader
//! refuses a segment whose header names another, so a reader of session A
//! can never be walked into B's bytes, whatever the links say
//! (invariant 2 holds by construction, not by a policy).
//!
//! # Reuse is detected, not prevented
//!
//! Each unit has a *stamp* outside the data area: odd and new on every
//! allocation, even on release, bumped by two when a merge retires it.
//! Every change is followed by `fence(Release)` before the memory is handed
//! on (Boehm's seqlock reader pattern: "Can seqlocks get along with
//! programming language memory models?", 2012). A reader that loaded any
//! word written by a later owner and then fenced (Acquire) observes the new
//! stamp. Stamps also grow across the segments that cover a unit's
//! memory in turn (split and merged; the pool docs, "Stamps"), so a mark
//! or table entry an earlier owner left never carries the stamp of the
//! segment that now holds it.
//!
//! That is not enough on its own: a reader that finds a frame claimed
//! loads its mark (and its table entry) before the writer may have stored
//! them, and an earlier owner's *other* words have the same shape — a meta
//! word is `stream << 32 | check`, payload is any bytes — so one could
//! read as a mark of the current stamp (seen: a stale meta word of stream
//! 3 read as an empty frame of a segment stamped 3, after which the
//! reader's offsets were wrong and its stream stalled). So a shared
//! window's segment has its words after the header zeroed when it is
//! prepared, before it is linked (published with its header; one `Relaxed`
//! store per word, about as much as writing the segment's frames once
//! more). Zero is no mark and no entry (owned stamps are odd), and each
//! word is then written only by the one writer whose frame or table entry
//! it is: a reader loads zero or that writer's word. A single writer's
//! segment needs none of it (it claims after it writes, above). Recovery
//! zeroes a restored head after its valid frames the same way.
//!
//! State words carry 21 bits of the stamp and marks and table
//! entries 32, and every state change of a shared window is a CAS, so an
//! appender that slept through a release and reuse fails its CAS instead
//! of writing into the new owner's segment (a single writer's head is
//! never released under it, above). A segment is released only when it is sealed and
//! every frame its count announces carries its mark: no writer can still be
//! copying into it.
//!
//! # Release and retention
//!
//! The oldest segment is released when the segments after it still hold
//! the session's retention (`max_events` events or `max_bytes` bytes): a
//! session keeps *at least* its newest events up to those limits, and at
//! most one segment more. The release is a CAS of `oldest` to the
//! successor; its winner frees the segment. Closing a session swaps `head`
//! and `oldest` to `CLOSED`, seals the head as *last*, and frees the chain
//! (a segment with a frame still being written is handed back as
//! [`window::Deferred`] and freed later).
//!
//! A frame claimed but not yet marked keeps its segment — and so every
//! segment after it, since releases go oldest first — from being released.
//! Its writer is inside a copy that takes no lock, but the operating system
//! may deschedule it there for a whole time slice, and with several
//! writers per session the others go on appending meanwhile. So the window
//! may grow past its retention behind such a frame up to twice it; an
//! appender that would grow it further waits (`Backoff`, then yields) for
//! that writer instead. Without the bound one preempted writer let its
//! session fill the pool. A single-writer window finishes each frame before
//! it moves on and never waits here.
//!
//! A reader may *hold its place* ([`Window::hold`]): it claims one of the
//! window's few hold slots (one CAS) and stores its next sequence number
//! there after each read (one `Release` store, no RMW). A release that
//! would go past the retention first loads the slots (`Acquire`) and keeps
//! the oldest segment while a held reader has not read all of it and the
//! window is within `hold_bytes`. The check is a hint, not a lock: a slot
//! stored after the release loaded it does not stop the release, and that
//! reader lags as any reader would (the stamp check is what keeps it from
//! wrong bytes). A slot only moves forward while one reader owns it, so a
//! stale value is an older place, which keeps more, never less. The
//! pool's pressure path (`force`) ignores holds.
//!
//! Free segments keep their pages resident for the next allocation; the
//! engine's sweep gives back the pages of segments that stayed free from
//! one sweep to the next ([`Pool::trim`]; see [`pool`], "Giving memory
//! back"). To a reader still copying from such a segment the zeros the
//! kernel leaves are one more later owner's writes: the stamp, bumped when
//! the segment was released, already tells it so.
//!
//! # Orderings
//!
//! - `head`/`oldest` stores and CASes are `Release` (or `AcqRel`), loads
//!   `Acquire`: a segment's header and state are written before it is
//!   linked, so whoever finds it through a link sees them.
//! - The claim CAS is `Relaxed`: it only has to be unique; the frame is
//!   published by its mark.
//! - The mark store is `Release`, the reader's mark load `Acquire`.
//! - Stamp changes: `Relaxed` store + `fence(Release)`; the reader checks
//!   with `fence(Acquire)` + `Relaxed` load after its copies.
//! - No `SeqCst` in the storage protocol.
//!
//! # Limits
//!
//! A unit's stamp is compared on 32 bits: a cursor held across 2^31
//! reuses of its segment could be fooled; a state CAS needs 2^20 reuses of
//! one unit within one appender's preemption. Segments hold at most 65,535
//! frames and 64 MiB; the pool at most 2^32 - 1 units.

pub(crate) mod backing;
pub(crate) mod freelist;
pub(crate) mod layout;
pub(crate) mod pool;
#[cfg(not(loom))]
pub(crate) mod recover;
pub(crate) mod window;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod recover_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub(crate) use layout::FrameCheck;
pub(crate) use pool::{Pool, PoolShape, TRIM_PER_PASS};
pub(crate) use window::{
    AppendFailure, Cursor, Deferred, Owner, Read, Retention, SingleWriter, Window, ROOMY_FRAMES,
};

/// The default unit: 512-byte segments are the smallest class.
pub(crate) const UNIT_WORDS: usize = 64;
