#!/usr/bin/env bash
# The one command that checks everything: installs what it needs, then lint, types and tests.
#   scripts/test.sh              # ruff, mypy --strict, the whole test suite (slow suites short),
#                                # including the e2e suite with real vLLM (set up on first use)
#   scripts/test.sh -m slow      # the long suites (pytest arguments pass through)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/setup-env.sh"
"$ROOT/scripts/setup-e2e.sh"  # real vLLM for the e2e suite, in its own .venv-e2e
# The two-adapter test runs LMCache's Redis adapter against a real redis-server (Debian's); it
# skips, saying why, where none can be installed.
if ! command -v redis-server >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { timeout 300 apt-get install -y -q redis-server \
      || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q redis-server; }
  } >/dev/null 2>&1 || echo "test.sh: could not install redis-server; the two-adapter test skips"
fi
cd "$ROOT"
ruff check adp_gateway adp_wire lmcache_adp tests bench deploy
ruff format --check adp_gateway adp_wire lmcache_adp tests bench deploy
mypy
python -m pytest -p no:cacheprovider "$@"
