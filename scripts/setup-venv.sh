#!/usr/bin/env bash
# The Python environment the tests use (.venv, made here, never the system's site-packages):
# the packages pinned in scripts/requirements-test.txt (gguf: the dequantization oracle and
# the writer of random-weight models; pytest; numpy). Idempotent: a venv whose pins are
# already installed is left alone (a stamp file records what was installed).
# Usage: bash scripts/setup-venv.sh   (TQ_VENV=DIR to put it elsewhere)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TQ_VENV:-$ROOT/.venv}"
REQ="$ROOT/scripts/requirements-test.txt"
STAMP="$VENV/.tq-requirements"
die() { echo "setup-venv.sh: error: $*" >&2; exit 1; }
if [[ -x "$VENV/bin/python" ]] && cmp -s "$REQ" "$STAMP"; then
  echo "setup-venv.sh: $VENV up to date"
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" \
  || die "pip install -r $REQ failed (network? proxy?)"
cp "$REQ" "$STAMP"
echo "setup-venv.sh: $VENV ready"
