#!/usr/bin/env bash
# The functions `rewind serve` runs, listed for the linker to lay out
# together (`server/build.rs` passes the list as lld's
# `--symbol-ordering-file`), so that the server's resident code is the code
# it runs and not the 64 KiB the kernel maps around each page fault.
#
#   bash server/symbol-order.sh           record the list again (writes server/symbol-order.txt)
#   bash server/symbol-order.sh --check   how much of the list the built binary has, and where
#
# Recording builds the release binary, starts `rewind serve` under
# valgrind's callgrind (the policy compiler child too, so that it compiles
# for the CPU valgrind presents), drives it with `rewind load`'s profiles
# and the admin surface, stops it, and lists every function of the binary
# that ran, the most executed first. Takes about two minutes and needs
# valgrind, binutils (`nm`), curl and Python 3.
#
# Record again after changes that add or rename much of the serving path:
# a function missing from the list still works, it is only laid out with
# the rest of the code (`--check` counts what matches). Symbol names are
# those of this toolchain, `Cargo.lock` and the release profile (not of the
# checkout's directory); a toolchain update changes them.
#
# Environment: REWIND_BIN (default target/release/rewind; recording builds it
# unless set), SYMBOL_ORDER_OUT (scratch directory, default a fresh mktemp).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIST=$ROOT/server/symbol-order.txt
BIN=${REWIND_BIN:-$ROOT/target/release/rewind}

die() { echo "symbol-order: $*" >&2; exit 1; }
for tool in nm python3; do
    command -v "$tool" >/dev/null || die "needs $tool"
done

if [[ ${1:-} == --check ]]; then
    [[ -x $BIN ]] || die "no binary at $BIN (cargo build --release first)"
    python3 - "$BIN" "$LIST" <<'PY'
import subprocess, sys

exe, listed = sys.argv[1], sys.argv[2]
names = [l.strip() for l in open(listed) if l.strip()]
nm = subprocess.run(["nm", "--defined-only", "-S", exe], capture_output=True, text=True, check=True)
symbols = {}
for line in nm.stdout.splitlines():
    parts = line.split()
    if len(parts) == 4 and parts[2] in "tTwW":
        symbols.setdefault(parts[3], (int(parts[0], 16), int(parts[1], 16)))
found = [symbols[n] for n in names if n in symbols]
if not found:
    sys.exit(f"symbol order: none of the {len(names)} listed functions is in {exe}")
size = sum(s for _, s in found)
span = max(a + s for a, s in found) - min(a for a, _ in found)
print(
    f"symbol order: {len(found)} of {len(names)} listed functions ({100 * len(found) // len(names)} %) "
    f"are in {exe}: {size / 1048576:.2f} MiB of code laid out in {span / 1048576:.2f} MiB"
)
PY
    exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument $1 (no argument records the list; --check checks it)"

command -v valgrind >/dev/null || die "needs valgrind (apt-get install valgrind)"
command -v curl >/dev/null || die "needs curl"
if [[ -z ${REWIND_BIN:-} ]]; then
    (cd "$ROOT" && cargo build --release -p rewind-server --bin rewind) || die "cargo build failed"
fi
[[ -x $BIN ]] || die "no binary at $BIN"

OUT=${SYMBOL_ORDER_OUT:-$(mktemp -d)}
mkdir -p "$OUT"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
ADMIN=$(free_port)

echo "symbol-order: starting rewind serve under callgrind (output in $OUT)" >&2
REWIND_POLICY_COMPILER_BY_PATH=1 valgrind --tool=callgrind --trace-children=yes --demangle=no \
    --callgrind-out-file="$OUT/callgrind.%p" \
    "$BIN" serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" \
    --policy-compile-timeout-secs 600 >"$OUT/serve.log" 2>&1 &
SERVER=$!
stop() {
    kill -TERM "$SERVER" 2>/dev/null || return 0
    for _ in $(seq 1 240); do
        kill -0 "$SERVER" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL "$SERVER" 2>/dev/null || true
}
trap stop EXIT

for _ in $(seq 1 600); do
    curl -fs -o /dev/null "http://127.0.0.1:$ADMIN/healthz" && break
    kill -0 "$SERVER" 2>/dev/null || die "the server exited; see $OUT/serve.log"
    sleep 0.5
done
curl -fs -o /dev/null "http://127.0.0.1:$ADMIN/healthz" || die "the server did not answer in 300 s; see $OUT/serve.log"
# The token the server made and printed, as an operator reads it.
TOKEN=$(sed -n 's/^rewind: admin token *//p' "$OUT/serve.log")
[[ -n $TOKEN ]] || die "no admin token in $OUT/serve.log"

# What an operator's server does: every load profile, and the admin surface.
# profile | sessions | extra flags (as in benches/peers/compare.sh)
CASES=(
    "throughput|1|"
    "throughput|20|"
    "throughput|100|"
    "resume|50|--resume-delay 0ms,50ms --interval 2ms"
    "storm|200|--resume-delay 50ms"
    "adversarial|20|"
    "mixed|20|"
)
for case in "${CASES[@]}"; do
    IFS='|' read -r profile sessions flags <<<"$case"
    echo "symbol-order: load --profile $profile --sessions $sessions $flags" >&2
    # shellcheck disable=SC2086 # the flags are words
    timeout 300 "$BIN" load --url "http://127.0.0.1:$PORT/mcp" --profile "$profile" \
        --sessions "$sessions" --duration 5s --quiet $flags >>"$OUT/load.log" 2>&1 ||
        die "rewind load --profile $profile failed; see $OUT/load.log"
done
for path in metrics policy readyz healthz; do
    curl -fs -o /dev/null -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$ADMIN/$path" ||
        die "GET /$path on the admin surface failed"
done
# And the refusal of a request without the token.
curl -s -o /dev/null "http://127.0.0.1:$ADMIN/metrics" || true
stop
trap - EXIT

PROFILE=$(grep -l '^cmd: .* serve ' "$OUT"/callgrind.* | head -1) || true
[[ -n $PROFILE ]] || die "callgrind wrote no profile of the server in $OUT"
python3 - "$BIN" "$PROFILE" "$LIST" <<'PY'
import bisect, collections, os, re, subprocess, sys

exe, profile, listed = sys.argv[1:4]
real = os.path.realpath(exe)
nm = subprocess.run(["nm", "--defined-only", "-S", exe], capture_output=True, text=True, check=True)
by_name, table = {}, []
for line in nm.stdout.splitlines():
    parts = line.split()
    if len(parts) == 4 and parts[2] in "tTwW":
        addr, size = int(parts[0], 16), int(parts[1], 16)
        by_name.setdefault(parts[3], size)
        table.append((addr, size, parts[3]))
table.sort()
starts = [a for a, _, _ in table]

def symbol(name):
    """Callgrind's name for a function: a symbol, or an address when
    valgrind could not read the symbol table."""
    if not name.startswith("0x"):
        return name if name in by_name else None
    addr = int(name, 16)
    i = bisect.bisect_right(starts, addr) - 1
    if i >= 0 and table[i][0] <= addr < table[i][0] + max(table[i][1], 1):
        return table[i][2]
    return None

# Self cost (instructions) per function of the binary. A `calls=` line is
# followed by the call's inclusive cost, which is not the caller's own.
names, objects = {}, {}
cost = collections.Counter()
current, ours, skip = None, False, False
named = re.compile(r"(c?ob|c?fn|c?fi|c?fl|fe)=\((\d+)\)(?: (.*))?$")
for line in open(profile):
    line = line.rstrip("\n")
    if skip:
        skip = False
        continue
    if line.startswith("calls="):
        skip = True
        continue
    m = named.match(line)
    if m:
        kind, ident, name = m.groups()
        if kind in ("ob", "cob"):
            if name:
                objects[ident] = name
            if kind == "ob":
                ours = os.path.realpath(objects[ident]) == real
        elif kind in ("fn", "cfn"):
            if name:
                names[ident] = name
            if kind == "fn":
                current = symbol(names[ident]) if ours else None
        continue
    if current and line and line[0] in "0123456789+-*":
        cost[current] += int(line.split()[-1])

ordered = [name for name, _ in cost.most_common()]
# A run under valgrind does not take every path a native run takes (timing,
# the CPU features code picks at run time), so functions the previous list
# had that this binary still has are kept, after the recorded ones.
seen = set(ordered)
try:
    with open(listed) as previous:
        kept = [l.strip() for l in previous if l.strip() in by_name and l.strip() not in seen]
except FileNotFoundError:
    kept = []
ordered += kept
with open(listed, "w") as out:
    out.write("".join(f"{name}\n" for name in ordered))
size = sum(by_name[n] for n in ordered)
print(
    f"symbol-order: {len(ordered)} functions ({len(kept)} of them kept from the previous list), "
    f"{size / 1048576:.2f} MiB of code, written to {listed}",
    file=sys.stderr,
)
PY
