#!/usr/bin/env bash
# Launch the stock `lmcache server` with the lmcache-adp plugin as its L2 tier.
#
#   configs/lmcache-server.sh [--port 5555] [--http-port 8080] [--l1-size-gb 8]
#                             [--eviction-policy LRU] [--socket PATH] [--tenant NAME]
#                             [--zero-copy] [-- extra lmcache server flags]
#
# The gateway (adp-gateway serve) must use the same --socket (both default to the gateway's
# default socket, which `python -m adp_wire socket-path` prints); it may start before or after.
# --supported-transfer-mode auto serves both GPU (lmcache_driven) and CPU (engine_driven) clients.
# max_capacity_gb is 0: the gateway owns capacity and eviction, which survive restarts.
# --zero-copy puts L1 in shared memory (/dev/shm/lmcache_l1_pool_adp-PORT, allocated whole at
# start), so the gateway writes stores to the disk straight from L1 (docs/design.md).
set -euo pipefail
PORT=5555 HTTP_PORT=8080 L1_GB=8 EVICTION=LRU SOCKET="" TENANT=default
L1_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=$2; shift 2 ;;
    --http-port) HTTP_PORT=$2; shift 2 ;;
    --l1-size-gb) L1_GB=$2; shift 2 ;;
    --eviction-policy) EVICTION=$2; shift 2 ;;
    --socket) SOCKET=$2; shift 2 ;;
    --tenant) TENANT=$2; shift 2 ;;
    --zero-copy) L1_FLAGS=(--shm-name "adp-$PORT" --no-l1-use-lazy); shift ;;
    --) shift; break ;;
    *) echo "lmcache-server.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1
params='"tenant":"'"$TENANT"'"'
[ -n "$SOCKET" ] && params+=',"socket_path":"'"$SOCKET"'"'
l2='{"type":"native_plugin","module_path":"lmcache_adp","class_name":"ADPConnector",'
l2+='"adapter_params":{'"$params"'},"max_capacity_gb":0}'
exec lmcache server --host localhost --port "$PORT" --http-port "$HTTP_PORT" \
  --l1-size-gb "$L1_GB" --eviction-policy "$EVICTION" --chunk-size 256 \
  --supported-transfer-mode auto --l2-adapter "$l2" "${L1_FLAGS[@]}" "$@"
