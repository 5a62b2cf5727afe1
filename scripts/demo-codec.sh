#!/usr/bin/env bash
# Codec demo: measured distortion at d=128, b=1..4 against the paper's bounds and the exact
# Beta-law values from docs (turboquant.md), for the dense Haar and the randomized Hadamard rotation.
set -euo pipefail
TQ=${1:-build/tq}
N=${N:-20000}
printf '\nTurboQuant-mse distortion, d=128, %s random unit vectors (plain norm, as in the paper)\n' "$N"
printf '%-5s %-10s %-10s %-10s %-12s %-12s %-10s\n' bits haar hadamard exact "upper bound" "lower bound" "bits/value"
exact=(0 0.3609 0.1160 0.0340 0.0093)
for b in 1 2 3 4; do
  h=$("$TQ" distortion -d 128 -b "$b" -n "$N" -r haar --no-norm-correction --json)
  w=$("$TQ" distortion -d 128 -b "$b" -n "$N" -r hadamard --no-norm-correction --json)
  python3 - "$b" "${exact[$b]}" "$h" "$w" <<'PY'
import json, sys
b, exact = sys.argv[1], sys.argv[2]
h, w = json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(f"{b:<5} {h['mse']:<10.4f} {w['mse']:<10.4f} {exact:<10} {h['paper_upper_bound']:<12.4f} {h['lower_bound']:<12.4f} {h['bits_per_value']:<10.4f}")
PY
done
