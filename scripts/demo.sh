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
# The recommended cache (BENCHMARKS.md, "Recommended defaults"): for this model, its per-KV-head
# allocation at 4.25 bits per value (configs/smollm2-135m-kv4.25.kv: K tq4h6n8 / V tq4n8 with
# other types on 74 of the 90 KV heads, K scaling; a tq K type also gets one f16 sink token and
# RoPE-rotating K means per 512 tokens automatically, docs/design.md). TQ_DEMO_KV replaces its
# flags; TQ_DEMO_CTK / TQ_DEMO_CTV (with TQ_DEMO_KV_FLAGS) run a plain K/V pair instead, e.g.
# tq3h6 / tq4n8, the recommendation for a model without a fitted allocation.
if [[ -n "${TQ_DEMO_CTK:-}${TQ_DEMO_CTV:-}" ]]; then
  REC="-ctk ${TQ_DEMO_CTK:-tq3h6} -ctv ${TQ_DEMO_CTV:-tq4n8} ${TQ_DEMO_KV_FLAGS:-}"
else
  REC="${TQ_DEMO_KV:---kv-config configs/smollm2-135m-kv4.25.kv}"
fi
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
echo "turboquant demo: $MODEL, $THREADS threads, f16 KV cache vs [$REC] $ATTN"
hr
for flags in "-ctk f16 -ctv f16" "$REC"; do
  echo "[$flags] $PROMPT"
  # shellcheck disable=SC2086  # the flags are words
  "$TQ" generate --chat -n 80 -t "$THREADS" $flags $ATTN -p "$PROMPT"
  echo
done
hr
echo "perplexity on a corpus slice (2 windows of 512 tokens), same tokens for both caches:"
PPL_JSON="$(mktemp /tmp/tq_demo_ppl.XXXXXX)"
LABEL_FILE="$(mktemp /tmp/tq_demo_label.XXXXXX)"
trap 'rm -f "$PPL_JSON" "$LABEL_FILE"' EXIT
# shellcheck disable=SC2086
"$TQ" perplexity -f "$CORPUS" -c 512 --chunks 2 -t "$THREADS" $REC $ATTN --compare f16 --json > "$PPL_JSON"
python3 - "$PPL_JSON" "$LABEL_FILE" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
label = j['kv']['label']
open(sys.argv[2], 'w').write(label + '\n')  # the resolved cache, for the speed run below
short = label if len(label) <= 40 else label[:37] + '...'
ctx = 8192
w = max(13, len(short))
print(f"  {'f16':<{w}} ppl {j['ppl_f16']:.3f}")
print(f"  {short:<{w}} ppl {j['ppl']:.3f}  ({j['ppl_delta_pct']:+.2f}%, KLD {j['kld_mean']:.4f}, "
      f"top-1 agreement {100*j['top1_agreement']:.1f}%)")
f16 = j['kv_bytes_per_token_f16'] * ctx / 2**20
ours = j['kv_bytes_per_token'] * ctx / 2**20
print(f"KV memory at {ctx} tokens: f16 {f16:.1f} MiB, compressed {ours:.1f} MiB "
      f"({f16/ours:.2f}x smaller, {j['bits_per_value']:.2f} bits/value)")
PY
hr
echo "speed (prefill and decode tok/s, $THREADS threads; the second row is the compressed cache):"
"$TQ" bench model -t "$THREADS" --contexts 512,4096 --caches "f16;@$LABEL_FILE" $ATTN --decode 16
hr
GEMMA=models/gemma-3-270m-q4_k_m.gguf
echo "Gemma 3 270M (fetched by 'bash scripts/fetch-model.sh gemma3-270m'; 'make demo' and 'make test' do it),"
echo "with the cache fitted to it by 'tq calibrate' (or '-ctk auto' for any model):"
echo "  $TQ generate -m $GEMMA -p 'The capital of France is' --kv-config configs/gemma3-270m-kv4.25.kv   # a base model: no --chat"
echo "  $TQ perplexity -m $GEMMA -f data/debian-reference.en.txt -c 512 --chunks 8 --compare f16 --kv-config configs/gemma3-270m-kv4.25.kv"
