#!/usr/bin/env python3
"""One workload of `tidemark bench --spawn`, node builds alternated.

Usage: alternate.py TOOL ROUNDS NAME=NODE_BIN [NAME=NODE_BIN ...] [-- BENCH_ARGS...]

Runs `TOOL bench --spawn --node-bin NODE_BIN --json --quiet BENCH_ARGS`
for each build in turn, ROUNDS times (build A, B, C, A, B, C, ...); the
load tool is TOOL for every run, so only the node differs. BENCH_ARGS
default to W3 as BENCHMARKS.md measures it: `--fsync never -w w3`.
Every run's figures go to stderr as it ends; then a table of the median
throughput and latency percentiles per build, with each round's
throughput and p99, and the 1-minute load average at each run's start.
A run whose verification failed is reported and left out of the medians.

NICE=-10 runs every bench at that niceness (root only), in a session of
its own whose scheduling group (autogroup) gets that niceness too: on a
machine other work keeps busy, the bench and its node then get most of
the CPU, closer to a quiet machine (say so with the figures).

PIN=TOOL_CPUS:NODE_CPUS (e.g. PIN=0:1) runs the load tool on TOOL_CPUS and
each node (through a wrapper script that `taskset`s it) on NODE_CPUS, so
the node's threads never share a CPU with the tool's: on a 2-core machine
the tool's 16 connection threads otherwise preempt the node's event loop,
and how often depends on how the node orders its connections' turns.
"""

import json
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def main():
    args = sys.argv[1:]
    bench_args = ["--fsync", "never", "-w", "w3"]
    if "--" in args:
        bench_args = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    tool, rounds, builds = args[0], int(args[1]), [b.split("=", 1) for b in args[2:]]
    nice = os.environ.get("NICE")
    pin = os.environ.get("PIN")
    if pin:
        tool_cpus, node_cpus = pin.split(":")
        wrappers = tempfile.mkdtemp(prefix="alternate-pin-")
        atexit.register(shutil.rmtree, wrappers, True)
        pinned = []
        for name, node in builds:
            path = os.path.join(wrappers, name)
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\nexec taskset -c {node_cpus} {os.path.abspath(node)} "$@"\n')
            os.chmod(path, 0o755)
            pinned.append([name, path])
        builds = pinned
    runs = {name: [] for name, _ in builds}
    for r in range(rounds):
        for name, node in builds:
            load = open("/proc/loadavg").read().split()[0]
            cmd = [tool, "bench", "--spawn", "--node-bin", node, "--json", "--quiet"] + bench_args
            if pin:
                cmd = ["taskset", "-c", tool_cpus] + cmd
            if nice:
                # A session of its own is a scheduling group of its own
                # (autogroup): its niceness weighs against the other
                # sessions' groups, a process's own only within its group.
                cmd = ["setsid", "sh", "-c",
                       f'echo {nice} > /proc/self/autogroup 2>/dev/null; exec nice -n {nice} "$@"',
                       "sh"] + cmd
            out = subprocess.run(cmd, capture_output=True, text=True)
            reports = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode != 0 or not reports:
                print(f"round {r + 1} {name}: failed ({out.returncode}): {out.stderr[-500:]}",
                      file=sys.stderr)
                continue
            rep = reports[-1]
            lat = rep["latency_us"]
            print(f"round {r + 1} {name}: load {load}, {rep['workload']} {rep['ops_per_sec']:,.0f} "
                  f"{rep['unit']}/s, p50 {lat['p50']} p99 {lat['p99']} p99.9 {lat['p999']} us, "
                  f"verified {rep['verified']}", file=sys.stderr)
            if rep["verified"]:
                runs[name].append((rep["ops_per_sec"], lat, load))
    first = statistics.median(t for t, _, _ in runs[builds[0][0]]) if runs[builds[0][0]] else None
    p99_first = statistics.median(l["p99"] for _, l, _ in runs[builds[0][0]]) if first else None
    print("| build | ops/s median | ops/s by round | p50 median (us) | p99 median (us) "
          "| p99 by round (us) | p99 quartiles (us) | p99.9 median (us) | vs first: ops/s, p99 "
          "| 1-min load at start |")
    print("|---|---:|---|---:|---:|---|---|---:|---|---|")
    for name, _ in builds:
        rs = runs[name]
        if not rs:
            print(f"| {name} | no verified run | | | | | | | | |")
            continue
        ops = statistics.median(t for t, _, _ in rs)
        p99 = statistics.median(l["p99"] for _, l, _ in rs)
        ratio = f"{ops / first:.2f}x, {p99 / p99_first:.2f}x" if first else ""
        p99s = [l["p99"] for _, l, _ in rs]
        quartiles = ("{:.0f}-{:.0f}".format(*statistics.quantiles(p99s, n=4)[::2])
                     if len(p99s) >= 4 else "")
        print(f"| {name} | {ops:,.0f} | {' / '.join(f'{t:,.0f}' for t, _, _ in rs)} "
              f"| {statistics.median(l['p50'] for _, l, _ in rs):,.0f} | {p99:,.0f} "
              f"| {' / '.join(str(l['p99']) for _, l, _ in rs)} | {quartiles} "
              f"| {statistics.median(l['p999'] for _, l, _ in rs):,.0f} | {ratio} "
              f"| {' / '.join(load for _, _, load in rs)} |")


if __name__ == "__main__":
    main()
