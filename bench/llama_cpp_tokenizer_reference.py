#!/usr/bin/env python3
"""Outside reference for tq's tokenizers (not part of CI): llama.cpp's token ids, saved for the tests.

Loads each tokenizer in llama.cpp (llama-cpp-python, vocab_only=True) and stores, in a JSON that
tests/test_tokenizer.cpp reads in `make test` (the tests never need llama.cpp):
  - llama.cpp's ids for fixed strings (Unicode, digits, runs of spaces and newlines, emoji, code,
    control-token text with and without special-token parsing), add_bos=False;
  - for the whole corpus: the number of ids and the sha256 of the ids as little-endian int32,
    and the milliseconds llama.cpp took (1 thread, median of --reps).
Tokenizers:
  smollm2  the real SmolLM2-135M GGUF (byte-level BPE, pre = smollm)
  gemma3   the real Gemma 3 270M GGUF (SentencePiece, 262,144 pieces)
  qwen2    a BPE test vocabulary (pre = qwen2) written by bench/make_tokenizer_vocabs.py
  llama3   the same vocabulary with pre = llama-bpe
With --tq, also runs `tq tokenize --no-bos --json` on the same vocabularies (the Gemma one as the
tokenizer-only file make_tokenizer_vocabs.py writes) and records agreement and tq's milliseconds.

Run with the llama.cpp venv (scripts/llama_cpp_tokenizer_reference.sh does):
  .venv-ref/bin/python bench/llama_cpp_tokenizer_reference.py [--tq build/tq] [--out bench/results/tokenizer_reference.json]
"""
import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (text, parse_special). Kept short: each id list is stored in the JSON for every tokenizer.
STRINGS = [
    ("", False),
    (" ", False),
    ("Hello world!", False),
    ("The Debian GNU/Linux system", False),
    ("naïve café — 東京 🚀", False),
    ("Ünïcödé Ελληνικά русский 日本語 한국어 العربية हिन्दी", False),
    ("3.14159 1234567 12 123 1,000,000 0x1F 2024-12-04 ½ ²", False),
    ("a  b   c    d", False),
    ("\n", False),
    ("\n\n\n", False),
    ("  leading and trailing  ", False),
    ("line1\nline2\r\n\r\nline3\t\ttab\n \n  \n", False),
    ("     ", False),
    ("👍🏽 👨‍👩‍👧 🇩🇪 ✨🫠", False),
    ("  x = 3.14159;\n\tif (a != b) return -1;", False),
    ("def f(x):\n    return x**2  # it's\n", False),
    ("<div class=\"a\">&amp;</div> <b>bold</b> <table>", False),
    ("I'm sure they'll say it's John's, DON'T WE'LL 'tis", False),
    (" zqxj zqxjzqxj", False),
    ("\x01\x7f \U0001d518\U0001d52b\U0001d526 \ue000", False),
    ("<|im_start|>user\nhi<|im_end|>", False),
    ("<|im_start|>user\nhi<|im_end|>", True),
    ("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", False),
    ("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", True),
    ("<bos><eos><unk><pad><|endoftext|>", True),
]


def ids_sha256(ids):
    return hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest()


def timed(fn, reps):
    """fn's result and the medians of its wall and CPU milliseconds (the CPU time is the steadier
    figure on a shared machine)."""
    wall, cpu, out = [], [], None
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        cpu.append(1000 * (time.process_time() - c0))
        wall.append(1000 * (time.perf_counter() - t0))
    return out, statistics.median(wall), statistics.median(cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--gemma", default="models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--corpus", default="data/debian-reference.en.txt")
    ap.add_argument("--vocab-dir", default="build/tokenizer-vocabs", help="where the test vocabularies are written")
    ap.add_argument("--tq", help="tq binary: also compare tq's ids and time it")
    ap.add_argument("--reps", type=int, default=3, help="timing repetitions (median)")
    ap.add_argument("--out", default="bench/results/tokenizer_reference.json")
    a = ap.parse_args()
    for p in (a.smollm, a.gemma, a.corpus):
        if not os.path.exists(p):
            sys.exit(f"llama_cpp_tokenizer_reference.py: {p} missing (scripts/fetch-model.sh, scripts/fetch-corpus.sh)")
    try:
        import llama_cpp
    except ImportError as e:
        sys.exit(f"llama_cpp_tokenizer_reference.py: llama-cpp-python is not importable ({e}); "
                 "run it with a venv that has it (scripts/llama_cpp_reference.sh makes .venv-ref)")
    text = open(a.corpus, encoding="utf-8").read()
    # The test vocabularies: those bench/make_tokenizer_vocabs.py wrote into --vocab-dir (the shell
    # script runs it with the test venv), else made here (needs the `gguf` package).
    manifest = os.path.join(a.vocab_dir, "manifest.json")
    if os.path.exists(manifest):
        made = json.load(open(manifest))
    else:
        try:
            import make_tokenizer_vocabs
        except ImportError as e:
            sys.exit(f"llama_cpp_tokenizer_reference.py: no {manifest} and cannot make it here ({e}): run "
                     f"bench/make_tokenizer_vocabs.py --out {a.vocab_dir} with the test venv first")
        made = make_tokenizer_vocabs.make_all(a.smollm, a.gemma, a.vocab_dir)
    tokenizers = {
        "smollm2": {"llama_cpp_file": a.smollm, "tq_file": a.smollm, "source": "real model"},
        "gemma3": {"llama_cpp_file": a.gemma, "tq_file": made["gemma3"]["file"], "source": "real model"},
    }
    for name in ("qwen2", "llama3"):
        m = made[name]
        tokenizers[name] = {"llama_cpp_file": m["file"], "tq_file": m["file"],
                            "source": "bench/make_tokenizer_vocabs.py (SmolLM2 vocabulary + digit merges)",
                            "pre": m["pre"], "n_tokens": m["n_tokens"], "n_merges": m["n_merges"],
                            "vocab_sha256": m["vocab_sha256"]}
    report = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "llama_cpp_python": llama_cpp.__version__,
              "corpus": a.corpus, "corpus_bytes": len(text.encode("utf-8")),
              "corpus_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
              "digest": "sha256 of the ids as little-endian int32", "add_bos": False,
              "strings": [{"text": s, "parse_special": sp} for s, sp in STRINGS], "tokenizers": tokenizers}
    for name, t in tokenizers.items():
        llm = llama_cpp.Llama(model_path=t["llama_cpp_file"], vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        t["n_vocab"] = llm.n_vocab()
        t["llama_cpp_add_bos"] = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        t["llama_cpp_add_eos"] = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
        t["ids"] = [list(llm.tokenize(s.encode("utf-8"), add_bos=False, special=sp)) for s, sp in STRINGS]
        data = text.encode("utf-8")

        def tokenize_once():
            # One llama_tokenize call with room for every id: Llama.tokenize first tries a buffer of
            # n_ctx_train ids and, for the corpus, tokenizes a second time, which would double the time.
            n_max = len(data) + 16
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n_max, False, False)
            assert n >= 0, n
            return list(buf[:n])

        ids, ms, cpu_ms = timed(tokenize_once, a.reps)
        assert ids == list(llm.tokenize(data, add_bos=False, special=False))
        t["corpus"] = {"n_tokens": len(ids), "sha256": ids_sha256(ids), "llama_cpp_ms": ms, "llama_cpp_cpu_ms": cpu_ms,
                       "loadavg_1min": os.getloadavg()[0]}
        print(f"{name}: llama.cpp {len(ids)} corpus tokens in {ms:.1f} ms wall, {cpu_ms:.1f} ms CPU (1 thread)")
        del llm
        if a.tq:
            def run_tq():
                out = subprocess.run([a.tq, "tokenize", "-m", t["tq_file"], "-f", a.corpus, "--no-bos", "--json"],
                                     check=True, capture_output=True, text=True).stdout
                return json.loads(out)
            res = [run_tq() for _ in range(a.reps)]
            mine = res[0]["ids"]
            same = mine == ids
            k = next((i for i, (x, y) in enumerate(zip(mine, ids)) if x != y), min(len(mine), len(ids)))
            t["tq"] = {"corpus_identical": same, "n_tokens": len(mine), "first_mismatch": None if same else k,
                       "tokenize_ms": statistics.median(r["tokenize_ms"] for r in res),
                       "tokenize_cpu_ms": statistics.median(r["tokenize_cpu_ms"] for r in res),
                       "round_trip": res[0]["round_trip"]}
            print(f"{name}: tq {len(mine)} tokens, identical {same}, {t['tq']['tokenize_ms']:.1f} ms wall, "
                  f"{t['tq']['tokenize_cpu_ms']:.1f} ms CPU")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
