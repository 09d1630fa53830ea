#!/usr/bin/env bash
# Memory per idle MCP session: `rewind serve` beside rmcp's built-in cache,
# same run. Each server is loaded with `rewind load --profile idle`: N
# sessions initialised, one short call each, connections closed, then held
# idle; the server's RSS before the first session and after the last gives
# bytes per idle session, and a sample of sessions is called again to show
# they are still alive (not evicted).
#
#   bash benches/peers/idle-sessions.sh            # 100,000 sessions each
#   IDLE_SESSIONS=5000 bash benches/peers/idle-sessions.sh
#
# Environment: IDLE_SESSIONS (default 100000), IDLE_REWIND_FLAGS (extra
# `rewind serve` flags, e.g. smaller rings), REWIND_BIN, COMPARE_OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
N=${IDLE_SESSIONS:-100000}
export COMPARE_OUT=${COMPARE_OUT:-$PWD/target/compare/idle-$(date +%Y%m%d-%H%M%S)}
export REWIND_SERVE_FLAGS=${IDLE_REWIND_FLAGS:-}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
mkdir -p "$COMPARE_OUT"
# compare.sh does the building, starting and stopping; one case, two servers.
CASE="idle-$N|idle|$N|--open-concurrency 64 --count 1 --timeout 60s"
COMPARE_PEERS="rewind rmcp-builtin" COMPARE_CASES="idle-$N" COMPARE_EXTRA_CASE="$CASE" \
    bash benches/peers/compare.sh
