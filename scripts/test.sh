#!/usr/bin/env bash
# The one command that checks everything: installs what it needs, then lint, types and tests.
#   scripts/test.sh              # ruff, mypy --strict, the whole test suite (slow suites short),
#                                # including the e2e suite with real vLLM (set up on first use)
#   scripts/test.sh -m slow      # the long suites (pytest arguments pass through)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/setup-env.sh"
"$ROOT/scripts/setup-e2e.sh"  # real vLLM for the e2e suite, in its own .venv-e2e
cd "$ROOT"
ruff check gateway lmcache_adp tests bench deploy
ruff format --check gateway lmcache_adp tests bench deploy
mypy
python -m pytest -p no:cacheprovider "$@"
