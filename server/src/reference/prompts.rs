//! The reference server's prompts, and completion of their arguments.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ContentBlock, PromptMessage, ResourceContents, Role};
use rmcp::{prompt, prompt_router};
use serde::Deserialize;

use super::{ReferenceServer, RED_PIXEL_PNG};

/// Arguments of `test_prompt_with_arguments`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct PromptArgs {
    /// First test argument
    pub arg1: String,
    /// Second test argument
    pub arg2: String,
}

/// Arguments of `test_prompt_with_embedded_resource`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct EmbeddedResourceArgs {
    /// URI of the resource to embed
    #[serde(rename = "resourceUri")]
    pub resource_uri: String,
}

#[prompt_router(vis = "pub(super)")]
#[allow(
    missing_docs,
    reason = "the prompt macros generate public attribute functions; the prompts are documented by their descriptions"
)]
impl ReferenceServer {
    #[prompt(description = "A simple prompt without arguments")]
    async fn test_simple_prompt(&self) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            "This is a simple prompt for testing.",
        )]
    }

    #[prompt(description = "A prompt that substitutes its two arguments")]
    async fn test_prompt_with_arguments(
        &self,
        Parameters(args): Parameters<PromptArgs>,
    ) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Prompt with arguments: arg1='{}', arg2='{}'",
                args.arg1, args.arg2
            ),
        )]
    }

    #[prompt(description = "A prompt that embeds the resource named by its argument")]
    async fn test_prompt_with_embedded_resource(
        &self,
        Parameters(args): Parameters<EmbeddedResourceArgs>,
    ) -> Vec<PromptMessage> {
        vec![
            PromptMessage::new(
                Role::User,
                ContentBlock::resource(
                    ResourceContents::text(
                        "Embedded resource content for testing.",
                        args.resource_uri,
                    )
                    .with_mime_type("text/plain"),
                ),
            ),
            PromptMessage::new_text(Role::User, "Please process the embedded resource above."),
        ]
    }

    #[prompt(description = "A prompt with an image")]
    async fn test_prompt_with_image(&self) -> Vec<PromptMessage> {
        vec![
            PromptMessage::new(Role::User, ContentBlock::image(RED_PIXEL_PNG, "image/png")),
            PromptMessage::new_text(Role::User, "Please analyze the image above."),
        ]
    }
}

/// Completions for argument `name` of prompt `prompt`, starting with `prefix`.
pub fn complete(prompt: &str, name: &str, prefix: &str) -> Vec<String> {
    let candidates: &[&str] = match (prompt, name) {
        ("test_prompt_with_arguments", "arg1" | "arg2") => {
            &["paris", "park", "party", "test", "testValue1", "testValue2"]
        }
        ("test_prompt_with_embedded_resource", "resourceUri") => &[
            "test://static-text",
            "test://static-binary",
            "test://watched-resource",
        ],
        _ => &[],
    };
    candidates
        .iter()
        .filter(|c| c.starts_with(prefix))
        .map(|c| (*c).to_owned())
        .collect()
}
