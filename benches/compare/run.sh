#!/usr/bin/env bash
# IM-bench v1: tidemark against Redis Streams, SQLite and PostgreSQL in one run.
#
#   bash benches/compare/run.sh [tidemark-compare run flags, e.g. --w1-messages 100000]
#
# Installs what is missing (Debian's redis-server and postgresql; SQLite is
# bundled into the compare binary), builds tidemark and the compare program
# in release mode, starts Redis (AOF) and a PostgreSQL cluster on loopback
# in a temporary directory, runs W1-W4 against every system with the same
# parameters and payloads, stops everything it started, and writes
# benches/compare/results/latest.md (and latest.json); the table says which
# parameters are scaled down from the brief. Prerequisites and run time:
# benches/compare/README.md.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)

log() { echo "[run.sh] $*" >&2; }

# Fail before anything is installed or built, naming what is missing.
for tool in python3 cc; do
    command -v "$tool" >/dev/null || {
        log "$tool is needed (see benches/compare/README.md, Prerequisites)"
        exit 1
    }
done

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
if ((${#need_apt[@]})); then
    command -v apt-get >/dev/null || {
        log "${need_apt[*]} missing and no apt-get to install them (see benches/compare/README.md)"
        exit 1
    }
    log "installing ${need_apt[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

log "building tidemark and the compare program (release)"
cargo build --release -q -p tidemark-server --bin tidemark
cargo build --release -q --manifest-path benches/compare/Cargo.toml
TIDEMARK="$ROOT/target/release/tidemark"
COMPARE="$ROOT/benches/compare/target/release/tidemark-compare"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tidemark-compare.XXXXXX")
chmod 755 "$WORK"
REDIS_PID=""
PG_STARTED=""

# Run as the postgres user when we are root (PostgreSQL refuses root).
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cleanup() {
    set +e
    if [ -n "$PG_STARTED" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m fast -w stop >/dev/null 2>&1
    fi
    if [ -n "$REDIS_PID" ]; then
        kill "$REDIS_PID" 2>/dev/null
        wait "$REDIS_PID" 2>/dev/null
    fi
    if [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; else log "kept $WORK"; fi
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

REDIS_PORT=$(free_port)
mkdir -p "$WORK/redis"
log "starting redis-server on 127.0.0.1:$REDIS_PORT"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" \
    --appendonly yes --appendfsync everysec --save "" --protected-mode no \
    --daemonize no --logfile "$WORK/redis/redis.log" &
REDIS_PID=$!
for _ in $(seq 100); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
done
redis-cli -p "$REDIS_PORT" ping >/dev/null

PG_PORT=$(free_port)
mkdir -p "$WORK/pg"
[ "$(id -u)" -ne 0 ] || chown postgres: "$WORK/pg"
log "starting PostgreSQL ($PGBIN) on 127.0.0.1:$PG_PORT"
as_pg "$PGBIN/initdb" -D "$WORK/pg/data" -A trust -U postgres >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w start -o \
    "-c listen_addresses=127.0.0.1 -c port=$PG_PORT -c unix_socket_directories=$WORK/pg \
     -c shared_buffers=1GB -c wal_level=minimal -c max_wal_senders=0 \
     -c max_wal_size=4GB -c checkpoint_timeout=30min -c max_connections=100" >/dev/null
PG_STARTED=1

MACHINE="$(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), \
$(free -h | awk '/^Mem:/ {print $2}') RAM, disk $(df -h "$WORK" | awk 'NR==2 {print $1 " (" $2 ")"}'), \
kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME"); \
$(redis-server --version | cut -d' ' -f1-3), PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), \
SQLite bundled by rusqlite"

mkdir -p "$WORK/data"
"$COMPARE" run --redis-port "$REDIS_PORT" --pg-port "$PG_PORT" \
    --work-dir "$WORK/data" --node-bin "$TIDEMARK" \
    --out "${OUT:-$ROOT/benches/compare/results/latest.md}" \
    --machine "$MACHINE" --command "bash benches/compare/run.sh $*" "$@"
log "wrote ${OUT:-benches/compare/results/latest.md}"
