#!/usr/bin/env python3
"""CPU per 1,000,000 ACKs of W3 per node thread, and how much of it went to
page faults and to `sched_yield`.

Usage: w3-fault-cpu.py TOOL ROUNDS NAME=NODE_BIN [NAME=NODE_BIN ...]
       SYMS=loop,tidemark-commit TOP=25 w3-fault-cpu.py ...  (also the
       threads' leaf functions)

Runs `TOOL bench --spawn --fsync never --node-bin NODE_BIN -w w3` under
`perf record -g` (CPU samples at 4 kHz, kernel call chains), alternating
the node builds ROUNDS times; the load tool is TOOL for every run. Over
W3's measured phase (the event loop's first to last sample in
`CursorTable::advance`, as benches/ack-profile.py), it counts per thread
(the event loop, the node's other threads by name, the load tool's threads
together) the CPU ms (one sample per 250 us) and the ms of it whose kernel
call chain passes the page fault handler (`asm_exc_page_fault`: first
touches of memory, the allocator's fresh pages), or system calls and
interrupts (kernel ms), or `sched_yield`. Unlike benches/w3-sched.py it
traces no event per fault or system call, so the time a fault takes is
not inflated by the tracing. Prints the mean per build. Needs `perf` and
root (or perf_event_paranoid -1).
"""

import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HEADER = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):")


def samples(data):
    """(comm, pid, tid, time, frames leaf first) of every sample."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,time,event,ip,sym"],
                         capture_output=True, text=True).stdout
    for block in out.split("\n\n"):
        lines = block.strip("\n").split("\n")
        m = HEADER.match(lines[0]) if lines else None
        if not m:
            continue
        comm, pid, tid, at, _ = m.groups()
        frames = [(l.strip().split(None, 1) + [""])[1] for l in lines[1:]]
        yield comm, int(pid), int(tid), float(at), frames


def counts(data):
    recs = list(samples(data))
    in_advance = collections.Counter(
        r[2] for r in recs if any("CursorTable::advance" in f for f in r[4][:3]))
    loop = in_advance.most_common(1)[0][0]
    times = [r[3] for r in recs if r[2] == loop and any("CursorTable::advance" in f for f in r[4][:3])]
    first, last = min(times), max(times)
    out = collections.defaultdict(collections.Counter)
    leaves = collections.defaultdict(collections.Counter)
    for comm, pid, tid, at, frames in recs:
        if not first <= at <= last:
            continue
        who = "event loop" if tid == loop else (comm if pid == loop else "load tool")
        c = out[who]
        c["cpu ms"] += 0.25
        if any("asm_exc_page_fault" in f for f in frames):
            c["page fault ms"] += 0.25
        if any("entry_SYSCALL" in f or "asm_" in f or "irq" in f for f in frames):
            c["kernel ms"] += 0.25
        if any("sched_yield" in f for f in frames):
            c["sched_yield ms"] += 0.25
        if frames:
            leaves[who][frames[0][:80]] += 0.25
    return out, leaves


def main():
    tool, rounds, builds = sys.argv[1], int(sys.argv[2]), [b.split("=", 1) for b in sys.argv[3:]]
    results = collections.defaultdict(list)
    leaf_results = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as work:
        for r in range(rounds):
            for name, node in builds:
                data = os.path.join(work, f"{name}.data")
                load = open("/proc/loadavg").read().split()[0]
                run = subprocess.run(["perf", "record", "-q", "-g", "-e", "cpu-clock/freq=4000/", "-m", "8M",
                                      "-o", data, "--", tool, "bench", "--spawn", "--fsync", "never",
                                      "--node-bin", node, "-w", "w3", "--json", "--quiet"],
                                     check=True, capture_output=True, text=True)
                report = json.loads(run.stdout.strip().splitlines()[-1])
                c, leaves = counts(data)
                os.unlink(data)
                results[name].append(c)
                leaf_results[name].append(leaves)
                print(f"round {r + 1} {name}: load {load}, {report['ops_per_sec']:,.0f} ACKs/s, "
                      f"p99 {report['latency_us']['p99']} us", file=sys.stderr)
    names = [n for n, _ in builds]
    print("| per 1M ACKs | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for who in ("event loop", "tidemark-commit", "load tool"):
        for key in ("cpu ms", "kernel ms", "page fault ms", "sched_yield ms"):
            vals = [statistics.mean(run.get(who, {}).get(key, 0) for run in results[n]) for n in names]
            if any(vals):
                print(f"| {who}: {key} | " + " | ".join(f"{v:,.1f}" for v in vals) + " |")
    for who in filter(None, os.environ.get("SYMS", "").split(",")):
        total = collections.Counter()
        for n in names:
            for run in leaf_results[n]:
                for k, v in run[who].items():
                    total[k] += v / len(leaf_results[n])
        print(f"\n| {who}: leaf function, ms per 1M ACKs | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for k, _ in total.most_common(int(os.environ.get("TOP", "25"))):
            print(f"| `{k}` | " + " | ".join(
                f"{statistics.mean(run[who].get(k, 0) for run in leaf_results[n]):.1f}" for n in names) + " |")


if __name__ == "__main__":
    main()
