#!/usr/bin/env bash
# External-client tests of `rewind serve`:
#   1. the official MCP conformance suite (@modelcontextprotocol/conformance,
#      pinned; 0.1.13 is the last one that runs on Node 20), one run per scenario;
#   2. interop with the official TypeScript SDK client (tests/interop/*.mjs):
#      resume after a cut, tenant boundary over plain HTTP, a sampling request
#      cut and resumed before the client answers, server restart, and a
#      durable server (--data-dir) SIGKILLed mid-call: the same session
#      resumes the call (every stored progress once, then the restart's
#      error) and goes on without initializing again;
#   3. interop with the official Python SDK client (`mcp` from PyPI, pinned,
#      installed into a venv in the work directory): cut mid-call and resumed
#      by the SDK itself; a stateless (2026-07-28) call.
#
# Prints one line per step (PASS|FAIL NAME: ...) and ends with exactly
# `N passed, M failed`; exits non-zero on any failure. Every step is bounded.
#
# Environment:
#   REWIND_BIN=path       use this binary instead of building target/debug/rewind
#   INTEROP_KEEP=1        keep the work directory (logs, suite results) on exit
#   INTEROP_SCENARIOS="a b"  run only these conformance scenarios
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)

CONFORMANCE="@modelcontextprotocol/conformance@0.1.13"
PYTHON_MCP="mcp==2.3.0"
# Every server scenario of the pinned suite (`npx -y $CONFORMANCE list`); the
# run checks the suite still lists exactly these.
SCENARIOS=(server-initialize logging-set-level ping completion-complete tools-list
    tools-call-simple-text tools-call-image tools-call-audio tools-call-embedded-resource
    tools-call-mixed-content tools-call-with-logging tools-call-error tools-call-with-progress
    tools-call-sampling tools-call-elicitation json-schema-2020-12 elicitation-sep1034-defaults
    server-sse-polling server-sse-multiple-streams elicitation-sep1330-enums resources-list
    resources-read-text resources-read-binary resources-templates-read resources-subscribe
    resources-unsubscribe prompts-list prompts-get-simple prompts-get-with-args
    prompts-get-embedded-resource prompts-get-with-image dns-rebinding-protection)
ALL_SCENARIOS=("${SCENARIOS[@]}")
if [ -n "${INTEROP_SCENARIOS:-}" ]; then read -r -a SCENARIOS <<<"$INTEROP_SCENARIOS"; fi

export NO_COLOR=1 npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rewind-interop.XXXXXX")
# shellcheck source=lib.sh
. "$ROOT/.ci/lib.sh"
PASSED=0
FAILED=0
cleanup() {
    stop_server
    if [ -n "${INTEROP_KEEP:-}" ]; then echo "interop: logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n=== %s\n' "$*"; }
pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }
finish() {
    echo
    echo "interop: total time $(($(date +%s) - T0)) s"
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
    exit $?
}
# Indented tail of a log, for failures.
show() { echo "    --- last lines of $1:"; tail -n "${2:-40}" "$1" | sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^/    | /'; }

# --- the binary ----------------------------------------------------------------
step "build rewind (cargo build -p rewind-server --bin rewind)"
if [ -n "${REWIND_BIN:-}" ]; then
    # Absolute: the restart script runs it from tests/interop.
    BIN=$(realpath "$REWIND_BIN")
    echo "using REWIND_BIN=$BIN"
else
    BIN=$ROOT/target/debug/rewind
    if ! timeout 2400 cargo build -p rewind-server --bin rewind >"$WORK/build.log" 2>&1; then
        fail "build: cargo build -p rewind-server --bin rewind failed or timed out"
        show "$WORK/build.log"
        finish
    fi
fi
if ! timeout 20 "$BIN" serve --help >"$WORK/serve-help.log" 2>&1; then
    fail "build: '$BIN serve --help' does not work (no serve command yet?)"
    show "$WORK/serve-help.log" 20
    finish
fi

# --- the server under test -------------------------------------------------------
read -r PORT ADMIN_PORT RPORT RADMIN_PORT <<<"$(free_ports 4)"
URL="http://127.0.0.1:$PORT/mcp"
step "start: rewind serve --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:$ADMIN_PORT"
"$BIN" serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
wait_port "$PORT" "$SERVER_PID" 60
case $? in
0) echo "server up (pid $SERVER_PID) at $URL" ;;
2) fail "server: rewind serve exited during start"; show "$WORK/server.log"; finish ;;
*) fail "server: port $PORT not open after 60 s"; show "$WORK/server.log"; finish ;;
esac
grep -q "$URL" "$WORK/server.log" || echo "note: the server did not print $URL (yet)"

# --- 1. the conformance suite ----------------------------------------------------
step "conformance suite $CONFORMANCE against $URL"
if ! timeout 300 npx -y "$CONFORMANCE" --version >"$WORK/npx.log" 2>&1; then
    fail "conformance: could not fetch/run $CONFORMANCE with npx"
    show "$WORK/npx.log" 20
else
    listed=$(timeout 120 npx -y "$CONFORMANCE" list 2>/dev/null | sed -n '/^Server scenarios/,/^Client scenarios/p' | sed -n 's/^  - //p' | sort)
    if [ "$listed" = "$(printf '%s\n' "${ALL_SCENARIOS[@]}" | sort)" ]; then
        pass "conformance: the suite lists exactly the ${#ALL_SCENARIOS[@]} server scenarios run here"
    else
        fail "conformance: the suite's server scenarios differ from the ${#ALL_SCENARIOS[@]} run here: $(echo "$listed" | tr '\n' ' ')"
    fi
    for s in "${SCENARIOS[@]}"; do
        timeout 180 npx -y "$CONFORMANCE" server --url "$URL" --scenario "$s" -o "$WORK/conformance/$s" \
            >"$WORK/conformance-$s.log" 2>&1
        rc=$?
        node tests/interop/conformance-summary.mjs "$s" "$WORK/conformance/$s" "$rc"
        case $? in
        0) PASSED=$((PASSED + 1)) ;;
        1) FAILED=$((FAILED + 1)) ;;
        *)
            FAILED=$((FAILED + 1))
            [ "$rc" -eq 124 ] && echo "    (timed out after 180 s)"
            show "$WORK/conformance-$s.log" 25
            ;;
        esac
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            fail "server: rewind serve died during scenario $s"
            show "$WORK/server.log"
            finish
        fi
    done
fi

# --- 2. interop with the TypeScript SDK client -----------------------------------
step "npm ci (tests/interop)"
if ! (cd tests/interop && timeout 300 npm ci --no-audit --no-fund) >"$WORK/npm-ci.log" 2>&1; then
    fail "npm ci in tests/interop failed or timed out (is the npm registry reachable?)"
    show "$WORK/npm-ci.log" 30
    finish
fi
echo "npm ci done ($(node -p 'require("./tests/interop/node_modules/@modelcontextprotocol/sdk/package.json").version' 2>/dev/null || echo '?'))"

run_script() { # NAME SECONDS ARGS...
    local name=$1 secs=$2
    shift 2
    step "interop: $name"
    (cd tests/interop && timeout "$secs" node "$name.mjs" "$@") 2>&1 | tee "$WORK/$name.log"
    local rc=${PIPESTATUS[0]}
    local summary
    summary=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed" "$WORK/$name.log" | tail -n1)
    if [ "$rc" -eq 0 ]; then
        pass "$name ($summary)"
    else
        fail "$name (${summary:-exit $rc}$([ "$rc" -eq 124 ] && echo ", timed out after $secs s"))"
    fi
}

run_script resume 150 --url "$URL" --count 20 --interval-ms 50 --cut-after 5
run_script foreign-cursor 90 --url "$URL"
run_script sampling-cut 60 --url "$URL"

# --- 3. interop with the Python SDK client ---------------------------------------
step "python venv + $PYTHON_MCP"
PY=${PYTHON:-python3}
if ! timeout 60 "$PY" -m venv "$WORK/venv" >"$WORK/venv.log" 2>&1; then
    fail "python: cannot create a venv with $PY (is python3-venv installed?)"
    show "$WORK/venv.log" 10
elif ! timeout 300 "$WORK/venv/bin/pip" install --disable-pip-version-check -q "$PYTHON_MCP" >>"$WORK/venv.log" 2>&1; then
    fail "python: pip install $PYTHON_MCP failed or timed out (is PyPI reachable?)"
    show "$WORK/venv.log" 20
else
    step "interop: python_resume"
    timeout 120 "$WORK/venv/bin/python" tests/interop/python_resume.py --url "$URL" --count 20 --interval-ms 50 --cut-after 5 2>&1 | tee "$WORK/python.log"
    rc=${PIPESTATUS[0]}
    summary=$(grep -E "^python: [0-9]+ passed, [0-9]+ failed" "$WORK/python.log" | tail -n1)
    if [ "$rc" -eq 0 ]; then pass "python_resume ($summary)"; else fail "python_resume (${summary:-exit $rc}$([ "$rc" -eq 124 ] && echo ", timed out after 120 s"))"; fi
fi

if kill -0 "$SERVER_PID" 2>/dev/null; then
    pass "server: still running after the suite and the interop scripts"
else
    fail "server: rewind serve is no longer running"
    show "$WORK/server.log"
fi
stop_server

# The restart test runs its own server (twice, on the same port).
run_script restart 240 --url "http://127.0.0.1:$RPORT/mcp" \
    --server-cmd "$BIN serve --listen 127.0.0.1:$RPORT --admin-listen 127.0.0.1:$RADMIN_PORT"

# The same ports once the restart test has stopped its server: a durable
# server SIGKILLed mid-call and started again on its data directory.
run_script restart-durable 240 --url "http://127.0.0.1:$RPORT/mcp" \
    --server-cmd "$BIN serve --listen 127.0.0.1:$RPORT --admin-listen 127.0.0.1:$RADMIN_PORT --data-dir $WORK/data --global-bytes 134217728"

finish
