#!/usr/bin/env python3
"""`tq generate --chat` answers on a GGUF model with several KV caches, and (with --ref-venv's
llama-cpp-python) llama.cpp's greedy answer to the same chat-formatted prompt, for comparison.

    .venv/bin/python bench/gemma_chat.py --tq build/tq --model models/gemma-3-270m-q4_k_m.gguf \\
        --caches "f16/f16,tq3h6/tq4n8" --prompt "What is Debian?" --ref-venv /work/main/.venv-ref \\
        --out bench/results/gemma/chat.json

Greedy decoding (temperature 0) on both engines, -n tokens at most, 2 threads. The chat
template is the model's (Gemma: <start_of_turn>user ... <end_of_turn><start_of_turn>model);
llama.cpp gets the same text, tokenized with its special tokens and BOS.
"""
import argparse
import json
import os
import subprocess
import sys


def tq_answer(args, prompt, k, v):
    out = subprocess.run([args.tq, "generate", "-m", args.model, "-p", prompt, "--chat", "-n", str(args.n), "-t",
                          str(args.threads), "--temp", "0", "-ctk", k, "-ctv", v, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


LLAMA_SNIPPET = r"""
import json, sys
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(model_path=a["model"], n_ctx=512, n_threads=a["threads"], verbose=False, flash_attn=True)
out = []
for p in a["prompts"]:
    text = "<start_of_turn>user\n" + p + "<end_of_turn>\n<start_of_turn>model\n"
    ids = llm.tokenize(text.encode(), add_bos=True, special=True)
    llm.reset()
    gen = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        if llm.token_eog(tok) if hasattr(llm, "token_eog") else tok == llm.token_eos():
            break
        gen.append(tok)
        if len(gen) >= a["n"]:
            break
    out.append({"prompt": p, "prompt_tokens": len(ids), "text": llm.detokenize(gen).decode("utf-8", "replace"),
                "generated_tokens": len(gen)})
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--model", required=True)
    ap.add_argument("--caches", default="f16/f16,tq3h6/tq4n8", help="K/V pairs, comma-separated")
    ap.add_argument("--prompt", action="append", help="user message (repeatable)")
    ap.add_argument("-n", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ref-venv", help="virtual environment with llama-cpp-python (llama.cpp's answer too)")
    ap.add_argument("--out")
    args = ap.parse_args()
    prompts = args.prompt or ["What is Debian?"]
    rep = {"model": args.model, "n": args.n, "threads": args.threads, "answers": []}
    for p in prompts:
        for kv in args.caches.split(","):
            k, _, v = kv.partition("/")
            j = tq_answer(args, p, k, v or k)
            rep["answers"].append({"engine": "tq", "prompt": p, "cache": kv, "text": j["text"],
                                   "prompt_tokens": j["prompt_tokens"], "generated_tokens": j["generated_tokens"],
                                   "kv_bytes": j["kv_bytes"]})
            print(f"tq {kv}: {p!r} -> {j['text']!r}")
    if args.ref_venv:
        py = os.path.join(args.ref_venv, "bin", "python")
        arg = json.dumps({"model": args.model, "threads": args.threads, "prompts": prompts, "n": args.n})
        res = json.loads(subprocess.run([py, "-c", LLAMA_SNIPPET, arg], check=True, capture_output=True,
                                        text=True).stdout)
        for r in res:
            rep["answers"].append({"engine": "llama.cpp", "cache": "f16/f16", **r})
            print(f"llama.cpp f16/f16: {r['prompt']!r} -> {r['text']!r}")
        for r in res:
            mine = next(a for a in rep["answers"] if a["engine"] == "tq" and a["prompt"] == r["prompt"]
                        and a["cache"] == "f16/f16")
            r_same = mine["text"] == r["text"]
            rep.setdefault("tq_f16_equals_llama_cpp", {})[r["prompt"]] = r_same
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=2, ensure_ascii=False)


if __name__ == "__main__":
    sys.exit(main())
