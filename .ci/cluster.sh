#!/usr/bin/env bash
# Cluster mode (`rewind serve --cluster redis://… --node-id N`) end to end:
#   1. redis-server is there (installed with apt-get when it is not; a
#      service the install starts is stopped again: nothing here uses
#      port 6379);
#   2. the cluster integration tests (server/tests/cluster.rs, ignored by
#      `cargo test --workspace`), each with its own redis-server and nodes;
#   3. `rewind load` over three nodes: resume (round-robin and sticky),
#      adversarial (foreign, stale, future, dead cursors) and throughput
#      sharing one redis-server: zero violations, zero errors, every node
#      still running afterwards.
#   Then a new redis-server and three nodes for the external clients:
#   4. the official TypeScript SDK client (tests/interop/cluster-resume.mjs,
#      node_modules from `npm ci` in tests/interop as .ci/interop.sh does,
#      skipped when they already hold the locked SDK) initializes and starts
#      `progress_stream` on node 1, is cut, resumes the call with its
#      resumption token on node 2 (live) and node 3 (after the tool ended):
#      every progress once, in order, then the result;
#   5. the official conformance suite (@modelcontextprotocol/conformance,
#      every scenario of .ci/interop.sh's SCENARIOS) through
#      tests/interop/rr-proxy.mjs, a non-sticky round-robin proxy over the
#      three nodes: one PASS/FAIL line per scenario (`conformance-rr/NAME`),
#      then a line naming the failed ones; every node still running.
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
#   CLUSTER_SCENARIOS="a b"    run only these conformance scenarios in step 5
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
step "rewind load (resume both routes, adversarial, throughput) over $NODES nodes sharing one redis-server"
# Answers PING with +PONG within a second.
redis_pong() { # PORT
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'PING\r\n' >&3
        IFS= read -r -t 1 line <&3 && [ "${line%$'\r'}" = "+PONG" ]
    ) 2>/dev/null
}
# Starts a redis-server and $NODES nodes sharing it, logs named
# $WORK/PREFIXredis.log and $WORK/PREFIXnode-N.log. Sets G_URLS (the nodes'
# MCP URLs) and G_PIDS (their pids); returns 1, with a FAIL line, when
# anything does not come up.
start_group() { # PREFIX
    local prefix=$1 rport redis_pid up i port admin pid
    local -a ports
    read -r -a ports <<<"$(free_ports $((1 + 2 * NODES)))"
    rport=${ports[0]}
    "$REDIS" --bind 127.0.0.1 --port "$rport" --save "" --appendonly no --daemonize no \
        --dir "$WORK" >"$WORK/${prefix}redis.log" 2>&1 &
    redis_pid=$!
    G_REDIS_PID=$redis_pid
    STARTED+=("$redis_pid")
    up=""
    for _ in $(seq 1 100); do
        kill -0 "$redis_pid" 2>/dev/null || break
        if redis_pong "$rport"; then up=1; break; fi
        sleep 0.1
    done
    if [ -z "$up" ]; then
        fail "${prefix}redis-server on 127.0.0.1:$rport did not answer PING within 10 s"
        show "$WORK/${prefix}redis.log" 20
        return 1
    fi
    echo "${prefix}redis-server (pid $redis_pid) on 127.0.0.1:$rport"
    G_URLS=()
    G_PIDS=()
    for i in $(seq 1 "$NODES"); do
        port=${ports[$((2 * i - 1))]}
        admin=${ports[$((2 * i))]}
        "$BIN" serve --cluster "redis://127.0.0.1:$rport" --node-id "$i" \
            --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" >"$WORK/${prefix}node-$i.log" 2>&1 &
        pid=$!
        STARTED+=("$pid")
        G_PIDS+=("$pid")
        wait_port "$port" "$pid" 60
        case $? in
        0) G_URLS+=("http://127.0.0.1:$port/mcp") ;;
        2)
            fail "${prefix}node $i: rewind serve --cluster exited during start"
            show "$WORK/${prefix}node-$i.log" 30
            return 1
            ;;
        *)
            fail "${prefix}node $i: port $port not open after 60 s"
            show "$WORK/${prefix}node-$i.log" 30
            return 1
            ;;
        esac
    done
    pass "${prefix}nodes: $NODES rewind serve --cluster up ($(
        IFS=,
        echo "${G_URLS[*]}"
    ))"
}
# Fails (one line naming them) when a node of G_PIDS is no longer running.
check_group() { # PREFIX WHEN
    local dead=() i
    for i in $(seq 1 "$NODES"); do
        kill -0 "${G_PIDS[$((i - 1))]}" 2>/dev/null || dead+=("$i")
    done
    if [ "${#dead[@]}" -eq 0 ]; then
        pass "${1}nodes: all $NODES still running $2"
    else
        fail "${1}nodes: node(s) ${dead[*]} died $2"
        for i in "${dead[@]}"; do show "$WORK/${1}node-$i.log" 30; done
    fi
}

start_group "" || finish
URLS=("${G_URLS[@]}")

URL_LIST=$(
    IFS=,
    echo "${URLS[*]}"
)
# The profiles that resume (round-robin and sticky), that probe with
# foreign, stale, future and dead cursors, and that stream: every run must
# have zero violations and zero errors.
for run in "resume round-robin" "resume sticky" "adversarial round-robin" "throughput round-robin"; do
    read -r profile route <<<"$run"
    name="load $profile --route $route over $NODES nodes"
    json="$WORK/load-$profile-$route.json"
    text="$WORK/load-$profile-$route.txt"
    if timeout 180 "$BIN" load --url "$URL_LIST" --route "$route" --sessions 10 --duration "$DURATION" \
        --profile "$profile" --expect table --quiet --json "$json" >"$text" 2>&1 &&
        python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
v, e = r.get("violation_count"), r.get("error_count")
if v != 0 or e != 0:
    sys.exit("violations %r, errors %r" % (v, e))' "$json" >>"$text" 2>&1; then
        pass "$name: $(grep -E '^  (events|verification) ' "$text" | tr -s ' ' | tr '\n' ';')"
    else
        fail "$name (exit $?):"
        sed 's/^/    | /' "$text" | head -n 60
    fi
done

check_group "" "after the load"
for pid in "${G_PIDS[@]}" "$G_REDIS_PID"; do stop_pid "$pid"; done

# --- 4 and 5 run on a group of their own: redis-server and three nodes ----------------
step "a new group for the interop steps: redis-server and $NODES nodes"
if ! start_group "interop-"; then
    finish
fi

# --- 4. the official TypeScript SDK client resumes a call through another node -------
step "npm ci (tests/interop), unless its node_modules already hold the locked SDK"
export NO_COLOR=1 npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
sdk_version() { # the SDK version under tests/interop: installed (node_modules) or locked
    (cd tests/interop && node -p "require('./$1').$2" 2>/dev/null)
}
installed=$(sdk_version node_modules/@modelcontextprotocol/sdk/package.json version)
locked=$(sdk_version package-lock.json 'packages["node_modules/@modelcontextprotocol/sdk"].version')
npm_ok=1
if [ -n "$installed" ] && [ "$installed" = "$locked" ]; then
    echo "tests/interop/node_modules holds @modelcontextprotocol/sdk $installed (as locked): no npm ci"
elif (cd tests/interop && timeout 300 npm ci --no-audit --no-fund) >"$WORK/npm-ci.log" 2>&1; then
    echo "npm ci done (@modelcontextprotocol/sdk $(sdk_version node_modules/@modelcontextprotocol/sdk/package.json version))"
else
    npm_ok=""
    fail "npm ci in tests/interop failed or timed out (is the npm registry reachable?)"
    show "$WORK/npm-ci.log" 30
fi
if [ -n "$npm_ok" ]; then
    step "interop: cluster-resume (initialize and call on node 1, cut, resume on nodes 2 and 3)"
    (cd tests/interop && timeout 120 node cluster-resume.mjs --url-a "${G_URLS[0]}" --url-b "${G_URLS[1]}" \
        --url-c "${G_URLS[2]}" --count 40 --interval-ms 50 --cut-after 5) 2>&1 | tee "$WORK/cluster-resume.log"
    rc=${PIPESTATUS[0]}
    summary=$(grep -E "^cluster-resume: [0-9]+ passed, [0-9]+ failed" "$WORK/cluster-resume.log" | tail -n1)
    if [ "$rc" -eq 0 ]; then
        pass "ts-sdk cluster-resume ($summary)"
    else
        fail "ts-sdk cluster-resume (${summary:-exit $rc}$([ "$rc" -eq 124 ] && echo ", timed out after 120 s"))"
    fi
fi

# --- 5. the conformance suite through a non-sticky round-robin proxy -------------------
CONFORMANCE="@modelcontextprotocol/conformance@0.1.13"
# Every scenario .ci/interop.sh runs (its SCENARIOS array), unless
# CLUSTER_SCENARIOS names some.
eval "$(sed -n '/^SCENARIOS=(/,/)$/p' .ci/interop.sh)"
if [ -n "${CLUSTER_SCENARIOS:-}" ]; then read -r -a SCENARIOS <<<"$CLUSTER_SCENARIOS"; fi
step "conformance suite $CONFORMANCE, ${#SCENARIOS[@]} scenarios, through a round-robin proxy over $NODES nodes"
if [ "${#SCENARIOS[@]}" -eq 0 ]; then
    fail "conformance (round-robin): no scenarios found in .ci/interop.sh's SCENARIOS array"
    finish
fi
bases=()
for u in "${G_URLS[@]}"; do bases+=("${u%/mcp}"); done
node tests/interop/rr-proxy.mjs "${bases[@]}" >"$WORK/rr-proxy.log" 2>&1 &
PROXY_PID=$!
STARTED+=("$PROXY_PID")
PROXY_PORT=""
for _ in $(seq 1 100); do
    kill -0 "$PROXY_PID" 2>/dev/null || break
    PROXY_PORT=$(head -n1 "$WORK/rr-proxy.log" 2>/dev/null | grep -E '^[0-9]+$')
    [ -n "$PROXY_PORT" ] && break
    sleep 0.1
done
if [ -z "$PROXY_PORT" ]; then
    fail "rr-proxy: did not print its port within 10 s"
    show "$WORK/rr-proxy.log" 20
    finish
fi
RR_URL="http://127.0.0.1:$PROXY_PORT/mcp"
echo "rr-proxy (pid $PROXY_PID) at $RR_URL -> ${bases[*]}"
if ! timeout 300 npx -y "$CONFORMANCE" --version >"$WORK/npx.log" 2>&1; then
    fail "conformance (round-robin): could not fetch/run $CONFORMANCE with npx"
    show "$WORK/npx.log" 20
else
    rr_failed=()
    for s in "${SCENARIOS[@]}"; do
        before=$(wc -l <"$WORK/rr-proxy.log")
        timeout 180 npx -y "$CONFORMANCE" server --url "$RR_URL" --scenario "$s" -o "$WORK/conformance-rr/$s" \
            >"$WORK/conformance-rr-$s.log" 2>&1
        rc=$?
        node tests/interop/conformance-summary.mjs "$s" "$WORK/conformance-rr/$s" "$rc" |
            sed -E 's/^(PASS|FAIL) /\1 conformance-rr\//'
        case ${PIPESTATUS[0]} in
        0) PASSED=$((PASSED + 1)) ;;
        *)
            FAILED=$((FAILED + 1))
            rr_failed+=("$s")
            [ "$rc" -eq 124 ] && echo "    (timed out after 180 s)"
            show "$WORK/conformance-rr-$s.log" 25
            echo "    --- the proxy's lines for this scenario:"
            tail -n +"$((before + 1))" "$WORK/rr-proxy.log" | head -n 40 | sed 's/^/    | /'
            ;;
        esac
        if ! kill -0 "$PROXY_PID" 2>/dev/null; then
            fail "rr-proxy: died during scenario $s"
            show "$WORK/rr-proxy.log" 20
            break
        fi
    done
    forwarded=$(grep -cE '^rr-proxy: #' "$WORK/rr-proxy.log")
    per_node=$(for i in $(seq 0 $((NODES - 1))); do grep -cE "^rr-proxy: #.* -> upstream $i:" "$WORK/rr-proxy.log"; done | tr '\n' ' ')
    if [ "${#rr_failed[@]}" -eq 0 ]; then
        echo "conformance (round-robin): all ${#SCENARIOS[@]} scenarios passed; $forwarded requests forwarded (per node: $per_node)"
    else
        echo "conformance (round-robin): ${#rr_failed[@]} of ${#SCENARIOS[@]} scenarios failed: ${rr_failed[*]}; $forwarded requests forwarded (per node: $per_node)"
        for i in $(seq 1 "$NODES"); do
            if grep -qE ' (WARN|ERROR) ' "$WORK/interop-node-$i.log"; then
                echo "    --- WARN/ERROR lines of node $i:"
                grep -E ' (WARN|ERROR) ' "$WORK/interop-node-$i.log" | tail -n 20 | sed 's/^/    | /'
            fi
        done
    fi
fi
check_group "interop-" "after the SDK client and the conformance suite"
finish
