#!/usr/bin/env bash
# The main job: the gateway on the embedded software card plus `lmcache server` with the plugin,
# ready for vLLM (LMCacheMPConnector) to connect. Ctrl-C stops both cleanly.
#
#   scripts/serve.sh [--data-dir ./adp-data] [--capacity 8GiB] [--port 5555] [--http-port 8080]
#                    [--l1-size-gb 8] [--socket PATH] [--private-l1] [--huge-pages]
#
# --capacity is what the gateway preallocates in --data-dir (8 GiB unless told otherwise).
# --socket defaults to the gateway's own default (`python -m adp_wire socket-path` prints it).
# LMCache's L1 lives in shared memory where /dev/shm has room for it, and the gateway writes stores
# straight from it (configs/lmcache-server.sh says why); --private-l1 keeps it private memory.
# --huge-pages (root) lets the sessions' shared memory have huge pages, by setting the host's
#   /sys/kernel/mm/transparent_hugepage/shmem_enabled from `never` to `advise` (only memory that
#   asks for them gets them). On a 2-core VM it took 4 and 32 MiB stores from about 0.6x to 0.9x
#   of fio's best write (bench/results/hugepages/; docs/operations.md, "Huge pages").
#
# It prints one line when both serve (the server answers on its port), or one line saying what
# went wrong, and exits non-zero, if either cannot start (a second copy of the stack, a port in
# use, a data dir in use...).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA_DIR=$ROOT/adp-data CAPACITY=8GiB PORT=5555 HTTP_PORT=8080 L1_GB=8 SOCKET="" SERVER_FLAGS=()
HUGE_PAGES="" SHMEM=${ADP_SHMEM_SETTING:-/sys/kernel/mm/transparent_hugepage/shmem_enabled}  # tests: a copy
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) DATA_DIR=$2; shift 2 ;;
    --capacity) CAPACITY=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --http-port) HTTP_PORT=$2; shift 2 ;;
    --l1-size-gb) L1_GB=$2; shift 2 ;;
    --socket) SOCKET=$2; shift 2 ;;
    --private-l1) SERVER_FLAGS+=(--private-l1); shift ;;
    --huge-pages) HUGE_PAGES=1; shift ;;
    *) echo "serve.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
if [ -n "$HUGE_PAGES" ] && grep -q '\[never\]' "$SHMEM" 2>/dev/null; then
  echo advise 2>/dev/null > "$SHMEM" \
    || { echo "serve.sh: --huge-pages needs root to write advise to $SHMEM" >&2; exit 2; }
  echo "serve.sh: $SHMEM: never -> advise (shared memory that asks for huge pages gets them)"
fi
ADP_EXTRAS=${ADP_EXTRAS:-serve} source "$ROOT/scripts/setup-env.sh"
[ -n "$SOCKET" ] || SOCKET=$(python -m adp_wire socket-path)
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/adp-serve.XXXXXX")

keep() {  # show and keep a log; Ctrl-C must not end it before the processes' last lines
  trap '' INT
  exec tee "$1"
}
fail() {  # one line saying what went wrong, the log that says more, and stop what started
  echo "serve.sh: $1 (see $2)" >&2
  stop
  exit 1
}
server_pid=""
stop() {
  trap - INT TERM
  [ -n "$server_pid" ] && kill -INT "$server_pid" 2>/dev/null && wait "$server_pid" || true
  kill -TERM "$gateway_pid" 2>/dev/null && wait "$gateway_pid" || true
}

# Its own session: a terminal's Ctrl-C reaches the lmcache server and this script, which then
# stops the gateway last, after the server's final L2 writes.
setsid adp-gateway serve --data-dir "$DATA_DIR" --socket "$SOCKET" --capacity "$CAPACITY" \
  > >(keep "$LOGS/gateway.log") 2>&1 &
gateway_pid=$!
trap 'stop; exit 0' INT TERM
until grep -q "listening on" "$LOGS/gateway.log" 2>/dev/null; do
  kill -0 "$gateway_pid" 2>/dev/null \
    || fail "the gateway did not start: $(grep -m1 'error' "$LOGS/gateway.log" || true)" "$LOGS/gateway.log"
  sleep 0.2
done
"$ROOT/configs/lmcache-server.sh" --port "$PORT" --http-port "$HTTP_PORT" \
  --l1-size-gb "$L1_GB" --socket "$SOCKET" "${SERVER_FLAGS[@]}" > >(keep "$LOGS/server.log") 2>&1 &
server_pid=$!
# Ready means the server answers on its HTTP port and its own port listens (its health check
# comes first, seconds before the port), and the process is this script's own.
until python - "$HTTP_PORT" "$PORT" <<'EOF' 2>/dev/null
import socket, sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthcheck", timeout=1)
socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=1).close()
EOF
do
  kill -0 "$server_pid" 2>/dev/null \
    || fail "lmcache server did not start: $(grep -m1 -iE 'error|in use' "$LOGS/server.log" || true)" "$LOGS/server.log"
  sleep 0.5
done
cat <<EOF
serve.sh: ready. lmcache server on port $PORT (HTTP $HTTP_PORT), L1 ${L1_GB} GiB; gateway on
  $SOCKET, ${CAPACITY} preallocated in $DATA_DIR. Ctrl-C stops both. Logs: $LOGS
  Check it: scripts/smoke.sh --socket $SOCKET
EOF
wait -n "$gateway_pid" "$server_pid" || true
stop
