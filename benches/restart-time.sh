#!/bin/bash
# Times a clean restart of a kept data directory: copies DIR (so every run
# starts from the same bytes), starts `BIN serve` on the copy, and prints
# the seconds from spawn to its `listening` line; then stops it (SIGTERM).
# Alternate two builds on one directory to compare them:
#   tidemark bench --spawn -w population --groups 200000 --data-dir /tmp/pop --keep-data
#   for i in 1 2 3; do bash benches/restart-time.sh OLD /tmp/pop/tidemark-bench-*; \
#                      bash benches/restart-time.sh NEW /tmp/pop/tidemark-bench-*; done
set -euo pipefail
BIN=$1
SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -a "$SRC" "$WORK/data"
sync
start=$(date +%s.%N)
"$BIN" serve --data "$WORK/data" --listen 127.0.0.1:0 >"$WORK/out" 2>&1 &
pid=$!
until grep -q listening "$WORK/out"; do
    kill -0 "$pid" 2>/dev/null || { cat "$WORK/out" >&2; exit 1; }
    sleep 0.01
done
end=$(date +%s.%N)
kill -TERM "$pid"
wait "$pid" || true
echo "$end - $start" | bc
