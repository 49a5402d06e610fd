#!/usr/bin/env bash
# Launch the stock `lmcache server` with two L2 tiers: lmcache-adp (the gateway's NVMe tier)
# and LMCache's own Redis/Valkey adapter (`resp`, its C++ RESP client, shipped in the wheel).
#
#   configs/two-adapters.sh [--port 5555] [--http-port 8080] [--l1-size-gb 8]
#                           [--socket PATH] [--tenant NAME]
#                           [--redis-host 127.0.0.1] [--redis-port 6379] [--redis-workers 8]
#                           [--redis-first] [-- extra lmcache server flags]
#
# What LMCache does with two adapters (docs/compatibility.md, "Two adapters"):
# - every store goes to both (each keeps its own copy);
# - every lookup asks both in parallel and waits for both, so Redis's lookup time adds to ours
#   only where it is slower (bench/two_adapters.py measures it);
# - a chunk is loaded from the first adapter on the command line that holds it: ours, unless
#   --redis-first.
# Redis credentials: set LMCACHE_RESP_USERNAME / LMCACHE_RESP_PASSWORD in the environment
# rather than in the JSON, which LMCache logs. Redis keeps what its own maxmemory policy keeps
# (give it one, e.g. maxmemory-policy allkeys-lru); both adapters have max_capacity_gb 0, so
# LMCache's own L2 eviction stays off.
set -euo pipefail
PORT=5555 HTTP_PORT=8080 L1_GB=8 SOCKET="" TENANT=default  # SOCKET "": the gateway's default
REDIS_HOST=127.0.0.1 REDIS_PORT=6379 REDIS_WORKERS=8 REDIS_FIRST=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=$2; shift 2 ;;
    --http-port) HTTP_PORT=$2; shift 2 ;;
    --l1-size-gb) L1_GB=$2; shift 2 ;;
    --socket) SOCKET=$2; shift 2 ;;
    --tenant) TENANT=$2; shift 2 ;;
    --redis-host) REDIS_HOST=$2; shift 2 ;;
    --redis-port) REDIS_PORT=$2; shift 2 ;;
    --redis-workers) REDIS_WORKERS=$2; shift 2 ;;
    --redis-first) REDIS_FIRST=1; shift ;;
    --) shift; break ;;
    *) echo "two-adapters.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1
params='"tenant":"'"$TENANT"'"'
[ -n "$SOCKET" ] && params+=',"socket_path":"'"$SOCKET"'"'
adp='{"type":"native_plugin","module_path":"lmcache_adp","class_name":"ADPConnector",'
adp+='"adapter_params":{'"$params"'},"max_capacity_gb":0}'
redis='{"type":"resp","host":"'"$REDIS_HOST"'","port":'"$REDIS_PORT"','
redis+='"num_workers":'"$REDIS_WORKERS"',"max_capacity_gb":0}'
if [ "$REDIS_FIRST" = 1 ]; then adapters=(--l2-adapter "$redis" --l2-adapter "$adp")
else adapters=(--l2-adapter "$adp" --l2-adapter "$redis"); fi
exec lmcache server --host localhost --port "$PORT" --http-port "$HTTP_PORT" \
  --l1-size-gb "$L1_GB" --eviction-policy LRU --chunk-size 256 \
  --supported-transfer-mode auto "${adapters[@]}" "$@"
