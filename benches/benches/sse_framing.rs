//! SSE framing: Rewind's hand-written event frames against axum's
//! `response::sse`, both through an axum body collected to bytes.
//!
//! ```text
//! cargo bench -p rewind-benches --bench sse_framing
//! ```
//!
//! Each iteration frames 1000 events (id + one JSON payload line) and
//! collects the response body: a 150-byte progress notification (the
//! common case) and a 16 KiB tool result.

use std::convert::Infallible;

use axum::body::Body;
use axum::response::sse::{Event, Sse};
use axum::response::IntoResponse;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rewind_engine::{Config, Engine};
use rewind_server::mcp::bench_support::event_frame;

const EVENTS: usize = 1000;

fn payloads() -> Vec<(&'static str, String)> {
    let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok-17","progress":42.0,"total":100.0,"message":"load step 42/100"}}"#.to_owned();
    let text = "x".repeat(16 * 1024 - 64);
    let result = format!(
        r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}"#
    );
    vec![("progress_150B", progress), ("result_16KiB", result)]
}

fn sse_framing(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let engine = Engine::new(Config::default()).expect("engine");
    let session = engine.open(None).expect("session");
    let stream = session.new_stream().expect("stream");
    let id = session.append(stream, b"{}").expect("append");
    let mut group = c.benchmark_group("sse_framing");
    group.throughput(Throughput::Elements(EVENTS as u64));
    for (name, payload) in payloads() {
        let payload: std::sync::Arc<str> = payload.into();
        group.bench_function(BenchmarkId::new("rewind", name), |b| {
            b.iter(|| {
                let p = payload.clone();
                rt.block_on(async move {
                    let frames = futures::stream::iter(
                        (0..EVENTS)
                            .map(move |_| Ok::<_, Infallible>(event_frame(id, p.as_bytes()))),
                    );
                    axum::body::to_bytes(Body::from_stream(frames), usize::MAX)
                        .await
                        .expect("body")
                        .len()
                })
            })
        });
        group.bench_function(BenchmarkId::new("axum_sse", name), |b| {
            b.iter(|| {
                let p = payload.clone();
                rt.block_on(async move {
                    let events = futures::stream::iter((0..EVENTS).map(move |_| {
                        Ok::<_, Infallible>(Event::default().id(id.to_string()).data(&*p))
                    }));
                    let body = Sse::new(events).into_response().into_body();
                    axum::body::to_bytes(body, usize::MAX)
                        .await
                        .expect("body")
                        .len()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, sse_framing);
criterion_main!(benches);
