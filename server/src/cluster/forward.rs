//! Requests forwarded to the node that owns their session, and the
//! owner's replies.
//!
//! The forwarding node appends the request (method, headers, body, its own
//! node and a nonce) to the owner's request stream `rewind:in:<owner>` and
//! waits for the reply with that nonce on its own reply stream
//! `rewind:rep:<node>`. One task per node reads both of its streams with
//! one `XREAD BLOCK` on a connection of its own: requests are run by the
//! endpoint (as if they had arrived over HTTP, minus the `Host`/`Origin`
//! checks the forwarding node made), replies are handed to the request
//! waiting for them.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use redis::streams::StreamReadReply;
use redis::Value;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{keys, random_hex, Cluster};

/// Request and reply streams are trimmed to about this many entries.
const STREAM_MAXLEN: u64 = 100_000;
/// Request and reply streams of a node that stopped reading them vanish
/// this long after the last entry.
const STREAM_TTL_MS: u64 = 3_600_000;

/// A request forwarded to this node, the owner of its session.
#[derive(Debug)]
pub(crate) struct Forwarded {
    pub(crate) method: http::Method,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
}

/// The owner's answer to a forwarded request.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ForwardReply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    /// An SSE answer, served from the session's Redis Stream: its stream
    /// id, priming position (an event id), and whether it ends after its
    /// opening (SSE polling).
    pub(crate) sse: Option<(u32, String, bool)>,
    #[serde(skip)]
    pub(crate) body: Vec<u8>,
}

/// Why a request could not be forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForwardError {
    /// Redis did not take the request.
    Unreachable,
    /// The owner did not answer in time.
    Timeout,
}

#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    from: u16,
    nonce: String,
    method: String,
    headers: Vec<(String, String)>,
}

impl Cluster {
    /// Forwards `req` to node `owner` and waits up to `wait` for its reply.
    pub(crate) async fn forward(
        &self,
        owner: u16,
        req: Forwarded,
        wait: Duration,
    ) -> Result<ForwardReply, ForwardError> {
        let nonce = random_hex();
        let envelope = Envelope {
            from: self.inner.node,
            nonce: nonce.clone(),
            method: req.method.as_str().to_owned(),
            headers: req
                .headers
                .iter()
                // The forwarding node checked these against its own names.
                .filter(|(n, _)| *n != http::header::HOST && *n != http::header::ORIGIN)
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect(),
        };
        let Ok(h) = serde_json::to_vec(&envelope) else {
            return Err(ForwardError::Unreachable);
        };
        let (tx, rx) = oneshot::channel();
        self.pending().insert(nonce.clone(), tx);
        let inbox = keys::inbox(owner);
        let mut pipe = redis::pipe();
        pipe.cmd("XADD")
            .arg(&inbox)
            .arg("MAXLEN")
            .arg("~")
            .arg(STREAM_MAXLEN)
            .arg("*")
            .arg("h")
            .arg(h)
            .arg("b")
            .arg(req.body.as_ref())
            .ignore();
        pipe.cmd("PEXPIRE").arg(&inbox).arg(STREAM_TTL_MS).ignore();
        if self.query_pipe::<()>(&pipe).await.is_err() {
            self.pending().remove(&nonce);
            return Err(ForwardError::Unreachable);
        }
        self.inner.metrics.cluster.forwarded();
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            _ => {
                self.pending().remove(&nonce);
                Err(ForwardError::Timeout)
            }
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<ForwardReply>>> {
        self.inner.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Reads this node's request and reply streams until `shutdown`.
pub(super) async fn listen(cluster: Cluster, shutdown: CancellationToken) {
    let inbox = keys::inbox(cluster.inner.node);
    let replies = keys::replies(cluster.inner.node);
    let mut ids: Option<(String, String)> = None;
    let mut backoff = Duration::from_millis(100);
    'connect: loop {
        if shutdown.is_cancelled() {
            return;
        }
        let mut conn = match cluster.dedicated().await {
            Ok(c) => c,
            Err(_) => {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        // Start from Redis's clock now: what was sent before this node
        // listened was sent to an earlier process.
        let (mut in_id, mut rep_id) = match ids.take() {
            Some(ids) => ids,
            None => match redis::cmd("TIME")
                .query_async::<(u64, u64)>(&mut conn)
                .await
            {
                Ok((secs, micros)) => {
                    let now = format!("{}-0", secs * 1000 + micros / 1000);
                    (now.clone(), now)
                }
                Err(_) => continue 'connect,
            },
        };
        loop {
            let mut xread = redis::cmd("XREAD");
            let read = xread
                .arg("COUNT")
                .arg(64)
                .arg("BLOCK")
                .arg(1000)
                .arg("STREAMS")
                .arg(&inbox)
                .arg(&replies)
                .arg(&in_id)
                .arg(&rep_id)
                .query_async::<Option<StreamReadReply>>(&mut conn);
            let reply = tokio::select! {
                r = read => r,
                _ = shutdown.cancelled() => return,
            };
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "cluster: request listener lost its connection");
                    cluster.note(false);
                    ids = Some((in_id, rep_id));
                    continue 'connect;
                }
            };
            cluster.note(true);
            let Some(reply) = reply else { continue };
            for key in reply.keys {
                for entry in key.ids {
                    if key.key == inbox {
                        in_id.clone_from(&entry.id);
                        serve(&cluster, &entry.map);
                    } else {
                        rep_id.clone_from(&entry.id);
                        deliver(&cluster, &entry.map);
                    }
                }
            }
        }
    }
}

fn bytes_of(map: &HashMap<String, Value>, field: &str) -> Option<Vec<u8>> {
    match map.get(field)? {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// Runs one forwarded request and replies to its sender.
fn serve(cluster: &Cluster, map: &HashMap<String, Value>) {
    let Some(envelope) =
        bytes_of(map, "h").and_then(|h| serde_json::from_slice::<Envelope>(&h).ok())
    else {
        tracing::warn!("cluster: a forwarded request that does not parse; ignored");
        return;
    };
    let body = bytes_of(map, "b").unwrap_or_default();
    let Some(handler) = cluster.inner.inbox.get().cloned() else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    for (n, v) in &envelope.headers {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n.as_bytes()),
            http::HeaderValue::from_str(v),
        ) {
            headers.append(n, v);
        }
    }
    let method = http::Method::from_bytes(envelope.method.as_bytes()).unwrap_or(http::Method::POST);
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let reply = handler(Forwarded {
            method,
            headers,
            body: Bytes::from(body),
        })
        .await;
        let Ok(h) = serde_json::to_vec(&reply) else {
            return;
        };
        let to = keys::replies(envelope.from);
        let mut pipe = redis::pipe();
        pipe.cmd("XADD")
            .arg(&to)
            .arg("MAXLEN")
            .arg("~")
            .arg(STREAM_MAXLEN)
            .arg("*")
            .arg("n")
            .arg(&envelope.nonce)
            .arg("h")
            .arg(h)
            .arg("b")
            .arg(reply.body.as_slice())
            .ignore();
        pipe.cmd("PEXPIRE").arg(&to).arg(STREAM_TTL_MS).ignore();
        if let Err(e) = cluster.query_pipe::<()>(&pipe).await {
            tracing::warn!(error = %e, node = envelope.from, "cluster: cannot reply to a forwarded request");
        }
    });
}

/// Hands a reply to the request waiting for it.
fn deliver(cluster: &Cluster, map: &HashMap<String, Value>) {
    let Some(nonce) = bytes_of(map, "n").and_then(|n| String::from_utf8(n).ok()) else {
        return;
    };
    let Some(mut reply) =
        bytes_of(map, "h").and_then(|h| serde_json::from_slice::<ForwardReply>(&h).ok())
    else {
        return;
    };
    reply.body = bytes_of(map, "b").unwrap_or_default();
    if let Some(tx) = cluster.pending().remove(&nonce) {
        let _ = tx.send(reply);
    }
}
