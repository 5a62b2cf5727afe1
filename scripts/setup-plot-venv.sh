#!/usr/bin/env bash
# Python venv for the plotting scripts in bench/ (not a build or test dependency).
# Usage: bash scripts/setup-plot-venv.sh  ->  .venv-plot/bin/python bench/<script>.py
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TQ_PLOT_VENV:-.venv-plot}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "numpy==2.3.5" "matplotlib==3.10.7"
echo "$VENV ready"
