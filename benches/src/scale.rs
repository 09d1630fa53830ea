//! How big the benches are: full size under `cargo bench`, tiny under
//! `cargo test --benches` / `-- --test`, so CI can run every body quickly.

use std::time::Duration;

/// Sizes and criterion settings for one run.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Sessions in the replay and resume groups (100 000 for real runs).
    pub sessions: usize,
    /// Whether criterion runs each bench once (test mode).
    pub test_mode: bool,
}

impl Scale {
    /// The scale for this process, from its arguments (criterion's own rule:
    /// without `--bench`, or with `--test`, it is a test run) and the
    /// `REWIND_BENCH_SESSIONS` override.
    pub fn from_env() -> Scale {
        let args: Vec<String> = std::env::args().collect();
        let bench = args.iter().any(|a| a == "--bench");
        let test_mode = !bench || args.iter().any(|a| a == "--test" || a == "--list");
        let sessions = std::env::var("REWIND_BENCH_SESSIONS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(if test_mode { 500 } else { 100_000 });
        Scale {
            sessions,
            test_mode,
        }
    }

    /// Warm-up per bench: short, the whole run must fit in ~6 minutes.
    pub fn warm_up(&self) -> Duration {
        Duration::from_millis(500)
    }

    /// Measurement time per bench.
    pub fn measurement(&self) -> Duration {
        Duration::from_millis(2500)
    }
}

/// Whether a bench whose full id contains `id` may run under the filter
/// given on the command line (criterion filters by regex; this is a
/// substring check used only to skip building data nobody will measure).
pub fn selected(id: &str) -> bool {
    let mut skip_next = false;
    let mut filters = Vec::new();
    for a in std::env::args().skip(1) {
        if skip_next {
            skip_next = false;
            continue;
        }
        if a.starts_with('-') {
            // Options of criterion's CLI that take a value.
            skip_next = matches!(
                a.as_str(),
                "--save-baseline"
                    | "--baseline"
                    | "--load-baseline"
                    | "--sample-size"
                    | "--warm-up-time"
                    | "--measurement-time"
                    | "--nresamples"
                    | "--noise-threshold"
                    | "--confidence-level"
                    | "--significance-level"
                    | "--profile-time"
                    | "--output-format"
                    | "--color"
                    | "--format"
                    | "--plotting-backend"
            );
            continue;
        }
        filters.push(a);
    }
    filters.is_empty()
        || filters
            .iter()
            .any(|f| id.contains(f.as_str()) || f.contains(id))
}
