# After the set-up lines of bench/h200.sh (its lines 24-60: the wheels, the shim, the lmcache
# launcher, the data dir $D), with exists-trace.patch and a scratch ADP_SI hook applied:
mkdir -p "$D"
for i in 1 2 3; do
  for v in base gwsi; do
    [ "$(left)" -lt 40 ] && break 2
    mkdir -p "$OUT/$v-$i"; export ADP_TRACE_DIR=$OUT/$v-$i
    case $v in base) E="";; gwsi) E="ADP_SI=0.0005";; esac
    ts "== $v $i"
    env $E timeout $(( $(left) - 5 )) $PY -m bench.lookup_under_load --dir "$D/lookup" --mode gpu \
      --prompt-mib 1024 --prompts 8 --rounds 1 --contenders lmcache_adp --skip-exists \
      --lmcache-bin $BIN --out "$OUT/$v-$i/tr" 2>&1 | grep "^lmcache_adp 0" | cut -c1-200
    rm -rf "$D/lookup"
  done
done
rm -rf "$D"
$PY - "$OUT" <<'PYEOF'
import glob, os, sys
out = sys.argv[1]
def s(xs):
    xs = sorted(xs)
    return f"p50 {xs[len(xs)//2]:.2f} p90 {xs[int(len(xs)*0.9)]:.2f} max {xs[-1]:.2f}"
for d in sorted(glob.glob(f"{out}/*-*/")):
    for f in glob.glob(d + "trace-*.txt"):
        rows = [list(map(float, l.split())) for l in open(f)]
        for name, r in (("idle", rows[:40]), ("busy", rows[40:])):
            if r:
                print(os.path.basename(d.rstrip("/")), name, len(r), "rt:", s([x[1] for x in r]), "| react:", s([x[2] for x in r]))
PYEOF
tar -czf "$OUT/traces.tgz" -C "$OUT" $(cd "$OUT" && ls -d */) && rm -rf "$OUT"/*-*/
ts "== done"
