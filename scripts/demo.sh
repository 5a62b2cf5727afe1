#!/usr/bin/env bash
# `make demo` ends here: the default model (SmolLM2-135M-Instruct Q4_1) with the f16 KV cache
# and with the recommended compressed cache, side by side: answer to a prompt, perplexity on
# a corpus slice, KV memory at 8K context, speed. Usage: bash scripts/demo.sh build/tq
set -euo pipefail

TQ="${1:-build/tq}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL="models/SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS="data/debian-reference.en.txt"
# The recommended cache (BENCHMARKS.md, "Recommended defaults").
REC_K="${TQ_DEMO_CTK:-tq3h6}"
REC_V="${TQ_DEMO_CTV:-tq4n8}"
# Extra --kv-* flags for it (none: a tq K type gets one f16 sink token and online K mean
# centring with one RoPE-rotating mean per 512 quantized tokens automatically,
# docs/design.md; they do nothing to f16).
REC_FLAGS="${TQ_DEMO_KV_FLAGS:-}"
# Decode kernel of the tq cache: the int8 lookup tables (same KLD as the float kernel on this
# model, faster decode; BENCHMARKS.md). TQ_DEMO_ATTN=--exact-attention for the float kernel.
ATTN="${TQ_DEMO_ATTN:---attn-lut8}"
THREADS="${TQ_DEMO_THREADS:-2}"
PROMPT="${TQ_DEMO_PROMPT:-What is a Debian package, in two sentences?}"

[[ -x "$TQ" ]] || { echo "demo.sh: $TQ not built" >&2; exit 1; }
[[ -f "$MODEL" ]] || bash scripts/fetch-model.sh
[[ -f "$CORPUS" ]] || bash scripts/fetch-corpus.sh

hr() { printf '%*s\n' 78 '' | tr ' ' '-'; }
hr
echo "turboquant demo: $MODEL, $THREADS threads, f16 KV cache vs $REC_K/$REC_V ${REC_FLAGS:-(automatic: 1 f16 sink, RoPE-rotating K means per 512 tokens)} $ATTN"
hr
for cfg in "f16 f16" "$REC_K $REC_V"; do
  set -- $cfg
  echo "[-ctk $1 -ctv $2] $PROMPT"
  flags=""
  [[ $1 == f16 && $2 == f16 ]] || flags="$REC_FLAGS"
  "$TQ" generate --chat -n 80 -t "$THREADS" -ctk "$1" -ctv "$2" $flags $ATTN -p "$PROMPT"
  echo
done
hr
echo "perplexity on a corpus slice (2 windows of 512 tokens), same tokens for both caches:"
"$TQ" perplexity -f "$CORPUS" -c 512 --chunks 2 -t "$THREADS" -ctk "$REC_K" -ctv "$REC_V" $REC_FLAGS $ATTN \
  --compare f16 --json > /tmp/tq_demo_ppl.$$.json
python3 - /tmp/tq_demo_ppl.$$.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ctx = 8192
w = max(13, len(j['kv']['label']))
print(f"  {'f16':<{w}} ppl {j['ppl_f16']:.3f}")
print(f"  {j['kv']['label']:<{w}} ppl {j['ppl']:.3f}  ({j['ppl_delta_pct']:+.2f}%, KLD {j['kld_mean']:.4f}, "
      f"top-1 agreement {100*j['top1_agreement']:.1f}%)")
f16 = j['kv_bytes_per_token_f16'] * ctx / 2**20
ours = j['kv_bytes_per_token'] * ctx / 2**20
print(f"KV memory at {ctx} tokens: f16 {f16:.1f} MiB, {j['kv']['label']} {ours:.1f} MiB "
      f"({f16/ours:.2f}x smaller, {j['bits_per_value']:.2f} bits/value)")
PY
rm -f /tmp/tq_demo_ppl.$$.json
hr
echo "speed (prefill and decode tok/s, $THREADS threads):"
"$TQ" bench model -t "$THREADS" --contexts 512,4096 --caches "f16,$REC_K/$REC_V" $REC_FLAGS $ATTN --decode 16
hr
