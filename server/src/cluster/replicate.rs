//! The owner's copy of its sessions' events into Redis.
//!
//! An append only marks its session as having something to copy (one
//! atomic swap; the session is queued once however many appends follow).
//! One task per node drains the queue: for each queued session it reads
//! every event after the last one it copied — with one reader over all the
//! session's streams, so in sequence order whatever thread appended them —
//! and writes them, with the control entries that fall between them, as
//! one `MULTI`/`EXEC` per round for all the sessions of the round. A round
//! that fails is retried as it is until Redis answers (an `EXEC` that
//! reached Redis before the connection broke is recognised on the retry:
//! Redis refuses the entry ids it already has), so nothing is written twice
//! or out of order. Events the engine released before they could be
//! copied (Redis unreachable for longer than the session retains) leave a
//! jump in the sequence numbers, which readers report as a `gap`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewind_engine::{ReplayError, SessionHandle};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{keys, ms, Cluster};

/// Queued sessions, each at most once.
pub(crate) type Sender = mpsc::UnboundedSender<Arc<SessionReplica>>;
pub(crate) type Receiver = mpsc::UnboundedReceiver<Arc<SessionReplica>>;

pub(crate) fn channel() -> (Sender, Receiver) {
    mpsc::unbounded_channel()
}

/// Events one session contributes to one round at most (more waits for the
/// next round, so one busy session does not starve the others).
const ROUND_EVENTS: usize = 512;
const ROUND_BYTES: usize = 1 << 20;
/// Sessions one round serves at most.
const ROUND_SESSIONS: usize = 256;

/// The first control-entry number an adopting node uses after the last
/// event the dead owner copied (whose own control entries after that event
/// are numbered from 1).
const ADOPTED_CONTROLS: u64 = 1 << 32;

/// What besides events goes into a session's Redis Stream or record.
#[derive(Debug)]
pub(crate) enum Control {
    /// Request stream `0` closed: its answers are all in.
    Close(u32),
    /// The session's `initialize` parameters (the record's `init` field).
    Init(Vec<u8>),
    /// The session ended.
    End,
}

/// A session's replication state, kept by its MCP session.
#[derive(Debug)]
pub(crate) struct SessionReplica {
    handle: SessionHandle,
    queued: AtomicBool,
    tx: Sender,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Sequence number of the last event copied.
    copied: u64,
    /// Controls waiting for the event they follow to be copied:
    /// (that event's sequence number, control).
    controls: VecDeque<(u64, Control)>,
    /// The id of the last control entry written: (seq, k).
    last_control: (u64, u64),
    /// The end is written: nothing more to do.
    done: bool,
}

impl SessionReplica {
    pub(crate) fn new(handle: &SessionHandle, tx: Sender) -> Arc<SessionReplica> {
        Arc::new(SessionReplica {
            handle: handle.clone(),
            queued: AtomicBool::new(false),
            tx,
            state: Mutex::new(State {
                // An adopted session's events before its window are in
                // Redis already, and so may be control entries after the
                // last of them: this node's come after any of those.
                copied: handle.high_water(),
                last_control: (handle.high_water(), ADOPTED_CONTROLS),
                ..State::default()
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Something was appended (or a control added): queue the session for
    /// the next round unless it is queued already.
    pub(crate) fn kick(self: &Arc<Self>) {
        // AcqRel: the replicator clears the flag before it reads, so either
        // it sees this append or this swap sees the flag cleared and queues
        // the session again.
        if !self.queued.swap(true, Ordering::AcqRel) {
            let _ = self.tx.send(self.clone());
        }
    }

    /// Adds a control entry after event `after_seq`.
    pub(crate) fn control(self: &Arc<Self>, after_seq: u64, c: Control) {
        self.lock().controls.push_back((after_seq, c));
        self.kick();
    }
}

/// The replicator task.
pub(crate) async fn run(cluster: Cluster, mut rx: Receiver, shutdown: CancellationToken) {
    let maxlen = cluster.inner.options.session_events.max(16) * 2;
    let ttl = ms(cluster.record_ttl());
    let mut buf = Vec::new();
    loop {
        let first = tokio::select! {
            s = rx.recv() => match s { Some(s) => s, None => break },
            _ = shutdown.cancelled() => break,
        };
        let mut round = vec![first];
        while round.len() < ROUND_SESSIONS {
            match rx.try_recv() {
                Ok(s) => round.push(s),
                Err(_) => break,
            }
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut events = 0u64;
        let mut again = Vec::new();
        for s in &round {
            s.queued.store(false, Ordering::Release);
            // Pairs with `kick`'s swap (see there).
            std::sync::atomic::fence(Ordering::SeqCst);
            let (n, more) = collect(s, &mut pipe, &mut buf, maxlen, ttl);
            events += n;
            if more {
                again.push(s.clone());
            }
        }
        if pipe.cmd_iter().next().is_none() {
            continue;
        }
        let mut backoff = Duration::from_millis(100);
        let mut retry = false;
        loop {
            match cluster.query_pipe::<()>(&pipe).await {
                Ok(()) => break,
                Err(e) if retry && e.to_string().contains("equal or smaller") => {
                    // The failed attempt reached Redis before the
                    // connection broke (a transaction: all of it did).
                    break;
                }
                Err(e) if !super::is_connection_error(&e) => {
                    // Redis refused the round itself: retrying cannot help.
                    cluster.inner.metrics.cluster.replication_error();
                    tracing::error!(error = %e, "cluster: Redis refused a replication round; its events are not in Redis");
                    break;
                }
                Err(e) => {
                    cluster.inner.metrics.cluster.replication_error();
                    tracing::debug!(error = %e, "cluster: replication round failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    retry = true;
                }
            }
        }
        cluster.inner.metrics.cluster.replicated(events);
        for s in again {
            s.kick();
        }
    }
}

/// Adds session `s`'s pending events and controls to `pipe`. Returns how
/// many events, and whether more are ready than one round takes.
fn collect(
    s: &SessionReplica,
    pipe: &mut redis::Pipeline,
    buf: &mut Vec<u8>,
    maxlen: u64,
    ttl: u64,
) -> (u64, bool) {
    let mut st = s.lock();
    if st.done {
        return (0, false);
    }
    let id = s.handle.id();
    let epoch = s.handle.epoch();
    let key = keys::events(id, epoch);
    let record = keys::record(id);
    let mut reader = s.handle.subscribe_all(st.copied);
    let mut n = 0u64;
    let mut bytes = 0usize;
    let mut ended = false;
    let mut more = false;
    loop {
        if n as usize >= ROUND_EVENTS || bytes >= ROUND_BYTES {
            more = true;
            break;
        }
        match reader.next_into(buf) {
            Ok(Some(ev)) => {
                flush_controls(&mut st, ev.seq - 1, &key, &record, pipe);
                pipe.cmd("XADD")
                    .arg(&key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(maxlen)
                    .arg(format!("{}-0", ev.seq))
                    .arg("i")
                    .arg(ev.to_string())
                    .arg("d")
                    .arg(buf.as_slice())
                    .ignore();
                st.copied = ev.seq;
                n += 1;
                bytes += buf.len();
            }
            Ok(None) => break,
            Err(ReplayError::Lagged { .. }) => {
                // Released before it was copied: readers see the jump.
                let next = reader.skip_gap();
                st.copied = next.saturating_sub(1).max(st.copied);
            }
            Err(_) => {
                ended = true;
                break;
            }
        }
    }
    let copied = st.copied;
    flush_controls(&mut st, copied, &key, &record, pipe);
    let end_queued = st.controls.iter().any(|(_, c)| matches!(c, Control::End));
    if ended || end_queued && !more {
        // Everything readable is copied: the end goes after it.
        let at = next_control_id(&mut st, copied);
        pipe.cmd("XADD")
            .arg(&key)
            .arg(at)
            .arg("c")
            .arg("end")
            .ignore();
        pipe.cmd("DEL").arg(&record).ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(60_000).ignore();
        st.controls.clear();
        st.done = true;
    } else if n > 0 {
        pipe.cmd("PEXPIRE").arg(&key).arg(ttl).ignore();
        pipe.cmd("PEXPIRE").arg(&record).arg(ttl).ignore();
    }
    (n, more)
}

/// The id of the next control entry after event `seq`.
fn next_control_id(st: &mut State, seq: u64) -> String {
    let seq = seq.max(st.copied).max(st.last_control.0);
    let k = if st.last_control.0 == seq {
        st.last_control.1 + 1
    } else {
        1
    };
    st.last_control = (seq, k);
    format!("{seq}-{k}")
}

/// Writes the controls that follow events up to `upto` (copied already).
fn flush_controls(st: &mut State, upto: u64, key: &str, record: &str, pipe: &mut redis::Pipeline) {
    while st
        .controls
        .front()
        .is_some_and(|(after, c)| *after <= upto && !matches!(c, Control::End))
    {
        let Some((after, c)) = st.controls.pop_front() else {
            break;
        };
        match c {
            Control::Close(stream) => {
                let at = next_control_id(st, after);
                pipe.cmd("XADD")
                    .arg(key)
                    .arg(at)
                    .arg("c")
                    .arg("close")
                    .arg("s")
                    .arg(stream)
                    .ignore();
            }
            Control::Init(blob) => {
                pipe.cmd("HSET").arg(record).arg("init").arg(blob).ignore();
            }
            Control::End => {}
        }
    }
}
