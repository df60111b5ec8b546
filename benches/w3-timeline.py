#!/usr/bin/env python3
"""W3's slow moments and what ran on the CPUs then.

Usage: w3-timeline.py TOOL ROUNDS NAME=NODE_BIN [NAME=NODE_BIN ...] [--bucket MS]

Runs `TOOL bench --spawn --fsync never --node-bin NODE_BIN -w w3` under a
system-wide `perf record` (scheduler switches of every CPU, the event
loop's `writev`s and the commit thread's `pwrite64`s, CPU samples at
2 kHz), alternating the node builds, ROUNDS times; the
load tool is TOOL for every run, so only the node differs.

W3 is a closed loop (16 connections x 16 ACKs in flight), so an ACK's
latency is the inverse of the rate at which the node answers around it:
the measured phase (the event loop's first to last CPU sample in
`CursorTable::advance`, as benches/w3-sched.py) is cut into buckets of
MS milliseconds (default 5), each bucket's rate is the event loop's
`writev`s in it (one per connection window answered), and the slowest
buckets hold the slowest ACKs. For the slowest 2% of buckets, against
all of them, it prints the CPU time per bucket of: the event loop, the
load tool, the commit thread, the node's other threads, other processes
(what else runs on the machine), idle; and the commit thread's journal
writes (its cursor flushes) in them. (Page faults: benches/w3-sched.py.)

Ratios between builds of one table only: the tracing slows the node.
NICE=-15 runs the bench as benches/alternate.py does (root only).
Needs `perf`, root, x86_64 (system call numbers).
"""

import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile

WRITEV, PWRITE64 = 20, 18
SWITCH = re.compile(r"prev_comm=(.*?) prev_pid=(\d+) .*?==> next_comm=(.*?) next_pid=(\d+)")
LINE = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


def events(data):
    proc = subprocess.Popen(["perf", "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,ip,sym,trace"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        m = LINE.match(line)
        if m:
            comm, pid, tid, cpu, at, event, rest = m.groups()
            yield int(pid), int(tid), int(cpu), float(at), event, rest
    proc.wait()


def analyse(data, bucket_ms):
    evs = list(events(data))
    adv = collections.Counter(t for _, t, _, _, e, r in evs
                              if e.startswith("cpu-clock") and "CursorTable::advance" in r)
    loop = adv.most_common(1)[0][0]
    node = loop  # the event loop is the node's main thread
    times = [at for _, t, _, at, e, r in evs
             if t == loop and e.startswith("cpu-clock") and "CursorTable::advance" in r]
    first, last = min(times), max(times)
    tool_pids = set()
    pid_of = {}
    for pid, tid, _, _, _, _ in evs:
        pid_of[tid] = pid
    comm_of = {}
    width = bucket_ms / 1000
    n = int((last - first) / width) + 1
    b = [collections.Counter() for _ in range(n)]

    def who(tid):
        pid = pid_of.get(tid)
        if tid == 0:
            return "idle"
        if tid == loop:
            return "event loop"
        if pid == node:
            return "commit" if comm_of.get(tid, "").startswith("tidemark-commi") else "node other"
        if pid in tool_pids:
            return "load tool"
        return "other processes"

    # When the thread running on each CPU started, from the switches.
    since = {}
    for pid, tid, cpu, at, event, rest in evs:
        if event == "sched:sched_switch":
            m = SWITCH.search(rest)
            if not m:
                continue
            prev_comm, prev_pid, next_comm, next_pid = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            comm_of[prev_pid] = prev_comm
            comm_of[next_pid] = next_comm
    # The load tool: of the other processes running a tidemark binary (other
    # work on the machine may run some), the one with the most CPU samples.
    by_pid = collections.Counter(p for p, t, _, at, e, _ in evs
                                 if e.startswith("cpu-clock") and p != node and first <= at <= last
                                 and comm_of.get(t, "").startswith("tidemark"))
    if by_pid:
        tool_pids.add(by_pid.most_common(1)[0][0])
    for pid, tid, cpu, at, event, rest in evs:
        if event == "sched:sched_switch":
            m = SWITCH.search(rest)
            if not m:
                continue
            prev = int(m.group(2))
            start = since.get(cpu)
            if start is not None:
                lo, hi = max(start, first), min(at, last)
                while lo < hi:
                    i = min(int((lo - first) / width), n - 1)
                    end = min(hi, first + (i + 1) * width)
                    if end <= lo:  # lo on a bucket's edge, rounded down
                        i = min(i + 1, n - 1)
                        end = min(hi, first + (i + 1) * width)
                        if end <= lo:
                            break
                    b[i][who(prev) + " ms"] += (end - lo) * 1000
                    lo = end
            since[cpu] = at
            continue
        if not first <= at <= last:
            continue
        i = int((at - first) / width)
        if event == "raw_syscalls:sys_enter":
            nr = int(re.match(r"NR (\d+)", rest).group(1))
            if tid == loop and nr == WRITEV:
                b[i]["writev"] += 1
            elif pid == node and nr == PWRITE64:
                b[i]["journal writes"] += 1
    b = b[:-1] if len(b) > 1 else b  # the last bucket is partial
    return b


KEYS = ["writev", "event loop ms", "load tool ms", "commit ms", "node other ms", "other processes ms",
        "idle ms", "journal writes"]


def main():
    args = sys.argv[1:]
    bucket_ms = 5.0
    if "--bucket" in args:
        i = args.index("--bucket")
        bucket_ms = float(args[i + 1])
        del args[i:i + 2]
    tool, rounds, builds = args[0], int(args[1]), [a.split("=", 1) for a in args[2:]]
    nice = os.environ.get("NICE")
    slow = collections.defaultdict(list)
    every = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as work:
        for r in range(rounds):
            for name, bin_ in builds:
                data = os.path.join(work, f"{name}.data")
                load = open("/proc/loadavg").read().split()[0]
                bench = [tool, "bench", "--spawn", "--fsync", "never", "--node-bin", bin_,
                         "-w", "w3", "--json", "--quiet"]
                if nice:
                    # As benches/alternate.py: a session and scheduling group
                    # of its own at that niceness.
                    bench = ["setsid", "sh", "-c",
                             f'echo {nice} > /proc/self/autogroup 2>/dev/null; exec nice -n {nice} "$@"',
                             "sh"] + bench
                subprocess.run(["perf", "record", "-q", "-a", "-m", "16M", "-e", "cpu-clock/freq=2000/",
                                "-e", "sched:sched_switch",
                                "-e", "raw_syscalls:sys_enter", "--filter", f"id == {WRITEV} || id == {PWRITE64}",
                                "-o", data, "--"] + bench,
                               check=True, capture_output=True, text=True)
                bs = analyse(data, bucket_ms)
                os.unlink(data)
                bs_sorted = sorted(bs, key=lambda c: c["writev"])
                k = max(1, len(bs) // 50)
                slow[name].extend(bs_sorted[:k])
                every[name].extend(bs)
                print(f"round {r + 1} {name}: load {load}, {len(bs)} buckets, writev per bucket median "
                      f"{statistics.median(c['writev'] for c in bs):.0f}, slowest 2% "
                      f"{statistics.mean(c['writev'] for c in bs_sorted[:k]):.0f}", file=sys.stderr)
    names = [n for n, _ in builds]
    print(f"| per {bucket_ms:g} ms bucket: slowest 2% / all | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for key in KEYS:
        cells = []
        for nm in names:
            s = statistics.mean(c[key] for c in slow[nm]) if slow[nm] else 0
            a = statistics.mean(c[key] for c in every[nm]) if every[nm] else 0
            cells.append(f"{s:,.2f} / {a:,.2f}")
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
