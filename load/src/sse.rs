//! An incremental `text/event-stream` parser that keeps what a verifier
//! needs and a browser's `EventSource` throws away.
//!
//! It follows the WHATWG HTML "event stream interpretation" rules: lines end
//! in CRLF, LF or CR (a CRLF split across two chunks counts once); a line
//! starting with `:` is a comment; `field: value` loses one leading space of
//! its value; a blank line ends the event. Unlike `EventSource` it hands
//! back *every* block that set a field, including the ones the standard
//! does not dispatch: a priming event (`id` with empty `data`) carries the
//! cursor a client must resume from, and a bare `retry:` block is still
//! something the server said. Each event keeps the `id` field of its own
//! block (`None` when the block had none), so a verifier can tell which
//! events the server made resumable; the caller keeps the last one as its
//! cursor, as `EventSource`'s `lastEventId` does.

/// One event of the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `id` field of this block, if it had one (an empty `id:` resets
    /// the cursor and is kept as `Some("")`).
    pub id: Option<String>,
    /// The `event` field; `None` means the default type, `message`.
    pub event: Option<String>,
    /// The `data` lines joined with `\n`; empty for priming events.
    pub data: String,
    /// Whether the block had at least one `data` field.
    pub has_data: bool,
    /// The `retry` field in milliseconds, if it was a valid number.
    pub retry: Option<u64>,
}

impl SseEvent {
    /// Whether this is an event carrying a message (a `data` field with
    /// something in it), as opposed to a priming event or a `retry` hint.
    pub fn carries_data(&self) -> bool {
        self.has_data && !self.data.is_empty()
    }

    /// The event type, `message` when the block named none.
    pub fn kind(&self) -> &str {
        self.event.as_deref().unwrap_or("message")
    }
}

/// Parses a byte stream fed in arbitrary chunks.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, unfinished line.
    line: Vec<u8>,
    /// The previous chunk ended in CR: a LF starting this one belongs to it.
    after_cr: bool,
    /// The event being built.
    current: SseEvent,
    /// Whether any field was set since the last blank line.
    dirty: bool,
    /// Bytes consumed so far (for evidence).
    consumed: u64,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Bytes fed so far.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Feeds the next chunk, appending each event it completes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) {
        self.consumed += chunk.len() as u64;
        let mut rest = chunk;
        if self.after_cr {
            self.after_cr = false;
            if let [b'\n', tail @ ..] = rest {
                rest = tail;
            }
        }
        while let Some(at) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&rest[..at]);
            let ended_by_cr = rest[at] == b'\r';
            rest = &rest[at + 1..];
            if ended_by_cr {
                match rest {
                    [b'\n', tail @ ..] => rest = tail,
                    [] => self.after_cr = true,
                    _ => {}
                }
            }
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, out);
        }
        self.line.extend_from_slice(rest);
    }

    /// Whether the stream stopped in the middle of an event (bytes of a
    /// line or fields not yet ended by a blank line).
    pub fn has_partial_event(&self) -> bool {
        self.dirty || !self.line.is_empty()
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.dirty {
                out.push(std::mem::take(&mut self.current));
                self.dirty = false;
            }
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match name {
            b"data" => {
                if self.current.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(&value);
                self.current.has_data = true;
            }
            b"id" => {
                // The standard ignores ids containing NUL.
                if value.contains('\0') {
                    return;
                }
                self.current.id = Some(value.into_owned());
            }
            b"event" => self.current.event = Some(value.into_owned()),
            b"retry" => {
                if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                    self.current.retry = value.parse().ok();
                }
            }
            _ => return,
        }
        self.dirty = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chunks(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        out
    }

    #[test]
    fn a_priming_event_keeps_its_id_though_its_data_is_empty() {
        let events = parse_chunks(&[b"id: a-1\nretry: 1000\ndata: \n\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id.as_deref(), Some("a-1"));
        assert_eq!(events[0].retry, Some(1000));
        assert!(events[0].has_data);
        assert!(!events[0].carries_data());
    }

    #[test]
    fn events_split_at_every_byte_parse_the_same() {
        let stream: &[u8] =
            b": keep-alive\n\nid: 7\nevent: gap\ndata: {\"a\":1}\r\ndata: x\r\n\r\nid: 8\rdata:y\r\r";
        let whole = parse_chunks(&[stream]);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(parse_chunks(&bytes), whole);
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].kind(), "gap");
        assert_eq!(whole[0].data, "{\"a\":1}\nx");
        assert_eq!(whole[1].id.as_deref(), Some("8"));
        assert_eq!(whole[1].data, "y");
    }

    #[test]
    fn comments_and_unknown_fields_make_no_event() {
        let events = parse_chunks(&[b": ping\n\nfoo: bar\n\n"]);
        assert!(events.is_empty());
    }

    #[test]
    fn a_block_without_id_has_none_and_a_bad_retry_is_ignored() {
        let events = parse_chunks(&[b"retry: 12x\ndata: hello\n\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, None);
        assert_eq!(events[0].retry, None);
        assert_eq!(events[0].data, "hello");
    }

    #[test]
    fn a_stream_cut_mid_event_reports_the_partial_event() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(b"id: 1\ndata: par", &mut out);
        assert!(out.is_empty());
        assert!(p.has_partial_event());
        p.feed(b"tial\n\n", &mut out);
        assert_eq!(out[0].data, "partial");
        assert!(!p.has_partial_event());
    }
}
