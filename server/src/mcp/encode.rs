//! Outgoing messages as the bytes an event stores.
//!
//! rmcp serialises a notification's `params` through a `serde_json::Value`
//! (to merge `_meta`): a map, a string per key and a buffer that grows
//! several times — about ten allocations for one progress notification,
//! the message a long tool call sends most. [`encode`] writes a progress
//! notification without `_meta` straight into the caller's buffer, the same
//! bytes rmcp writes (keys in the map's sorted order; numbers and strings by
//! serde_json's own serialisers; a test holds the two equal), and leaves
//! every other message to rmcp's `Serialize`.

use std::io::Write as _;

use rmcp::model::{
    JsonRpcMessage, MetaObject, NotificationMetaObject, NumberOrString, ProgressNotificationParam,
    ServerJsonRpcMessage, ServerNotification,
};

/// Appends `msg`'s JSON to `out`.
pub(crate) fn encode(msg: &ServerJsonRpcMessage, out: &mut Vec<u8>) -> serde_json::Result<()> {
    if let JsonRpcMessage::Notification(n) = msg {
        if let ServerNotification::ProgressNotification(p) = &n.notification {
            let no_meta = p.params.meta.is_none()
                && p.extensions.get::<NotificationMetaObject>().is_none()
                && p.extensions.get::<MetaObject>().is_none();
            if no_meta {
                return progress(&p.params, out);
            }
        }
    }
    serde_json::to_writer(out, msg)
}

/// A progress notification without `_meta`.
fn progress(p: &ProgressNotificationParam, out: &mut Vec<u8>) -> serde_json::Result<()> {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"#);
    // The keys in the order of the map rmcp serialises through (sorted).
    if let Some(message) = &p.message {
        out.extend_from_slice(br#""message":"#);
        serde_json::to_writer(&mut *out, message)?;
        out.push(b',');
    }
    out.extend_from_slice(br#""progress":"#);
    serde_json::to_writer(&mut *out, &p.progress)?;
    out.extend_from_slice(br#","progressToken":"#);
    match &p.progress_token.0 {
        NumberOrString::Number(n) => {
            // Infallible on a Vec.
            let _ = write!(out, "{n}");
        }
        NumberOrString::String(s) => serde_json::to_writer(&mut *out, &**s)?,
    }
    if let Some(total) = p.total {
        out.extend_from_slice(br#","total":"#);
        serde_json::to_writer(&mut *out, &total)?;
    }
    out.extend_from_slice(b"}}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rmcp::model::{
        JsonObject, Notification, NumberOrString, ProgressNotificationParam, ProgressToken,
        ServerJsonRpcMessage, ServerNotification,
    };

    use super::encode;

    fn message(p: ProgressNotificationParam) -> ServerJsonRpcMessage {
        ServerJsonRpcMessage::notification(ServerNotification::ProgressNotification(
            Notification::new(p),
        ))
    }

    fn float() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            (0u32..1000).prop_map(f64::from),
            Just(0.0),
            Just(-0.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(1e300),
            Just(5e-324),
        ]
    }

    fn token() -> impl Strategy<Value = NumberOrString> {
        prop_oneof![
            any::<i64>().prop_map(NumberOrString::Number),
            any::<String>().prop_map(|s| NumberOrString::String(s.into())),
            Just(NumberOrString::String(
                "\"\\\u{0}\u{1f}\u{7f}é😀</script>".into()
            )),
        ]
    }

    proptest! {
        #[test]
        fn a_progress_notification_is_the_bytes_rmcp_writes(
            token in token(),
            progress in float(),
            total in proptest::option::of(float()),
            text in proptest::option::of(any::<String>()),
        ) {
            let mut p = ProgressNotificationParam::new(ProgressToken(token), progress);
            p.total = total;
            p.message = text;
            let msg = message(p);
            let mut ours = b"kept".to_vec();
            encode(&msg, &mut ours).unwrap();
            prop_assert_eq!(&ours[..4], b"kept", "appends, never clears");
            let theirs = serde_json::to_vec(&msg).unwrap();
            prop_assert_eq!(
                String::from_utf8_lossy(&ours[4..]),
                String::from_utf8_lossy(&theirs)
            );
        }
    }

    #[test]
    fn a_notification_with_meta_is_left_to_rmcp_and_keeps_it() {
        let mut meta = JsonObject::new();
        meta.insert("trace".into(), serde_json::json!("abc"));
        let mut p = ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(7)), 0.5);
        p.meta = Some(meta.into());
        let msg = message(p);
        let mut ours = Vec::new();
        encode(&msg, &mut ours).unwrap();
        assert_eq!(ours, serde_json::to_vec(&msg).unwrap());
        let v: serde_json::Value = serde_json::from_slice(&ours).unwrap();
        assert_eq!(v["params"]["_meta"]["trace"], "abc");
    }

    #[test]
    fn other_messages_are_rmcp_s_bytes() {
        let msg = ServerJsonRpcMessage::notification(
            ServerNotification::ToolListChangedNotification(Default::default()),
        );
        let mut ours = Vec::new();
        encode(&msg, &mut ours).unwrap();
        assert_eq!(ours, serde_json::to_vec(&msg).unwrap());
    }
}
