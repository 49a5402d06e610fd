#!/usr/bin/env bash
# Creates one venv per LMCache release under test, for the compatibility suite (tests/compat):
#   scripts/setup-compat.sh lmcache==0.5.4 lmcache==0.5.7rc2 lmcache-cli==0.5.7rc3.dev0
# makes .venv-compat/lmcache-0.5.4/, .venv-compat/lmcache-0.5.7rc2/, ... (git-ignored) and
# prints nothing else on success. Each holds torch 2.13.0 (CPU; installed first, so LMCache does
# not pull a CUDA build), that one LMCache distribution, and lmcache-adp's own run-time
# dependencies; the plugin itself comes from this checkout on PYTHONPATH, and the gateway runs
# from the main .venv. A stamp skips a venv already made by this version of the script. About a
# minute per venv with a warm pip cache.
#
# lmcache-cli is LMCache's CLI alone (pure Python, no native extensions, no torch in its
# requirements); its venv is made the same way, with torch, so a test can show what it can run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=${ADP_COMPAT_DIR:-$ROOT/.venv-compat}
PYTHON=${PYTHON:-python3}
[ $# -gt 0 ] || { echo "usage: $0 lmcache==VERSION|lmcache-cli==VERSION ..." >&2; exit 2; }
script_hash=$(sha1sum "$ROOT/scripts/setup-compat.sh" | cut -c1-12)

for requirement in "$@"; do
  case "$requirement" in
    lmcache==* | lmcache-cli==*) ;;
    *) echo "setup-compat: expected lmcache==VERSION or lmcache-cli==VERSION, got $requirement" >&2
       exit 2 ;;
  esac
  venv="$BASE/${requirement/==/-}"
  stamp="$venv/.adp-compat-installed-$script_hash"
  [ -e "$stamp" ] && continue
  echo "setup-compat: making $venv ($requirement)"
  rm -rf "$venv"
  mkdir -p "$BASE"
  "$PYTHON" -m venv "$venv"
  pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  quiet_pip() { "${pip[@]}" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a dir" || true; }; }
  quiet_pip install torch==2.13.0
  echo "torch==2.13.0" > "$venv/torch-constraint.txt"
  # The `lmcache` command of 0.5.4 and 0.5.5 imports openai at start-up (every subcommand,
  # `lmcache server` included) but does not require it: without it, ModuleNotFoundError.
  extra=()
  case "$requirement" in lmcache==0.5.4 | lmcache==0.5.5) extra=(openai) ;; esac
  # lmcache-adp's run-time dependencies besides LMCache (pyproject.toml's [project] list).
  PIP_CONSTRAINT="$venv/torch-constraint.txt" quiet_pip install "$requirement" "${extra[@]}" \
    "numpy>=1.26" "msgpack>=1.0" "xxhash>=3.4" "pyyaml>=6.0"
  "$venv/bin/python" -m pip show "${requirement%%==*}" >/dev/null \
    || { echo "setup-compat: installing $requirement failed, see above" >&2; exit 1; }
  touch "$stamp"
done
