#!/usr/bin/env bash
# The image's entry point (the Dockerfile installs it as adp-entrypoint): one image, one service
# per container.
#
#   gateway [adp-gateway serve flags]
#       The storage gateway on $ADP_DATA_DIR (a volume) with its socket at $ADP_SOCKET (in a
#       volume the lmcache server containers mount too). With $ADP_CONFIG set, its settings come
#       from that file (data_dirs, devices, tenants, ...) and only the socket is given here.
#       $ADP_METRICS_ADDRESS (such as 0.0.0.0:9464) serves /metrics, /healthz and /readyz.
#   lmcache-server [configs/lmcache-server.sh flags] [-- lmcache server flags]
#       The stock `lmcache server` with the plugin on $ADP_SOCKET, ports $LMCACHE_PORT (5555)
#       and $LMCACHE_HTTP_PORT (8080). It listens on localhost: add `-- --host 0.0.0.0` (or the
#       node's address) for vLLM in another network namespace.
#   anything else
#       Run as given: `adp-gateway check`, `lmcache bench l2 ...`, `bash`.
#
# The socket path is always given on the command line, so the gateway, its clients and
# adp-healthcheck agree on it.
set -euo pipefail

role=${1:-gateway}
case "$role" in
  gateway)
    shift $(($# > 0 ? 1 : 0))
    args=(--socket "$ADP_SOCKET")
    [ -n "${ADP_METRICS_ADDRESS:-}" ] && args+=(--metrics-address "$ADP_METRICS_ADDRESS")
    if [ -n "${ADP_CONFIG:-}" ]; then
      exec adp-gateway serve --config "$ADP_CONFIG" "${args[@]}" "$@"
    fi
    exec adp-gateway serve --data-dir "$ADP_DATA_DIR" "${args[@]}" "$@"
    ;;
  lmcache-server)
    shift
    exec /opt/lmcache-adp/configs/lmcache-server.sh --socket "$ADP_SOCKET" \
      --port "${LMCACHE_PORT:-5555}" --http-port "${LMCACHE_HTTP_PORT:-8080}" "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
