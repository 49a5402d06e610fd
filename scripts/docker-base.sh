#!/usr/bin/env bash
# Builds a local base image for the Dockerfile without any container registry: a Debian bookworm
# root filesystem made by debootstrap from Debian's own archive (minbase, python3, python3-venv),
# then `docker import`ed. Python 3.11.2, like python:3.11-slim-bookworm, which the Dockerfile
# uses by default.
#
#   scripts/docker-base.sh [TAG]        # default TAG: lmcache-adp-base:bookworm
#   docker build --build-arg BASE_IMAGE=lmcache-adp-base:bookworm ...
#
# Needs root, debootstrap and a running Docker daemon. The root filesystem's tarball is kept in
# $ADP_DOCKER_CACHE (default ~/.cache/lmcache-adp/docker), so a fresh daemon re-imports it in
# seconds instead of running debootstrap again (about 80 s). Nothing is done when the image with
# this script's version is already there. DEBIAN_MIRROR picks another Debian mirror.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TAG=${1:-lmcache-adp-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${ADP_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lmcache-adp/docker}
version=$(sha1sum "$ROOT/scripts/docker-base.sh" | cut -c1-12)
tarball="$CACHE/bookworm-python3-$version.tar"

existing=$(docker image inspect --format '{{ index .Config.Labels "lmcache-adp.base-version" }}' \
  "$TAG" 2>/dev/null || true)
if [ "$existing" = "$version" ]; then
  echo "docker-base: $TAG is up to date"
  exit 0
fi

if [ ! -s "$tarball" ]; then
  [ "$(id -u)" = 0 ] || { echo "docker-base: debootstrap needs root" >&2; exit 1; }
  command -v debootstrap >/dev/null \
    || { echo "docker-base: debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
  mkdir -p "$CACHE"
  rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$rootfs" "$rootfs.log" "$tarball.tmp"' EXIT
  echo "docker-base: debootstrap bookworm into $rootfs (about 80 s)"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$MIRROR" \
    > "$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; echo "docker-base: debootstrap failed" >&2; exit 1; }
  # What an image does not need: downloaded packages, package lists, documentation.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
  tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  for old in "$CACHE"/bookworm-python3-*.tar; do
    [ "$old" = "$tarball" ] || rm -f "$old"  # tarballs of older versions of this script
  done
fi

docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL lmcache-adp.base-version=$version" \
  --change 'CMD ["python3"]' \
  "$tarball" "$TAG" >/dev/null
echo "docker-base: imported $TAG"
