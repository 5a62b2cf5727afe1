#!/usr/bin/env bash
# Outside reference (NOT part of CI): installs llama-cpp-python from PyPI into a virtual
# environment and compares it with `tq` on the same model and text: token ids, top-1
# agreement of next-token predictions, perplexity with the f16 cache, llama.cpp's q8_0 / q4_0
# KV perplexity, and prefill / decode tok/s of both engines.
#
# PyPI has no binary wheel of llama-cpp-python (checked for 0.3.36 and 0.3.16 with
# `pip download --no-deps --only-binary=:all:`), so pip compiles the bundled llama.cpp from
# the sdist: CPU backend only, no mtmd/llava, no tools/tests/examples; about 20-40 minutes at
# nice 10 with 2 jobs on the shared 2-core machine (once; the venv is reused).
#
# Usage: bash scripts/llama_cpp_reference.sh [build/tq] [ctx] [chunks] [quality threads] [speed threads] [speed contexts] [extra args]
#   defaults: build/tq 512 8 1 2 512 (speed contexts comma-separated; "" for none); extra args
#   go to bench/llama_cpp_reference.py (e.g. --no-quality, --kv-ppl "", --reps 3, --rounds 5: speed runs of
#   the two engines alternating, ratio per round; --self-ubatch 32,1:
#   llama.cpp against its own run with other micro-batch sizes; --pairs auto:q4_0: a tq cache
#   against a llama.cpp cache of another type; tq_cache_ratio: each tq cache against the first).
#   TQ_REF_MODEL: the GGUF (default models/SmolLM2-135M-Instruct.Q4_1.gguf; e.g.
#   models/gemma-3-270m-q4_k_m.gguf); TQ_REF_OUT: the report (default
#   bench/results/llama_cpp_reference_c<ctx>.json); TQ_REF_ISA: the /proc/cpuinfo flag names
#   to build llama.cpp for instead of the CPU's own, e.g. "avx avx2 fma f16c bmi2" for an
#   AVX2-only llama.cpp on an AVX-512 host (give it its own TQ_REF_VENV, and run tq beside it
#   with TQ_SIMD=avx2 OPENBLAS_CORETYPE=Haswell).
# Then: bench/forward_ref64.py (float64 numpy forward pass) says which engine is nearer the
# exact result where they differ (see BENCHMARKS.md, "Outside reference").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TQ="${1:-build/tq}"
CTX="${2:-512}"
CHUNKS="${3:-8}"
THREADS="${4:-1}"
SPEED_THREADS="${5:-2}"
SPEED_CONTEXTS="${6-512}"
shift $(($# < 6 ? $# : 6))
VENV="${TQ_REF_VENV:-$ROOT/.venv-ref}"
LLAMA_CPP_PYTHON_VERSION=0.3.36

bash scripts/fetch-model.sh
bash scripts/fetch-model.sh gemma3-270m
bash scripts/fetch-corpus.sh
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
# Instruction sets: the CPU's own (from /proc/cpuinfo), named one by one instead of
# GGML_NATIVE=ON, so that AMX stays off. Some VMs advertise AMX in CPUID without enabling its
# register state: a -march=native build then dies with SIGILL at its first `tileloadd`
# (ggml_backend_amx_mul_mat), which is what a native build did on this project's machine.
isa_flags() {
  local flags f out="-DGGML_NATIVE=OFF"
  flags=" ${TQ_REF_ISA:-$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)} "
  for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
           avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ "$flags" == *" ${f%%:*} "* ]]; then out+=" -DGGML_${f#*:}=ON"; else out+=" -DGGML_${f#*:}=OFF"; fi
  done
  echo "$out"
}
CMAKE_ARGS_REF="$(isa_flags) -DLLAVA_BUILD=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"
# Rebuilt when the version or these build options change (the stamp records them).
STAMP="$VENV/.llama-cpp-build"
if ! "$VENV/bin/python" -c "import llama_cpp, numpy, tokenizers, gguf, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON_VERSION')" 2>/dev/null \
   || [[ "$(cat "$STAMP" 2>/dev/null)" != "$LLAMA_CPP_PYTHON_VERSION $CMAKE_ARGS_REF" ]]; then
  echo "llama_cpp_reference.sh: installing llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (compiles llama.cpp; this takes a while)" >&2
  rm -f "$STAMP"
  CMAKE_ARGS="$CMAKE_ARGS_REF" CMAKE_BUILD_PARALLEL_LEVEL="${TQ_REF_JOBS:-2}" \
    nice -n 10 "$VENV/bin/pip" install --force-reinstall --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
      numpy tokenizers gguf==0.19.0
  echo "$LLAMA_CPP_PYTHON_VERSION $CMAKE_ARGS_REF" > "$STAMP"
fi
mkdir -p bench/results
"$VENV/bin/python" bench/llama_cpp_reference.py --tq "$TQ" --model "${TQ_REF_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}" \
  --corpus data/debian-reference.en.txt --ctx "$CTX" --chunks "$CHUNKS" --threads "$THREADS" \
  --speed-threads "$SPEED_THREADS" --speed-contexts "$SPEED_CONTEXTS" \
  --out "${TQ_REF_OUT:-bench/results/llama_cpp_reference_c${CTX}.json}" "$@"
