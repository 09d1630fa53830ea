#!/usr/bin/env bash
# Does `rewind serve` give memory back once a burst of sessions is over?
# Starts the server with a short idle TTL, streams `rewind load --profile
# resume` through 200 sessions, then samples the server's RSS and pool
# gauges right after the load and again once the sessions have expired and
# two sweeps have passed.
#
#   bash benches/peers/rss-after-burst.sh
#   REWIND_BIN=/path/to/other/rewind bash benches/peers/rss-after-burst.sh
#
# Environment: REWIND_BIN (default: builds the release binary), BURST_SESSIONS
# (default 200), BURST_DURATION (default 5s), BURST_TTL_SECS (default 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${REWIND_BIN:-}" ]; then
    cargo build --release -p rewind-server --bin rewind >&2
    REWIND_BIN=$PWD/target/release/rewind
fi
SESSIONS=${BURST_SESSIONS:-200}
DURATION=${BURST_DURATION:-5s}
TTL=${BURST_TTL_SECS:-3}
OUT=$(mktemp -d)
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$OUT"' EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
PORT=$(free_port)
ADMIN=$(free_port)
"$REWIND_BIN" serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" \
    --idle-ttl-secs "$TTL" >"$OUT/serve.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
    grep -q "admin token" "$OUT/serve.log" 2>/dev/null && break
    sleep 0.1
done
TOKEN=$(awk '/admin token/{print $NF}' "$OUT/serve.log")

rss() { awk '/^VmRSS/{printf "%.1f", $2 / 1024}' "/proc/$PID/status"; }
gauges() {
    curl -s -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$ADMIN/metrics" | awk '
        /^rewind_sessions_live /{s=$2} /^rewind_bytes_held /{h=$2} /^rewind_bytes_released /{r=$2}
        END {printf "%d | %.1f | %s", s, h / 1048576, r == "" ? "-" : sprintf("%.1f", r / 1048576)}'
}
echo "| moment | VmRSS MiB | sessions live | held MiB | released MiB |"
echo "| --- | --- | --- | --- | --- |"
echo "| started | $(rss) | $(gauges) |"
"$REWIND_BIN" load --url "http://127.0.0.1:$PORT/mcp" --profile resume --sessions "$SESSIONS" \
    --duration "$DURATION" --resume-delay 0ms,50ms --interval 2ms --server-pid "$PID" \
    >"$OUT/load.txt" 2>&1 || { cat "$OUT/load.txt" >&2; exit 1; }
echo "| after $SESSIONS sessions of \`--profile resume\` | $(rss) | $(gauges) |"
sleep $((TTL + 5))
echo "| $((TTL + 5)) s later (sessions expired, sweeps passed) | $(rss) | $(gauges) |"
grep -E "violations" "$OUT/load.txt" | head -1 >&2
