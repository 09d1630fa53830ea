//! SSE responses: one [`Replay`] read loop per response (invariant 7).
//!
//! A response starts with its opening frames (a `reset`/`gap` signal when
//! the engine asked for one, then the priming event: the reader's position
//! as `id`, empty `data`, and the `retry` hint), then delivers every event
//! of its stream from the engine — replayed and live alike, by the same
//! `next_into` loop — until one of:
//!
//! - the stream is a request stream that is no longer open (its responses
//!   are stored) and the reader has caught up;
//! - the session ended and everything before the end was delivered;
//! - a tool closed the stream ([`SseStream::close`](super::SseStream::close))
//!   or the server closes POST streams after priming: the client resumes;
//! - shutdown.
//!
//! Waiting uses the engine's listener protocol: create the listener, read
//! once more, and only then wait, so an append between the two is never
//! missed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use rewind_engine::{EventId, Replay, ReplayError, Signal};
use tokio_util::sync::CancellationToken;

use super::session::{McpSession, STANDALONE};
use crate::metrics::ServerMetrics;

/// The priming event: the position to resume from, nothing to deliver.
pub(crate) fn priming_frame(id: EventId, retry: Duration) -> Bytes {
    Bytes::from(format!(
        "id: {id}\nretry: {}\ndata: \n\n",
        retry.as_millis()
    ))
}

/// A `reset`/`gap` signal (no id: it is not part of any stream).
pub(crate) fn signal_frame(signal: &Signal, retry: Duration) -> Bytes {
    Bytes::from(format!(
        "event: {}\nretry: {}\ndata: {}\n\n",
        signal.kind.event_name(),
        retry.as_millis(),
        signal.to_json()
    ))
}

/// One stored event as SSE bytes: `id:`, then one `data:` line per line
/// of the payload.
pub fn event_frame(id: EventId, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(payload.len() + 64);
    write_event_frame(&mut out, id, payload);
    Bytes::from(out)
}

/// [`event_frame`], appended to `out`.
pub(crate) fn write_event_frame(out: &mut Vec<u8>, id: EventId, payload: &[u8]) {
    use std::io::Write as _;
    fn data_line(out: &mut Vec<u8>, line: &[u8]) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        out.push(b'\n');
    }
    out.reserve(payload.len() + 64);
    // Writing into a Vec cannot fail.
    let _ = writeln!(out, "id: {id}");
    // Payloads are compact JSON (no newlines): one `data:` line, found with
    // one vectorised scan. Split anyway when there is a newline, so a stray
    // one can never end the event early or forge a field.
    if payload.contains(&b'\n') {
        for line in payload.split(|&b| b == b'\n') {
            data_line(out, line);
        }
    } else {
        data_line(out, payload);
    }
    out.push(b'\n');
}

/// Events already stored when a reader wakes go out as one body chunk (one
/// write, one wake-up of the connection task) up to these bounds, so a
/// burst costs one syscall instead of one per event while a chunk never
/// holds back more than this much.
const COALESCE_EVENTS: usize = 64;
const COALESCE_BYTES: usize = 64 * 1024;

pub(crate) const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// A `gap` notice sent mid-stream to a reader that fell behind: the same
/// body a resume from its position would get.
pub(crate) fn gap_frame(json: &str) -> String {
    format!("event: gap\ndata: {json}\n\n")
}

/// What ends a response besides the end of its stream.
#[derive(Debug, Clone)]
pub(crate) struct Stops {
    pub(crate) shutdown: CancellationToken,
    pub(crate) keep_alive: Option<Duration>,
    /// End right after the opening frames (SSE polling).
    pub(crate) after_opening: bool,
}

/// The state of one SSE response.
#[derive(Debug)]
pub(crate) struct SseReader {
    replay: Replay,
    session: Arc<McpSession>,
    opening: Vec<Bytes>,
    buf: Vec<u8>,
    stops: Stops,
    kick: CancellationToken,
    metrics: Arc<ServerMetrics>,
    /// Events delivered from before the reconnect, while still counting
    /// (a resumed response counts until it first catches up).
    replayed: Option<u64>,
    /// The stream is closed: deliver what is left, then end.
    draining: bool,
    done: bool,
    /// Where the last gap notice moved this reader, until it reads again.
    last_gap: Option<u64>,
}

impl SseReader {
    pub(crate) fn new(
        mut replay: Replay,
        session: Arc<McpSession>,
        opening: Vec<Bytes>,
        stops: Stops,
        metrics: Arc<ServerMetrics>,
        resumed: bool,
    ) -> SseReader {
        // A client reading a burst more slowly than the tool writes it
        // gets all of it (up to the engine's `reader_hold_bytes`), not a gap.
        replay.hold();
        let kick = session.kick_token(replay.stream());
        let mut opening = opening;
        opening.reverse();
        metrics.sse_stream(true);
        SseReader {
            replay,
            session,
            opening,
            buf: Vec::new(),
            stops,
            kick,
            metrics,
            replayed: resumed.then_some(0),
            draining: false,
            done: false,
            last_gap: None,
        }
    }

    /// The response body.
    pub(crate) fn into_stream(self) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
        futures::stream::unfold(self, |mut r| async move {
            let frame = r.next_frame().await?;
            Some((Ok(frame), r))
        })
    }

    fn caught_up(&mut self) {
        if let Some(n) = self.replayed.take() {
            self.metrics.observe_replay(n);
        }
    }

    /// The next stored event (its payload in `self.buf`), or `None` when
    /// caught up.
    fn try_next(&mut self) -> Option<Result<Item, ReplayError>> {
        match self
            .session
            .next_into(&mut self.replay, &self.kick, &mut self.buf)
        {
            Ok(Some(id)) => {
                self.last_gap = None;
                if let Some(n) = &mut self.replayed {
                    *n += 1;
                }
                Some(Ok(Item::Event(id)))
            }
            Ok(None) => None,
            Err(ReplayError::Lagged { after, .. }) => {
                // Events this reader had not sent yet were released: say so
                // with the same `gap` a resume from here would get, then go
                // on from the oldest event still held.
                let oldest = self.replay.skip_gap();
                if self.last_gap == Some(oldest) {
                    // Lagged again at the same place with nothing read in
                    // between: the engine cannot position this reader.
                    // End the response (the client resumes) rather than
                    // repeat the same notice.
                    tracing::warn!(
                        oldest,
                        "a reader lagged twice at the same event; ending its response"
                    );
                    return Some(Err(ReplayError::SessionEnded));
                }
                self.last_gap = Some(oldest);
                let oldest = EventId {
                    seq: oldest,
                    ..after
                };
                let signal = Signal::lagged(after, Some(oldest));
                Some(Ok(Item::Gap(signal.to_json())))
            }
            Err(e) => Some(Err(e)),
        }
    }

    fn frame(&self, item: Item) -> Bytes {
        match item {
            Item::Event(id) => event_frame(id, &self.buf),
            Item::Gap(json) => Bytes::from(gap_frame(&json)),
            Item::KeepAlive => Bytes::from_static(KEEP_ALIVE),
        }
    }

    async fn next_frame(&mut self) -> Option<Bytes> {
        if let Some(f) = self.opening.pop() {
            return Some(f);
        }
        let id = match self.next_item().await? {
            Item::Event(id) => id,
            // Gaps and keep-alives go out on their own.
            other => return Some(self.frame(other)),
        };
        // An event: add every further event that is already stored, up to
        // the bounds, to the same chunk. What stops the batch (caught up,
        // a gap, the end) is met again by the next call, which reads on
        // from the same position.
        let mut out = Vec::with_capacity(self.buf.len() + 64);
        write_event_frame(&mut out, id, &self.buf);
        let mut events = 1;
        while events < COALESCE_EVENTS && out.len() < COALESCE_BYTES {
            match self.try_next() {
                Some(Ok(Item::Event(id))) => {
                    write_event_frame(&mut out, id, &self.buf);
                    events += 1;
                }
                Some(Ok(Item::Gap(json))) => {
                    out.extend_from_slice(gap_frame(&json).as_bytes());
                    break;
                }
                Some(Ok(Item::KeepAlive)) | Some(Err(_)) | None => break,
            }
        }
        Some(Bytes::from(out))
    }

    /// The next event of the stream (payload in `self.buf`), a gap, or a
    /// keep-alive tick; `None` once the response should end.
    async fn next_item(&mut self) -> Option<Item> {
        if self.done || self.stops.after_opening || self.stops.shutdown.is_cancelled() {
            return self.finish();
        }
        let stream = self.replay.stream();
        loop {
            match self.try_next() {
                Some(Ok(f)) => return Some(f),
                Some(Err(_ended)) => return self.finish(),
                None => {}
            }
            self.caught_up();
            if self.draining {
                return self.finish();
            }
            if self.kick.is_cancelled() {
                return self.finish();
            }
            let appended = self.replay.listen();
            let closed = self.session.listen_closed();
            match self.try_next() {
                Some(Ok(f)) => return Some(f),
                Some(Err(_ended)) => return self.finish(),
                None => {}
            }
            if stream != STANDALONE && !self.session.is_open(stream) {
                // Closed after our last read: its final events may have
                // landed in between. Deliver them, then end.
                self.draining = true;
                continue;
            }
            let keep_alive = async {
                match self.stops.keep_alive {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = appended => {}
                _ = closed => {}
                _ = keep_alive => {
                    self.session.handle.touch();
                    return Some(Item::KeepAlive);
                }
                _ = self.kick.cancelled() => return self.finish(),
                _ = self.stops.shutdown.cancelled() => return self.finish(),
            }
        }
    }

    fn finish<T>(&mut self) -> Option<T> {
        self.done = true;
        None
    }

    /// The first thing this reader would deliver after its opening frames:
    /// `Ok((id, payload))` for an event, `Err(self)` for anything else (a
    /// gap, or the end), handing the reader back so the caller can still
    /// answer with SSE.
    pub(crate) async fn first_event(mut self) -> Result<(EventId, Vec<u8>, SseReader), SseReader> {
        loop {
            match self.next_item().await {
                Some(Item::Event(id)) => {
                    let payload = std::mem::take(&mut self.buf);
                    return Ok((id, payload, self));
                }
                Some(Item::KeepAlive) => continue,
                Some(gap @ Item::Gap(_)) => {
                    let f = self.frame(gap);
                    self.opening.insert(0, f);
                    return Err(self);
                }
                None => return Err(self),
            }
        }
    }

    /// Appends `frame` to the frames sent before the stream's events.
    /// The position of the reader (before its first event: the priming
    /// event's id).
    pub(crate) fn position(&self) -> EventId {
        self.replay.position()
    }

    pub(crate) fn push_opening(&mut self, frame: Bytes) {
        self.opening.insert(0, frame);
    }

    /// Every event payload this reader delivers until its stream ends (the
    /// answers of a POST served as one JSON body). Gaps and keep-alives are
    /// not part of such a body and are skipped.
    pub(crate) async fn collect(mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(item) = self.next_item().await {
            if let Item::Event(_) = item {
                out.push(std::mem::take(&mut self.buf));
            }
        }
        out
    }
}

/// What a reader delivers next.
#[derive(Debug)]
enum Item {
    /// An event, its payload in the reader's buffer.
    Event(EventId),
    /// A gap notice (JSON), for a reader that fell behind.
    Gap(String),
    /// Nothing for a while.
    KeepAlive,
}

impl Drop for SseReader {
    fn drop(&mut self) {
        // A resume cut before it caught up still replayed what it sent.
        if let Some(n) = self.replayed.take() {
            self.metrics.observe_replay(n);
        }
        self.metrics.sse_stream(false);
        self.session.forget_kick(self.replay.stream());
    }
}

#[cfg(test)]
mod tests {
    use super::event_frame;
    use rewind_engine::{Config, Engine};

    fn an_id() -> rewind_engine::EventId {
        let engine = Engine::new(Config::default()).expect("engine");
        let session = engine.open(None).expect("session");
        let stream = session.new_stream().expect("stream");
        session.append(stream, b"{}").expect("append")
    }

    #[test]
    fn a_payload_without_newlines_is_one_data_line() {
        let id = an_id();
        let frame = event_frame(id, br#"{"a":1}"#);
        assert_eq!(
            &frame[..],
            format!("id: {id}\ndata: {{\"a\":1}}\n\n").as_bytes()
        );
    }

    #[test]
    fn every_line_of_a_payload_is_its_own_data_line_so_no_field_is_forged() {
        let id = an_id();
        let frame = event_frame(id, b"one\r\nevent: forged\n\nid: 9\n");
        assert_eq!(
            &frame[..],
            format!("id: {id}\ndata: one\ndata: event: forged\ndata: \ndata: id: 9\ndata: \n\n")
                .as_bytes()
        );
    }
}
