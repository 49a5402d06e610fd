#!/usr/bin/env bash
# The 2 GB restore of one contender at a time (../restore-reads/adp_only.py: store, restart,
# restore, clear L1, restore again), with the host's shmem huge-page setting switched between
# runs (root: it writes /sys/kernel/mm/transparent_hugepage/shmem_enabled, and puts back what
# was there), ROUNDS rounds interleaved; the disk's read and write requests from /proc/diskstats.
#   bash bench/results/hugepages/ab.sh [ROUNDS] [DISK] > bench/results/hugepages/ab-<commit>.txt
set -u
ROUNDS=${1:-3}; DISK=${2:-vda}; SETTING=/sys/kernel/mm/transparent_hugepage/shmem_enabled
BEFORE=$(grep -o '\[[a-z_]*\]' $SETTING | tr -d '[]')
trap 'echo "$BEFORE" > $SETTING' EXIT
stats() { awk -v d="$DISK" '$3==d {print $4, $6, $8, $10}' /proc/diskstats; }
echo "commit $(git rev-parse --short HEAD), $(date -u +%F\ %H:%M) UTC, $(nproc) cores, disk $DISK"
for round in $(seq "$ROUNDS"); do
  for mode in advise never; do
    echo "$mode" > $SETTING
    for contender in adp fs; do
      before=$(stats)
      out=$(timeout 600 python bench/results/restore-reads/adp_only.py 2 $contender 2>/dev/null | tail -1)
      python3 - "$round" "$mode" "$contender" "$before" "$(stats)" "$out" <<'PY'
import json, sys
round_, mode, contender, before, after, out = sys.argv[1:]
a, z = [list(map(int, s.split())) for s in (before, after)]
reads, writes = z[0] - a[0], z[2] - a[2]
r = json.loads(out)
print(f"round {round_} shmem {mode:6} {contender:3} prefetch {r['lookup_prefetch_s']:.2f} s "
      f"(again {r['again']['lookup_prefetch_s']:.2f}), restore {r['restore_s']:.2f} "
      f"(again {r['again']['restore_s']:.2f}), ok {r['ok'] and r['digest_matches_store']}; "
      f"reads {reads} of {(z[1] - a[1]) * 512 / max(reads, 1) / 1024:.0f} KiB, "
      f"writes {writes} of {(z[3] - a[3]) * 512 / max(writes, 1) / 1024:.0f} KiB", flush=True)
PY
    done
  done
done
