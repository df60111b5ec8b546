#!/bin/bash
# Makes a crash directory whose journal tail holds joins: opens DIR (in
# place: copy it first) with `BIN serve`, checkpoints put off; waits for
# `listening` (and, with WAIT_LOAD=1, for the end of the background load);
# then N joins of new users (20,000,001 up) to random groups of 1..GROUPS,
# each followed by a send of that user to that group; then SIGKILL.
# Extra `serve` flags go in SERVE_FLAGS (e.g. --load-before-listening).
# With LEAD_GROUP set (a group id), 40 sends of 3,000 bytes to that group
# follow (it is created if missing): past a small group's 64 KiB, so the
# group gets its own segment file, which its records are written to.
#   cp -a /tmp/pop/clean /tmp/pop/crash
#   bash benches/crash-tail.sh target/release/tidemark /tmp/pop/crash 10000000 200
set -euo pipefail
BIN=$1
DIR=$2
GROUPS_MAX=$3
N=${4:-200}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
# shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
"$BIN" serve --data "$DIR" --listen 127.0.0.1:0 --checkpoint-interval-ms 3600000 ${SERVE_FLAGS:-} >"$OUT" 2>&1 &
pid=$!
until grep -q listening "$OUT"; do
    kill -0 "$pid" 2>/dev/null || { cat "$OUT" >&2; exit 1; }
    sleep 0.1
done
addr=$(sed -n 's/^tidemark listening on //p' "$OUT")
if [ "${WAIT_LOAD:-0}" = 1 ]; then
    while "$BIN" stats --addr "$addr" --json --timeout-ms 60000 | grep -q '"storage.state_loading":1'; do
        sleep 1
    done
fi
RANDOM=7
for i in $(seq 1 "$N"); do
    g=$(( (RANDOM * 32768 + RANDOM) % GROUPS_MAX + 1 ))
    u=$(( 20000000 + i ))
    "$BIN" join --addr "$addr" --group "$g" --user "$u" --timeout-ms 3600000 >/dev/null
    "$BIN" send --addr "$addr" --group "$g" --sender "$u" "tail $i" --timeout-ms 3600000 >/dev/null
done
if [ -n "${LEAD_GROUP:-}" ]; then
    "$BIN" create-group --addr "$addr" --group "$LEAD_GROUP" --timeout-ms 3600000 >/dev/null 2>&1 || true
    head -c 3000 /dev/zero | tr '\0' 'p' >"$OUT.payload"
    for i in $(seq 1 40); do
        "$BIN" send --addr "$addr" --group "$LEAD_GROUP" --sender 7 --payload-file "$OUT.payload" \
            --timeout-ms 3600000 >/dev/null
    done
    rm -f "$OUT.payload"
fi
"$BIN" stats --addr "$addr" --json | tr ',' '\n' | grep -E '"engine.checkpoints"|"storage.state_loading"' || true
kill -KILL "$pid"
wait "$pid" || true
