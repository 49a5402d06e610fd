#!/usr/bin/env bash
# The main job: the gateway on the embedded software card plus `lmcache server` with the plugin,
# ready for vLLM (LMCacheMPConnector) to connect. Ctrl-C stops both cleanly.
#
#   scripts/serve.sh [--data-dir DIR] [--capacity SIZE] [--port 5555] [--http-port 8080]
#                    [--l1-size-gb 8] [--socket PATH] [--zero-copy]
#
# --zero-copy keeps LMCache's L1 in shared memory, which the gateway reads and writes directly.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA_DIR=$ROOT/adp-data CAPACITY="" PORT=5555 HTTP_PORT=8080 L1_GB=8
SOCKET=/tmp/lmcache-adp/gateway.sock SERVER_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) DATA_DIR=$2; shift 2 ;;
    --capacity) CAPACITY=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --http-port) HTTP_PORT=$2; shift 2 ;;
    --l1-size-gb) L1_GB=$2; shift 2 ;;
    --socket) SOCKET=$2; shift 2 ;;
    --zero-copy) SERVER_FLAGS+=(--zero-copy); shift ;;
    *) echo "serve.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
ADP_EXTRAS=${ADP_EXTRAS:-serve} source "$ROOT/scripts/setup-env.sh"

gateway_args=(serve --data-dir "$DATA_DIR" --socket "$SOCKET")
[ -n "$CAPACITY" ] && gateway_args+=(--capacity "$CAPACITY")
# Its own session: a terminal's Ctrl-C reaches the lmcache server and this script, which then
# stops the gateway last, after the server's final L2 writes.
setsid adp-gateway "${gateway_args[@]}" &
gateway_pid=$!
server_pid=""
stop() {
  trap - INT TERM
  [ -n "$server_pid" ] && kill -INT "$server_pid" 2>/dev/null && wait "$server_pid" || true
  kill -TERM "$gateway_pid" 2>/dev/null && wait "$gateway_pid" || true
}
trap 'stop; exit 0' INT TERM
for _ in $(seq 100); do [ -S "$SOCKET" ] && break; kill -0 "$gateway_pid" || exit 1; sleep 0.1; done
"$ROOT/configs/lmcache-server.sh" --port "$PORT" --http-port "$HTTP_PORT" \
  --l1-size-gb "$L1_GB" --socket "$SOCKET" "${SERVER_FLAGS[@]}" &
server_pid=$!
echo "serve.sh: gateway pid $gateway_pid, lmcache server pid $server_pid (port $PORT); Ctrl-C stops both"
wait -n "$gateway_pid" "$server_pid" || true
stop
