#!/bin/bash
# Leadership under load (BENCHMARKS.md, "Leadership under load"): a fresh
# 3-node replica set on this machine, one W1 run of 60 s against its
# leader, then how often leadership changed: the leader before and after
# (`cluster status`), the load tool's result (a run that ends early was
# cut by a lost leader), and the leadership lines of each node's log
# ("leads", "lost leadership", "a turn of writes and fdatasyncs took").
#   cargo build --release -p tidemark-server
#   bash benches/leadership-under-load.sh target/release/tidemark [BASEPORT]
# Alternate two builds in one session to compare them: the machine's
# other load moves the figures.
set -u
BIN=$1
BP=${2:-7400}
WORK=$(mktemp -d)
pids=""
trap 'kill $pids 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
# The members' shared secret (format-spec/cluster.md section 7.1).
head -c 32 /dev/urandom | base64 >"$WORK/cluster-token"
chmod 600 "$WORK/cluster-token"
for i in 1 2 3; do
    peers=""
    for j in 1 2 3; do
        [ "$i" != "$j" ] && peers="$peers --cluster-peer $j=127.0.0.1:$((BP + 10 + j)),127.0.0.1:$((BP + j))"
    done
    # shellcheck disable=SC2086
    RUST_LOG=info "$BIN" serve --data "$WORK/c$i" --listen "127.0.0.1:$((BP + i))" \
        --cluster-node-id "$i" --cluster-listen "127.0.0.1:$((BP + 10 + i))" \
        --cluster-token-file "$WORK/cluster-token" $peers \
        >"$WORK/c$i.out" 2>"$WORK/c$i.log" &
    pids="$pids $!"
done
sleep 3
leader=$("$BIN" cluster status --addr "127.0.0.1:$((BP + 1))" --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["leader_id"])')
echo "leader before: $leader"
"$BIN" bench -w w1 --addr "127.0.0.1:$((BP + leader))" --messages 100000000 --duration 60 \
    --json --quiet >"$WORK/bench.json" 2>"$WORK/bench.err"
echo "load tool exit status $?: $(head -c 400 "$WORK/bench.json") $(tail -1 "$WORK/bench.err")"
for i in 1 2 3; do
    echo "node $i says the leader is: $("$BIN" cluster status --addr "127.0.0.1:$((BP + i))" --json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["leader_id"])')"
done
for i in 1 2 3; do
    echo "node $i:"
    grep -E 'leads|lost leadership|leadership lost|turn of writes' "$WORK/c$i.log" | cut -c1-200
done
