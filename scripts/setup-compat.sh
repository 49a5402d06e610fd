#!/usr/bin/env bash
# Creates one venv per LMCache release under test, for the compatibility suite (tests/compat):
#   scripts/setup-compat.sh lmcache==0.5.4 lmcache==0.5.7rc2 lmcache-cli==0.5.7rc3.dev0
# makes .venv-compat/lmcache-0.5.4/, .venv-compat/lmcache-0.5.7rc2/, ... (git-ignored). Each
# holds torch 2.13.0 (CPU; installed first, so LMCache does not pull a CUDA build), that one
# LMCache distribution, and lmcache-adp's other run-time dependencies as pyproject.toml lists
# them; the plugin itself comes from this checkout on PYTHONPATH, and the gateway runs from the
# main .venv. About two minutes per venv with a warm pip cache. A stamp (this script and that
# dependency list) skips a venv that is up to date; when only the list changed, the venv is
# kept and just gets what it lacks.
#
# lmcache-cli is LMCache's CLI alone (pure Python, no native extensions, no torch in its
# requirements); its venv is made the same way, with torch, so a test can show what it can run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=${ADP_COMPAT_DIR:-$ROOT/.venv-compat}
PYTHON=${PYTHON:-python3}
[ $# -gt 0 ] || { echo "usage: $0 lmcache==VERSION|lmcache-cli==VERSION ..." >&2; exit 2; }
# lmcache-adp's run-time dependencies besides LMCache, from pyproject.toml.
mapfile -t deps < <("$PYTHON" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    for dep in tomllib.load(f)["project"]["dependencies"]:
        if re.split(r"[\s<>=!~;\[]", dep, maxsplit=1)[0].lower() != "lmcache":
            print(dep)
EOF
)
stamp_hash=$({ cat "$ROOT/scripts/setup-compat.sh"; printf '%s\n' "${deps[@]}"; } | sha1sum | cut -c1-12)

for requirement in "$@"; do
  case "$requirement" in
    lmcache==* | lmcache-cli==*) ;;
    *) echo "setup-compat: expected lmcache==VERSION or lmcache-cli==VERSION, got $requirement" >&2
       exit 2 ;;
  esac
  venv="$BASE/${requirement/==/-}"
  stamp="$venv/.adp-compat-installed-$stamp_hash"
  [ -e "$stamp" ] && continue
  pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  quiet_pip() { "${pip[@]}" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a dir" || true; }; }
  installed=$("$venv/bin/python" -m pip show "${requirement%%==*}" 2>/dev/null || true)
  if ! grep -qx "Version: ${requirement#*==}" <<< "$installed"; then
    echo "setup-compat: making $venv ($requirement)"
    rm -rf "$venv"
    mkdir -p "$BASE"
    "$PYTHON" -m venv "$venv"
    quiet_pip install torch==2.13.0
    echo "torch==2.13.0" > "$venv/torch-constraint.txt"
  else
    echo "setup-compat: updating $venv (its stamp is out of date)"
  fi
  # The `lmcache` command of 0.5.4 and 0.5.5 imports openai at start-up (every subcommand,
  # `lmcache server` included) but does not require it: without it, ModuleNotFoundError.
  extra=()
  case "$requirement" in lmcache==0.5.4 | lmcache==0.5.5) extra=(openai) ;; esac
  PIP_CONSTRAINT="$venv/torch-constraint.txt" quiet_pip install "$requirement" "${extra[@]}" \
    "${deps[@]}"
  "$venv/bin/python" -m pip show "${requirement%%==*}" >/dev/null \
    || { echo "setup-compat: installing $requirement failed, see above" >&2; exit 1; }
  rm -f "$venv"/.adp-compat-installed-*
  touch "$stamp"
done
