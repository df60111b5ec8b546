#!/usr/bin/env python3
"""CPU samples of the node's event loop per 1,000,000 ACKs of W3, by area.

Usage: ack-profile.py TOOL ROUNDS NAME=NODE_BIN [NAME=NODE_BIN ...]

Runs `TOOL bench --spawn --fsync never --node-bin NODE_BIN -w w3` under
`perf record -F 4000 -g`, alternating the node builds, ROUNDS times (the
load tool is TOOL for every run, so only the node differs). For each run
it takes the event loop thread (the thread with the most samples in
`CursorTable::advance`) over W3's measured phase (its first to its last
sample in `advance`) and counts its samples by leaf function; then prints
the mean per build, per area, and the functions with the most samples.
At 4 kHz one sample per 1M ACKs is 0.25 ns per ACK.

`advance` is its own area: its three dependent cache misses cost what the
other processes on the machine leave of the shared cache, whatever the
build (BENCHMARKS.md, "W3 since storage v2: thin LTO measured").
Needs `perf` and W3's default size (1,000,000 ACKs).
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

ACKS = 1_000_000
HEADER = re.compile(r"\s*\S.*?\s+(\d+)\s+([\d.]+):")
FRAME = re.compile(r"\s*[0-9a-f]+\s+(.*)\s+\((.*)\)\s*$")
CRATE = re.compile(r"tidemark_(\w+)::")
METRICS = ("clock_gettime", "Instant", "Timespec", "hdrhistogram", "Durations",
           "Stats::latency", "Stats::request", "slowlog")


def samples(data):
    """(thread id, time, [(symbol, dso)] leaf first) of every sample."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,time,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    for block in out.split("\n\n"):
        lines = [line for line in block.split("\n") if line.strip()]
        head = HEADER.match(lines[0]) if lines else None
        if not head:
            continue
        frames = [m.groups() for m in map(FRAME.match, lines[1:]) if m]
        if frames:
            yield int(head.group(1)), float(head.group(2)), frames


def area(frames):
    symbol, dso = frames[0]
    if "kernel" in dso:
        return "kernel"
    if "CursorTable::advance" in symbol:
        return "advance"
    if symbol.startswith(("mi_", "_mi_")) or symbol in ("malloc", "_int_malloc", "_int_free", "cfree@GLIBC_2.2.5"):
        return "allocator"
    if any(m in symbol for m in METRICS):
        return "metrics and clock reads"
    # Library code (hashing, vectors) counts for the crate that called it.
    for s, _ in frames:
        crate = CRATE.search(s)
        if crate:
            name = crate.group(1)
            # Before storage v2 the node and the protocol were one crate.
            return {"server": "node and protocol", "node": "node and protocol",
                    "protocol": "node and protocol"}.get(name, name)
    return "libc and other"


def profile(data):
    runs = list(samples(data))
    in_advance = collections.Counter(t for t, _, f in runs if "CursorTable::advance" in f[0][0])
    loop = in_advance.most_common(1)[0][0]
    times = [at for t, at, f in runs if t == loop and "CursorTable::advance" in f[0][0]]
    first, last = min(times), max(times)
    areas, leaves = collections.Counter(), collections.Counter()
    for t, at, frames in runs:
        if t == loop and first <= at <= last:
            a = area(frames)
            areas[a] += 1
            if a != "kernel":
                areas["user"] += 1
                leaves[frames[0][0]] += 1
    scale = 1_000_000 / ACKS
    return ({k: v * scale for k, v in areas.items()}, {k: v * scale for k, v in leaves.items()})


def main():
    tool, rounds, builds = sys.argv[1], int(sys.argv[2]), [b.split("=", 1) for b in sys.argv[3:]]
    results = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as work:
        for r in range(rounds):
            for name, node in builds:
                data = os.path.join(work, f"{name}-{r}.data")
                load = open("/proc/loadavg").read().split()[0]
                subprocess.run(["perf", "record", "-F", "4000", "-g", "-q", "-o", data, "--",
                                tool, "bench", "--spawn", "--fsync", "never", "--node-bin", node,
                                "-w", "w3", "--quiet"], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                results[name].append(profile(data))
                print(f"round {r + 1} {name}: load {load}", file=sys.stderr)
    names = [n for n, _ in builds]

    def mean(name, key, part):
        runs = results[name]
        return sum(run[part].get(key, 0) for run in runs) / len(runs)

    print("| event loop, samples per 1M ACKs | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    keys = sorted({k for n in names for run in results[n] for k in run[0]},
                  key=lambda k: -mean(names[0], k, 0))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{mean(n, k, 0):,.0f}" for n in names) + " |")
    print("| user less advance | " + " | ".join(
        f"{mean(n, 'user', 0) - mean(n, 'advance', 0):,.0f}" for n in names) + " |")
    print()
    top = sorted({k for n in names for run in results[n] for k in run[1]},
                 key=lambda k: -max(mean(n, k, 1) for n in names))[:40]
    for k in top:
        print(" ".join(f"{mean(n, k, 1):7.0f}" for n in names), " ", k[:120])


if __name__ == "__main__":
    main()
