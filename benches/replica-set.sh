#!/bin/bash
# W1 and W3 (IM-bench v1, /work/shared/design-brief.md section 5) against a
# single node and against the leader of a 3-node replica set on this
# machine (format-spec/cluster.md), alternated ROUNDS times; every node
# with the default fsync=always. Prints one line per run: the workload,
# the setup and the load tool's JSON summary (ops_per_sec, latency_us),
# and for the set the elections its members started during the run.
#   cargo build --release -p tidemark-server
#   bash benches/replica-set.sh target/release/tidemark [ROUNDS] [MESSAGES] [ACKS] [WORKLOADS]
# MESSAGES: W1 sends (default 200,000); ACKS: W3 ACKs (default 1,000,000,
# 100,000 members); WORKLOADS: "w1 w3" (default).
# The three nodes share the machine's cores with each other and with the
# load tool: compare the ratio, not the absolute figures.
# Failover time (SIGKILL of the leader to the first send a new leader
# acknowledged, 20 kills): benches/failover.sh.
set -euo pipefail
BIN=$1
ROUNDS=${2:-2}
MESSAGES=${3:-200000}
ACKS=${4:-1000000}
WORKLOADS=${5:-w1 w3}
WORK=$(mktemp -d)
pids=""
trap 'kill $pids 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

load() {
    case $1 in
    w1) "$BIN" bench -w w1 --addr "$2" --messages "$MESSAGES" --duration 20 --json --quiet ;;
    w3) "$BIN" bench -w w3 --addr "$2" --ops "$ACKS" --json --quiet ;;
    esac
}

single() {
    rm -rf "$WORK/s"
    "$BIN" serve --data "$WORK/s" --listen 127.0.0.1:7201 >"$WORK/s.log" 2>&1 &
    pids=$!
    sleep 1
    load "$1" 127.0.0.1:7201
    kill $pids; wait $pids 2>/dev/null || true; pids=""
}

replica_set() {
    # The set's shared secret (format-spec/cluster.md section 7.1).
    head -c 32 /dev/urandom | base64 >"$WORK/cluster-token"
    chmod 600 "$WORK/cluster-token"
    for i in 1 2 3; do
        peers=""
        for j in 1 2 3; do
            [ "$i" != "$j" ] && peers="$peers --cluster-peer $j=127.0.0.1:731$j,127.0.0.1:730$j"
        done
        rm -rf "$WORK/c$i"
        # shellcheck disable=SC2086
        "$BIN" serve --data "$WORK/c$i" --listen "127.0.0.1:730$i" --cluster-node-id "$i" \
            --cluster-listen "127.0.0.1:731$i" --cluster-token-file "$WORK/cluster-token" \
            $peers >"$WORK/c$i.log" 2>&1 &
        pids="$pids $!"
    done
    # Elections start after 1-2 s without a leader (cluster.md 5.3).
    leader=None
    for _ in $(seq 50); do
        sleep 0.2
        leader=$("$BIN" cluster status --addr 127.0.0.1:7301 --json 2>/dev/null |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["leader_id"])' 2>/dev/null) || true
        [ -n "$leader" ] && [ "$leader" != None ] && break
    done
    before=$(elections)
    load "$1" "127.0.0.1:730$leader"
    echo " elections started during the run (all members): $(( $(elections) - before ))"
    # shellcheck disable=SC2086
    kill $pids; wait 2>/dev/null || true; pids=""
}

# The elections the set's members have started since they started (STATS
# raft.elections_started, summed over the three).
elections() {
    local n=0 e
    for i in 1 2 3; do
        e=$("$BIN" cluster status --addr "127.0.0.1:730$i" --json 2>/dev/null |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["counters"]["elections_started"])' 2>/dev/null) || e=0
        n=$((n + ${e:-0}))
    done
    echo "$n"
}

for round in $(seq "$ROUNDS"); do
    for w in $WORKLOADS; do
        echo "$w single node, round $round: $(single "$w")"
        echo "$w replica set of 3, round $round: $(replica_set "$w")"
    done
done
