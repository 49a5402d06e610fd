#!/usr/bin/env bash
# A static fio (Debian bookworm's 3.33 source, built with libaio only) in .fio/fio, to carry to a
# host that has no fio and no network (the H200 device: bench/h200.sh). Needs apt-get (the
# Debian source package and libaio-dev), gcc and make; writes nothing outside .fio/ and /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/fio-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "deb-src http://deb.debian.org/debian bookworm main" >"$work/sources.list"
mkdir -p "$work/lists/partial"
apt_private=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$work/lists")
apt-get "${apt_private[@]}" update -qq
(cd "$work" && apt-get "${apt_private[@]}" source --download-only fio >/dev/null)
dpkg -s libaio-dev >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libaio-dev
tar -xzf "$work"/fio_*.orig.tar.gz -C "$work"
cd "$work"/fio-*/
./configure --build-static --disable-native >/dev/null
make -j"$(nproc)" >/dev/null
strip fio
cd - >/dev/null
mkdir -p .fio && cp "$work"/fio-*/fio .fio/fio
grep -qx '/.fio/' .git/info/exclude 2>/dev/null || echo '/.fio/' >>.git/info/exclude
.fio/fio --version
