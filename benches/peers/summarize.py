#!/usr/bin/env python3
"""Markdown tables from the JSON reports compare.sh collected.

    python3 summarize.py OUT_DIR "rewind rmcp-builtin ..."

Reads OUT_DIR/<peer>-<case>.json (written by `rewind load --json`), prints
one table per kind of case with ratios to Rewind, then every correctness
failure with its evidence. Standard library only.
"""

import json
import os
import sys

out_dir = sys.argv[1]
peers = sys.argv[2].split() if len(sys.argv) > 2 else []


def load(peer, case):
    path = os.path.join(out_dir, f"{peer}-{case}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def owner(name):
    # The longest peer name that prefixes the file: `rewind-peer-x.json` is
    # rewind-peer's case x, not rewind's case `peer-x`.
    return max((p for p in peers if name.startswith(p + "-")), key=len, default=None)


cases = sorted(
    {name[len(p) + 1 : -5] for name in os.listdir(out_dir) if name.endswith(".json") for p in [owner(name)] if p},
    key=lambda c: (c.split("-")[0], "paced" in c, int(c.split("-")[-1]) if c.split("-")[-1].isdigit() else 0),
)


def mib(kib):
    return "-" if kib is None else f"{kib / 1024:.1f}"


def rss(r):
    p = r.get("server_process") or {}
    anon = p.get("rss_anon_after_kib")
    anon = "" if anon is None else f", anon {mib(anon)}"
    return f"{mib(p.get('rss_before_kib'))} → {mib(p.get('rss_after_kib'))} (max {mib(p.get('rss_max_kib'))}{anon})"


def cpu(r):
    p = r.get("server_process") or {}
    per = p.get("cpu_us_per_event")
    return f"{p.get('cpu_percent', 0):.0f} %" + (f", {per:.1f} µs/ev" if per else "")


def viol(r):
    n = r["violation_count"]
    if not n:
        return "0"
    kinds = ", ".join(f"{k} {v}" for k, v in r["violations_by_kind"].items())
    return f"**{n}** ({kinds})"


def errs(r):
    n = r["error_count"]
    if not n:
        return "0"
    return f"{n} (" + ", ".join(f"{k} {v}" for k, v in r["errors_by_kind"].items()) + ")"


def ratio(value, base):
    if not base or value is None:
        return "-"
    return f"{value / base:.2f}×"


def pct(p, key):
    return "-" if not p else f"{p[key]:.2f}"


def row(cells):
    print("| " + " | ".join(str(c) for c in cells) + " |")


for kind in ["throughput", "resume", "storm", "adversarial", "soak", "mixed"]:
    kc = [c for c in cases if c.split("-")[0] == kind]
    if not kc:
        continue
    print(f"\n### {kind}\n")
    if kind in ("throughput", "soak", "mixed"):
        row(["case", "server", "events/s", "vs Rewind", "calls/s", "server CPU", "generator CPU", "server RSS MiB before → after (max, anon after)", "violations", "errors"])
        row(["---"] * 10)
    elif kind == "resume":
        row(["case", "server", "events/s", "vs Rewind", "first event p50/p99 ms (0 ms delay)", "first event p50/p99 ms (50 ms delay)", "headers p99 ms (50 ms)", "server CPU", "server RSS MiB before → after (max, anon after)", "violations", "errors"])
        row(["---"] * 11)
    elif kind == "storm":
        row(["case", "server", "resumed at once", "completed", "all results in ms", "vs Rewind", "result p99 ms", "server RSS MiB before → after (max, anon after)", "violations", "errors"])
        row(["---"] * 10)
    elif kind == "adversarial":
        row(["case", "server", "foreign", "future", "malformed", "stale (re-init)", "dead", "foreign events delivered", "violations", "errors"])
        row(["---"] * 10)
    for c in kc:
        base = load("rewind", c)
        for p in peers:
            r = load(p, c)
            if r is None:
                continue
            if kind in ("throughput", "soak", "mixed"):
                row([c, p, f"{r['events']['per_s']:.0f}", ratio(r["events"]["per_s"], base and base["events"]["per_s"]),
                     f"{r['calls']['per_s']:.0f}", cpu(r), f"{r['generator']['cpu_percent']:.0f} %", rss(r), viol(r), errs(r)])
            elif kind == "resume":
                by = {d["delay_ms"]: d for d in r["resume"]}
                z, f = by.get(0, {}), by.get(50, {})
                fe = lambda d: f"{pct(d.get('first_event'), 'p50_ms')} / {pct(d.get('first_event'), 'p99_ms')}"
                row([c, p, f"{r['events']['per_s']:.0f}", ratio(r["events"]["per_s"], base and base["events"]["per_s"]),
                     fe(z), fe(f), pct(f.get("headers"), "p99_ms"), cpu(r), rss(r), viol(r), errs(r)])
            elif kind == "storm":
                s = r["storm"][0] if r["storm"] else None
                b = base["storm"][0] if base and base["storm"] else None
                if s is None:
                    row([c, p, "-", "-", "-", "-", "-", rss(r), viol(r), errs(r)])
                    continue
                done = f"{s['completion_ms']:.0f}" + ("" if s["finished"] else " (timed out)")
                row([c, p, s["resumed"], s["completed"], done, ratio(s["completion_ms"], b and b["completion_ms"]),
                     "-" if s["result_p99_ms"] is None else f"{s['result_p99_ms']:.0f}", rss(r), viol(r), errs(r)])
            elif kind == "adversarial":
                def answers(k):
                    t = r["probes"].get(k)
                    if not t:
                        return "-"
                    a = ", ".join(("no same-id re-init" if s == "0" else s) + f" ×{n}" for s, n in t["answers"].items())
                    extra = []
                    if t["signalled"]:
                        extra.append(f"{t['signalled']} signalled")
                    if t["own_events"]:
                        extra.append(f"{t['own_events']} own events")
                    return a + (f" ({', '.join(extra)})" if extra else "")
                foreign = sum(t["foreign_events"] for t in r["probes"].values())
                row([c, p] + [answers(k) for k in ["foreign", "future", "malformed", "stale", "dead"]] + [foreign, viol(r), errs(r)])

for c in [c for c in cases if c.split("-")[0] == "idle"]:
    print(f"\n### {c}: memory per idle session\n")
    row(["server", "sessions held", "RSS before MiB", "RSS after MiB", "bytes per idle session", "vs Rewind", "sampled alive"])
    row(["---"] * 7)
    base = load("rewind", c)
    b = base and base.get("idle") and base["idle"].get("bytes_per_session")
    for p in peers:
        r = load(p, c)
        if r is None or not r.get("idle"):
            continue
        i = r["idle"]
        per = i.get("bytes_per_session")
        row([p, i["sessions"], mib(i["rss_before_kib"]), mib(i["rss_after_kib"]),
             "-" if per is None else f"{per:.0f}", ratio(per, b), f"{i['alive']} of {i['sampled']}"])

print("\n### Correctness failures, with evidence\n")
any_failure = False
for p in peers:
    for c in cases:
        r = load(p, c)
        if r is None or not r["violation_count"]:
            continue
        any_failure = True
        print(f"- **{p}**, {c}: {viol(r)}")
        shown = set()
        for v in r["violations"]:
            if v["kind"] in shown:
                continue
            shown.add(v["kind"])
            cursor = f" (Last-Event-ID: `{v['cursor']}`)" if v.get("cursor") else ""
            print(f"  - `{v['kind']}` session {v['session']} call `{v.get('call') or '-'}` on {v['leg']}{cursor}, "
                  f"event id `{v.get('event_id') or '-'}`:\n    arrived `{v['arrived']}`\n    expected: {v['expected']}")
if not any_failure:
    print("none")
