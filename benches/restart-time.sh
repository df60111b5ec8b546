#!/bin/bash
# Times a restart of a kept data directory: copies DIR (so every run
# starts from the same bytes), starts `BIN serve` on the copy, and prints
# the seconds from spawn to its `listening` line; with GROUP and USER also
# the seconds from spawn to the answer of a first PULL (`BIN pull
# --no-ack`) of that member of that group, and from spawn to the end of
# the background load of the saved state (STATS `storage.state_loading`
# back to 0; a build without that figure, or started with
# --load-before-listening, loaded everything before listening) and the
# node's CPU seconds to then (user + system: on a shared machine a
# steadier figure than the wall clock); then stops it (SIGTERM). Extra `serve` flags go in SERVE_FLAGS.
# Alternate two builds on one directory to compare them:
#   tidemark bench --spawn -w population --groups 200000 --data /tmp/pop --keep-data
#   for i in 1 2 3; do bash benches/restart-time.sh OLD /tmp/pop/tidemark-bench-*; \
#                      bash benches/restart-time.sh NEW /tmp/pop/tidemark-bench-*; done
# A directory left by a SIGKILL times a crash restart the same way (the
# copy replays its journal tail every time).
# With JOIN_USER set (and GROUP, USER), the seconds to a JOIN of that new
# user to GROUP answered follow the first PULL, and the node is then
# killed (SIGKILL) without waiting for the end of the load: at 10 M
# groups a full load takes minutes.
# With UNREAD_USER set (GROUP and USER not needed), the first request is
# an UNREAD of that user: the seconds from spawn to its answer follow the
# listening time, with the number of groups it listed, and the node is
# then killed (SIGKILL). A build or directory without a user index
# answers it only after the whole load; with one, from the index.
set -euo pipefail
BIN=$1
SRC=$2
GROUP=${3:-}
USER_ID=${4:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -a "$SRC" "$WORK/data"
sync
start=$(date +%s.%N)
# shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
"$BIN" serve --data "$WORK/data" --listen 127.0.0.1:0 ${SERVE_FLAGS:-} >"$WORK/out" 2>"$WORK/err" &
pid=$!
until grep -q listening "$WORK/out"; do
    kill -0 "$pid" 2>/dev/null || { cat "$WORK/out" "$WORK/err" >&2; exit 1; }
    sleep 0.01
done
end=$(date +%s.%N)
listening=$(echo "$end - $start" | bc)
if [ -n "${UNREAD_USER:-}" ]; then
    addr=$(sed -n 's/^tidemark listening on //p' "$WORK/out")
    "$BIN" unread --addr "$addr" --user "$UNREAD_USER" --timeout-ms 3600000 --json >"$WORK/unread"
    answered=$(date +%s.%N)
    groups=$(grep -o '"group"' "$WORK/unread" | wc -l)
    echo "$listening $(echo "$answered - $start" | bc) $groups"
    kill -KILL "$pid"
    wait "$pid" || true
    exit 0
fi
if [ -n "$GROUP" ]; then
    addr=$(sed -n 's/^tidemark listening on //p' "$WORK/out")
    "$BIN" pull --addr "$addr" --group "$GROUP" --user "$USER_ID" --no-ack --json >/dev/null
    pulled=$(date +%s.%N)
    if [ -n "${JOIN_USER:-}" ]; then
        "$BIN" join --addr "$addr" --group "$GROUP" --user "$JOIN_USER" --timeout-ms 3600000 >/dev/null
        joined=$(date +%s.%N)
        echo "$listening $(echo "$pulled - $start" | bc) $(echo "$joined - $start" | bc)"
        kill -KILL "$pid"
        wait "$pid" || true
        exit 0
    fi
    while "$BIN" stats --addr "$addr" --json | grep -q '"storage.state_loading":1'; do
        sleep 0.01
    done
    loaded=$(date +%s.%N)
    # The node's CPU seconds (user + system, all its threads) to here:
    # what the load cost, apart from what other processes took.
    cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$pid/stat")
    echo "$listening $(echo "$pulled - $start" | bc) $(echo "$loaded - $start" | bc) $cpu"
else
    echo "$listening"
fi
kill -TERM "$pid"
wait "$pid" || true
