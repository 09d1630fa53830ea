#!/usr/bin/env bash
# Cluster mode (`rewind serve --cluster redis://… --node-id N`) end to end:
#   1. redis-server is there (installed with apt-get when it is not; a
#      service the install starts is stopped again: nothing here uses
#      port 6379);
#   2. the cluster integration tests (server/tests/cluster.rs, ignored by
#      `cargo test --workspace`), each with its own redis-server and nodes;
#   3. `rewind load --profile resume` spread round-robin over three nodes
#      sharing one redis-server: zero violations, zero errors, every node
#      still running afterwards.
#
# Prints one line per step (PASS|FAIL NAME: ...) and ends with exactly
# `N passed, M failed`; exits non-zero on any failure. Every wait is
# bounded; everything listens on loopback ports chosen by the kernel, and
# everything started here is stopped on exit.
#
# Environment:
#   REWIND_BIN=path            use this binary instead of building target/debug/rewind
#   REWIND_REDIS_SERVER=path   use this redis-server instead of the one on PATH
#   CLUSTER_LOAD_DURATION=5s   how long the load runs
#   CLUSTER_KEEP=1             keep the work directory (logs) on exit
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
DURATION=${CLUSTER_LOAD_DURATION:-5s}
NODES=3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rewind-cluster.XXXXXX")
# shellcheck source=lib.sh
. "$ROOT/.ci/lib.sh"
PASSED=0
FAILED=0
STARTED=() # pids of the processes started here

# Stops one process: SIGTERM, up to 5 s to exit, then SIGKILL.
stop_pid() { # PID
    kill -0 "$1" 2>/dev/null || return 0
    kill -TERM "$1" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
cleanup() {
    local pid
    for pid in "${STARTED[@]}"; do stop_pid "$pid"; done
    if [ -n "${CLUSTER_KEEP:-}" ]; then echo "cluster: logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n=== %s\n' "$*"; }
pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }
finish() {
    echo
    echo "cluster: total time $(($(date +%s) - T0)) s"
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
    exit $?
}
# Indented tail of a log, for failures.
show() { echo "    --- last lines of $1:"; tail -n "${2:-40}" "$1" | sed 's/^/    | /'; }

# --- the binary ----------------------------------------------------------------
if [ -n "${REWIND_BIN:-}" ]; then
    BIN=$(realpath "$REWIND_BIN")
else
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/rewind
    step "build rewind (cargo build -p rewind-server --bin rewind)"
    if ! timeout 2400 cargo build -p rewind-server --bin rewind >"$WORK/build.log" 2>&1; then
        fail "build: cargo build -p rewind-server --bin rewind failed or timed out"
        show "$WORK/build.log" 30
        finish
    fi
fi

# --- 1. redis-server -------------------------------------------------------------
step "redis-server"
SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=(sudo -n); fi
# pids of every running redis-server (ours are not started yet).
redis_pids() { pgrep -x redis-server 2>/dev/null | sort; }
install_redis() {
    local before after pid
    before=$(redis_pids)
    apt_install() {
        timeout 600 "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends redis-server >>"$WORK/apt.log" 2>&1
    }
    if ! apt_install; then
        timeout 300 "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update >>"$WORK/apt.log" 2>&1
        apt_install || return 1
    fi
    # Debian starts the redis service on install: stop what the install
    # started (it is not ours to leave running, and nothing here uses it).
    after=$(redis_pids)
    if [ "$after" != "$before" ]; then
        timeout 30 "${SUDO[@]}" systemctl stop redis-server >>"$WORK/apt.log" 2>&1 ||
            timeout 30 "${SUDO[@]}" service redis-server stop >>"$WORK/apt.log" 2>&1 || true
        for pid in $(comm -13 <(echo "$before") <(redis_pids)); do
            "${SUDO[@]}" kill -TERM "$pid" 2>/dev/null || true
        done
        for _ in $(seq 1 50); do
            [ -z "$(comm -13 <(echo "$before") <(redis_pids))" ] && break
            sleep 0.1
        done
        if [ -n "$(comm -13 <(echo "$before") <(redis_pids))" ]; then
            echo "    the redis service the install started is still running: $(comm -13 <(echo "$before") <(redis_pids) | tr '\n' ' ')"
            return 1
        fi
        echo "    stopped the redis service the install started"
    fi
}
REDIS=${REWIND_REDIS_SERVER:-}
if [ -z "$REDIS" ]; then
    if ! command -v redis-server >/dev/null; then
        echo "no redis-server on PATH: apt-get install -y redis-server"
        if ! install_redis; then
            fail "redis-server: not installed and apt-get install redis-server failed"
            [ -f "$WORK/apt.log" ] && show "$WORK/apt.log" 20
            finish
        fi
    fi
    REDIS=$(command -v redis-server)
fi
if REDIS_VERSION=$(timeout 10 "$REDIS" --version 2>&1); then
    pass "redis-server: $REDIS ($REDIS_VERSION)"
else
    fail "redis-server: '$REDIS --version' failed: $REDIS_VERSION"
    finish
fi
export REWIND_REDIS_SERVER=$REDIS

# --- 2. the cluster integration tests --------------------------------------------
step "cargo test -p rewind-server --test cluster -- --ignored --test-threads 1"
timeout 2400 cargo test -p rewind-server --test cluster -- --ignored --test-threads 1 \
    >"$WORK/cargo-test.log" 2>&1
rc=$?
summary=$(grep -E '^test result: ' "$WORK/cargo-test.log" | tail -n1)
if [ "$rc" -eq 0 ]; then
    pass "cargo test --test cluster --ignored (${summary#test result: })"
else
    fail "cargo test --test cluster --ignored (${summary:-exit $rc}$([ "$rc" -eq 124 ] && echo ", timed out after 2400 s"))"
    grep -E '^test .* FAILED$' "$WORK/cargo-test.log" | sed 's/^/    /'
    # The failures (backtrace frames left out): each test's panic, then
    # the last lines of its nodes' and redis-server's logs.
    if grep -q '^failures:$' "$WORK/cargo-test.log"; then
        echo "    --- failures:"
        sed -n '/^failures:$/,$p' "$WORK/cargo-test.log" | grep -vE '^ +(at |[0-9]+: )' |
            head -n 200 | sed 's/^/    | /'
    else
        show "$WORK/cargo-test.log" 40 # a build error, a timeout
    fi
fi

# --- 3. rewind load over three nodes sharing one redis-server ----------------------
step "rewind load --profile resume over $NODES nodes sharing one redis-server"
# Answers PING with +PONG within a second.
redis_pong() { # PORT
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'PING\r\n' >&3
        IFS= read -r -t 1 line <&3 && [ "${line%$'\r'}" = "+PONG" ]
    ) 2>/dev/null
}
read -r -a PORTS <<<"$(free_ports $((1 + 2 * NODES)))"
RPORT=${PORTS[0]}
"$REDIS" --bind 127.0.0.1 --port "$RPORT" --save "" --appendonly no --daemonize no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
STARTED+=("$REDIS_PID")
up=""
for _ in $(seq 1 100); do
    kill -0 "$REDIS_PID" 2>/dev/null || break
    if redis_pong "$RPORT"; then up=1; break; fi
    sleep 0.1
done
if [ -z "$up" ]; then
    fail "redis-server on 127.0.0.1:$RPORT did not answer PING within 10 s"
    show "$WORK/redis.log" 20
    finish
fi
echo "redis-server (pid $REDIS_PID) on 127.0.0.1:$RPORT"

URLS=()
NODE_PIDS=()
for i in $(seq 1 "$NODES"); do
    port=${PORTS[$((2 * i - 1))]}
    admin=${PORTS[$((2 * i))]}
    "$BIN" serve --cluster "redis://127.0.0.1:$RPORT" --node-id "$i" \
        --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" >"$WORK/node-$i.log" 2>&1 &
    pid=$!
    STARTED+=("$pid")
    NODE_PIDS+=("$pid")
    wait_port "$port" "$pid" 60
    case $? in
    0) URLS+=("http://127.0.0.1:$port/mcp") ;;
    2)
        fail "node $i: rewind serve --cluster exited during start"
        show "$WORK/node-$i.log" 30
        finish
        ;;
    *)
        fail "node $i: port $port not open after 60 s"
        show "$WORK/node-$i.log" 30
        finish
        ;;
    esac
done
pass "nodes: $NODES rewind serve --cluster up ($(
    IFS=,
    echo "${URLS[*]}"
))"

URL_LIST=$(
    IFS=,
    echo "${URLS[*]}"
)
if timeout 180 "$BIN" load --url "$URL_LIST" --sessions 10 --duration "$DURATION" --profile resume \
    --expect table --quiet --json "$WORK/load.json" >"$WORK/load.txt" 2>&1 &&
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
v, e = r.get("violation_count"), r.get("error_count")
if v != 0 or e != 0:
    sys.exit("violations %r, errors %r" % (v, e))' "$WORK/load.json" >>"$WORK/load.txt" 2>&1; then
    pass "load resume over $NODES nodes: $(grep -E '^  (events|verification) ' "$WORK/load.txt" | tr -s ' ' | tr '\n' ';')"
else
    fail "load resume over $NODES nodes (exit $?):"
    sed 's/^/    | /' "$WORK/load.txt" | head -n 60
fi

dead=()
for i in $(seq 1 "$NODES"); do
    kill -0 "${NODE_PIDS[$((i - 1))]}" 2>/dev/null || dead+=("$i")
done
if [ "${#dead[@]}" -eq 0 ]; then
    pass "nodes: all $NODES still running after the load"
else
    fail "nodes: node(s) ${dead[*]} died during the load"
    for i in "${dead[@]}"; do show "$WORK/node-$i.log" 30; done
fi
finish
