#!/usr/bin/env python3
"""Top-1 agreement of tq with llama.cpp on the rows where llama.cpp agrees with itself.

Reads the JSON that `scripts/llama_cpp_reference.sh ... --self-ubatch 32[,1]` writes (e.g.
bench/results/llama_cpp_reference_c512_self.json): llama.cpp's top-1 token per scored row from its
one-batch run and from each micro-batch size, and tq's. A row is stable when every llama.cpp run
picks the same token there; prints one JSON object per file with the stable share and tq's
agreement with llama.cpp on the stable rows and on all rows.

  python3 bench/llama_cpp_stable_rows.py bench/results/llama_cpp_reference_c512_self.json
"""
import json
import sys


def stable_rows(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"llama_cpp_stable_rows: {path}: {e}")
    ref, tq = d.get("llama_cpp_top1_f16"), d.get("tq_top1_f16")
    runs = sorted(k for k in d if k.startswith("llama_cpp_top1_f16_ubatch"))
    if not isinstance(ref, list) or not isinstance(tq, list) or not runs:
        raise SystemExit(f"llama_cpp_stable_rows: {path}: needs llama_cpp_top1_f16, tq_top1_f16 and "
                         "llama_cpp_top1_f16_ubatch* lists (run the reference script with --self-ubatch)")
    others = [d[k] for k in runs]
    if any(not isinstance(o, list) or len(o) != len(ref) for o in others + [tq]) or not ref:
        raise SystemExit(f"llama_cpp_stable_rows: {path}: top-1 lists are empty or of different lengths")
    stable = [i for i in range(len(ref)) if all(o[i] == ref[i] for o in others)]
    agree_stable = sum(tq[i] == ref[i] for i in stable)
    agree_all = sum(t == r for t, r in zip(tq, ref))
    return {
        "file": path,
        "rows": len(ref),
        "llama_cpp_runs": ["one batch"] + [k[len("llama_cpp_top1_f16_"):] for k in runs],
        "stable_rows": len(stable),
        "llama_cpp_self_agreement": len(stable) / len(ref),
        "top1_tq_vs_llama_cpp_stable_rows": agree_stable / len(stable) if stable else None,
        "top1_tq_vs_llama_cpp_all_rows": agree_all / len(ref),
    }


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0)
    if len(sys.argv) < 2:
        sys.exit("usage: llama_cpp_stable_rows.py REFERENCE_SELF_JSON... (see --help)")
    for p in sys.argv[1:]:
        print(json.dumps(stable_rows(p)))
