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
import os
import statistics
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


def llama_perplexity(args, tokens, type_k, type_v, other_top1=None, ubatch=None):
    """llama.cpp perplexity with the convention of its `perplexity` tool and `tq perplexity`:
    window c is tokens[c*ctx, (c+1)*ctx), evaluated from an empty cache in one batch; rows
    ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1. Where other_top1 (tq's argmax per scored
    row) differs from llama.cpp's, records llama.cpp's logit gap between the two choices. ubatch:
    llama.cpp's micro-batch (default: the whole window in one)."""
    from llama_cpp import Llama
    ctx = args.ctx
    llm = Llama(model_path=args.model, n_ctx=ctx, n_batch=ctx, n_ubatch=ubatch or ctx, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=True, type_k=type_k, type_v=type_v,
                flash_attn=True, verbose=False)
    first = ctx // 2
    nll, n, top1, gaps, chunk_ppl = 0.0, 0, [], [], []
    t0 = time.time()
    for c in range(args.chunks):
        chunk = tokens[c * ctx:(c + 1) * ctx]
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[first:ctx - 1], dtype=np.float64)
        lp = log_softmax(logits)
        tgt = np.asarray(chunk[first + 1:ctx])
        nl = -lp[np.arange(len(tgt)), tgt]
        chunk_ppl.append(math.exp(nl.mean()))
        nll += float(nl.sum())
        n += len(tgt)
        mine = lp.argmax(axis=1)
        if other_top1 is not None:
            theirs = np.asarray(other_top1[len(top1):len(top1) + len(mine)])
            for r in np.nonzero(mine != theirs)[0]:
                gaps.append(float(logits[r, mine[r]] - logits[r, theirs[r]]))
        top1.extend(int(i) for i in mine)
    secs = time.time() - t0
    del llm
    return {"ppl": math.exp(nll / n), "scored": n, "chunk_ppl": chunk_ppl, "top1": top1, "seconds": secs,
            "gaps": gaps}


def llama_speed(args, tokens, type_k, type_v, ctx):
    """Prefill of ctx corpus tokens from an empty cache, then args.decode greedy steps (the
    protocol of `tq bench model`); medians over args.reps."""
    import llama_cpp
    from llama_cpp import Llama
    llm = Llama(model_path=args.model, n_ctx=ctx + args.decode, n_batch=512, n_ubatch=512,
                n_threads=args.speed_threads, n_threads_batch=args.speed_threads, type_k=type_k, type_v=type_v,
                flash_attn=True, verbose=False)
    n_vocab = llm.n_vocab()
    pf, dc = [], []
    for _ in range(args.reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens[:ctx])
        pf.append(ctx / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(args.decode):
            # logits_all=False: llm.scores is not filled, read the last row from llama.cpp
            last = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            llm.eval([int(last.argmax())])
        dc.append(args.decode / (time.perf_counter() - t0))
    del llm
    return statistics.median(pf), statistics.median(dc)


def speed_ratios(speed, pairs=()):
    """Per context and cache type both engines ran: tq / llama.cpp tok/s of each round (the
    two runs next to each other), and the median over rounds. pairs: (tq cache, llama.cpp
    cache) of different types to compare too (e.g. tq's auto against llama.cpp's q4_0); their
    rows name both ("auto vs q4_0")."""
    out = []
    keys = sorted({(r["context"], r["cache"], r["cache"]) for r in speed if r["engine"] == "llama.cpp"})
    keys += sorted({(r["context"], t, l) for r in speed for t, l in pairs if r["engine"] == "llama.cpp"})
    for ctx, tq_cache, cache in keys:
        pf, dc = [], []
        for rnd in sorted({r["round"] for r in speed if r["context"] == ctx}):
            a = [r for r in speed if (r["engine"], r["context"], r["cache"], r["round"]) == ("llama.cpp", ctx, cache, rnd)]
            b = [r for r in speed if (r["engine"], r["context"], r["cache"], r["round"]) == ("tq", ctx, tq_cache, rnd)]
            if a and b:
                pf.append(b[0]["prefill_tok_s"] / a[0]["prefill_tok_s"])
                dc.append(b[0]["decode_tok_s"] / a[0]["decode_tok_s"])
        if pf:
            name = cache if tq_cache == cache else f"{tq_cache} vs {cache}"
            out.append({"context": ctx, "cache": name, "rounds": len(pf), "prefill_ratio": pf, "decode_ratio": dc,
                        "prefill_ratio_median": statistics.median(pf), "decode_ratio_median": statistics.median(dc),
                        "prefill_ratio_min": min(pf), "prefill_ratio_max": max(pf),
                        "decode_ratio_min": min(dc), "decode_ratio_max": max(dc)})
    return out


def tq_cache_ratios(speed):
    """tq's own caches against the first tq cache of the same round and context (one process
    runs them one after the other), per round and the median: e.g. auto / f16."""
    out = []
    for ctx in sorted({r["context"] for r in speed if r["engine"] == "tq"}):
        rows = [r for r in speed if r["engine"] == "tq" and r["context"] == ctx]
        caches = list(dict.fromkeys(r["cache"] for r in rows))
        for cache in caches[1:]:
            pf, dc = [], []
            for rnd in sorted({r["round"] for r in rows}):
                a = [r for r in rows if (r["cache"], r["round"]) == (caches[0], rnd)]
                b = [r for r in rows if (r["cache"], r["round"]) == (cache, rnd)]
                if a and b:
                    pf.append(b[0]["prefill_tok_s"] / a[0]["prefill_tok_s"])
                    dc.append(b[0]["decode_tok_s"] / a[0]["decode_tok_s"])
            if pf:
                out.append({"context": ctx, "cache": cache, "vs": caches[0], "rounds": len(pf),
                            "prefill_ratio": pf, "decode_ratio": dc,
                            "prefill_ratio_median": statistics.median(pf), "decode_ratio_median": statistics.median(dc)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="threads for the perplexity runs (tq and llama.cpp)")
    ap.add_argument("--speed-threads", type=int, default=2)
    ap.add_argument("--speed-contexts", default="512", help="comma-separated; empty: no speed runs")
    ap.add_argument("--decode", type=int, default=32, help="greedy decode steps in the speed runs")
    ap.add_argument("--reps", type=int, default=3, help="speed repetitions (median)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="speed rounds per context: llama.cpp then tq, alternating, each with --reps; the "
                         "report gives every round and the median over rounds of tq / llama.cpp per cache")
    ap.add_argument("--tq-caches", default="f16,q8_0,q4_0,tq5/tq3 plain",
                    help="tq caches in the speed runs (tq bench model --caches: types or whole labels)")
    ap.add_argument("--llama-caches", default="f16,q8_0,q4_0", help="llama.cpp caches in the speed runs (of f16, q8_0, q4_0)")
    ap.add_argument("--no-quality", action="store_true", help="speed runs only")
    ap.add_argument("--pairs", default="",
                    help="extra speed ratios of a tq cache against a llama.cpp cache of another type, "
                         "comma-separated TQ:LLAMA (e.g. auto:q4_0,auto:q8_0)")
    ap.add_argument("--kv-ppl", default="q8_0,q4_0", help="llama.cpp quantized KV caches for perplexity ('' for none)")
    ap.add_argument("--self-ubatch", default="",
                    help="comma-separated micro-batch sizes: llama.cpp's f16 perplexity again with each, top-1 "
                         "agreement with its own one-batch run (below 64 rows its flash attention takes the "
                         "one-query path: f16 queries, f16 V accumulation)")
    ap.add_argument("--hf-tokenizer", action="store_true", help="only compare tq's ids with HF tokenizers")
    ap.add_argument("--out")
    args = ap.parse_args()
    try:
        args.self_ubatch = [int(x) for x in args.self_ubatch.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--self-ubatch: '{args.self_ubatch}' is not a comma-separated list of integers")
    if any(not 1 <= u <= args.ctx for u in args.self_ubatch):
        ap.error(f"--self-ubatch: micro-batch sizes must be in 1..{args.ctx} (--ctx)")
    bad = set(filter(None, args.llama_caches.split(","))) - {"f16", "q8_0", "q4_0"}
    if bad:
        ap.error(f"--llama-caches: unknown cache type(s) {', '.join(sorted(bad))} (valid: f16, q8_0, q4_0)")
    pairs = []
    for item in filter(None, (x.strip() for x in args.pairs.split(","))):
        t, sep, l = item.partition(":")
        if not sep or not t or l not in ("f16", "q8_0", "q4_0"):
            ap.error(f"--pairs: '{item}' is not TQ_CACHE:LLAMA_CACHE with LLAMA_CACHE one of f16, q8_0, q4_0")
        pairs.append((t, l))
    text = open(args.corpus, encoding="utf-8").read()
    report = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "model": args.model,
              "corpus": args.corpus, "ctx": args.ctx, "chunks": args.chunks, "threads": args.threads}

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)

    # `ours`: what `tq perplexity` scores (with the BOS the model asks for, as its add_bos says);
    # `plain`: the text alone, compared with llama.cpp's and HF's ids.
    ours = tq_json(args, "tokenize", "-m", args.model, "-f", args.corpus)["ids"]
    plain = tq_json(args, "tokenize", "-m", args.model, "-f", args.corpus, "--no-bos")["ids"]
    report["tokens_tq"] = len(plain)
    report["tq_adds_bos"] = len(ours) == len(plain) + 1
    if gguf_metadata(args.model).get("tokenizer.ggml.model") == "gpt2":
        try:
            hf = hf_tokenizer(args.model).encode(text).ids
            report["tokens_hf_identical"] = hf == plain
            print(f"tokenizer: tq {len(plain)} tokens; HF tokenizers identical: {hf == plain}")
        except ImportError:
            print("tokenizer: HF tokenizers not installed, skipped")
    if args.hf_tokenizer:
        return
    import llama_cpp
    report["llama_cpp_python"] = llama_cpp.__version__
    # What each engine ran with: llama.cpp's compiled instruction sets, tq's SIMD level override
    # (TQ_SIMD; unset: the host's best) and OpenBLAS kernel choice.
    report["llama_cpp_system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    report["tq_env"] = {k: os.environ.get(k, "") for k in ("TQ_SIMD", "OPENBLAS_CORETYPE")}
    # This llama.cpp applies a Walsh-Hadamard rotation to K and V when their cache type is
    # quantized (attn_rot_k / attn_rot_v in llama-kv-cache.cpp) unless LLAMA_ATTN_ROT_DISABLE=1:
    # its q8_0 / q4_0 are then the counterparts of tq's q8_0h / q4_0h, not of tq's q8_0 / q4_0.
    report["LLAMA_ATTN_ROT_DISABLE"] = os.environ.get("LLAMA_ATTN_ROT_DISABLE", "")
    vocab = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    report["llama_cpp_add_bos"] = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(vocab.model)))
    ref_ids = list(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))
    del vocab
    same = ref_ids == plain
    report["tokens_llama_cpp"] = len(ref_ids)
    report["tokens_llama_cpp_identical"] = same
    if not same:
        k = next((i for i, (a, b) in enumerate(zip(ref_ids, plain)) if a != b), min(len(ref_ids), len(plain)))
        report["tokens_first_mismatch"] = {"index": k, "tq": plain[k:k + 8], "llama_cpp": ref_ids[k:k + 8]}
    print(f"tokenizer: llama.cpp {len(ref_ids)} tokens, identical: {same} (llama.cpp add_bos: "
          f"{report['llama_cpp_add_bos']})")
    save()

    F16, Q8, Q4 = llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_Q4_0
    if not args.no_quality:
        tq_ppl = tq_json(args, "perplexity", "-m", args.model, "-f", args.corpus, "-c", str(args.ctx), "--chunks",
                         str(args.chunks), "-t", str(args.threads), "--top1")
        ref = llama_perplexity(args, ours, F16, F16, tq_ppl["top1"])
        a, b = np.asarray(ref["top1"]), np.asarray(tq_ppl["top1"])
        assert len(a) == len(b) == tq_ppl["scored_tokens"], (len(a), len(b), tq_ppl["scored_tokens"])
        agree = float(np.mean(a == b))
        # Where the two argmaxes differ: llama.cpp's logit gap between its choice and ours
        # (a near-tie means the disagreement is rounding, not a different model).
        dis = np.nonzero(a != b)[0]
        gaps = ref["gaps"]
        report.update({
            "scored_tokens": ref["scored"], "llama_cpp_ppl_f16": ref["ppl"], "tq_ppl_f16": tq_ppl["ppl"],
            "ppl_rel_diff_pct": 100 * (tq_ppl["ppl"] / ref["ppl"] - 1), "top1_agreement_vs_llama_cpp": agree,
            "top1_disagreements": len(dis), "top1_disagreement_logit_gaps": sorted(gaps),
            "llama_cpp_chunk_ppl_f16": ref["chunk_ppl"], "tq_chunk_ppl_f16": tq_ppl.get("chunk_ppl"),
            "llama_cpp_seconds_f16": ref["seconds"], "tq_seconds_f16": tq_ppl["seconds"],
            "llama_cpp_top1_f16": ref["top1"], "tq_top1_f16": tq_ppl["top1"]})
        print(f"f16 perplexity ({ref['scored']} scored tokens): llama.cpp {ref['ppl']:.4f}, tq {tq_ppl['ppl']:.4f} "
              f"({report['ppl_rel_diff_pct']:+.3f}%); top-1 agreement {100 * agree:.2f}% "
              f"({len(dis)} differ; llama.cpp logit gap at those: max {max(gaps, default=0):.3f})")
        save()
        for ub in args.self_ubatch:
            r = llama_perplexity(args, ours, F16, F16, ubatch=ub)
            ag = float(np.mean(np.asarray(r["top1"]) == a))
            ag_tq = float(np.mean(np.asarray(r["top1"]) == b))
            report[f"llama_cpp_ppl_f16_ubatch{ub}"] = r["ppl"]
            report[f"llama_cpp_top1_ubatch{ub}_vs_own_f16"] = ag
            report[f"llama_cpp_top1_ubatch{ub}_vs_tq"] = ag_tq
            report[f"llama_cpp_top1_f16_ubatch{ub}"] = r["top1"]
            print(f"llama.cpp f16, micro-batches of {ub}: ppl {r['ppl']:.4f}, top-1 vs its one-batch run "
                  f"{100 * ag:.2f}%, vs tq {100 * ag_tq:.2f}%")
            save()
        for name, t in (("q8_0", Q8), ("q4_0", Q4)):
            if name not in args.kv_ppl.split(","):
                continue
            r = llama_perplexity(args, ours, t, t)
            ag = float(np.mean(np.asarray(r["top1"]) == a))
            report[f"llama_cpp_ppl_{name}"] = r["ppl"]
            report[f"llama_cpp_top1_vs_own_f16_{name}"] = ag
            report[f"llama_cpp_seconds_{name}"] = r["seconds"]
            print(f"llama.cpp {name} KV: ppl {r['ppl']:.4f} ({100 * (r['ppl'] / ref['ppl'] - 1):+.2f}% vs its f16), "
                  f"top-1 vs its f16 {100 * ag:.2f}%")
            save()
    speed = []
    ctxs = [int(x) for x in args.speed_contexts.split(",") if x.strip()]
    for ctx in ctxs:
        for rnd in range(args.rounds):
            load0 = os.getloadavg()[0]
            for name, t in (("f16", F16), ("q8_0", Q8), ("q4_0", Q4)):
                if name not in args.llama_caches.split(","):
                    continue
                pf, dc = llama_speed(args, ours, t, t, ctx)
                speed.append({"engine": "llama.cpp", "context": ctx, "cache": name, "prefill_tok_s": pf,
                              "decode_tok_s": dc, "threads": args.speed_threads, "reps": args.reps,
                              "decode_tokens": args.decode, "round": rnd})
                print(f"llama.cpp ctx {ctx} {name}: prefill {pf:.1f} tok/s, decode {dc:.2f} tok/s")
            tq = tq_json(args, "bench", "model", "-m", args.model, "-f", args.corpus, "-t", str(args.speed_threads),
                         "--contexts", str(ctx), "--caches", args.tq_caches, "--decode", str(args.decode),
                         "--reps", str(args.reps))
            for r in tq["rows"]:
                speed.append({"engine": "tq", "context": ctx, "cache": r["cache"], "prefill_tok_s": r["prefill_tok_s"],
                              "decode_tok_s": r["decode_tok_s"], "threads": args.speed_threads, "reps": args.reps,
                              "decode_tokens": args.decode, "round": rnd, "kv_bytes": r.get("kv_bytes"),
                              "prefill_matmul": tq.get("prefill_matmul"), "blas_core": tq.get("blas_core")})
                print(f"tq        ctx {ctx} {r['cache']}: prefill {r['prefill_tok_s']:.1f} tok/s, "
                      f"decode {r['decode_tok_s']:.2f} tok/s")
            for row in speed:
                if row["context"] == ctx and row["round"] == rnd:
                    row["loadavg_1min_before"] = load0
            report["speed"] = speed
            report["speed_ratio"] = speed_ratios(speed, pairs)
            report["tq_cache_ratio"] = tq_cache_ratios(speed)
            save()
    for r in report.get("speed_ratio", []):
        print(f"tq / llama.cpp ctx {r['context']} {r['cache']}: prefill {r['prefill_ratio_median']:.3f}x, "
              f"decode {r['decode_ratio_median']:.3f}x (median of {r['rounds']} rounds)")
    for r in report.get("tq_cache_ratio", []):
        print(f"tq {r['cache']} / tq {r['vs']} ctx {r['context']}: prefill {r['prefill_ratio_median']:.3f}x, "
              f"decode {r['decode_ratio_median']:.3f}x (median of {r['rounds']} rounds)")


if __name__ == "__main__":
    sys.exit(main())
