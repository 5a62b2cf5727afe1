#!/usr/bin/env bash
# Gemma 3 270M at long context, 2 threads: prefill and decode tok/s of f16 and the recommended
# caches in one process (runs alternate cache by cache; medians of REPS rounds), and the KV
# bytes each cache holds (`kv_bytes`: KvCache::bytes_used after the prefill and the decode
# steps). The default caches: f16; `auto`, the generic recommendation, which on this model
#   resolves to "k=tq4h6n8 v=tq3h6n8 sink=1 center=k,rope,512 scale-k" (the `kv` field of the
#   JSON; earlier runs spelled out the pair measured before `auto` settled on a tq3h6n8 V,
#   "k=tq4h6n8 v=tq3h4n8 scale-k"); the calibrated 4.25-bit file.
# tq caches use the lookup-table attention kernel (--attn-lut8; f16 runs its own kernel).
# Usage: bash scripts/bench-gemma-long.sh            -> bench/results/gemma/speed_long.json
# Env:   TQ (default build/tq), THREADS (2), CONTEXTS (4095,16383,32767), REPS (3), DECODE (32),
#        NICE (5), CACHES (the list above), OUT (default bench/results/gemma/speed_long.json).
# Takes about 9 prefills of each context: on a quiet 2-core machine ~45 min; on the shared one
# a 32K f16 prefill took 8.4 min (65 tok/s).
set -eu
cd "$(dirname "$0")/.."
TQ="${TQ:-build/tq}"
THREADS="${THREADS:-2}"
CONTEXTS="${CONTEXTS:-4095,16383,32767}"
REPS="${REPS:-3}"
DECODE="${DECODE:-32}"
NICE="${NICE:-5}"
CACHES="${CACHES:-f16;auto;@configs/gemma3-270m-kv4.25.kv}"
OUT="${OUT:-bench/results/gemma/speed_long.json}"
mkdir -p "$(dirname "$OUT")"
nice -n "$NICE" "$TQ" bench model -m models/gemma-3-270m-q4_k_m.gguf -f data/debian-reference.en.txt \
  -t "$THREADS" --contexts "$CONTEXTS" --caches "$CACHES" --decode "$DECODE" --reps "$REPS" \
  --attn-lut8 --json > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
python3 - "$OUT" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["rows"]:
    print(f'{r["context"]:>6} {r["cache"][:40]:<40} prefill {r["prefill_tok_s"]:8.1f} ({r["prefill_vs_first"]:.2f}x)'
          f'  decode {r["decode_tok_s"]:7.2f} ({r["decode_vs_first"]:.2f}x)  kv {r["kv_bytes"] / 2**20:8.2f} MiB')
PY
