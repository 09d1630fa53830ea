//! The owner's copy of its sessions' events into Redis.
//!
//! An append only marks its session as having something to copy (one
//! atomic swap; the session is queued once however many appends follow).
//! One task per node drains the queue: for each queued session it reads
//! every event after the last one it copied — with one reader over all the
//! session's streams, so in sequence order whatever thread appended them —
//! and writes them, with the control entries that fall between them, with
//! one script per session ([`WRITE`]: atomic, and only while the session's
//! record names this node's boot), all the sessions of a round in one
//! pipeline. A round that fails is retried as it is until Redis answers
//! (entries Redis has already are skipped), so nothing is written twice or
//! out of order. The replicator holds each session's place after what it
//! copied ([`Hold`]), so retention keeps what is not copied yet, up to the
//! engine's `reader_hold_bytes`; events released before they could be
//! copied all the same (Redis unreachable for longer than that) leave a
//! jump in the sequence numbers, which readers report as a `gap`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewind_engine::{Hold, ReplayError, SessionHandle};
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
    /// The place after `copied`, held so that retention keeps what is not
    /// copied yet (up to the engine's `reader_hold_bytes`) while Redis is
    /// slower than the appends. `None` once done, or when the session's
    /// hold slots were all taken.
    hold: Option<Hold>,
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
                hold: handle.hold_after(handle.high_water()),
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

/// Writes one session's share of a round, if this node still owns it
/// (the record names this node's boot and the session's epoch): a node
/// that stalled past its heartbeat and whose sessions were taken over
/// meanwhile must not write into them. A session whose record is gone
/// (deleted by its `DELETE` before the answer, expired, or lost with
/// Redis's data) gets only its last events and its end entry, so readers
/// elsewhere end with it. Each event or control entry is added unless Redis has it
/// already (a round retried after a broken connection), so a retry writes
/// nothing twice. Returns 1, or 0 when this node no longer owns the
/// session.
///
/// KEYS: record, events. ARGV: boot, epoch, maxlen, ttl, then operations:
/// `e id i d t` (event: its entry id, event id, payload, and the wall
/// clock in Unix milliseconds when it was copied, which readers elsewhere
/// take as its age), `c id stream` (close), `x id` (end), `h blob`
/// (the record's `init`).
const WRITE: &str = r"
local ending = ARGV[#ARGV - 1] == 'x'
local boot = redis.call('HGET', KEYS[1], 'boot')
if boot then
  if boot ~= ARGV[1] or redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2] then return 0 end
elseif not ending then
  return 0
end
local i = 5
local ended = false
local function add(id, ...)
  local r = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], id, ...)
  if type(r) == 'table' and r.err and not string.find(r.err, 'equal or smaller', 1, true) then
    error(r.err)
  end
end
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'e' then add(ARGV[i+1], 'i', ARGV[i+2], 'd', ARGV[i+3], 't', ARGV[i+4]); i = i + 5
  elseif op == 'c' then add(ARGV[i+1], 'c', 'close', 's', ARGV[i+2]); i = i + 3
  elseif op == 'x' then add(ARGV[i+1], 'c', 'end'); ended = true; i = i + 2
  elseif op == 'h' then
    if boot then redis.call('HSET', KEYS[1], 'init', ARGV[i+1]) end
    i = i + 2
  else return redis.error_reply('unknown operation ' .. op) end
end
if ended then
  redis.call('DEL', KEYS[1])
  redis.call('PEXPIRE', KEYS[2], 60000)
else
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
";

/// The replicator task.
pub(crate) async fn run(cluster: Cluster, mut rx: Receiver, shutdown: CancellationToken) {
    let maxlen = cluster.inner.options.session_events.max(16) * 2;
    let ttl = ms(cluster.record_ttl());
    let boot = cluster.inner.boot.clone();
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
        let mut written = Vec::new();
        let mut events = 0u64;
        let mut again = Vec::new();
        for s in &round {
            s.queued.store(false, Ordering::Release);
            // Pairs with `kick`'s swap (see there).
            std::sync::atomic::fence(Ordering::SeqCst);
            let Some((cmd, n, more)) = collect(s, &mut buf, &boot, maxlen, ttl) else {
                continue;
            };
            pipe.add_command(cmd);
            written.push(s.clone());
            events += n;
            if more {
                again.push(s.clone());
            }
        }
        if written.is_empty() {
            continue;
        }
        let mut backoff = Duration::from_millis(100);
        let owned: Vec<i64> = loop {
            match cluster.query_pipe::<Vec<i64>>(&pipe).await {
                Ok(owned) => break owned,
                Err(e) if !super::is_connection_error(&e) => {
                    // Redis refused the round itself: retrying cannot help.
                    cluster.inner.metrics.cluster.replication_error();
                    tracing::error!(
                        error = %e,
                        "cluster: Redis refused a replication round; its events are not in Redis"
                    );
                    break Vec::new();
                }
                Err(e) => {
                    cluster.inner.metrics.cluster.replication_error();
                    tracing::debug!(error = %e, "cluster: replication round failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        };
        cluster.inner.metrics.cluster.replicated(events);
        for (s, owned) in written.iter().zip(owned) {
            if owned == 0 {
                // Another node owns it now (this one stalled past its
                // heartbeat), it ended elsewhere, or this incarnation was
                // replaced by a re-initialisation: this copy must go.
                {
                    // Not held past here: closing the session below ends
                    // it, and its end adds a control entry (a lock again).
                    let mut st = s.lock();
                    st.done = true;
                    st.hold = None;
                }
                if s.handle.is_ended() {
                    continue;
                }
                tracing::warn!(
                    session = format_args!("{:016x}", s.handle.cursor_now(0).tag),
                    "cluster: a session this node held is owned elsewhere now; ending it here"
                );
                s.handle.close();
            }
        }
        for s in again {
            s.kick();
        }
    }
}

/// The `EVAL` that writes session `s`'s pending events and controls, how
/// many events it holds, and whether more are ready than one round takes.
fn collect(
    s: &SessionReplica,
    buf: &mut Vec<u8>,
    boot: &str,
    maxlen: u64,
    ttl: u64,
) -> Option<(redis::Cmd, u64, bool)> {
    let mut st = s.lock();
    if st.done {
        return None;
    }
    let id = s.handle.id();
    let epoch = s.handle.epoch();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(WRITE)
        .arg(2)
        .arg(keys::record(id))
        .arg(keys::events(id, epoch))
        .arg(boot)
        .arg(format!("{epoch:x}"))
        .arg(maxlen)
        .arg(ttl);
    let mut reader = s.handle.subscribe_all(st.copied);
    let now_ms = super::unix_ms();
    let mut n = 0u64;
    let mut bytes = 0usize;
    let mut ended = false;
    let mut more = false;
    let mut ops = 0usize;
    loop {
        if n as usize >= ROUND_EVENTS || bytes >= ROUND_BYTES {
            more = true;
            break;
        }
        match reader.next_into(buf) {
            Ok(Some(ev)) => {
                ops += flush_controls(&mut st, ev.seq - 1, &mut cmd);
                cmd.arg("e")
                    .arg(format!("{}-0", ev.seq))
                    .arg(ev.to_string())
                    .arg(buf.as_slice())
                    .arg(now_ms);
                st.copied = ev.seq;
                n += 1;
                ops += 1;
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
    if let Some(hold) = &st.hold {
        // Copied out of the engine: a failed round is retried from `cmd`.
        hold.advance(copied);
    }
    ops += flush_controls(&mut st, copied, &mut cmd);
    let end_queued = st.controls.iter().any(|(_, c)| matches!(c, Control::End));
    if ended || end_queued && !more {
        // Everything readable is copied: the end goes after it.
        let at = next_control_id(&mut st, copied);
        cmd.arg("x").arg(at);
        ops += 1;
        st.controls.clear();
        st.done = true;
        st.hold = None;
    }
    (ops > 0).then_some((cmd, n, more))
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

/// Adds the controls that follow events up to `upto` (copied already) to
/// `cmd`; returns how many.
fn flush_controls(st: &mut State, upto: u64, cmd: &mut redis::Cmd) -> usize {
    let mut n = 0;
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
                cmd.arg("c").arg(at).arg(stream);
            }
            Control::Init(blob) => {
                cmd.arg("h").arg(blob);
            }
            Control::End => continue,
        }
        n += 1;
    }
    n
}
