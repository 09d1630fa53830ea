//! A `tokio::sync::broadcast` channel per session.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use tokio::sync::broadcast::{self, error::TryRecvError};

use super::{new_session_key, SessionKey};
use crate::{deliver, AppendStore, ReplayStore};

/// What many servers reach for first: one `broadcast` channel per session
/// (capacity 64), in a map behind an `RwLock`. A writer holds the channel's
/// `Arc`, so an append is one `send` with no map lookup.
///
/// **Broadcast cannot replay after an arbitrary cursor.** A receiver sees
/// only what was sent after it subscribed, and what it has not yet read.
/// So it is measured for append, and for "drain the last 64": each session
/// keeps a receiver that subscribed before its events were sent, and a
/// replay drains it (the bench re-fills it outside the timed region). It
/// is not in the resume-decision group: it has no cursor to find.
pub struct BroadcastPerSession {
    sessions: RwLock<HashMap<SessionKey, Arc<Channel>>>,
    capacity: usize,
}

struct Channel {
    tx: broadcast::Sender<Bytes>,
    /// The receiver subscribed before the session's events were sent.
    rx: Mutex<broadcast::Receiver<Bytes>>,
}

/// A writer on a [`BroadcastPerSession`] session.
#[derive(Clone)]
pub struct BroadcastWriter {
    key: SessionKey,
    channel: Arc<Channel>,
}

impl fmt::Debug for BroadcastWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastWriter")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for BroadcastPerSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastPerSession")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Default for BroadcastPerSession {
    fn default() -> Self {
        BroadcastPerSession::new(64)
    }
}

impl BroadcastPerSession {
    /// Channels of `capacity` events.
    pub fn new(capacity: usize) -> BroadcastPerSession {
        BroadcastPerSession {
            sessions: RwLock::new(HashMap::new()),
            capacity,
        }
    }

    fn channel(&self, key: &SessionKey) -> Option<Arc<Channel>> {
        self.sessions
            .read()
            .expect("map lock poisoned")
            .get(key)
            .cloned()
    }
}

impl AppendStore for BroadcastPerSession {
    type Writer = BroadcastWriter;
    const NAME: &'static str = "Broadcast";

    fn open(&self) -> BroadcastWriter {
        let (tx, rx) = broadcast::channel(self.capacity);
        let channel = Arc::new(Channel {
            tx,
            rx: Mutex::new(rx),
        });
        let key = new_session_key();
        self.sessions
            .write()
            .expect("map lock poisoned")
            .insert(key.clone(), channel.clone());
        BroadcastWriter { key, channel }
    }

    fn append(&self, writer: &mut BroadcastWriter, payload: &[u8]) {
        // Fails only without receivers; every channel keeps one.
        let _ = writer.channel.tx.send(Bytes::copy_from_slice(payload));
    }
}

impl ReplayStore for BroadcastPerSession {
    /// The session: a broadcast receiver has no other position.
    type Cursor = SessionKey;

    fn append_for_cursor(&self, writer: &mut BroadcastWriter, payload: &[u8]) -> SessionKey {
        self.append(writer, payload);
        writer.key.clone()
    }

    fn close(&self, writer: BroadcastWriter) {
        self.sessions
            .write()
            .expect("map lock poisoned")
            .remove(&writer.key);
    }

    fn replay_after(&self, cursor: &SessionKey, buf: &mut Vec<u8>) -> usize {
        let Some(channel) = self.channel(cursor) else {
            return 0;
        };
        let mut rx = channel.rx.lock().expect("receiver lock poisoned");
        let mut n = 0;
        loop {
            match rx.try_recv() {
                Ok(b) => {
                    deliver(buf, &b);
                    n += 1;
                }
                // Lapped: the receiver moves on to the oldest retained event.
                Err(TryRecvError::Lagged(_)) => continue,
                Err(TryRecvError::Empty | TryRecvError::Closed) => return n,
            }
        }
    }

    fn resume_first(&self, cursor: &SessionKey, buf: &mut Vec<u8>) -> bool {
        let Some(channel) = self.channel(cursor) else {
            return false;
        };
        let mut rx = channel.rx.lock().expect("receiver lock poisoned");
        loop {
            match rx.try_recv() {
                Ok(b) => {
                    deliver(buf, &b);
                    return true;
                }
                Err(TryRecvError::Lagged(_)) => continue,
                Err(TryRecvError::Empty | TryRecvError::Closed) => return false,
            }
        }
    }

    fn needs_rearm(&self) -> bool {
        true
    }

    fn rearm(&self, cursor: &SessionKey, payload: &[u8]) {
        if let Some(channel) = self.channel(cursor) {
            for _ in 0..self.capacity {
                let _ = channel.tx.send(Bytes::copy_from_slice(payload));
            }
        }
    }
}
