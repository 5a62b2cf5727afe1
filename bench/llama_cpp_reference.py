#!/usr/bin/env python3
"""Outside reference for the turboquant LLM path (not part of CI).

Runs llama.cpp (through llama-cpp-python) and `tq` on the same GGUF model and text and
checks: identical token ids on the whole corpus; next-token top-1 agreement on the scored
positions (> 99% expected); perplexity of the f16 cache within 1%; and reports llama.cpp's
own q8_0 / q4_0 KV-cache perplexity and prefill / decode tok/s next to tq's.

Also (--hf-tokenizer) rebuilds the tokenizer with Hugging Face `tokenizers` from the GGUF
vocabulary and merges (BPE + Digits(individual) + ByteLevel, the SmolLM2 pre-tokenizer) and
compares its ids: the known ids in tests/test_tokenizer.cpp come from it.

Perplexity convention (same as `tq perplexity` and llama.cpp's `perplexity` tool): windows of
ctx tokens, no BOS (the model's add_bos_token is false), tokens ctx/2+1 .. ctx-1 scored.
"""
import argparse
import json
import math
import struct
import subprocess
import sys
import time

import numpy as np


def gguf_metadata(path):
    """Minimal GGUF metadata reader (for the tokenizer vocabulary and merges)."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    off = 0

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)
        off += struct.calcsize("<" + fmt)
        return v[0]

    def rs():
        nonlocal off
        n = rd("Q")
        s = data[off:off + n]
        off += n
        return s.decode("utf-8")

    scal = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def rv(t):
        if t in scal:
            return rd(scal[t])
        if t == 8:
            return rs()
        at, n = rd("I"), rd("Q")
        return [rv(at) for _ in range(n)]

    assert rd("I") == 0x46554747, "not a GGUF file"
    rd("I")
    rd("Q")
    md = {}
    for _ in range(rd("Q")):
        k = rs()
        md[k] = rv(rd("I"))
    return md


def hf_tokenizer(model_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    md = gguf_metadata(model_path)
    vocab = {t: i for i, t in enumerate(md["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    tk = Tokenizer(models.BPE(vocab, merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    return tk


def tq_json(args, *cmd):
    out = subprocess.run([args.tq, *cmd, "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def llama_perplexity(args, tokens, type_k, type_v):
    from llama_cpp import Llama
    llm = Llama(model_path=args.model, n_ctx=args.ctx, n_batch=args.ctx, n_ubatch=args.ctx, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=True, type_k=type_k, type_v=type_v,
                flash_attn=True, verbose=False)
    first = args.ctx // 2
    nll, n, top1 = 0.0, 0, []
    t0 = time.time()
    for c in range(args.chunks):
        chunk = tokens[c * args.ctx:(c + 1) * args.ctx]
        llm.reset()
        llm.eval(chunk)
        lp = log_softmax(np.asarray(llm.scores[:args.ctx], dtype=np.float64))
        for j in range(first, args.ctx - 1):
            nll -= lp[j, chunk[j + 1]]
            top1.append(int(lp[j].argmax()))
            n += 1
    secs = time.time() - t0
    return math.exp(nll / n), top1, secs, llm


def llama_speed(args, tokens, type_k, type_v, ctx, n_decode=16):
    from llama_cpp import Llama
    llm = Llama(model_path=args.model, n_ctx=ctx + n_decode, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, type_k=type_k, type_v=type_v, flash_attn=True, verbose=False)
    t0 = time.time()
    llm.eval(tokens[:ctx])
    pf = ctx / (time.time() - t0)
    t0 = time.time()
    for i in range(n_decode):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([tok])
    dc = n_decode / (time.time() - t0)
    return pf, dc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speed-contexts", default="512,4096,8192")
    ap.add_argument("--hf-tokenizer", action="store_true", help="only compare tq's ids with HF tokenizers")
    ap.add_argument("--out")
    args = ap.parse_args()
    text = open(args.corpus, encoding="utf-8").read()
    report = {"model": args.model, "corpus": args.corpus, "ctx": args.ctx, "chunks": args.chunks,
              "threads": args.threads}

    ours = tq_json(args, "tokenize", "-m", args.model, "-f", args.corpus)["ids"]
    hf = hf_tokenizer(args.model).encode(text).ids
    report["tokens_tq"] = len(ours)
    report["tokens_hf_identical"] = hf == ours
    print(f"tokenizer: tq {len(ours)} tokens; HF tokenizers identical: {hf == ours}")
    if args.hf_tokenizer:
        return
    import llama_cpp
    ref_ids = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False).tokenize(
        text.encode("utf-8"), add_bos=False, special=False)
    report["tokens_llama_cpp_identical"] = list(ref_ids) == ours
    print(f"tokenizer: llama.cpp identical: {report['tokens_llama_cpp_identical']}")

    tq_ppl = tq_json(args, "perplexity", "-m", args.model, "-f", args.corpus, "-c", str(args.ctx), "--chunks",
                     str(args.chunks), "-t", str(args.threads), "--top1")
    F16, Q8, Q4 = llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_Q4_0
    ppl_f16, top1, secs, _ = llama_perplexity(args, ours, F16, F16)
    agree = float(np.mean(np.asarray(top1) == np.asarray(tq_ppl["top1"])))
    report.update({"llama_cpp_ppl_f16": ppl_f16, "tq_ppl_f16": tq_ppl["ppl"],
                   "ppl_rel_diff_pct": 100 * (tq_ppl["ppl"] / ppl_f16 - 1), "top1_agreement_vs_llama_cpp": agree,
                   "llama_cpp_seconds_f16": secs, "tq_seconds_f16": tq_ppl["seconds"]})
    print(f"f16 perplexity: llama.cpp {ppl_f16:.4f}, tq {tq_ppl['ppl']:.4f} "
          f"({report['ppl_rel_diff_pct']:+.2f}%); top-1 agreement {100 * agree:.2f}%")
    for name, t in (("q8_0", Q8), ("q4_0", Q4)):
        p, _, s, _ = llama_perplexity(args, ours, t, t)
        report[f"llama_cpp_ppl_{name}"] = p
        print(f"llama.cpp {name} KV: ppl {p:.4f} ({100 * (p / ppl_f16 - 1):+.2f}% vs its f16)")
    speed = []
    for ctx in [int(x) for x in args.speed_contexts.split(",")]:
        for name, t in (("f16", F16), ("q8_0", Q8), ("q4_0", Q4)):
            pf, dc = llama_speed(args, ours, t, t, ctx)
            speed.append({"context": ctx, "cache": name, "prefill_tok_s": pf, "decode_tok_s": dc})
            print(f"llama.cpp ctx {ctx} {name}: prefill {pf:.1f} tok/s, decode {dc:.2f} tok/s")
    report["llama_cpp_speed"] = speed
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
