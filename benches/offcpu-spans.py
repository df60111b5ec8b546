#!/usr/bin/env python3
"""Off-CPU spans of a node's threads, from a `perf record -e
sched:sched_switch -g` of the node (benches/checkpoint-latency.sh with
PERF_DIR=...).

usage: perf script -i RUN.data -F comm,tid,time,event,trace,ip,sym | \
           python3 benches/offcpu-spans.py [MIN_MS] [TOP] [MATCH]

For each thread whose name starts with `tidemark` (the commit thread, the
event loop, the checkpointer, the flusher, the maintenance worker...): the
time from each switch out to its next switch in, with the state it left
in (S: asleep, D: waiting for the disk, R: preempted) and the frames of
its stack at the switch that say why (the scheduler's own frames left
out). Prints, per thread, the spans of at least MIN_MS ms (default 20)
grouped by their leading frames, and the TOP (default 8) longest with the
time each began (perf's clock, to compare with other threads' spans).

MATCH (a regular expression) keeps only the spans whose whole stack at the
switch names a matching frame: the grouping shows four leading frames, so
a wait deep in a call (a file creation waiting for an inode block:
`bit_wait_io < ... < __ext4_get_inode_loc < __ext4_new_inode <
ext4_create`) groups with every other wait of its kind; with MATCH
`ext4_create|ext4_mkdir` and MIN_MS 0 it prints every creation's wait.

Record the whole machine (`perf record -a`, PERF_ALL=1 in
benches/checkpoint-latency.sh) rather than the node (`-p PID`): with
`-p` a switch into a node thread from another process's thread (the
idle task after a disk wait, most often) is not recorded, and a span
that ended that way is lost from the counts.
"""
import re
import sys
from collections import defaultdict

MIN_MS = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
TOP = int(sys.argv[2]) if len(sys.argv) > 2 else 8
MATCH = re.compile(sys.argv[3]) if len(sys.argv) > 3 else None

HEAD = re.compile(r"^\s*(\S.*?)\s+(\d+)\s+(\d+\.\d+):\s+(\S+):\s*(.*)$")
SWITCH = re.compile(
    r"prev_comm=(.*?) prev_pid=(\d+) .*?prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)"
)
# Frames that only say "the thread left the CPU".
NOISE = re.compile(
    r"^(__schedule|schedule|schedule_\w+|__x64_sys_\w+|do_syscall_64|"
    r"entry_SYSCALL_64\w*|\[unknown\]|__traceiter_\w+|__bpf_trace_\w+|"
    r"preempt_schedule\w*|io_schedule\w*|__cond_resched|_cond_resched|"
    r"syscall|__GI___\w+|__libc_\w+|do_epoll_wait|__futex_wait|futex_wait\w*|"
    r"do_futex|__x64_sys_futex|finish_task_switch\w*)$"
)


def events(lines):
    head, stack = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if head:
                yield head, stack
            head, stack = None, []
            continue
        m = HEAD.match(line)
        if m and head is None:
            head = m.groups()
            continue
        if head is not None:
            parts = line.split(None, 1)
            if len(parts) == 2:
                stack.append(parts[1].split("+0x")[0])
    if head:
        yield head, stack


def where(stack, n=4):
    frames = [f for f in stack if not NOISE.match(f)]
    return " < ".join(frames[:n]) or "?"


def main():
    out = {}  # tid -> (time, state, where)
    names = {}
    spans = defaultdict(list)  # tid -> [(ms, state, where)]
    for (comm, tid, ts, event, trace), stack in events(sys.stdin):
        if "sched_switch" not in event:
            continue
        m = SWITCH.search(trace)
        if not m:
            continue
        prev_comm, prev_pid, state, next_comm, next_pid = m.groups()
        t = float(ts)
        if prev_comm.startswith("tidemark"):
            names[prev_pid] = prev_comm
            if MATCH is None or any(MATCH.search(f) for f in stack):
                out[prev_pid] = (t, state, where(stack))
            else:
                out.pop(prev_pid, None)
        if next_pid in out:
            t0, st, w = out.pop(next_pid)
            spans[next_pid].append(((t - t0) * 1000.0, st, w, t0))
    for tid, ss in sorted(spans.items(), key=lambda kv: names.get(kv[0], "")):
        long = [s for s in ss if s[0] >= MIN_MS]
        if not long:
            continue
        print(f"== {names.get(tid, '?')} ({tid}): {len(ss)} spans off CPU, "
              f"{len(long)} of at least {MIN_MS:g} ms")
        groups = defaultdict(list)
        for ms, st, w, _ in long:
            groups[(st[:1], w)].append(ms)
        for (st, w), ms in sorted(groups.items(), key=lambda kv: -max(kv[1])):
            print(f"  {len(ms):4d} x  longest {max(ms):8.1f} ms  total {sum(ms):8.1f} ms  [{st}] {w}")
        print("  longest:")
        for ms, st, w, t0 in sorted(long, reverse=True)[:TOP]:
            print(f"    {ms:8.1f} ms [{st}] from {t0:.3f} {w}")


if __name__ == "__main__":
    main()
