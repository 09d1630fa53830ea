//! The sample `rewind.toml` at the repository root, read by the real
//! settings loader: it loads, it changes nothing as it stands, every key
//! it shows commented out is a real key with a valid example, and it shows
//! every key the loader accepts.

use std::collections::BTreeSet;
use std::path::PathBuf;

use rewind_engine::Config;
use rewind_server::mcp::McpOptions;
use rewind_server::settings::{
    ClusterFileSettings, EngineFileSettings, FileSettings, HttpFileSettings, LogFormat, ServeArgs,
    Settings, DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN,
};
use serde_aux::serde_introspection::serde_introspect;

fn sample_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rewind.toml")
}

fn sample() -> String {
    std::fs::read_to_string(sample_path()).expect("rewind.toml at the repository root")
}

/// A commented-out `# key = value` line, as (key, the line uncommented).
fn commented_key(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix('#')?.trim_start();
    let (key, _) = rest.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .then_some((key, rest))
}

/// The sample with every commented-out key line uncommented.
fn everything_set() -> String {
    sample()
        .lines()
        .map(|line| commented_key(line).map_or(line, |(_, uncommented)| uncommented))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Keys the sample shows, commented out or not, as `table.key` / `key`.
fn keys_shown() -> BTreeSet<String> {
    let mut table = String::new();
    let mut keys = BTreeSet::new();
    for line in sample().lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            table = format!("{name}.");
            keys.insert(name.to_owned());
        } else if let Some((key, _)) = commented_key(line) {
            keys.insert(format!("{table}{key}"));
        } else if let Some((key, _)) = line.split_once('=').filter(|_| !line.starts_with('#')) {
            keys.insert(format!("{table}{}", key.trim()));
        }
    }
    keys
}

#[test]
fn the_sample_loads_and_as_it_stands_is_the_defaults() {
    let path = sample_path();
    let file = FileSettings::load(&path).unwrap();
    let settings =
        Settings::resolve_with_file(&ServeArgs::default(), None, file, Some(&path)).unwrap();
    let defaults = Config::default();
    assert_eq!(settings.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(settings.admin_listen.to_string(), DEFAULT_ADMIN_LISTEN);
    assert!(settings.admin_token.is_none());
    assert!(settings.policy.is_none() && settings.policy_dir.is_none());
    assert_eq!(settings.log_format, LogFormat::default());
    let http = McpOptions::default();
    assert!(settings.http.allowed_hosts.is_none() && settings.http.allowed_origins.is_none());
    assert_eq!(settings.http.cors, http.cors);
    assert_eq!(settings.http.json_response, http.json_response);
    assert_eq!(settings.http.max_body_bytes, http.max_body_bytes);
    assert_eq!(settings.http.max_header_bytes, http.max_header_bytes);
    assert_eq!(settings.engine.session_events, defaults.session_events);
    assert_eq!(settings.engine.session_bytes, defaults.session_bytes);
    assert_eq!(
        settings.engine.reader_hold_bytes,
        defaults.reader_hold_bytes
    );
    assert_eq!(settings.engine.global_bytes, defaults.global_bytes);
    assert_eq!(
        settings.engine.max_segment_bytes,
        defaults.max_segment_bytes
    );
    assert_eq!(settings.engine.max_event_bytes, defaults.max_event_bytes);
    assert_eq!(settings.engine.max_sessions, defaults.max_sessions);
    assert_eq!(
        settings.engine.max_sessions_per_principal,
        defaults.max_sessions_per_principal
    );
    assert_eq!(settings.engine.idle_ttl, defaults.idle_ttl);
    assert_eq!(settings.engine.max_resume_age, defaults.max_resume_age);
}

#[test]
fn every_commented_out_example_is_a_valid_setting() {
    let path = sample_path();
    let text = everything_set();
    let mut file = FileSettings::parse(&text, &path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(file.admin_token.is_some() && file.policy.is_some() && file.policy_dir.is_some());
    assert!(file.engine.max_resume_age_secs.is_some());
    // Cluster mode and a data directory exclude each other (the sample
    // says so): each is checked without the other.
    assert!(file.cluster.redis.is_some() && file.engine.data_dir.is_some());
    let mut clustered = FileSettings::parse(&text, &path).unwrap();
    clustered.engine.data_dir = None;
    let c = Settings::resolve_with_file(&ServeArgs::default(), None, clustered, Some(&path))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.cluster.and_then(|c| c.node_id), Some(1));
    file.cluster = Default::default();
    let settings = Settings::resolve_with_file(&ServeArgs::default(), None, file, Some(&path))
        .unwrap_or_else(|e| panic!("{e}"));
    // Relative paths are taken from the file's directory.
    let root = path.parent().unwrap();
    assert_eq!(
        settings.policy.as_deref(),
        Some(root.join("policies/strict.wasm").as_path())
    );
    assert_eq!(
        settings.policy_dir.as_deref(),
        Some(root.join("policies/live").as_path())
    );
}

#[test]
fn the_sample_shows_every_key_the_loader_accepts() {
    let mut accepted: BTreeSet<String> = serde_introspect::<FileSettings>()
        .iter()
        .map(|k| (*k).to_owned())
        .collect();
    accepted.extend(
        serde_introspect::<EngineFileSettings>()
            .iter()
            .map(|k| format!("engine.{k}")),
    );
    accepted.extend(
        serde_introspect::<HttpFileSettings>()
            .iter()
            .map(|k| format!("http.{k}")),
    );
    accepted.extend(
        serde_introspect::<ClusterFileSettings>()
            .iter()
            .map(|k| format!("cluster.{k}")),
    );
    assert!(accepted.len() >= 11, "introspection found {accepted:?}");
    assert_eq!(keys_shown(), accepted);
}
