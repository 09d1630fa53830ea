//! Fuzzes the event-id and session-id parsers: no input panics, and any
//! input that parses is exactly the canonical spelling of what it parsed to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_engine::{EventId, SessionId};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = EventId::parse(s) {
        assert_eq!(id.to_string(), s);
    }
    if let Ok(id) = SessionId::parse(s) {
        assert_eq!(id.to_string(), s);
    }
});
