#!/usr/bin/env bash
# An interleaved A/B of one benchmark on this machine: ROUNDS rounds, each running the command
# first on BASE (an older commit, checked out in a temporary worktree) and then on this checkout,
# so that a noisy host weighs on both alike. Compare the two sides' medians over the rounds; one
# run of each side proves nothing on a shared VM (bench/README.md).
#   bash bench/ab.sh BASE ROUNDS OUT COMMAND...
#   bash bench/ab.sh HEAD~1 3 /tmp/ab-matrix .venv/bin/python -m bench.matrix --dir /tmp/ab-mx \
#       --sizes-kb 4096,32768 --keys 32 --in-flight 1,4 --contenders adp-periodic,fs-odirect
#   bash bench/ab.sh HEAD~1 3 /tmp/ab-lookup .venv/bin/python -m bench.lookup_under_load \
#       --dir /tmp/ab-lul --rounds 1 --skip-exists --contenders lmcache_adp_shm,fs_native,null
# COMMAND gets `--out OUT/<side>-r<round>` appended (each bench writes that .json and .md, with
# its commit) and its output goes to OUT/<side>-r<round>.log. Each side runs from its own tree
# with that tree first on PYTHONPATH, so the plugin `lmcache server` loads, the gateway and the
# bench all come from it; both use this checkout's .venv (and .fio). The bench empties or
# replaces its --dir itself. For the GPU host, bench/h200_ab.sh does the same for its lookups.
set -u
[ $# -ge 4 ] || { sed -n '2,16p' "$0"; exit 2; }
BASE=$1; ROUNDS=$2; OUT=$(realpath -m "$3"); shift 3
ROOT=$(git rev-parse --show-toplevel)
TREE=$(mktemp -d /tmp/ab-base.XXXXXX)
git -C "$ROOT" worktree add --detach -q "$TREE" "$BASE" || exit 1
trap 'git -C "$ROOT" worktree remove --force "$TREE"' EXIT
for kept in .venv .fio; do [ -e "$ROOT/$kept" ] && ln -s "$ROOT/$kept" "$TREE/$kept"; done
mkdir -p "$OUT"
failed=0
for round in $(seq "$ROUNDS"); do
  for side in base new; do
    tree=$ROOT; [ "$side" = base ] && tree=$TREE
    echo "== round $round, $side: $(git -C "$tree" rev-parse --short HEAD), $(date -u +%H:%M:%S)"
    (cd "$tree" && PYTHONPATH="$tree" "$@" --out "$OUT/$side-r$round") > "$OUT/$side-r$round.log" 2>&1
    status=$?
    echo "   exit $status, $OUT/$side-r$round.{json,md}"
    [ "$status" = 0 ] || failed=1
  done
done
exit "$failed"
