#!/usr/bin/env bash
# Launch the stock `lmcache server` with the lmcache-adp plugin as its L2 tier.
#
#   configs/lmcache-server.sh [--port 5555] [--http-port 8080] [--l1-size-gb 8]
#                             [--eviction-policy LRU] [--socket PATH] [--tenant NAME]
#                             [--private-l1] [-- extra lmcache server flags]
#
# The gateway (adp-gateway serve) must use the same --socket (both default to the gateway's
# default socket, which `python -m adp_wire socket-path` prints); it may start before or after.
# --supported-transfer-mode auto serves both GPU (lmcache_driven) and CPU (engine_driven) clients.
# max_capacity_gb is 0: the gateway owns capacity and eviction, which survive restarts.
# L1 lives in shared memory (/dev/shm/lmcache_l1_pool_adp-PORT, sized whole at start), so the
# gateway writes stores to the disk straight from L1 and LMCache's process does no per-byte work
# for them: the same copy inside LMCache's process cost its L1-hit lookups about 2 ms more at p99
# than in another process (docs/design.md, "Zero-copy stores"). Where /dev/shm
# cannot hold L1 (a container's 64 MiB), L1 stays private memory (the copy path) and one line
# says how to give it room. --private-l1 keeps L1 private without asking.
set -euo pipefail
PORT=5555 HTTP_PORT=8080 L1_GB=8 EVICTION=LRU SOCKET="" TENANT=default PRIVATE_L1=""
SHM_DIR=${ADP_SHM_DIR:-/dev/shm}  # tests: another directory
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=$2; shift 2 ;;
    --http-port) HTTP_PORT=$2; shift 2 ;;
    --l1-size-gb) L1_GB=$2; shift 2 ;;
    --eviction-policy) EVICTION=$2; shift 2 ;;
    --socket) SOCKET=$2; shift 2 ;;
    --tenant) TENANT=$2; shift 2 ;;
    --private-l1) PRIVATE_L1=1; shift ;;
    --) shift; break ;;
    *) echo "lmcache-server.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1
shm_room() {  # bytes free in $SHM_DIR for this port's L1, whose stale segment it would take over
  local stale=$SHM_DIR/lmcache_l1_pool_adp-$PORT taken=0
  [ -f "$stale" ] && taken=$(du -B1 "$stale" | cut -f1)
  echo $(( $(df --output=avail -B1 "$SHM_DIR" | tail -1) + taken ))
}
L1_FLAGS=()
if [ -z "$PRIVATE_L1" ]; then
  room=$(shm_room)
  if awk -v room="$room" -v gb="$L1_GB" 'BEGIN { exit !(room >= gb * 2^30) }'; then
    L1_FLAGS=(--shm-name "adp-$PORT" --no-l1-use-lazy)
  else
    echo "lmcache-server.sh: $SHM_DIR has $(( room / 2**20 )) MiB free, too little for a" \
      "${L1_GB} GiB L1; L1 stays private memory and stores are copied inside LMCache's process." \
      "For zero-copy stores, give $SHM_DIR room (docker run --shm-size or --ipc host), or lower" \
      "--l1-size-gb; --private-l1 says this is meant." >&2
  fi
fi
params='"tenant":"'"$TENANT"'"'
[ -n "$SOCKET" ] && params+=',"socket_path":"'"$SOCKET"'"'
l2='{"type":"native_plugin","module_path":"lmcache_adp","class_name":"ADPConnector",'
l2+='"adapter_params":{'"$params"'},"max_capacity_gb":0}'
exec lmcache server --host localhost --port "$PORT" --http-port "$HTTP_PORT" \
  --l1-size-gb "$L1_GB" --eviction-policy "$EVICTION" --chunk-size 256 \
  --supported-transfer-mode auto --l2-adapter "$l2" "${L1_FLAGS[@]}" "$@"
