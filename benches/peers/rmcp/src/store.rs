//! One in-memory `EventStore` shared by every session: what rmcp's
//! `EventStore` trait asks for (globally unique ids; replay locates the
//! stream from the id alone) with a bounded memory.
//!
//! Replay gets only the cursor, never the session presenting it: the trait
//! carries none. So a session that presents another session's cursor is
//! replayed that session's events — the comparison shows it happening.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};

/// Events kept in all, oldest dropped first.
const CAPACITY: usize = 1 << 20;

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    /// Event sequence → its stream.
    stream_of: HashMap<u64, String>,
    /// Per stream, its events in order.
    streams: HashMap<String, VecDeque<(u64, ServerSseMessage)>>,
    /// Every event in order, to drop the oldest.
    order: VecDeque<u64>,
}

/// The shared store.
#[derive(Debug, Default)]
pub struct SharedEventStore {
    inner: Mutex<Inner>,
}

fn parse(id: &str) -> Option<u64> {
    id.strip_prefix("event-")?.parse().ok()
}

#[async_trait::async_trait]
impl EventStore for SharedEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let seq = g.next;
        g.next += 1;
        let id = format!("event-{seq}");
        let mut stored = event.clone();
        stored.event_id = Some(id.clone());
        g.stream_of.insert(seq, stream_id.to_owned());
        g.streams
            .entry(stream_id.to_owned())
            .or_default()
            .push_back((seq, stored));
        g.order.push_back(seq);
        while g.order.len() > CAPACITY {
            let Some(old) = g.order.pop_front() else {
                break;
            };
            if let Some(stream) = g.stream_of.remove(&old) {
                let empty = g.streams.get_mut(&stream).is_some_and(|q| {
                    q.pop_front();
                    q.is_empty()
                });
                if empty {
                    g.streams.remove(&stream);
                }
            }
        }
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let seq = parse(last_event_id).ok_or("unknown event id")?;
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let stream = g.stream_of.get(&seq).ok_or("event no longer stored")?;
        let events: Vec<ServerSseMessage> = g
            .streams
            .get(stream)
            .map(|q| {
                q.iter()
                    .filter(|(s, _)| *s > seq)
                    .map(|(_, e)| e.clone())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Box::pin(futures::stream::iter(events)))
    }
}
