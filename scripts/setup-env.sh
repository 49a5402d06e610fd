#!/usr/bin/env bash
# Creates .venv (once) with lmcache-adp, LMCache 0.5.6 and the test tools. Sourced by serve.sh
# and test.sh; safe to run again (it only installs what is missing).
#
# torch: a machine that already has torch (a GPU host) keeps it: the venv then sees the system's
# packages and torch is held at that version. Otherwise torch==2.13.0 is installed first; on the
# project's CPU machines pip takes that CPU wheel from local disk, and LMCache does not then pull
# a multi-GB CUDA build.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ADP_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${ADP_EXTRAS:-test}
stamp="$VENV/.adp-installed-$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup-env.sh" | sha1sum | cut -c1-12)-$EXTRAS"

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "setup-env: using the system's torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
if [ ! -e "$stamp" ]; then
  pip=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
  # pip's exit status, without the local index's noise about packages it does not hold.
  quiet_pip() { "${pip[@]}" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a dir" || true; }; }
  # torch's version from its metadata: importing torch before numpy is installed prints
  # "Failed to initialize NumPy" (numpy comes with the project's dependencies, below).
  torch_version() { "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))'; }
  if ! torch_version >/dev/null 2>&1; then
    echo "setup-env: installing torch 2.13.0 (CPU)"
    quiet_pip install torch==2.13.0
  fi
  constraints="$VENV/torch-constraint.txt"
  version=$(torch_version)
  echo "torch==$version" > "$constraints"
  echo "setup-env: installing lmcache-adp[$EXTRAS] (lmcache 0.5.6 takes a minute or two)"
  PIP_CONSTRAINT="$constraints" quiet_pip install -e "$ROOT[$EXTRAS]"
  # LMCache logs as it is imported: its lines only when the import fails.
  imported=$("$VENV/bin/python" -c 'import lmcache_adp, lmcache' 2>&1) \
    || { echo "$imported" >&2; echo "setup-env: the install failed, see above" >&2; exit 1; }
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH" LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1
