# shellcheck shell=bash
# Sourced by .ci/run: a Docker daemon and a base image for tests/docker, where they can be had
# within a bounded time, on a fresh machine as on one that has them already. Where they cannot,
# it exports ADP_DOCKER_UNAVAILABLE with the reason, and tests/docker skips with it; it never
# fails CI by itself. ADP_DOCKER_CI=0 skips it all.
#
# From nothing (root, Debian): apt-get install docker.io debootstrap, start dockerd (log in
# $ADP_DOCKERD_LOG), scripts/docker-base.sh (debootstrap + docker import, cached as a tarball).
# adp_docker_ci_stop stops a dockerd started here; .ci/run calls it on exit.

adp_docker_started_pid=""
adp_docker_reason=""

adp_docker_ci_stop() {
  if [ -n "$adp_docker_started_pid" ] && kill -0 "$adp_docker_started_pid" 2>/dev/null; then
    kill -TERM "$adp_docker_started_pid"
    for _ in $(seq 100); do kill -0 "$adp_docker_started_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  adp_docker_started_pid=""
}

adp_docker_ci_setup() {
  local root started log waited
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  started=$SECONDS
  log=${ADP_DOCKERD_LOG:-${TMPDIR:-/tmp}/adp-dockerd.log}
  if [ "${ADP_DOCKER_CI:-1}" = 0 ]; then
    adp_docker_reason="ADP_DOCKER_CI=0"
    return 1
  fi
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { adp_docker_reason="not root: cannot install ${missing[*]}"; return 1; }
    command -v apt-get >/dev/null || { adp_docker_reason="no apt-get for ${missing[*]}"; return 1; }
    if ! { timeout 300 apt-get update -qq >/dev/null 2>&1 \
      && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null 2>&1; }; then
      adp_docker_reason="apt-get install ${missing[*]} failed or took over 300 s"
      return 1
    fi
  fi
  if ! timeout 20 docker info >/dev/null 2>&1; then
    # Its own session, so that CI's terminal signals go to the tests only.
    setsid dockerd >"$log" 2>&1 &
    adp_docker_started_pid=$!
    waited=0
    until timeout 10 docker info >/dev/null 2>&1; do
      if ! kill -0 "$adp_docker_started_pid" 2>/dev/null || [ "$waited" -ge 60 ]; then
        adp_docker_ci_stop
        adp_docker_reason="dockerd did not come up within 60 s: $(tail -1 "$log")"
        return 1
      fi
      sleep 1
      waited=$((waited + 1))
    done
  fi
  # Each change of pyproject.toml's dependencies leaves a few GB of old build layers: keep
  # those of the last three days (the build's cache), drop older ones.
  timeout 120 docker image prune --force --filter until=72h >/dev/null 2>&1 || true
  timeout 900 "$root/scripts/docker-base.sh" >&2 \
    || { adp_docker_reason="scripts/docker-base.sh failed or took over 900 s"; return 1; }
  echo "docker-ci: daemon and base image ready in $((SECONDS - started)) s" >&2
}

if adp_docker_ci_setup; then
  export ADP_DOCKER_BASE_IMAGE=lmcache-adp-base:bookworm
else
  export ADP_DOCKER_UNAVAILABLE="scripts/docker-ci.sh: $adp_docker_reason"
  echo "docker-ci: tests/docker will skip: $adp_docker_reason" >&2
fi
unset adp_docker_reason
