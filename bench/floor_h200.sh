#!/usr/bin/env bash
# The disk's floor on the H200 device host (bench/floor.py): fio at the gateway's shapes and at
# fio's best, a Python probe of each shape, and dd, O_DIRECT. Prepared on the CPU host, not run
# there. That host has no fio and no network, so carry a static one:
#   bash bench/build_fio.sh          # -> .fio/fio (6 MB, no shared libraries)
#   pip download the cp312 wheels of msgpack and xxhash into .whl/ (bench/gpu_restore.sh)
# then one call:
#   run(command="bash bench/floor_h200.sh", carry=[".fio", ".whl"], timeout_s=600)
# Results come back in $OUT: floor-h200.{json,md}, dd.txt, run_stdout.txt. Without .fio the
# floor falls back to dd (4 MiB, one stream) for fio's column; the Python probe runs either way.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run_stdout.txt") 2>&1
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; GIB=${FLOOR_GIB:-8}
if [ -d .whl ] && [ -z "${NO_INSTALL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl && export PYTHONPATH=$SITE
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -x .fio/fio ] && export PATH=$PWD/.fio:$PATH
D=""  # a directory on a real disk that takes O_DIRECT
for d in ${DATA_DIRS:-/tmp /var/tmp /root}; do
  if [ "$(stat -f -c %T "$d" 2>/dev/null)" != tmpfs ] &&
    dd if=/dev/zero of="$d/.odt" bs=1M count=4 oflag=direct status=none 2>/dev/null; then
    D=$d/adp-floor; rm -f "$d/.odt"; break
  fi
  rm -f "$d/.odt"
done
[ -z "$D" ] && { echo "no directory takes O_DIRECT"; exit 1; }
echo "floor in $D: $(df -h "$D" | tail -1); $(nproc) CPUs; $(fio --version 2>/dev/null || echo 'no fio')"
$PY -m bench.floor --dir "$D" --file-gib "$GIB" --out "$OUT/floor-h200"
N=$((GIB * 256))  # dd, 4 MiB, one stream: needs nothing carried
{ dd if=/dev/zero of="$D/dd.bin" bs=4M count=$N oflag=direct conv=fdatasync 2>&1 | tail -1
  dd if="$D/dd.bin" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1; } | tee "$OUT/dd.txt"
rm -rf "$D"
