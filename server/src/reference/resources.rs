//! The reference server's resources: two static ones (text and binary), a
//! watched one whose content changes with `touch_resource`, and the
//! template `test://template/{id}/data`.

use rmcp::model::{Resource, ResourceContents, ResourceTemplate};
use rmcp::ErrorData as McpError;
use serde_json::json;

use super::RED_PIXEL_PNG;

/// The static text resource.
pub const STATIC_TEXT: &str = "test://static-text";
/// The static binary resource (a PNG).
pub const STATIC_BINARY: &str = "test://static-binary";
/// The resource `touch_resource` changes; subscribe to it to be notified.
pub const WATCHED: &str = "test://watched-resource";
/// The URI template.
pub const TEMPLATE: &str = "test://template/{id}/data";

const TEMPLATE_PREFIX: &str = "test://template/";
const TEMPLATE_SUFFIX: &str = "/data";

/// Every direct resource (templates: [`templates`]).
pub fn list() -> Vec<Resource> {
    let resource = |uri: &str, name: &str, description: &str, mime: &str| {
        Resource::new(uri, name)
            .with_description(description)
            .with_mime_type(mime)
    };
    vec![
        resource(
            STATIC_TEXT,
            "static-text",
            "A text resource that never changes",
            "text/plain",
        ),
        resource(
            STATIC_BINARY,
            "static-binary",
            "A 1x1 PNG image",
            "image/png",
        ),
        resource(
            WATCHED,
            "watched-resource",
            "A text resource that changes on every touch_resource call; subscribe to be notified",
            "text/plain",
        ),
    ]
}

/// Every resource template.
pub fn templates() -> Vec<ResourceTemplate> {
    vec![ResourceTemplate::new(TEMPLATE, "template-data")
        .with_description("JSON data for the id in the URI")
        .with_mime_type("application/json")]
}

/// The `{id}` of a URI of the template, if `uri` is one.
fn template_id(uri: &str) -> Option<&str> {
    let id = uri
        .strip_prefix(TEMPLATE_PREFIX)?
        .strip_suffix(TEMPLATE_SUFFIX)?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// `Ok` if `uri` names a resource of this server.
pub fn check_known(uri: &str) -> Result<(), McpError> {
    match uri {
        STATIC_TEXT | STATIC_BINARY | WATCHED => Ok(()),
        _ if template_id(uri).is_some() => Ok(()),
        _ => Err(not_found(uri)),
    }
}

fn not_found(uri: &str) -> McpError {
    McpError::resource_not_found(format!("no resource {uri}"), Some(json!({ "uri": uri })))
}

/// The contents of `uri`; the watched resource is at `revision`.
pub fn read(uri: &str, revision: u64) -> Result<rmcp::model::ReadResourceResult, McpError> {
    let contents = match uri {
        STATIC_TEXT => {
            ResourceContents::text("This is the content of the static text resource.", uri)
                .with_mime_type("text/plain")
        }
        STATIC_BINARY => ResourceContents::blob(RED_PIXEL_PNG, uri).with_mime_type("image/png"),
        WATCHED => ResourceContents::text(format!("Watched resource, revision {revision}."), uri)
            .with_mime_type("text/plain"),
        _ => {
            let id = template_id(uri).ok_or_else(|| not_found(uri))?;
            ResourceContents::text(
                json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                    .to_string(),
                uri,
            )
            .with_mime_type("application/json")
        }
    };
    Ok(rmcp::model::ReadResourceResult::new(vec![contents]))
}

/// Completions for argument `name` of resource template `uri`, starting
/// with `prefix`.
pub fn complete(uri: &str, name: &str, prefix: &str) -> Vec<String> {
    if uri != TEMPLATE || name != "id" {
        return Vec::new();
    }
    ["1", "42", "123"]
        .into_iter()
        .filter(|v| v.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_ids_are_exactly_one_segment() {
        assert_eq!(template_id("test://template/123/data"), Some("123"));
        for bad in [
            "test://template//data",
            "test://template/1/2/data",
            "test://template/123",
            "test://other/123/data",
        ] {
            assert_eq!(template_id(bad), None, "{bad}");
            assert!(read(bad, 0).is_err(), "{bad}");
        }
        let r = read("test://template/7/data", 0).unwrap();
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("Data for ID: 7"), "{text}");
    }
}
