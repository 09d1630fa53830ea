#!/usr/bin/env python3
"""Which code of a running program is resident, by crate.

    python3 benches/peers/resident-code.py PID [EXECUTABLE]

Reads the present bit of every page of EXECUTABLE's executable mappings in
/proc/PID/pagemap (readable without privileges; the frame numbers, which
need them, are not used), attributes each resident page to the symbols it
overlaps (`nm -C -S`, so the binary needs its symbol table, which the
release profile keeps) by their first path component, and prints KiB per
component and per group. Pages the kernel mapped around a fault (64 KiB of
"fault-around" by default) count for whatever symbols they hold.
Needs Linux, binutils (`nm`, `readelf`) and Python 3.
"""

import bisect
import collections
import os
import re
import struct
import subprocess
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")

GROUPS = [
    (r"^(cranelift|regalloc2|wasmtime_internal_cranelift)", "the compiler: cranelift, regalloc2, wasmtime's cranelift glue"),
    (r"^(wasmtime|wasmparser|gimli|object|postcard)", "wasmtime's runtime, wasmparser, gimli, object"),
    (r"^(alloc|core|std|hashbrown|smallvec)$", "generics from alloc, core, std, hashbrown, smallvec"),
    (r"^(tokio|hyper|axum|http|http_body_util|tower|matchit)$", "tokio, hyper, axum, http"),
    (r"^(clap_builder|clap_lex|rewind_load|toml|comfy_table)$", "the command line: clap, rewind_load's flags, toml, comfy_table"),
    (r"^(rmcp|serde_json|serde|serde_core)$", "rmcp, serde"),
    (r"^(rewind_server|rewind_engine|rewind)$", "rewind: server, engine, main"),
]


def component(symbol):
    """`core::ptr::drop_in_place<foo::Bar>` -> core; `<a::B as c::D>::f` -> a."""
    m = re.match(r"<?&?(?:mut )?([A-Za-z_][A-Za-z0-9_]*)", symbol)
    return m.group(1) if m else "?"


def main():
    pid = int(sys.argv[1])
    exe = sys.argv[2] if len(sys.argv) > 2 else os.readlink(f"/proc/{pid}/exe")
    mappings = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == exe and "x" in parts[1]:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                mappings.append((start, end, int(parts[2], 16)))
    if not mappings:
        sys.exit(f"no executable mapping of {exe} in process {pid}")

    symbols = []
    nm = subprocess.run(["nm", "-C", "--defined-only", "-S", exe], capture_output=True, text=True, check=True)
    for line in nm.stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[2] in "tTwW":
            symbols.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    symbols.sort()
    starts = [s[0] for s in symbols]

    # File offset -> virtual address, from the program headers.
    loads = []
    readelf = subprocess.run(["readelf", "-lW", exe], capture_output=True, text=True, check=True)
    for line in readelf.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == "LOAD":
            loads.append((int(fields[1], 16), int(fields[2], 16)))
    loads.sort()

    per_component = collections.Counter()
    resident = 0
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for start, end, offset in mappings:
            for page in range(start, end, PAGE):
                pagemap.seek(page // PAGE * 8)
                (entry,) = struct.unpack("<Q", pagemap.read(8))
                if not entry >> 63 & 1:
                    continue
                resident += 1
                file_offset = offset + (page - start)
                vaddr = next(va + file_offset - off for off, va in reversed(loads) if off <= file_offset)
                found = False
                i = bisect.bisect_right(starts, vaddr + PAGE) - 1
                while i >= 0 and symbols[i][0] >= vaddr - (1 << 20):
                    sym_start, size, name = symbols[i]
                    overlap = min(sym_start + size, vaddr + PAGE) - max(sym_start, vaddr)
                    if overlap > 0:
                        per_component[component(name)] += overlap
                        found = True
                    i -= 1
                if not found:
                    per_component["(no symbol)"] += PAGE

    print(f"resident code: {resident * PAGE // 1024} KiB in {resident} pages of {exe}")
    groups = collections.Counter()
    for name, size in per_component.items():
        group = next((g for pattern, g in GROUPS if re.match(pattern, name)), "other")
        groups[group] += size
    print("\nby group (KiB):")
    for group, size in groups.most_common():
        print(f"{size / 1024:8.0f}  {group}")
    print("\nby first path component (KiB, top 40):")
    for name, size in per_component.most_common(40):
        print(f"{size / 1024:8.0f}  {name}")


if __name__ == "__main__":
    main()
