#!/usr/bin/env bash
# The lookup benchmark on the GPU host, A/B: rounds alternate between an older commit (.base/) and
# this checkout, one bench/h200.sh lookup round each, LOOKUP_CONTENDERS in every round (8 prompts
# of 1 GiB, GPU mode), so both sides meet the same host within minutes. Staging as for
# bench/h200.sh, plus the older commit: mkdir .base && git archive <commit> -- . ":!bench/results" |
# tar -x -C .base && echo /.base/ >> .git/info/exclude. One call:
#   run(command="ROUNDS=3 BASE=<commit> NEW=$(git rev-parse --short HEAD) bash bench/h200_ab.sh",
#       carry=[".whl", ".stage", ".base"], timeout_s=600)
# Results: $OUT/ab.tgz, with bench/h200.sh's files of each round in {base,new}-r<round>/ (their
# logs left out): a call brings back only a few files.
set -u
[ -d .base ] || { echo 'no .base/: stage the older commit first'; exit 1; }
OUT=${OUT:-/tmp/out}; ROOT=$PWD; T0=$(date +%s)
ln -sfn "$ROOT/.whl" .base/.whl; ln -sfn "$ROOT/.stage" .base/.stage
C=${LOOKUP_CONTENDERS:-lmcache_adp_shm,lmcache_adp,null}
ARGS='--skip-exists --lookups-per-store 16 --idle-lookups 120'
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in base new; do
    left=$(( ${TOTAL_S:-560} - ($(date +%s) - T0) ))
    [ "$left" -lt "${ROUND_S:-120}" ] && { echo "stop: ${left}s left"; break 2; }
    if [ $side = base ]; then dir=$ROOT/.base; commit=${BASE:-base}; else dir=$ROOT; commit=${NEW:-new}; fi
    echo "[$(( $(date +%s) - T0 ))s] == round $r $side ($commit)"
    (cd "$dir" && OUT=$OUT/$side-r$r STEPS=lookup LOOKUP_PROMPTS=8 LOOKUP_ROUNDS=1 LOOKUP_CONTENDERS=$C \
      LOOKUP_ARGS="$ARGS" ADP_COMMIT=$commit BUDGET_S=$(( left - 5 )) bash bench/h200.sh > /dev/null 2>&1)
    tail -3 "$OUT/$side-r$r/run_stdout.txt"
    grep -A8 '^| contender' "$OUT/$side-r$r"/lookup-h[0-9]*.md 2>/dev/null | head -8
  done
done
(cd "$OUT" && tar -czf ab.tgz --exclude logs.tgz base-r* new-r* && rm -rf base-r* new-r*)
echo "[$(( $(date +%s) - T0 ))s] done"
