//! The MCP messages the load generator sends, and a typed reading of what
//! comes back.
//!
//! Every tool call names its origin twice: in its progress token and in the
//! `label` argument that `progress_stream` echoes in every progress message
//! and in its result. Both are a [`Tag`] (run, session, call), so any
//! event can be traced to the session and call it was produced for, and a
//! server that hands one session's events to another is caught by content,
//! not only by ids.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;

/// The protocol revision the generator asks for in `initialize`.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// The tool every server under test must offer.
pub const TOOL: &str = "progress_stream";

/// Where an event came from: this run, this session, this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag {
    /// A random number per run, so events of an earlier run never count as ours.
    pub run: u32,
    /// The session's index in the run.
    pub session: u32,
    /// The call's number within the session (its incarnations included).
    pub call: u32,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{:08x}.{}.{}", self.run, self.session, self.call)
    }
}

impl Tag {
    /// Reads a tag back from a token or label; `None` if it is not one.
    pub fn parse(s: &str) -> Option<Tag> {
        let rest = s.strip_prefix('L')?;
        let mut parts = rest.split('.');
        let run = u32::from_str_radix(parts.next()?, 16).ok()?;
        let session = parts.next()?.parse().ok()?;
        let call = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Tag { run, session, call })
    }

    /// The `message` of progress notification `i` of `count`, as the tool
    /// writes it.
    pub fn progress_message(&self, i: u64, count: u64) -> String {
        format!("{self} step {i}/{count}")
    }

    /// The text of the tool's result.
    pub fn result_text(&self, count: u64) -> String {
        format!("{self} progress_stream done: {count} notifications")
    }
}

/// The `initialize` request (always JSON-RPC id 1, as the first request of
/// a session).
pub fn initialize(id: u64) -> String {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": { "name": "rewind-load", "version": env!("CARGO_PKG_VERSION") },
        },
    })
    .to_string()
}

/// The `notifications/initialized` notification.
pub fn initialized() -> String {
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned()
}

/// A `tools/call` of `progress_stream` tagged with `tag`, with `extra`
/// arguments besides the three it always has.
pub fn call_progress_stream(
    id: u64,
    tag: Tag,
    count: u32,
    interval_ms: u64,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> String {
    let tag = tag.to_string();
    let mut arguments = extra.clone();
    arguments.insert("count".into(), count.into());
    arguments.insert("interval_ms".into(), interval_ms.into());
    arguments.insert("label".into(), tag.clone().into());
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {
            "name": TOOL,
            "arguments": arguments,
            "_meta": { "progressToken": tag },
        },
    })
    .to_string()
}

/// A JSON-RPC id or progress token: a number or a string.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Scalar<'a> {
    /// A number (kept as JSON text would say it).
    Number(serde_json::Number),
    /// A string.
    #[serde(borrow)]
    Text(Cow<'a, str>),
}

impl Scalar<'_> {
    /// Whether this is the integer `n`.
    pub fn is_number(&self, n: u64) -> bool {
        matches!(self, Scalar::Number(x) if x.as_u64() == Some(n))
    }

    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Text(s) => Some(s),
            Scalar::Number(_) => None,
        }
    }
}

impl fmt::Display for Scalar<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Number(n) => write!(f, "{n}"),
            Scalar::Text(s) => write!(f, "{s:?}"),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    params: Option<ParamsWire<'a>>,
    #[serde(borrow, default)]
    result: Option<ResultWire<'a>>,
    #[serde(borrow, default)]
    error: Option<ErrorWire<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ParamsWire<'a> {
    #[serde(borrow, default)]
    progress_token: Option<Scalar<'a>>,
    #[serde(default)]
    progress: Option<f64>,
    #[serde(default)]
    total: Option<f64>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultWire<'a> {
    #[serde(borrow, default)]
    content: Option<Vec<ContentWire<'a>>>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(borrow, default)]
    server_info: Option<ServerInfoWire<'a>>,
    #[serde(borrow, default)]
    protocol_version: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct ContentWire<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct ServerInfoWire<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    version: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct ErrorWire<'a> {
    #[serde(default)]
    code: i64,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

/// What one SSE `data` (or JSON body) said.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    /// `notifications/progress`.
    Progress {
        /// Its `progressToken`.
        token: Option<Scalar<'a>>,
        /// Its `progress`.
        progress: Option<f64>,
        /// Its `total`.
        total: Option<f64>,
        /// Its `message`.
        message: Option<Cow<'a, str>>,
    },
    /// A successful response.
    Result {
        /// The request it answers.
        id: Option<Scalar<'a>>,
        /// The text of its first content block (tool results).
        text: Option<Cow<'a, str>>,
        /// `isError` of a tool result.
        is_error: bool,
        /// `serverInfo.name` and `.version` (initialize results).
        server: Option<(String, String)>,
        /// `protocolVersion` (initialize results).
        protocol_version: Option<Cow<'a, str>>,
    },
    /// An error response.
    Error {
        /// The request it answers.
        id: Option<Scalar<'a>>,
        /// Its code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// Any other notification (logging, list changes, …).
    Notification {
        /// Its method.
        method: Cow<'a, str>,
    },
    /// A request from the server (ping, sampling, …).
    Request {
        /// Its method.
        method: Cow<'a, str>,
    },
}

impl<'a> Message<'a> {
    /// Reads one JSON-RPC message.
    pub fn parse(data: &'a str) -> Result<Message<'a>, String> {
        let wire: Wire<'a> = serde_json::from_str(data).map_err(|e| e.to_string())?;
        if let Some(method) = wire.method {
            if method == "notifications/progress" {
                let p = wire.params.ok_or("progress notification without params")?;
                return Ok(Message::Progress {
                    token: p.progress_token,
                    progress: p.progress,
                    total: p.total,
                    message: p.message,
                });
            }
            return Ok(match wire.id {
                Some(_) => Message::Request { method },
                None => Message::Notification { method },
            });
        }
        if let Some(e) = wire.error {
            return Ok(Message::Error {
                id: wire.id,
                code: e.code,
                message: e.message.map(Cow::into_owned).unwrap_or_default(),
            });
        }
        if let Some(r) = wire.result {
            let text = r
                .content
                .and_then(|c| c.into_iter().find_map(|block| block.text));
            let server = r.server_info.map(|s| {
                (
                    s.name.map(Cow::into_owned).unwrap_or_default(),
                    s.version.map(Cow::into_owned).unwrap_or_default(),
                )
            });
            return Ok(Message::Result {
                id: wire.id,
                text,
                is_error: r.is_error.unwrap_or(false),
                server,
                protocol_version: r.protocol_version,
            });
        }
        Err("neither a request, a notification nor a response".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_reads_back_from_its_text() {
        let tag = Tag {
            run: 0xdead_beef,
            session: 12,
            call: 7,
        };
        assert_eq!(tag.to_string(), "Ldeadbeef.12.7");
        assert_eq!(Tag::parse(&tag.to_string()), Some(tag));
        assert_eq!(Tag::parse("Ldeadbeef.12"), None);
        assert_eq!(Tag::parse("Ldeadbeef.12.7.1"), None);
        assert_eq!(Tag::parse("7"), None);
    }

    #[test]
    fn progress_results_and_errors_are_told_apart() {
        let p = Message::parse(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":3,"total":5,"message":"m"}}"#,
        )
        .unwrap();
        assert_eq!(
            p,
            Message::Progress {
                token: Some(Scalar::Text("t".into())),
                progress: Some(3.0),
                total: Some(5.0),
                message: Some("m".into()),
            }
        );
        let r = Message::parse(
            r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"done \"x\""}]}}"#,
        )
        .unwrap();
        let Message::Result { id, text, .. } = r else {
            panic!("{r:?}")
        };
        assert!(id.unwrap().is_number(2));
        assert_eq!(text.as_deref(), Some("done \"x\""));
        let e =
            Message::parse(r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32600,"message":"no"}}"#)
                .unwrap();
        assert!(matches!(e, Message::Error { code: -32600, .. }));
        let n = Message::parse(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":1}}"#).unwrap();
        assert!(matches!(n, Message::Notification { .. }));
        assert!(Message::parse("{}").is_err());
        assert!(Message::parse("not json").is_err());
    }
}
