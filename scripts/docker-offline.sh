#!/usr/bin/env bash
# Builds the container image with no package index reached from inside the build: this host
# downloads exactly the wheels the Dockerfile installs, for the base image's own Python, glibc
# and machine, into deploy/docker/wheels/ (never committed), then runs
# `docker build --build-arg PIP_NO_INDEX=1`. Also what to use behind a TLS-inspecting proxy
# that the build could not trust: the host's pip already does.
#
#   scripts/docker-offline.sh [--base IMAGE] [--tag TAG]       # default TAG: lmcache-adp
#
# --base: the image to build on (the Dockerfile's BASE_IMAGE). Default: python:3.11-slim-bookworm
#   where Docker has it or can pull it; otherwise lmcache-adp-base:bookworm, which
#   scripts/docker-base.sh makes from Debian's own archive (root and debootstrap; no registry).
# The wheels: the CPU build of torch (a wheel this host's pip holds on local disk, else from
# $TORCH_INDEX_URL, PyTorch's CPU index), then pyproject.toml's dependencies with everything they
# need (deploy/docker/fetch_wheels.py says how). They are kept in $ADP_DOCKER_CACHE (default
# ~/.cache/lmcache-adp/docker), so the next build downloads nothing. Needs docker, and python3
# (3.11 or later) with pip on the host. $PYTHON picks another Python.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE="" TAG=lmcache-adp PYTHON=${PYTHON:-python3}
PUBLIC_BASE=python:3.11-slim-bookworm LOCAL_BASE=lmcache-adp-base:bookworm
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    *) echo "docker-offline.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
say() { echo "docker-offline.sh: $*"; }
die() { echo "docker-offline.sh: $*" >&2; exit 1; }

timeout 30 docker info >/dev/null 2>&1 || die "no Docker daemon answers (\`docker info\`)"
have() { docker image inspect "$1" >/dev/null 2>&1; }
if [ -z "$BASE" ]; then
  if have "$PUBLIC_BASE" || timeout 300 docker pull -q "$PUBLIC_BASE" >/dev/null 2>&1; then
    BASE=$PUBLIC_BASE
  else
    say "$PUBLIC_BASE cannot be pulled: using $LOCAL_BASE, made from Debian's archive"
    "$ROOT/scripts/docker-base.sh" "$LOCAL_BASE" || die "scripts/docker-base.sh failed (above)"
    BASE=$LOCAL_BASE
  fi
fi
have "$BASE" || die "no image $BASE here: pull it, or leave out --base"

# What the wheels must fit: the base image's Python (x.y.z: markers may depend on the patch
# level), its glibc and its machine.
read -r python glibc machine < <(timeout 120 docker run --rm --network none "$BASE" python3 -c \
  'import platform; print(platform.python_version(), platform.libc_ver()[1], platform.machine())') \
  || die "$BASE has no python3 that answers"
say "base $BASE: Python $python, glibc $glibc, $machine"
"$PYTHON" "$ROOT/deploy/docker/fetch_wheels.py" "$python" "$glibc" "$machine" \
  || die "the wheels could not be downloaded (above)"

say "docker build -t $TAG (the build reaches no index)"
started=$SECONDS
docker build --tag "$TAG" --build-arg "BASE_IMAGE=$BASE" --build-arg PIP_NO_INDEX=1 "$ROOT" \
  || die "docker build failed (above)"
say "built $TAG in $((SECONDS - started)) s: $(docker image inspect --format '{{.Size}}' "$TAG" \
  | awk '{printf "%.2f GB", $1 / 1e9}')"
