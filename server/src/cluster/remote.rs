//! Serving a session another node owns: its cursor classified against the
//! record and the Redis Stream, and one read loop over that stream.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use redis::streams::{StreamId, StreamRangeReply, StreamReadReply};
use redis::Value;
use rewind_engine::{CursorFact, EventId, ResumeFacts, SessionFact, SessionId, Signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{keys, Cluster, Record};
use crate::mcp::sse::{event_frame, gap_frame, KEEP_ALIVE};

/// How long a cursor beyond what Redis holds may wait for the owner's copy
/// of its event (it may be on its way) before it counts as forged.
const REPLICATION_WAIT: Duration = Duration::from_secs(1);
/// How long one `XREAD BLOCK` of a reader waits; between two, the reader
/// checks that its session and owner are still there.
const BLOCK: Duration = Duration::from_secs(5);

/// A stream entry id, `seq-k`.
fn entry_seq(id: &str) -> Option<(u64, u64)> {
    let (a, b) = id.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn field<'a>(e: &'a StreamId, name: &str) -> Option<&'a [u8]> {
    match e.map.get(name)? {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// The event id an event entry carries.
fn entry_event(e: &StreamId) -> Option<EventId> {
    EventId::parse(std::str::from_utf8(field(e, "i")?).ok()?).ok()
}

/// What the shared tier says about a presented session and cursor.
#[derive(Debug)]
pub(crate) struct Classified {
    /// The facts for the policy (safe set not filled in yet).
    pub(crate) facts: ResumeFacts,
    /// The session's record, when it is the presenter's.
    pub(crate) record: Option<Record>,
    /// The parsed cursor.
    pub(crate) cursor: Option<EventId>,
    /// The newest event Redis holds (0: none) and the node that appended it.
    pub(crate) high_water: (u64, u16),
    /// The oldest event Redis still holds.
    pub(crate) oldest: u64,
}

impl Cluster {
    /// Classifies a request for session `id` (not held here).
    pub(crate) async fn classify(
        &self,
        id: SessionId,
        principal: Option<&str>,
        last_event_id: Option<&str>,
    ) -> redis::RedisResult<Classified> {
        let cursor = last_event_id.map(EventId::parse);
        let parsed = cursor.and_then(Result::ok);
        let mut out = Classified {
            facts: ResumeFacts::new(SessionFact::Unknown, CursorFact::Unchecked),
            record: None,
            cursor: parsed,
            high_water: (0, 0),
            oldest: 1,
        };
        let Some((record, alive)) = self.record_and_owner(id).await? else {
            return Ok(out);
        };
        if record.principal.as_deref() != principal {
            out.facts = ResumeFacts::new(SessionFact::WrongPrincipal, CursorFact::Unchecked);
            return Ok(out);
        }
        let session = if alive {
            SessionFact::Remote
        } else {
            SessionFact::OwnerLost
        };
        let key = keys::events(id, record.epoch);
        // The cursor's own entry comes with the window when the cursor
        // names this incarnation.
        let exact = parsed
            .filter(|c| c.tag == record.tag && c.epoch == record.epoch && c.seq > 0)
            .map(|c| c.seq);
        let (hw, oldest, mut at_cursor) = self.window(&key, record.owner, exact).await?;
        out.high_water = hw;
        out.oldest = oldest;
        let cursor_fact = match cursor {
            None => CursorFact::Absent,
            Some(Err(_)) => CursorFact::Malformed,
            Some(Ok(c)) if c.tag != record.tag => CursorFact::Foreign,
            Some(Ok(c)) if c.epoch < record.epoch => CursorFact::OlderEpoch,
            Some(Ok(c)) if c.epoch > record.epoch => CursorFact::Future,
            Some(Ok(c)) => {
                if c.seq > out.high_water.0 && session == SessionFact::Remote {
                    // Maybe not copied yet: give the owner a moment.
                    let deadline = tokio::time::Instant::now() + REPLICATION_WAIT;
                    while c.seq > out.high_water.0 && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        let (hw, oldest, entry) =
                            self.window(&key, record.owner, Some(c.seq)).await?;
                        out.high_water = hw;
                        out.oldest = oldest;
                        at_cursor = entry;
                    }
                }
                out.facts.cursor_seq = c.seq;
                if c.seq > out.high_water.0 {
                    CursorFact::Future
                } else if c.seq + 1 < out.oldest {
                    CursorFact::BeforeWindow
                } else if c.seq == 0 || c.seq < out.oldest {
                    CursorFact::InWindow
                } else {
                    // The cursor's own event must be the one Redis holds
                    // at that number: same node, so the same history.
                    match at_cursor {
                        Some((e, copied_ms)) if e.node == c.node => {
                            // Its age: since the owner copied it (within a
                            // replication round of its append).
                            out.facts.cursor_age_ms = copied_ms
                                .map_or(rewind_engine::policy::UNKNOWN, |t| {
                                    super::unix_ms().saturating_sub(t)
                                });
                            CursorFact::InWindow
                        }
                        // Another node's event at that number: the cursor
                        // is from a history that was not carried over.
                        Some(_) => CursorFact::OlderEpoch,
                        // A hole in what Redis holds.
                        None => CursorFact::BeforeWindow,
                    }
                }
            }
        };
        let age = out.facts.cursor_age_ms;
        out.facts = ResumeFacts::new(session, cursor_fact);
        out.facts.cursor_age_ms = age;
        if let Some(c) = parsed.filter(|_| cursor_fact != CursorFact::Foreign) {
            out.facts.cursor_seq = c.seq;
        }
        out.facts.high_water = out.high_water.0;
        out.facts.oldest_retained = out.oldest;
        out.record = Some(record);
        Ok(out)
    }

    /// The newest event of `key` (its number and node; `owner` when none),
    /// the oldest one's number (newest + 1 when none), and the event at
    /// `exact`, in one round trip.
    async fn window(
        &self,
        key: &str,
        owner: u16,
        exact: Option<u64>,
    ) -> redis::RedisResult<((u64, u16), u64, Option<(EventId, Option<u64>)>)> {
        let mut pipe = redis::pipe();
        pipe.cmd("XREVRANGE")
            .arg(key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(8);
        pipe.cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1);
        let id = format!("{}-0", exact.unwrap_or(0));
        pipe.cmd("XRANGE").arg(key).arg(&id).arg(&id);
        let (last, first, at): (StreamRangeReply, StreamRangeReply, StreamRangeReply) =
            self.query_pipe(&pipe).await?;
        let at = exact.and(at.ids.first().and_then(|e| {
            let copied_ms = field(e, "t")
                .and_then(|t| std::str::from_utf8(t).ok())
                .and_then(|t| t.parse().ok());
            Some((entry_event(e)?, copied_ms))
        }));
        let mut hw = (0, owner);
        for e in &last.ids {
            if let Some((seq, k)) = entry_seq(&e.id) {
                if k == 0 {
                    hw = (seq, entry_event(e).map_or(owner, |ev| ev.node));
                    break;
                }
                // Controls follow their event: the event is `seq`.
                hw = (hw.0.max(seq), owner);
            }
        }
        let oldest = match first.ids.first().and_then(|e| entry_seq(&e.id)) {
            Some((seq, 0)) => seq,
            Some((seq, _)) => seq + 1,
            None => hw.0 + 1,
        };
        Ok((hw, oldest.min(hw.0 + 1), at))
    }
}

/// One SSE response served from a session's Redis Stream.
#[derive(Debug, Clone)]
pub(crate) struct Follow {
    pub(crate) session: SessionId,
    pub(crate) epoch: u64,
    pub(crate) tag: u64,
    pub(crate) node: u16,
    /// The stream delivered.
    pub(crate) stream: u32,
    /// Deliver events after this number.
    pub(crate) after: u64,
    /// A request stream: end at its close entry.
    pub(crate) ends_on_close: bool,
    /// End once caught up instead of waiting for more (the owner is gone).
    pub(crate) ends_when_caught_up: bool,
}

impl Cluster {
    /// The body of an SSE response: `opening`, then `follow`'s events.
    pub(crate) fn follow_body(
        &self,
        follow: Follow,
        opening: Vec<Bytes>,
        keep_alive: Option<Duration>,
        shutdown: CancellationToken,
    ) -> axum::body::Body {
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let cluster = self.clone();
        tokio::spawn(async move {
            cluster.inner.metrics.sse_stream(true);
            cluster.inner.metrics.cluster.remote_stream(true);
            for frame in opening {
                if tx.send(frame).await.is_err() {
                    break;
                }
            }
            if !tx.is_closed() {
                read_loop(&cluster, &follow, &tx, keep_alive, &shutdown).await;
            }
            cluster.inner.metrics.cluster.remote_stream(false);
            cluster.inner.metrics.sse_stream(false);
        });
        axum::body::Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        }))
    }
}

/// Reads the session's Redis Stream from `follow.after` on and sends
/// `follow.stream`'s events, until the stream closes, the session ends,
/// the client goes or the server stops.
async fn read_loop(
    cluster: &Cluster,
    follow: &Follow,
    tx: &mpsc::Sender<Bytes>,
    keep_alive: Option<Duration>,
    shutdown: &CancellationToken,
) {
    let Ok((mut conn, mut pooled)) = cluster.reader().await else {
        return;
    };
    let key = keys::events(follow.session, follow.epoch);
    let mut last = format!("{}-0", follow.after);
    let mut next = follow.after + 1;
    let block = keep_alive.map_or(BLOCK, |k| k.min(BLOCK));
    let id_at = |stream, seq| EventId {
        tag: follow.tag,
        node: follow.node,
        epoch: follow.epoch,
        stream,
        seq,
    };
    loop {
        let mut xread = redis::cmd("XREAD");
        let read = xread
            .arg("COUNT")
            .arg(256)
            .arg("BLOCK")
            .arg(super::ms(block))
            .arg("STREAMS")
            .arg(&key)
            .arg(&last)
            .query_async::<Option<StreamReadReply>>(&mut conn);
        let reply = tokio::select! {
            r = read => r,
            _ = tx.closed() => return,
            _ = shutdown.cancelled() => return,
        };
        let reply = match reply {
            Ok(r) => r,
            Err(_) if pooled => {
                // An idle connection Redis closed meanwhile (a restart):
                // once more on a new one.
                pooled = false;
                match cluster.dedicated().await {
                    Ok(c) => conn = c,
                    Err(_) => return,
                }
                continue;
            }
            Err(_) => {
                cluster.note(false);
                return;
            }
        };
        pooled = false;
        let entries: Vec<StreamId> = reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default();
        // From here until the next `XREAD`, the connection is idle: a
        // reader that ends hands it to the next one.
        if entries.is_empty() {
            if follow.ends_when_caught_up
                || !still_there(cluster, follow).await
                || keep_alive.is_some() && tx.send(Bytes::from_static(KEEP_ALIVE)).await.is_err()
            {
                cluster.give_back(conn);
                return;
            }
            continue;
        }
        let mut out = Vec::new();
        let mut done = false;
        for e in &entries {
            last.clone_from(&e.id);
            let Some((seq, k)) = entry_seq(&e.id) else {
                continue;
            };
            if k == 0 {
                if seq > next {
                    let signal = Signal::lagged(
                        id_at(follow.stream, next - 1),
                        Some(id_at(follow.stream, seq)),
                    );
                    out.extend_from_slice(gap_frame(&signal.to_json()).as_bytes());
                }
                next = next.max(seq + 1);
                if let (Some(id), Some(data)) = (entry_event(e), field(e, "d")) {
                    if id.stream == follow.stream {
                        out.extend_from_slice(&event_frame(id, data));
                    }
                }
                continue;
            }
            match field(e, "c") {
                Some(b"end") => done = true,
                Some(b"close") if follow.ends_on_close => {
                    let s = field(e, "s")
                        .and_then(|s| std::str::from_utf8(s).ok())
                        .and_then(|s| s.parse::<u32>().ok());
                    if s == Some(follow.stream) {
                        done = true;
                    }
                }
                _ => {}
            }
            if done {
                break;
            }
        }
        let gone = !out.is_empty() && tx.send(Bytes::from(out)).await.is_err();
        if done || gone {
            cluster.give_back(conn);
            return;
        }
    }
}

/// Whether the session's record is still there and its owner alive (a
/// reader of a session whose owner died ends once caught up, so the
/// client's next request finds out what became of the session).
async fn still_there(cluster: &Cluster, follow: &Follow) -> bool {
    matches!(
        cluster.record_and_owner(follow.session).await,
        Ok(Some((r, true))) if r.epoch == follow.epoch
    )
}
