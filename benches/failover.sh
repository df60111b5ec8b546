#!/bin/bash
# Failover time of a 3-node replica set: the leader is SIGKILLed
# KILLS times (restarted after each) while a client sends, each send
# retried through whichever member leads; the time from the SIGKILL to the
# first send another member acknowledged, as the client sees it, p50 and
# max. It is the end-to-end test `cluster_faults::failover_time_over_leader_kills_loses_nothing_acknowledged`
# (the dev profile is optimized; it also checks that every acknowledged send is
# stored once at its id and that the replicas' logs end identical).
#   bash benches/failover.sh [KILLS]
set -euo pipefail
KILLS=${1:-20}
TIDEMARK_FAILOVER_KILLS=$KILLS cargo test --test it -- \
    cluster_faults::failover_time_over_leader_kills_loses_nothing_acknowledged --nocapture 2>&1 |
    grep -E '^failover over|^test result'
