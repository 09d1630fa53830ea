//! The resume decision through the WebAssembly policy host, against its
//! baselines in the same run, on the same facts:
//!
//! - `policy_decision/wasm_default`: the default plugin through
//!   [`PolicyHost`] (thread-cached instance, one typed call).
//! - `policy_decision/native`: the same table in Rust ([`NativePolicy`]).
//! - `policy_decision/wasm_floor`: the `empty` fixture through the same host
//!   path: facts copy, fuel and deadline re-arm, one typed call to a
//!   function that returns a constant. The target (`docs/performance.md`):
//!   `wasm_default` ≤ 2× this.
//! - `whole_resume/{wasm_default,native}`: a whole `Engine::resume` for an
//!   in-window cursor — session lookup, facts, decision, clamp — plus the
//!   first replayed event, with the policy through the host and native.
//!   The target (`docs/performance.md`): wasm ≤ 1.5× native.
//! - `policy_swap/*`: publishing a generation (validated or not), and the
//!   first decision after a swap (which instantiates on this thread).
//!
//! After criterion, a short run prints decision latency percentiles while
//! another thread swaps 100 times a second.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use rewind_engine::policy::wasm::{plugins, vectors, PolicyHost, PolicyHostConfig};
use rewind_engine::policy::{NativePolicy, Policy, ResumeFacts};
use rewind_engine::{Config, Engine, ResumeAction, ResumeRequest};

/// Facts every decision bench cycles through (a power of two).
const FACTS: usize = 1024;

fn facts() -> Vec<ResumeFacts> {
    let mut facts = vectors::decision_table();
    facts.extend(vectors::RandomFacts::new(0xBE7C).take(FACTS - facts.len()));
    facts
}

/// One decision per iteration, cycling through `facts`.
fn decide_body(policy: &dyn Policy, facts: &[ResumeFacts], b: &mut criterion::Bencher<'_>) {
    let mut i = 0usize;
    b.iter(|| {
        let answer = policy.decide(black_box(&facts[i & (FACTS - 1)]));
        i = i.wrapping_add(1);
        black_box(answer)
    });
}

fn decision(c: &mut Criterion) {
    let facts = facts();
    let wasm_default = PolicyHost::with_default_policy().expect("default policy");
    let floor = PolicyHost::with_policy(
        PolicyHostConfig::default(),
        "empty",
        plugins::fixtures::EMPTY,
    )
    .expect("empty fixture");
    let mut group = c.benchmark_group("policy_decision");
    group.throughput(Throughput::Elements(1));
    group.bench_function("wasm_default", |b| decide_body(&wasm_default, &facts, b));
    group.bench_function("native", |b| decide_body(&NativePolicy, &facts, b));
    group.bench_function("wasm_floor", |b| decide_body(&floor, &facts, b));
    group.finish();
}

fn swap(c: &mut Criterion) {
    let host = PolicyHost::with_default_policy().expect("default policy");
    let default = host.load("default", plugins::DEFAULT).expect("default");
    let strict = host.load("strict", plugins::STRICT).expect("strict");
    let facts = facts();
    let mut group = c.benchmark_group("policy_swap");
    let mut flip = false;
    let mut next = || {
        flip = !flip;
        if flip {
            strict.clone()
        } else {
            default.clone()
        }
    };
    group.bench_function("swap_validated", |b| {
        b.iter(|| host.swap(&next()).expect("valid"))
    });
    group.bench_function("swap_unvalidated", |b| {
        b.iter(|| host.swap_unvalidated(&next()).expect("ours"))
    });
    group.bench_function("swap_then_first_decision", |b| {
        b.iter(|| {
            host.swap_unvalidated(&next()).expect("ours");
            black_box(host.decide(&facts[0]))
        })
    });
    group.finish();
}

/// Decision latency percentiles on one thread while another swaps 100
/// times a second (validated swaps).
fn latency_during_swaps() {
    const RUN: Duration = Duration::from_secs(2);
    let host = Arc::new(PolicyHost::with_default_policy().expect("default policy"));
    let strict = host.load("strict", plugins::STRICT).expect("strict");
    let default = host.load("default", plugins::DEFAULT).expect("default");
    let facts = facts();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (host, stop) = (host.clone(), stop.clone());
        thread::spawn(move || {
            let mut swaps = 0u32;
            let began = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                host.swap(if swaps.is_multiple_of(2) {
                    &strict
                } else {
                    &default
                })
                .expect("valid");
                swaps += 1;
                let due = began + Duration::from_millis(10) * swaps;
                thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            swaps
        })
    };
    let mut samples = Vec::with_capacity(1 << 22);
    let (mut faults, began) = (0u64, Instant::now());
    let mut i = 0usize;
    while began.elapsed() < RUN {
        let t = Instant::now();
        let answer = host.decide(black_box(&facts[i & (FACTS - 1)]));
        samples.push(t.elapsed().as_nanos() as u64);
        faults += u64::from(answer.fault.is_some());
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().expect("swapper");
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!(
        "policy_decision_during_swaps: {} decisions, {swaps} swaps in {RUN:?}, {faults} faults; \
         p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
        samples.len(),
        pct(0.50),
        pct(0.99),
        pct(0.999),
        samples[samples.len() - 1]
    );
}

/// One resume of the last 8 events of a 64-event stream, and the first
/// replayed event, through `engine`.
fn resume_body(engine: &Engine, b: &mut criterion::Bencher<'_>) {
    let session = engine.open(None).expect("open");
    let stream = session.new_stream().expect("stream");
    let ids: Vec<_> = (0..64)
        .map(|i| {
            session
                .append(
                    stream,
                    format!("event {i:03} ......................................................")
                        .as_bytes(),
                )
                .expect("append")
        })
        .collect();
    let sid = session.id().to_string();
    let cursor = ids[55].to_string();
    let mut buf = Vec::with_capacity(256);
    b.iter(|| {
        let d = engine.resume(ResumeRequest {
            session_id: Some(black_box(&sid)),
            last_event_id: Some(black_box(&cursor)),
            principal: None,
        });
        let ResumeAction::Replay(mut replay) = d.action else {
            panic!("expected a replay, got {:?}", d.verdict)
        };
        black_box(replay.next_into(&mut buf).expect("in window"))
    });
}

fn whole_resume(c: &mut Criterion) {
    let mut config = Config::default();
    config.session_events = 64;
    let native = Engine::new(config.clone()).expect("engine");
    let host = PolicyHost::with_default_policy().expect("default policy");
    let wasm = Engine::with_policy(config, Arc::new(host)).expect("engine");
    let mut group = c.benchmark_group("whole_resume");
    group.throughput(Throughput::Elements(1));
    group.bench_function("wasm_default", |b| resume_body(&wasm, b));
    group.bench_function("native", |b| resume_body(&native, b));
    group.finish();
}

criterion_group!(benches, decision, whole_resume, swap);

fn main() {
    benches();
    // Skipped under `cargo test --benches` (criterion's test mode), which
    // only checks that the benches run.
    if !std::env::args().any(|a| a == "--test") {
        latency_during_swaps();
    }
    Criterion::default().configure_from_args().final_summary();
}
