#!/bin/bash
# What a journal's fdatasync costs when each write grows the file against
# when it overwrites a file written (and synced) beforehand, on this
# machine's file system: 4 KiB writes at 300 a second (a commit round
# each), one fdatasync per write, ROUNDS alternated pairs, first alone and
# then beside a buffered writer that dirties 3 GB (another process's
# write-back, as a build or a checkpoint's runs). A growing file's
# fdatasync must also commit its new size (on ext4 a journal commit, which
# in data=ordered mode waits for the data of every file in that
# transaction); an overwrite's only flushes its pages and the disk's cache.
# Prints p50 / p99 / p99.9 / max of the fdatasync latency per run.
#   bash benches/fdatasync-prewritten.sh DIR ROUNDS
set -euo pipefail
DIR=${1:-.}
ROUNDS=${2:-2}
command -v fio >/dev/null || { echo "fio is needed (apt-get install fio)" >&2; exit 2; }
WORK=$(mktemp -d "$DIR/fdatasync.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
one() { # MODE BESIDE
    local extra=--overwrite=0 bg=
    [ "$1" = prewritten ] && extra=--overwrite=1
    if [ "$2" = writer ]; then
        fio --name=bg --filename="$WORK/bg.dat" --rw=write --bs=1M --size=3G \
            --ioengine=psync --end_fsync=1 >/dev/null 2>&1 &
        bg=$!
    fi
    fio --name=fg --filename="$WORK/fg.dat" --rw=write --bs=4k --size=64M $extra \
        --fallocate=none --fdatasync=1 --rate_iops=300 --runtime=20 --time_based=1 \
        --ioengine=psync --output-format=json >"$WORK/out.json" 2>/dev/null
    if [ -n "$bg" ]; then kill "$bg" 2>/dev/null || true; wait "$bg" 2>/dev/null || true; fi
    rm -f "$WORK/fg.dat" "$WORK/bg.dat"
    python3 - "$1" "$2" "$WORK/out.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[3]))["jobs"][0]
lat = job["sync"]["lat_ns"]
p = lat["percentile"]
ms = lambda ns: ns / 1e6
print(f"{sys.argv[1]:>10} beside {sys.argv[2]:>6}: {lat['N']} fdatasyncs, "
      f"p50 {ms(p['50.000000']):.2f} p99 {ms(p['99.000000']):.2f} "
      f"p99.9 {ms(p['99.900000']):.2f} max {ms(lat['max']):.1f} ms")
PY
}
for beside in nothing writer; do
    for _ in $(seq 1 "$ROUNDS"); do
        one grow "$beside"
        one prewritten "$beside"
    done
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
