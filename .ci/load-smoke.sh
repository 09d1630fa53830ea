#!/usr/bin/env bash
# `rewind load` against a real `rewind serve` on free loopback ports: every
# profile for a few seconds with a few sessions, then the streaming
# profiles against a server whose window is far smaller than a call's
# burst. Fails on any violation or error. Prints one PASS/FAIL line per profile and ends with `N passed, M failed`.
#
# Environment:
#   REWIND_BIN=path     use this binary instead of building target/debug/rewind
#   LOAD_SMOKE_DURATION=3s   per profile
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
DURATION=${LOAD_SMOKE_DURATION:-3s}
PROFILES=(throughput resume storm adversarial soak mixed idle)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rewind-load-smoke.XXXXXX")
# shellcheck source=lib.sh
. "$ROOT/.ci/lib.sh"
PASSED=0
FAILED=0
trap 'stop_server; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

finish() {
    echo "load-smoke: total time $(($(date +%s) - T0)) s"
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
    exit $?
}

if [ -n "${REWIND_BIN:-}" ]; then
    BIN=$REWIND_BIN
else
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/rewind
    if ! timeout 2400 cargo build -p rewind-server --bin rewind >"$WORK/build.log" 2>&1; then
        echo "FAIL build: cargo build -p rewind-server --bin rewind"
        tail -n 30 "$WORK/build.log"
        FAILED=1
        finish
    fi
fi

# start_server NAME [serve flags...]: a `rewind serve` on free loopback ports.
start_server() {
    local name=$1
    shift
    read -r PORT ADMIN <<<"$(free_ports 2)"
    "$BIN" serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" "$@" \
        >"$WORK/server-$name.log" 2>&1 &
    SERVER_PID=$!
    if ! wait_port "$PORT" "$SERVER_PID" 30; then
        echo "FAIL server ($name): rewind serve $* did not listen on 127.0.0.1:$PORT"
        tail -n 30 "$WORK/server-$name.log"
        FAILED=$((FAILED + 1))
        finish
    fi
}

# run_profile LABEL PROFILE COUNT: one `rewind load` run against the server.
run_profile() {
    local label=$1 p=$2 count=$3
    if timeout 120 "$BIN" load --url "http://127.0.0.1:$PORT/mcp" --profile "$p" --sessions 8 \
        --duration "$DURATION" --count "$count" --server-pid "$SERVER_PID" --expect table \
        --json "$WORK/$label.json" >"$WORK/$label.txt" 2>&1; then
        PASSED=$((PASSED + 1))
        echo "PASS load $label: $(grep -E '^  (events|verification) ' "$WORK/$label.txt" | tr -s ' ' | tr '\n' ';')"
    else
        FAILED=$((FAILED + 1))
        echo "FAIL load $label (exit $?):"
        sed 's/^/    | /' "$WORK/$label.txt" | head -n 60
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        FAILED=$((FAILED + 1))
        echo "FAIL server: rewind serve died during $label"
        tail -n 30 "$WORK/server-"*.log
        finish
    fi
}

start_server default
for p in "${PROFILES[@]}"; do
    run_profile "$p" "$p" 20
done
stop_server

# A window far smaller than a call's burst (16 events per session, 4 KiB
# segments, 200 notifications per call): readers lag and resumes fall out
# of the window all the time. Every loss must be an explicit gap, and
# every call must still deliver its result on its own stream.
start_server small-window --session-events 16 --max-segment-bytes 4096
for p in throughput resume adversarial; do
    run_profile "small-window-$p" "$p" 200
done
finish
