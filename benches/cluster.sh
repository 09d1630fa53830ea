#!/usr/bin/env bash
# One command: what cluster mode costs, measured in one run with the same load.
#
#   bash benches/cluster.sh
#
# Builds the release binary, starts one redis-server on a free loopback port
# (`--save "" --appendonly no`), then measures one configuration after
# another, each on freshly started nodes (and an emptied Redis):
#
#   1-node            one `rewind serve`, no Redis
#   1-node-cluster    one `rewind serve --cluster redis://… --node-id 1`
#   3-node-sticky     three nodes, `rewind load --route sticky` (every
#                     request of a session on the node of its `initialize`,
#                     as a balancer hashing Mcp-Session-Id routes)
#   3-node-rr         three nodes, `rewind load --route round-robin` (every
#                     request on the next node: POSTs forwarded to the owner
#                     through Redis, GET resumes served from Redis)
#
# Each runs `rewind load --profile throughput` (events/s) and then
# `--profile resume` (resume latency: GET → first event, p50/p99) with the
# same sessions, duration and seed. Prints one markdown table (also written
# to the output directory with every run's JSON and text report), the CPU
# model and the exact commands. Exits non-zero when any run has a
# violation, when a run produced no report, or when a node died; errors
# (timeouts, refused connections) are shown in the table but do not fail.
#
# Every wait is bounded; everything listens on loopback ports chosen by the
# kernel, and everything started here is stopped on exit.
#
# Environment:
#   CLUSTER_BENCH_SESSIONS=20     sessions of every run
#   CLUSTER_BENCH_DURATION=10s    load time of every run (humantime)
#   CLUSTER_BENCH_SEED=1          `rewind load --seed` (cut points)
#   CLUSTER_BENCH_RESUME_FLAGS="--resume-delay 0ms,50ms --interval 2ms"
#                                 extra flags of the resume runs (as the
#                                 resume cases of benches/peers/compare.sh);
#                                 the table shows the 50 ms delay, or the
#                                 last delay given
#   CLUSTER_BENCH_LOAD_TIMEOUT=600   seconds one `rewind load` may take
#   CLUSTER_BENCH_OUT=DIR         where results go [default: target/cluster-bench/<time>]
#   REWIND_BIN=PATH               use this rewind binary instead of building one
#   REWIND_REDIS_SERVER=PATH      use this redis-server instead of the one on PATH
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)
COMMAND="$(env | grep -E '^(CLUSTER_BENCH_[A-Z_]+|REWIND_BIN|REWIND_REDIS_SERVER)=' | sort | sed -E "s/=(.*)/='\1'/" | tr '\n' ' ')bash benches/cluster.sh"

SESSIONS=${CLUSTER_BENCH_SESSIONS:-20}
DURATION=${CLUSTER_BENCH_DURATION:-10s}
SEED=${CLUSTER_BENCH_SEED:-1}
RESUME_FLAGS=${CLUSTER_BENCH_RESUME_FLAGS:---resume-delay 0ms,50ms --interval 2ms}
LOAD_TIMEOUT=${CLUSTER_BENCH_LOAD_TIMEOUT:-600}
OUT=${CLUSTER_BENCH_OUT:-$ROOT/target/cluster-bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" || exit 1
: >"$OUT/commands.txt"
# Nothing of the caller's environment may turn the single node into a
# cluster node or load a configuration file.
unset REWIND_CLUSTER REWIND_NODE_ID REWIND_CONFIG REWIND_LISTEN REWIND_ADMIN_LISTEN

# shellcheck source=../.ci/lib.sh
. "$ROOT/.ci/lib.sh"

step() { printf '\n=== %s\n' "$*" >&2; }
die() {
    echo "cluster-bench: $*" >&2
    exit 1
}

STARTED=() # pids of everything started here still to stop
cleanup() {
    local pid
    for pid in "${STARTED[@]}"; do stop_pid "$pid"; done
    STARTED=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Every session holds a connection per node it talks to.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# --- the binary and redis-server ----------------------------------------------------
if [ -n "${REWIND_BIN:-}" ]; then
    BIN=$(realpath "$REWIND_BIN") || die "REWIND_BIN=$REWIND_BIN not found"
else
    step "cargo build --release -p rewind-server --bin rewind"
    timeout 3600 cargo build --release -p rewind-server --bin rewind >"$OUT/build.log" 2>&1 ||
        die "cargo build --release failed or timed out; see $OUT/build.log"
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/rewind
fi
[ -x "$BIN" ] || die "no binary at $BIN"
REDIS=${REWIND_REDIS_SERVER:-$(command -v redis-server)}
[ -n "$REDIS" ] && [ -x "$REDIS" ] ||
    die "no redis-server (apt-get install redis-server, or REWIND_REDIS_SERVER=path; .ci/cluster.sh installs it)"

# Sends one command to the redis-server on PORT; succeeds when the answer is EXPECTED, within a second.
redis_cmd() { # PORT COMMAND EXPECTED
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf '%s\r\n' "$2" >&3
        IFS= read -r -t 1 line <&3 && [ "${line%$'\r'}" = "$3" ]
    ) 2>/dev/null
}

read -r -a PORTS <<<"$(free_ports 7)"
RPORT=${PORTS[0]}
step "redis-server on 127.0.0.1:$RPORT"
"$REDIS" --bind 127.0.0.1 --port "$RPORT" --save "" --appendonly no --daemonize no \
    --dir "$OUT" >"$OUT/redis.log" 2>&1 &
REDIS_PID=$!
STARTED+=("$REDIS_PID")
up=""
for _ in $(seq 1 100); do
    kill -0 "$REDIS_PID" 2>/dev/null || break
    if redis_cmd "$RPORT" PING +PONG; then up=1; break; fi
    sleep 0.1
done
[ -n "$up" ] || die "redis-server did not answer PING within 10 s; see $OUT/redis.log"
REDIS_URL="redis://127.0.0.1:$RPORT"

# --- the configurations ----------------------------------------------------------------
NODE_PIDS=()
URL_LIST=""
# Starts N nodes (cluster nodes when CLUSTER is 1); sets NODE_PIDS, URL_LIST.
start_nodes() { # NAME N CLUSTER
    local name=$1 n=$2 cluster=$3 i port admin pid urls=() flags
    NODE_PIDS=()
    for i in $(seq 1 "$n"); do
        port=${PORTS[$((2 * i - 1))]}
        admin=${PORTS[$((2 * i))]}
        flags=()
        [ "$cluster" = 1 ] && flags=(--cluster "$REDIS_URL" --node-id "$i")
        "$BIN" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" "${flags[@]}" \
            >"$OUT/$name-node-$i.log" 2>&1 &
        pid=$!
        STARTED+=("$pid")
        NODE_PIDS+=("$pid")
        wait_port "$port" "$pid" 60
        case $? in
        0) urls+=("http://127.0.0.1:$port/mcp") ;;
        2) echo "  node $i exited during start; see $OUT/$name-node-$i.log" >&2; return 1 ;;
        *) echo "  node $i: port $port not open after 60 s; see $OUT/$name-node-$i.log" >&2; return 1 ;;
        esac
    done
    URL_LIST=$(IFS=,; echo "${urls[*]}")
}
stop_nodes() {
    local pid
    for pid in "${NODE_PIDS[@]}"; do stop_pid "$pid"; done
    STARTED=("$REDIS_PID")
    NODE_PIDS=()
}

# One `rewind load`, bounded; its JSON and text go to $OUT/NAME-PROFILE.*.
load() { # NAME PROFILE ROUTE FLAGS...
    local name=$1 profile=$2 route=$3 pid rc
    shift 3
    local cmd=(rewind load --url "$URL_LIST" --route "$route" --profile "$profile"
        --sessions "$SESSIONS" --duration "$DURATION" --seed "$SEED" "$@"
        --quiet --show-violations 5 --json "$OUT/$name-$profile.json")
    echo "  ${cmd[*]}" >&2
    echo "${cmd[*]}" >>"$OUT/commands.txt"
    rm -f "$OUT/$name-$profile.json"
    timeout "$LOAD_TIMEOUT" "$BIN" "${cmd[@]:1}" >"$OUT/$name-$profile.txt" 2>&1 &
    pid=$!
    STARTED+=("$pid")
    wait "$pid"
    rc=$?
    echo "    exit $rc: $(grep -E '^  (events|verification) ' "$OUT/$name-$profile.txt" | tr -s ' ' | tr '\n' ';')" >&2
    [ "$rc" -eq 124 ] && echo "    timed out after $LOAD_TIMEOUT s" >&2
    return 0
}

# name | nodes | cluster | route
CONFIGS=(
    "1-node|1|0|round-robin"
    "1-node-cluster|1|1|round-robin"
    "3-node-sticky|3|1|sticky"
    "3-node-rr|3|1|round-robin"
)
NAMES=()
DIED=()
read -r -a RESUME_ARGS <<<"$RESUME_FLAGS"
for c in "${CONFIGS[@]}"; do
    IFS='|' read -r name n cluster route <<<"$c"
    NAMES+=("$name")
    step "$name: $n node(s)$([ "$cluster" = 1 ] && echo ", --cluster, --route $route")"
    if [ "$cluster" = 1 ]; then
        redis_cmd "$RPORT" FLUSHALL +OK || die "redis-server did not answer FLUSHALL"
    fi
    if ! start_nodes "$name" "$n" "$cluster"; then
        stop_nodes
        DIED+=("$name (start)")
        continue
    fi
    load "$name" throughput "$route"
    load "$name" resume "$route" "${RESUME_ARGS[@]}"
    for i in $(seq 1 "$n"); do
        kill -0 "${NODE_PIDS[$((i - 1))]}" 2>/dev/null || DIED+=("$name node $i")
    done
    stop_nodes
done
cleanup

# --- the table ---------------------------------------------------------------------
step "summary ($OUT)"
{
    echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), $(nproc) cores; load average at the start $LOAD_AT_START, at the end $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "Command: \`$COMMAND\` ($SESSIONS sessions, $DURATION per run, seed $SEED; resume flags: $RESUME_FLAGS)"
    echo 'Runs, in order (`rewind` is '"$BIN"'):'
    echo
    echo '```sh'
    cat "$OUT/commands.txt"
    echo '```'
    echo
    python3 - "$OUT" "${NAMES[@]}" <<'EOF'
import json, os, sys

out, names = sys.argv[1], sys.argv[2:]
labels = {
    "1-node": "1 node, no Redis",
    "1-node-cluster": "1 node, --cluster",
    "3-node-sticky": "3 nodes, --cluster, --route sticky",
    "3-node-rr": "3 nodes, --cluster, --route round-robin",
}

def report(name, profile):
    path = os.path.join(out, f"{name}-{profile}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def ms(p, key):
    return f"{p[key]:.2f} ms" if p else "n/a"

print("| configuration | events/s | resume p50 | resume p99 | violations | errors |")
print("|---|---|---|---|---|---|")
bad = 0
delays = set()
samples = []
for name in names:
    t, r = report(name, "throughput"), report(name, "resume")
    events = f"{t['events']['per_s']:,.0f}" if t else "no report"
    first = None
    if r and r["resume"]:
        by = {d["delay_ms"]: d for d in r["resume"]}
        d = by.get(50) or r["resume"][-1]
        first, delays = d["first_event"], delays | {d["delay_ms"]}
        samples.append(f"{name} {first['count'] if first else 0}")
    v = [x["violation_count"] for x in (t, r) if x]
    e = [x["error_count"] for x in (t, r) if x]
    if not (t and r) or sum(v) > 0:
        bad += 1
    viol = " + ".join(str(x) for x in v) if len(v) == 2 else "no report"
    err = " + ".join(str(x) for x in e) if len(e) == 2 else "no report"
    print(f"| {labels.get(name, name)} | {events} | {ms(first, 'p50_ms')} | {ms(first, 'p99_ms')} | {viol} | {err} |")
print()
print("events/s: the throughput run's progress notifications delivered in order per second; "
      "resume p50/p99: the resume run's GET (with Last-Event-ID) → first event, at the "
      + "/".join(f"{d} ms" for d in sorted(delays)) + " resume delay (all delays in the JSON); "
      "violations and errors: throughput run + resume run. Resume samples at that delay: "
      + ", ".join(samples) + ".")
for name in names:
    for profile in ("throughput", "resume"):
        x = report(name, profile)
        if x and (x["violation_count"] or x["error_count"]):
            print(f"\n{name} {profile}: violations {x['violations_by_kind']}, errors {x['errors_by_kind']}")
            for v in x["violations"][:3]:
                print("  violation:", json.dumps(v)[:400])
            for e in x["errors"][:3]:
                print("  error:", json.dumps(e)[:400])
sys.exit(1 if bad else 0)
EOF
} | tee "$OUT/summary.md"
rc=${PIPESTATUS[0]}
if [ "${#DIED[@]}" -gt 0 ]; then
    echo "cluster-bench: node(s) died or did not start: ${DIED[*]}" >&2
    rc=1
fi
[ "$rc" -eq 0 ] || echo "cluster-bench: FAILED (a violation, a missing report or a dead node; see $OUT)" >&2
echo "cluster-bench: total $(($(date +%s) - T0)) s; results in $OUT" >&2
exit "$rc"
