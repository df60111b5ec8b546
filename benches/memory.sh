#!/bin/bash
# Resident memory per idle group and per membership (BENCHMARKS.md, "Memory
# per idle group and per membership"), two builds alternated: the
# population workload at GROUPS groups, driven by NEW's load tool with
# `--node-bin` so both nodes see the same client and the same settle rule,
# then W1 and W3 the same way (`--fsync never`, 200,000 sends and ACKs:
# the allocator's cost, not the disk's). JSON per run
# in OUT (default: a new temporary directory), one summary line per run.
#   bash benches/memory.sh OLD NEW [GROUPS] [ROUNDS] [OUT]
set -euo pipefail
OLD=$1
NEW=$2
NGROUPS=${3:-1000000}
ROUNDS=${4:-1}
OUT=${5:-$(mktemp -d)}
DATA=$(mktemp -d)
trap 'rm -rf "$DATA"' EXIT
summary() {
    python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d = d[0] if isinstance(d, list) else d
m = d["memory"]
mb = lambda k: m[k]["rss_bytes"] / 1e6
print("  RSS empty %.1f MB, after creation %.1f MB (before settling %.1f), after joins %.1f MB, after sends %.1f MB; "
      "per idle group %.1f B, per membership %.1f B; create %.0f/s, join %.0f/s, send %.0f/s" % (
      mb("empty"), mb("after_create"), m["before_settle"]["after_create"]["rss_bytes"] / 1e6,
      mb("after_join"), mb("after_send"), m["rss_bytes_per_group"], m["rss_bytes_per_membership"],
      d["create"]["groups_per_sec"], d["join"]["joins_per_sec"], d["ops_per_sec"]))
PY
}
for round in $(seq 1 "$ROUNDS"); do
    for which in old new; do
        bin=$OLD; [ "$which" = new ] && bin=$NEW
        json=$OUT/population-$which-$round.json
        echo "round $round, $which ($bin), load $(cut -d' ' -f1-3 /proc/loadavg)"
        "$NEW" bench --spawn --node-bin "$bin" -w population --groups "$NGROUPS" \
            --messages 100000 --node-checkpoint-interval-ms 5000 --data "$DATA" \
            --json --quiet >"$json"
        summary "$json"
    done
done
for round in $(seq 1 "$ROUNDS"); do
    for which in old new; do
        bin=$OLD; [ "$which" = new ] && bin=$NEW
        for w in w1 w3; do
            json=$OUT/$w-$which-$round.json
            # --ops sizes W3 only: the load tool refuses it for W1.
            ops=(); [ "$w" = w3 ] && ops=(--ops 200000)
            "$NEW" bench --spawn --node-bin "$bin" --fsync never -w "$w" --messages 200000 \
                "${ops[@]}" --data "$DATA" --json --quiet >"$json"
            python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d=d[0] if isinstance(d,list) else d; print('  %s %s: %.0f ops/s, p50 %s us, p99 %s us' % (sys.argv[2], sys.argv[3], d['ops_per_sec'], d['latency_us']['p50'], d['latency_us']['p99']))" "$json" "$w" "$which"
        done
    done
done
echo "JSON in $OUT"
