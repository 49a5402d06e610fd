#!/usr/bin/env bash
# The main job: the gateway on the embedded software card plus `lmcache server` with the plugin,
# ready for vLLM (LMCacheMPConnector) to connect. Ctrl-C stops both cleanly.
#
#   scripts/serve.sh [--data-dir ./adp-data] [--capacity 8GiB] [--port 5555] [--http-port 8080]
#                    [--l1-size-gb 8] [--socket PATH] [--metrics-address 127.0.0.1:9464]
#                    [--no-metrics] [--private-l1] [--huge-pages]
#
# --capacity is what the gateway preallocates in --data-dir (8 GiB unless told otherwise).
# --socket defaults to the gateway's own default (`python -m adp_wire socket-path` prints it).
# --metrics-address is where the gateway serves /metrics (Prometheus), /healthz and /readyz
#   (127.0.0.1:9464 unless told otherwise); --no-metrics serves none of them. LMCache serves its
#   own metrics on its HTTP port (--http-port), at /metrics.
# LMCache's L1 lives in shared memory where /dev/shm has room for it, and the gateway writes stores
# straight from it (configs/lmcache-server.sh says why); --private-l1 keeps it private memory.
# --huge-pages (root) lets the sessions' shared memory have huge pages, by setting the host's
#   /sys/kernel/mm/transparent_hugepage/shmem_enabled from `never` to `advise` (only memory that
#   asks for them gets them). On a 2-core VM it took 4 and 32 MiB stores from 0.40-0.55x to
#   0.69-0.89x of fio's best write (bench/results/matrix-vm.md, matrix-hugepages-vm.md).
#
# Both processes' output goes to the terminal and to a log directory under $TMPDIR (else /tmp),
# which a clean stop removes. Once both serve (the server answers on its ports) it prints a ready
# block: ports, socket, data dir, the metrics URL and the command that checks the stack. When
# either cannot start (a second copy of the stack, a port in use, a data dir in use...), that
# process's own error shows once, then one line `serve.sh: ... did not start` naming the log
# directory, which is kept, and it exits 1; likewise, with one line `serve.sh: ... exited`, when
# one of them exits while serving. (Ctrl-C reaches this script as SIGINT, which a shell ignores
# for a job it starts in the background with `&`: stop such a job with SIGTERM.)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA_DIR=$ROOT/adp-data CAPACITY=8GiB PORT=5555 HTTP_PORT=8080 L1_GB=8 SOCKET="" SERVER_FLAGS=()
METRICS=127.0.0.1:9464
HUGE_PAGES="" SHMEM=${ADP_SHMEM_SETTING:-/sys/kernel/mm/transparent_hugepage/shmem_enabled}  # tests: a copy
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) DATA_DIR=$2; shift 2 ;;
    --capacity) CAPACITY=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --http-port) HTTP_PORT=$2; shift 2 ;;
    --l1-size-gb) L1_GB=$2; shift 2 ;;
    --socket) SOCKET=$2; shift 2 ;;
    --metrics-address) METRICS=$2; shift 2 ;;
    --no-metrics) METRICS=""; shift ;;
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
fail() {  # the process's own error is on the terminal already: say which, keep the logs
  sleep 0.2  # for tee to show that error first
  echo "serve.sh: $1 (its error is above; logs kept in $LOGS)" >&2
  stop
  exit 1
}
server_pid=""
stop() {
  trap - INT TERM
  [ -n "$server_pid" ] && kill -INT "$server_pid" 2>/dev/null && wait "$server_pid" || true
  kill -TERM "$gateway_pid" 2>/dev/null && wait "$gateway_pid" || true
}
clean_stop() {  # Ctrl-C or SIGTERM: both stop, and their logs were on the terminal
  stop
  rm -rf "$LOGS"
  exit 0
}

# Its own session: a terminal's Ctrl-C reaches the lmcache server and this script, which then
# stops the gateway last, after the server's final L2 writes.
GATEWAY_FLAGS=(--data-dir "$DATA_DIR" --socket "$SOCKET" --capacity "$CAPACITY")
[ -z "$METRICS" ] || GATEWAY_FLAGS+=(--metrics-address "$METRICS")
setsid adp-gateway serve "${GATEWAY_FLAGS[@]}" > >(keep "$LOGS/gateway.log") 2>&1 &
gateway_pid=$!
trap clean_stop INT TERM
until grep -q "listening on" "$LOGS/gateway.log" 2>/dev/null; do
  if ! kill -0 "$gateway_pid" 2>/dev/null; then
    grep -q "metrics_address" "$LOGS/gateway.log" 2>/dev/null \
      && fail "the gateway did not start: --metrics-address HOST:PORT moves its metrics, --no-metrics turns them off"
    fail "the gateway did not start"
  fi
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
  kill -0 "$server_pid" 2>/dev/null || fail "lmcache server did not start"
  sleep 0.5
done
metrics="off (--no-metrics)"
[ -z "$METRICS" ] || metrics="http://$METRICS/metrics (and /healthz, /readyz)"
cat <<EOF
serve.sh: ready. lmcache server on port $PORT (HTTP $HTTP_PORT), L1 ${L1_GB} GiB; gateway on
  $SOCKET, ${CAPACITY} preallocated in $DATA_DIR. Ctrl-C stops both.
  Gateway metrics: $metrics
  Check it: scripts/smoke.sh --socket $SOCKET
  Logs (removed at a clean stop): $LOGS
EOF
wait -n "$gateway_pid" "$server_pid" && status=0 || status=$?
# Only a process that exited on its own (or was stopped by someone else) comes here: this
# script's Ctrl-C and SIGTERM end in clean_stop.
who="the gateway"
kill -0 "$gateway_pid" 2>/dev/null && who="lmcache server"
echo "serve.sh: $who exited (status $status) while serving; stopping the stack (logs kept in $LOGS)" >&2
stop
exit 1
