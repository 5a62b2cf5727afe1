#!/usr/bin/env bash
# `pip install .` into a fresh venv, then the pytest suite (python/tests) against the installed
# package instead of the build tree. Not in ctest: the first run compiles the whole library into
# the extension (minutes; build/python-<tag>/ is kept, so later runs are incremental).
# Usage: bash scripts/check-pip-install.sh [TQ_CLI]   (TQ_CLI: the tq binary the tests compare
# with; default build/tq)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLI="${1:-$ROOT/build/tq}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$ROOT"
"$TMP/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  $(grep -E '^(pytest|nanobind)==' "$ROOT/scripts/requirements-test.txt")
cd "$TMP"  # not the repository: `import turboquant` must find the installed package
"$TMP/venv/bin/python" -c "import turboquant, sys; assert turboquant.__file__.startswith('$TMP'), turboquant.__file__; print('installed:', turboquant.__file__)"
TQ_CLI="$CLI" TQ_SOURCE_DIR="$ROOT" "$TMP/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/python/tests"
echo "check-pip-install: pip install . and the pytest suite on the installed package OK"
