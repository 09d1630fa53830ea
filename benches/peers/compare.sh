#!/usr/bin/env bash
# One command: Rewind and the servers people would otherwise pick, loaded by
# the same `rewind load` profiles on the same machine in the same run.
#
#   bash benches/peers/compare.sh
#
# Builds and installs what it needs (release `rewind`, the Rust peers in
# benches/peers, `npm ci` for the TypeScript peer, a venv for the Python
# peer), then for each server in turn: starts it on a free loopback port,
# runs every case against it (`--server-pid` samples its CPU and RSS), and
# stops it. Writes each case's JSON and text into the output directory and
# prints a markdown table (ratios to Rewind, server CPU, RSS per phase)
# followed by every correctness failure with its evidence.
#
# Environment:
#   COMPARE_DURATION=10s   load time of each case (humantime)
#   COMPARE_SMOKE=1        a quick run: 2s cases, the 2,000-session storm kept
#   COMPARE_PEERS="rewind rmcp-builtin rmcp-shared-store bare-hyper ts python"
#                          (also `rewind-peer`: `rewind serve` with the reference
#                          tool sending through rmcp's `ctx.peer`, not its sink;
#                          and `rewind-16ev`: `rewind serve --session-events 16
#                          --max-segment-bytes 4096`, retention equal to rmcp's
#                          built-in cache of 16 events per stream, for a
#                          like-for-like memory comparison; and
#                          `rewind-inproc`: `rewind serve --policy-compiler
#                          in-process`, the policy compiler's code resident in
#                          the server as before it compiled in a child)
#   COMPARE_CASES="throughput-1 ..."   only these cases (names as in CASES below)
#   COMPARE_OUT=DIR        where results go [default: target/compare/<time>]
#   COMPARE_EXTRA_CASE="name|profile|sessions|flags"  one more case (see idle-sessions.sh)
#   REWIND_BIN=PATH        use this rewind binary instead of building one
#   REWIND_SERVE_FLAGS=".." extra flags for `rewind serve` [default: none, its defaults]
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PEERS_DIR=$ROOT/benches/peers
T0=$(date +%s)

DURATION=${COMPARE_DURATION:-10s}
if [ -n "${COMPARE_SMOKE:-}" ]; then DURATION=${COMPARE_DURATION:-2s}; fi
read -r -a PEERS <<<"${COMPARE_PEERS:-rewind rmcp-builtin rmcp-shared-store bare-hyper ts python}"
OUT=${COMPARE_OUT:-$ROOT/target/compare/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
export NO_COLOR=1 npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

# name | profile | sessions | extra flags
CASES=(
    "throughput-1|throughput|1|"
    "throughput-20|throughput|20|"
    "throughput-100|throughput|100|"
    "resume-50|resume|50|--resume-delay 0ms,50ms --interval 2ms"
    "resume-200|resume|200|--resume-delay 0ms,50ms --interval 2ms"
    # The same at one offered load for every server (a 1 s pause after each
    # call: ~4,000 and ~17,000 events/s), so latency is not queueing behind
    # a faster server's extra work.
    "resume-paced-50|resume|50|--resume-delay 0ms,50ms --interval 2ms --think 1s"
    "resume-paced-200|resume|200|--resume-delay 0ms,50ms --interval 2ms --think 1s"
    "storm-200|storm|200|--resume-delay 50ms"
    "storm-2000|storm|2000|--resume-delay 50ms"
    "adversarial-20|adversarial|20|"
)
# A case defined by the caller (idle-sessions.sh).
if [ -n "${COMPARE_EXTRA_CASE:-}" ]; then CASES+=("$COMPARE_EXTRA_CASE"); fi
if [ -n "${COMPARE_CASES:-}" ]; then
    wanted=" $COMPARE_CASES "
    kept=()
    for c in "${CASES[@]}"; do [[ $wanted == *" ${c%%|*} "* ]] && kept+=("$c"); done
    CASES=("${kept[@]}")
fi

step() { printf '\n=== %s\n' "$*" >&2; }
die() { echo "compare: $*" >&2; exit 1; }

# Thousands of sessions need thousands of sockets, in the servers and here.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# --- build and install ---------------------------------------------------------
step "rewind binary"
if [ -n "${REWIND_BIN:-}" ]; then
    BIN=$REWIND_BIN
else
    cargo build --release -p rewind-server --bin rewind >"$OUT/build-rewind.log" 2>&1 ||
        die "cargo build --release -p rewind-server failed; see $OUT/build-rewind.log"
    BIN=$ROOT/target/release/rewind
fi
needs() { [[ " ${PEERS[*]} " == *" $1 "* ]]; }
if needs rmcp-builtin || needs rmcp-shared-store || needs bare-hyper; then
    step "build the Rust peers (benches/peers, release)"
    (cd "$PEERS_DIR" && cargo build --release) >"$OUT/build-peers.log" 2>&1 ||
        die "building benches/peers failed; see $OUT/build-peers.log"
fi
if needs ts; then
    step "npm ci (benches/peers/ts)"
    (cd "$PEERS_DIR/ts" && timeout 600 npm ci --no-audit --no-fund) >"$OUT/npm-ci.log" 2>&1 ||
        die "npm ci in benches/peers/ts failed; see $OUT/npm-ci.log"
fi
if needs python; then
    step "python venv (benches/peers/python/.venv)"
    VENV=$PEERS_DIR/python/.venv
    { [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"; } >"$OUT/venv.log" 2>&1 &&
        timeout 600 "$VENV/bin/pip" install -q -r "$PEERS_DIR/python/requirements.txt" >>"$OUT/venv.log" 2>&1 ||
        die "installing the Python peer failed; see $OUT/venv.log"
fi
PEER_BIN=$PEERS_DIR/target/release

# shellcheck source=../../.ci/lib.sh
. "$ROOT/.ci/lib.sh"
trap stop_server EXIT
trap 'exit 130' INT TERM

start_server() { # PEER -> sets SERVER_PID, URL
    local peer=$1 port
    port=$(free_port)
    URL="http://127.0.0.1:$port/mcp"
    # Each branch execs, so $! is the server's own pid (for --server-pid).
    case $peer in
    rewind | rewind-peer | rewind-16ev | rewind-inproc)
        local admin variant=()
        admin=$(free_port)
        # rmcp's built-in cache keeps 16 events per request stream; one call
        # runs per session at a time here, so 16 events per session is the
        # same retention. Rewind keeps at least that many and at most one
        # segment more, and a streaming session's segments grow to
        # --max-segment-bytes (64 KiB, some 300 events, by default): 4 KiB
        # segments hold about 16 of these events, so the one more is small.
        [ "$peer" != rewind-16ev ] || variant=(--session-events 16 --max-segment-bytes 4096)
        [ "$peer" != rewind-inproc ] || variant=(--policy-compiler in-process)
        # shellcheck disable=SC2086 # several flags
        exec "$BIN" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" "${variant[@]}" ${REWIND_SERVE_FLAGS:-} ;;
    rmcp-builtin) exec "$PEER_BIN/rmcp-builtin" "127.0.0.1:$port" ;;
    rmcp-shared-store) exec "$PEER_BIN/rmcp-shared-store" "127.0.0.1:$port" ;;
    bare-hyper) exec "$PEER_BIN/bare-hyper" "127.0.0.1:$port" ;;
    ts) exec node "$PEERS_DIR/ts/server.mjs" "127.0.0.1:$port" ;;
    python) cd "$PEERS_DIR/python" && exec "$VENV/bin/python" server.py "127.0.0.1:$port" ;;
    esac >>"$OUT/$peer-server.log" 2>&1 &
    SERVER_PID=$!
    wait_port "$port" "$SERVER_PID" 60
}

# Which cases a peer can take: the bare writer keeps nothing, so it only
# streams.
applies() { # PEER PROFILE
    [ "$1" != bare-hyper ] || [ "$2" = throughput ]
}

for peer in "${PEERS[@]}"; do
    step "$peer"
    for c in "${CASES[@]}"; do
        IFS='|' read -r name profile sessions extra <<<"$c"
        applies "$peer" "$profile" || continue
        if [ -z "$SERVER_PID" ] || ! kill -0 "$SERVER_PID" 2>/dev/null; then
            [ -n "$SERVER_PID" ] && echo "  ($peer died; restarting it)" >&2
            SERVER_PID=""
            if ! start_server "$peer"; then
                echo "  $peer did not start; see $OUT/$peer-server.log" >&2
                stop_server
                continue 2
            fi
        fi
        peer_flags=()
        [ "$peer" != rewind-peer ] || peer_flags=(--tool-args '{"via":"peer"}')
        # shellcheck disable=SC2086 # $extra holds several flags
        timeout 600 "$BIN" load --url "$URL" --profile "$profile" --sessions "$sessions" \
            --duration "$DURATION" --server-pid "$SERVER_PID" --quiet --show-violations 3 \
            --json "$OUT/$peer-$name.json" "${peer_flags[@]}" $extra >"$OUT/$peer-$name.txt" 2>&1
        rc=$?
        summary=$(grep -E '^  (events|verification|storm round 1) ' "$OUT/$peer-$name.txt" | sed 's/^ */    /')
        printf '  %-16s exit %s\n%s\n' "$name" "$rc" "$summary" >&2
    done
    stop_server
done

step "summary ($OUT)"
python3 "$PEERS_DIR/summarize.py" "$OUT" "${PEERS[*]}" | tee "$OUT/summary.md"
echo "compare: total $(($(date +%s) - T0)) s; results in $OUT" >&2
