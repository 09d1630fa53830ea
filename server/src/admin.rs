//! The admin surface: metrics and policy control on their own port, behind
//! a bearer token.
//!
//! | route | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text ([`crate::metrics::render`]) |
//! | `GET /policy` | status JSON: live generation, recent generations, their counters |
//! | `POST /policy?name=NAME` | body = the plugin's `.wasm` bytes: load, validate, swap; 200 with the new generation, 422 with the load error or validation report |
//! | `POST /policy/rollback` | back to the previous good generation; 409 when there is none |
//! | `GET /healthz`, `GET /livez` | 200 `ok` while the process serves (no token: for probes) |
//! | `GET /readyz` | 200 `ready`, or 503 once shutdown has begun (no token) |
//!
//! Every other route answers 401 without `Authorization: Bearer <token>`. Uploads
//! over [`MAX_POLICY_BYTES`] get 413; nothing about the live policy changes
//! on any refusal. Loading and validating compile and run the candidate, so
//! they run on the blocking pool, never on the threads serving streams.
//!
//! With a [`PolicyStore`] ([`AdminState::with_store`]), every module swapped
//! in is also written to the policy directory and rollbacks are recorded
//! there, so the server restarts with the policy that was live; a push that
//! cannot be recorded is refused and changes nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rewind_engine::policy::wasm::{
    GenerationStatus, LoadError, PolicyHost, SwapError, ValidationFailure, ValidationReport,
};
use rewind_engine::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use subtle::ConstantTimeEq as _;
use tokio_util::sync::CancellationToken;

use crate::metrics::{render, state_label, ServerMetrics};
use crate::policy_store::{valid_name, PolicyStore, PushError};

/// Largest policy upload accepted (the plugins of this workspace are a few
/// KiB; a module this large is a mistake or an attack).
pub const MAX_POLICY_BYTES: usize = 16 << 20;

/// What the admin routes act on.
#[derive(Debug, Clone)]
pub struct AdminState {
    engine: Engine,
    host: Arc<PolicyHost>,
    metrics: Arc<ServerMetrics>,
    token: Arc<str>,
    store: Option<Arc<PolicyStore>>,
    shutdown: Option<CancellationToken>,
}

impl AdminState {
    /// The admin of `engine`, whose policy is `host` (the same host the
    /// engine was built with), with the transport's `metrics`, answering only
    /// requests that carry `token`.
    pub fn new(
        engine: Engine,
        host: Arc<PolicyHost>,
        metrics: Arc<ServerMetrics>,
        token: impl Into<Arc<str>>,
    ) -> AdminState {
        AdminState {
            engine,
            host,
            metrics,
            token: token.into(),
            store: None,
            shutdown: None,
        }
    }

    /// Also records every swap and rollback in `store` (the same host's
    /// policy directory; see [`crate::policy_store`]).
    pub fn with_store(mut self, store: Arc<PolicyStore>) -> AdminState {
        self.store = Some(store);
        self
    }

    /// Records an automatic rollback the host made since the last command,
    /// if any. Touches the disk only when the live generation changed.
    async fn sync_store(&self) -> Option<String> {
        let store = self.store.clone()?;
        let host = Arc::clone(&self.host);
        match tokio::task::spawn_blocking(move || store.sync(&host)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => {
                tracing::warn!("{e}");
                Some(e.to_string())
            }
            Err(join) => Some(format!("recording the live policy failed: {join}")),
        }
    }

    /// `GET /readyz` answers 503 once `shutdown` is cancelled.
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> AdminState {
        self.shutdown = Some(shutdown);
        self
    }
}

/// A fresh admin token: 32 lower-case hex characters from the OS's
/// random source.
pub fn generate_token() -> Result<String, std::io::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| std::io::Error::other(format!("cannot generate an admin token: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The admin routes: the health probes, and everything else behind the
/// bearer token.
pub fn router(state: AdminState) -> Router {
    let guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/policy", get(policy_status).post(policy_swap))
        .route("/policy/rollback", post(policy_rollback))
        .layer(DefaultBodyLimit::max(MAX_POLICY_BYTES))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(live))
        .route("/livez", get(live))
        .route("/readyz", get(ready))
        .merge(guarded)
        .with_state(state)
}

async fn live() -> &'static str {
    "ok\n"
}

async fn ready(State(state): State<AdminState>) -> Response {
    match &state.shutdown {
        Some(s) if s.is_cancelled() => {
            (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
        }
        _ => "ready\n".into_response(),
    }
}

async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(token) if bool::from(token.as_bytes().ct_eq(state.token.as_bytes())) => {
            next.run(request).await
        }
        _ => {
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this admin surface needs `Authorization: Bearer <token>` (the token `rewind serve` printed at start, or the one configured)".to_owned(),
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

fn error(status: StatusCode, kind: &str, message: String) -> Response {
    (status, Json(json!({ "error": kind, "message": message }))).into_response()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let body = render(
        &state.engine.metrics(),
        &state.host.status(),
        &state.metrics,
    );
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

fn generation_json(g: &GenerationStatus) -> Value {
    let s = &g.stats;
    json!({
        "generation": s.generation,
        "name": g.name,
        "state": state_label(g.state),
        "decisions": s.decisions,
        "faults": {
            "out_of_set": s.out_of_set,
            "trap": s.traps,
            "out_of_fuel": s.out_of_fuel,
            "timeout": s.timeouts,
            "unavailable": s.unavailable,
        },
        "fault_rate": s.fault_rate(),
        "instantiations": s.instantiations,
    })
}

async fn policy_status(State(state): State<AdminState>) -> Response {
    let store_error = state.sync_store().await;
    let status = state.host.status();
    let mut body = json!({
        "live": generation_json(&status.live),
        "generations": status.generations.iter().map(generation_json).collect::<Vec<_>>(),
        "swaps": status.swaps,
        "manual_rollbacks": status.manual_rollbacks,
        "automatic_rollbacks": status.automatic_rollbacks,
        "loads": {
            "loaded": status.loads.loaded,
            "refused": status.loads.refused,
            "compiler_failed": status.loads.compiler_failed,
            "seconds": status.loads.time.as_secs_f64(),
        },
    });
    if let Some(store) = &state.store {
        body["store"] = json!({
            "dir": store.dir().display().to_string(),
            "live_file": store.live_file().map(|f| f.display().to_string()),
            "error": store_error,
        });
    }
    Json(body).into_response()
}

/// Query of `POST /policy`.
#[derive(Debug, Deserialize)]
struct SwapQuery {
    name: Option<String>,
}

async fn policy_swap(
    State(state): State<AdminState>,
    query: Result<Query<SwapQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let name = match query {
        Ok(Query(SwapQuery { name: Some(name) })) if valid_name(&name) => name,
        Ok(Query(SwapQuery { name: None })) => "uploaded".to_owned(),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_name",
                "`name` must be 1 to 64 characters of A-Z, a-z, 0-9, `-`, `_` or `.`".to_owned(),
            )
        }
    };
    let wasm = match body {
        Ok(bytes) => bytes,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "policy upload is over the {} MiB limit",
                    MAX_POLICY_BYTES >> 20
                ),
            )
        }
        Err(rejection) => {
            return error(rejection.status(), "bad_body", rejection.body_text());
        }
    };
    if wasm.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "empty",
            "the request body is empty; send the plugin's .wasm bytes".to_owned(),
        );
    }
    if !wasm.starts_with(b"\0asm") {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "load",
            "the body is not a WebAssembly module (it does not start with `\\0asm`); send the \
             plugin's .wasm bytes"
                .to_owned(),
        );
    }
    let host = Arc::clone(&state.host);
    let store = state.store.clone();
    let outcome = tokio::task::spawn_blocking(move || match store {
        Some(store) => match store.push(&host, &name, &wasm) {
            Ok(pushed) => Ok((pushed.generation, Some(pushed.path))),
            Err(PushError::Load(e)) => Err(SwapRefusal::Load(e)),
            Err(PushError::Swap(e)) => Err(SwapRefusal::Swap(e)),
            Err(e) => Err(SwapRefusal::Store(e)),
        },
        None => {
            let module = host.load(&name, &wasm).map_err(SwapRefusal::Load)?;
            let generation = host.swap(&module).map_err(SwapRefusal::Swap)?;
            Ok((generation, None))
        }
    })
    .await;
    match outcome {
        Ok(Ok((generation, persisted))) => {
            let live = state.host.status().live;
            tracing::info!(generation, policy = %live.name, persisted = ?persisted, "policy swapped through the admin surface");
            let kept = match &persisted {
                Some(path) => format!("; kept in {} for restarts", path.display()),
                None => "; not kept across a restart (the server has no policy directory: \
                         --policy-dir / policy_dir)"
                    .to_owned(),
            };
            Json(json!({
                "generation": generation,
                "name": live.name,
                "persisted": persisted.map(|p| p.display().to_string()),
                "message": format!("policy `{}` passed validation and is live as generation {generation}{kept}", live.name),
            }))
            .into_response()
        }
        Ok(Err(SwapRefusal::Store(e))) => {
            let why = match e {
                PushError::Store(e) => e.to_string(),
                PushError::Name(name) => format!("`{name}` cannot name a policy file"),
                other => format!("{other:?}"),
            };
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store",
                format!("the policy could not be recorded, so it was not swapped in: {why}"),
            )
        }
        Ok(Err(SwapRefusal::Load(e))) => {
            if let LoadError::Compiler { .. } = e {
                // Not the module's fault alone: the child compiler could not
                // start, crashed or ran out of time. The operator reading
                // the server's log should hear of it, not only the pusher.
                tracing::warn!("policy push refused: {e}");
            }
            error(StatusCode::UNPROCESSABLE_ENTITY, "load", e.to_string())
        }
        Ok(Err(SwapRefusal::Swap(SwapError::Validation(report)))) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({
                "error": "validation",
                "message": describe_report(&report),
                "cases_run": report.cases_run,
                "cases_planned": report.cases_planned,
                "failed": report.failed,
                "failures": report.failures.iter().map(describe_failure).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
        Ok(Err(SwapRefusal::Swap(e))) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, "swap", e.to_string())
        }
        Err(join) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("loading the policy failed: {join}"),
        ),
    }
}

enum SwapRefusal {
    Load(rewind_engine::policy::wasm::LoadError),
    Swap(SwapError),
    Store(PushError),
}

async fn policy_rollback(State(state): State<AdminState>) -> Response {
    match state.host.rollback() {
        Ok(generation) => {
            let name = state.host.live_name();
            tracing::info!(generation, policy = %name, "policy rolled back through the admin surface");
            let kept = match (&state.store, state.sync_store().await) {
                (None, _) => String::new(),
                (Some(_), Some(e)) => format!(
                    "; WARNING: not recorded in the policy directory ({e}), a restart would bring back what was live before"
                ),
                (Some(store), None) => match store.live_file() {
                    Some(file) => format!("; recorded ({} is live for restarts)", file.display()),
                    None => "; recorded (the start policy is live for restarts)".to_owned(),
                },
            };
            Json(json!({
                "generation": generation,
                "name": name,
                "message": format!("rolled back; policy `{name}` is live as generation {generation}{kept}"),
            }))
            .into_response()
        }
        Err(e) => error(
            StatusCode::CONFLICT,
            "nothing_to_roll_back_to",
            e.to_string(),
        ),
    }
}

/// One line for a validation report: passed, or how many cases failed.
/// (The failures themselves: [`describe_failure`].)
pub fn describe_report(report: &ValidationReport) -> String {
    if report.passed() {
        report.to_string()
    } else {
        format!(
            "policy `{}` failed validation: {} of the {} cases run failed ({} planned)",
            report.policy, report.failed, report.cases_run, report.cases_planned
        )
    }
}

/// One line for a failed validation case: the row, and what the candidate
/// did, without wasmtime's backtrace.
pub fn describe_failure(failure: &ValidationFailure) -> String {
    let facts = &failure.facts;
    let session = facts
        .session_fact()
        .map_or_else(|| format!("code {}", facts.session), |s| format!("{s:?}"));
    let cursor = facts
        .cursor_fact()
        .map_or_else(|| format!("code {}", facts.cursor), |c| format!("{c:?}"));
    let what = match failure.code {
        Some(code) => match rewind_engine::Verdict::from_code(code) {
            Some(v) => format!("answered {v:?}"),
            None => format!("answered code {code} (no such verdict)"),
        },
        None => failure.fault.to_string(),
    };
    let detail = failure.detail.lines().last().unwrap_or("");
    let detail = detail
        .find("wasm trap:")
        .map_or(detail, |at| &detail[at..])
        .trim();
    if detail.is_empty() {
        format!("session={session} cursor={cursor}: {what}")
    } else {
        format!("session={session} cursor={cursor}: {what} ({detail})")
    }
}
