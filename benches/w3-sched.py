#!/usr/bin/env python3
"""Context switches, wake-ups and system calls per 1,000,000 ACKs of W3.

Usage: w3-sched.py TOOL ROUNDS NAME=NODE_BIN [NAME=NODE_BIN ...]

Runs `TOOL bench --spawn --fsync never --node-bin NODE_BIN -w w3` under
`perf record` (scheduler switches, wake-ups, every system call entry, and
CPU samples at 4 kHz), alternating the node builds, ROUNDS times; the load
tool is TOOL for every run, so only the node differs. For each run it
takes W3's measured phase (the event loop's first to last CPU sample in
`CursorTable::advance`, as benches/ack-profile.py) and counts, per thread
of the node and for the load tool's threads together:

- switches: the times the thread left its CPU, split into preempted
  (still runnable: state R) and asleep (S, D: it waited for something);
- wakes: the wake-ups the thread issued (of any thread);
- futex: futex system calls (lock and condition variable sleeps and wakes);
- syscalls: every system call, and the event loop's and the commit
  thread's by name; ms in syscalls: the time from entry to exit (asleep
  in epoll_wait included);
- page faults: faults of user memory (fresh pages: the allocator's);
- cpu ms: the thread's CPU time (its CPU samples, one per 250 us), and
  the commit thread's per journal write: in W3's measured phase its only
  writes are the cursor flushes (one a second), so that is one flush's CPU.

These counts are the work the scheduler does per ACK; unlike the wall
clock they barely move with what else runs on the machine, so builds can
be compared on a busy one. Prints the mean per build; then the ACK rate
and p99 the bench reported under perf (slowed by the tracing: compare them
only between builds of the same table). Needs `perf` and root (or
perf_event_paranoid -1) and x86_64 (system call numbers).
"""

import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ACKS = 1_000_000
LINE = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
SYSCALLS = {0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 19: "readv",
            20: "writev", 24: "sched_yield", 28: "madvise", 35: "nanosleep", 44: "sendto",
            45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 74: "fsync", 75: "fdatasync",
            202: "futex", 228: "clock_gettime", 230: "clock_nanosleep", 232: "epoll_wait",
            233: "epoll_ctl", 281: "epoll_pwait", 288: "accept4", 306: "syncfs", 441: "epoll_pwait2"}
FUTEX = 202
NODE_THREAD = {"tidemark-commit": "commit", "tidemark-flush": "flush", "tidemark-ckpt": "checkpointer",
               "tidemark-journa": "journal", "tidemark-worker": "worker", "tidemark-host": "host",
               "tidemark-signal": "signal"}


def events(data):
    """(pid, tid, comm, time, event, rest) of every recorded event."""
    proc = subprocess.Popen(["perf", "script", "-i", data, "-F", "comm,pid,tid,time,event,ip,sym,trace"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        m = LINE.match(line)
        if m:
            comm, pid, tid, at, event, rest = m.groups()
            yield int(pid), int(tid), comm, float(at), event, rest
    proc.wait()


def counts(data):
    """Per thread group: Counter of switches, preempted, asleep, wakes,
    futex, syscalls (and `sys <name>` for the event loop), per 1M ACKs."""
    evs = list(events(data))
    in_advance = collections.Counter(t for _, t, _, _, e, r in evs
                                     if e.startswith("cpu-clock") and "CursorTable::advance" in r)
    loop = in_advance.most_common(1)[0][0]
    times = [at for _, t, _, at, e, r in evs
             if t == loop and e.startswith("cpu-clock") and "CursorTable::advance" in r]
    first, last = min(times), max(times)
    node = loop  # the event loop is the node's main thread
    names = {}
    entered = {}
    out = collections.defaultdict(collections.Counter)
    for pid, tid, comm, at, event, rest in evs:
        if not first <= at <= last:
            continue
        if pid == node:
            who = "event loop" if tid == loop else NODE_THREAD.get(comm, comm)
        else:
            who = "load tool"
        names[tid] = who
        c = out[who]
        if event.startswith("cpu-clock"):
            c["cpu ms"] += 0.25  # one sample per 250 us of CPU at 4 kHz
        elif event == "sched:sched_switch":
            state = re.search(r"prev_state=(\S+)", rest).group(1)
            c["switches"] += 1
            c["preempted" if state.startswith("R") else "asleep"] += 1
        elif event == "sched:sched_waking":
            c["wakes"] += 1
        elif event == "raw_syscalls:sys_enter":
            nr = int(re.match(r"NR (\d+)", rest).group(1))
            entered[tid] = (nr, at)
            c["syscalls"] += 1
            if nr == FUTEX:
                c["futex"] += 1
            c["sys " + SYSCALLS.get(nr, f"nr {nr}")] += 1
        elif event == "raw_syscalls:sys_exit":
            nr, since = entered.pop(tid, (None, None))
            if nr is not None:
                c["ms in syscalls"] += (at - since) * 1000
                if who == "event loop":
                    c["ms in " + SYSCALLS.get(nr, f"nr {nr}")] += (at - since) * 1000
        elif event.startswith("exceptions:page_fault"):
            c["page faults"] += 1
    # The window holds W3's ACKS ACKs (the default size); scaled to 1M.
    scale = 1_000_000 / ACKS
    return {w: {k: v * scale for k, v in c.items()} for w, c in out.items()}, last - first


def main():
    tool, rounds, builds = sys.argv[1], int(sys.argv[2]), [b.split("=", 1) for b in sys.argv[3:]]
    results = collections.defaultdict(list)
    timing = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as work:
        for r in range(rounds):
            for name, node in builds:
                data = os.path.join(work, f"{name}.data")
                load = open("/proc/loadavg").read().split()[0]
                run = subprocess.run(["perf", "record", "-q", "-m", "8M", "-e", "cpu-clock/freq=4000/",
                                      "-e", "sched:sched_switch", "-e", "sched:sched_waking",
                                      "-e", "raw_syscalls:sys_enter", "-e", "raw_syscalls:sys_exit",
                                      "-e", "exceptions:page_fault_user", "-o", data, "--",
                                      tool, "bench", "--spawn", "--fsync", "never", "--node-bin", node,
                                      "-w", "w3", "--json", "--quiet"],
                                     check=True, capture_output=True, text=True)
                report = json.loads(run.stdout.strip().splitlines()[-1])
                c, secs = counts(data)
                os.unlink(data)
                results[name].append(c)
                timing[name].append((report["ops_per_sec"], report["latency_us"]["p99"], load))
                print(f"round {r + 1} {name}: load {load}, {report['ops_per_sec']:,.0f} ACKs/s, "
                      f"p99 {report['latency_us']['p99']} us, window {secs:.2f} s", file=sys.stderr)
    names = [n for n, _ in builds]

    def mean(name, who, key):
        return statistics.mean(run.get(who, {}).get(key, 0) for run in results[name])

    print("| per 1M ACKs | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    whos = ["event loop", "load tool"] + sorted(
        {w for n in names for run in results[n] for w in run} - {"event loop", "load tool"})
    for who in whos:
        keys = ["cpu ms", "switches", "preempted", "asleep", "wakes", "futex", "syscalls",
                "ms in syscalls", "page faults"]
        if who in ("event loop", "commit"):
            for prefix in ("sys ", "ms in "):
                keys += sorted({k for n in names for run in results[n]
                                for k in run.get(who, {}) if k.startswith(prefix) and k not in keys},
                               key=lambda k: -mean(names[0], who, k))
        for k in keys:
            vals = [mean(n, who, k) for n in names]
            if any(v >= 0.5 for v in vals):
                print(f"| {who}: {k} | " + " | ".join(f"{v:,.0f}" for v in vals) + " |")
        if who == "commit":
            # One journal write per cursor flush (the only rounds in W3's
            # measured phase): the CPU of one flush.
            per = [statistics.mean(run.get(who, {}).get("cpu ms", 0) / run[who]["sys pwrite64"]
                                   for run in results[n] if run.get(who, {}).get("sys pwrite64"))
                   if any(run.get(who, {}).get("sys pwrite64") for run in results[n]) else 0
                   for n in names]
            print("| commit: cpu ms per journal write (a cursor flush) | "
                  + " | ".join(f"{v:,.1f}" for v in per) + " |")
    print()
    print("| under perf | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    print("| ACKs/s, median | " + " | ".join(
        f"{statistics.median(t[0] for t in timing[n]):,.0f}" for n in names) + " |")
    print("| p99 us, median | " + " | ".join(
        f"{statistics.median(t[1] for t in timing[n]):,.0f}" for n in names) + " |")
    print("| 1-min load at start | " + " | ".join(
        " / ".join(t[2] for t in timing[n]) for n in names) + " |")


if __name__ == "__main__":
    main()
