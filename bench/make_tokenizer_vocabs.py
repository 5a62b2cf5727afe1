#!/usr/bin/env python3
"""Vocabulary-only GGUF files for the tokenizer references (bench/llama_cpp_tokenizer_reference.py).

There is no real Qwen 2 or Llama 3 model here, so their pre-tokenizers are checked on a byte-level
BPE vocabulary built deterministically from SmolLM2's (this recipe is also rebuilt in memory by
tests/test_tokenizer.cpp, `bpe_test_vocab`):

  tokens = SmolLM2's tokens (with their types), then the 100 two-digit strings "00".."99", then
           the 1000 three-digit strings "000".."999", then "Ġzqxj" (a token no merge reaches:
           only Llama 3's ignore_merges takes it whole);
  merges = SmolLM2's merges, then "a b" for each two-digit string ab, then "ab c" for each
           three-digit string abc (in the same order as the tokens);
  tokenizer.ggml.model = gpt2, .pre = qwen2 / llama-bpe, bos / eos / unknown / padding ids as
  SmolLM2's; no add_bos_token key (llama.cpp then adds BOS for llama3, not for qwen2).

With SmolLM2's rules digits never merge; with Qwen 2's (one digit per piece) they still do not;
with Llama 3's (up to three digits per piece) they do, so the vocabulary tells the rules apart.
The files also carry the few hyperparameters llama.cpp reads before the vocabulary
(vocab_only still runs load_hparams).

Also writes gemma3-vocab.gguf: the tokenizer.* keys of the real Gemma 3 GGUF with no tensors, so
that `tq tokenize` can run its vocabulary whatever weight types tq reads.

Writes DIR/manifest.json (files, sizes, vocabulary digests) beside them.

Usage: make_tokenizer_vocabs.py [--smollm models/SmolLM2-135M-Instruct.Q4_1.gguf]
                                [--gemma models/gemma-3-270m-q4_k_m.gguf] [--out build/tokenizer-vocabs]
"""
import argparse
import hashlib
import json
import os
import sys

import gguf  # noqa: E402  (the test venv has it: scripts/requirements-test.txt)

BPE_RULES = {"qwen2": ("qwen2", "qwen2"), "llama3": ("llama", "llama-bpe")}  # name: (architecture, pre)


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def bpe_test_vocab(smollm_path):
    r = gguf.GGUFReader(smollm_path)
    toks = list(field(r, "tokenizer.ggml.tokens"))
    types = [int(t) for t in field(r, "tokenizer.ggml.token_type")]
    merges = list(field(r, "tokenizer.ggml.merges"))
    digits = "0123456789"
    for a in digits:
        for b in digits:
            toks.append(a + b)
            types.append(1)
            merges.append(a + " " + b)
    for a in digits:
        for b in digits:
            for c in digits:
                toks.append(a + b + c)
                types.append(1)
                merges.append(a + b + " " + c)
    toks.append("\u0120zqxj")
    types.append(1)
    ids = {k: int(field(r, "tokenizer.ggml." + k)) for k in
           ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
           if field(r, "tokenizer.ggml." + k) is not None}
    return toks, types, merges, ids


def vocab_digest(toks, merges):
    """sha256 of the tokens and merges, each followed by a newline (tokens first): the same
    digest tests/test_tokenizer.cpp computes for its in-memory copy."""
    h = hashlib.sha256()
    for t in toks:
        h.update(t.encode("utf-8") + b"\n")
    for m in merges:
        h.update(m.encode("utf-8") + b"\n")
    return h.hexdigest()


def write_atomic(path, fill, arch):
    tmp = path + ".tmp%d" % os.getpid()
    w = gguf.GGUFWriter(tmp, arch)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def write_bpe(path, name, smollm_path):
    arch, pre = BPE_RULES[name]
    toks, types, merges, ids = bpe_test_vocab(smollm_path)

    def fill(w):
        # Hyperparameters llama.cpp's load_hparams needs before it reads a vocabulary (made up:
        # there are no weights).
        w.add_context_length(2048)
        w.add_embedding_length(64)
        w.add_block_count(1)
        w.add_feed_forward_length(128)
        w.add_head_count(4)
        w.add_head_count_kv(4)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(merges)
        for k, v in ids.items():
            w.add_uint32("tokenizer.ggml." + k, v)

    write_atomic(path, fill, arch)
    return {"file": path, "n_tokens": len(toks), "n_merges": len(merges), "vocab_sha256": vocab_digest(toks, merges),
            "pre": pre, "architecture": arch}


def write_gemma_vocab(path, gemma_path):
    r = gguf.GGUFReader(gemma_path)
    arch = field(r, "general.architecture")

    def fill(w):
        for key, f in r.fields.items():
            if not key.startswith("tokenizer."):
                continue
            v = f.contents()
            t = f.types[0]
            if t == gguf.GGUFValueType.ARRAY:
                w.add_array(key, v) if f.types[-1] == gguf.GGUFValueType.STRING else \
                    w.add_key_value(key, v, gguf.GGUFValueType.ARRAY, sub_type=f.types[-1])
            else:
                w.add_key_value(key, v, t)

    write_atomic(path, fill, arch)
    return {"file": path, "n_tokens": len(field(r, "tokenizer.ggml.tokens"))}


def make_all(smollm, gemma, out):
    os.makedirs(out, exist_ok=True)
    made = {}
    for name in BPE_RULES:
        made[name] = write_bpe(os.path.join(out, f"{name}-test-vocab.gguf"), name, smollm)
    if gemma and os.path.exists(gemma):
        made["gemma3"] = write_gemma_vocab(os.path.join(out, "gemma3-vocab.gguf"), gemma)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(made, f, indent=1)
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--gemma", default="models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--out", default="build/tokenizer-vocabs")
    a = ap.parse_args()
    if not os.path.exists(a.smollm):
        sys.exit(f"make_tokenizer_vocabs.py: {a.smollm} missing (run scripts/fetch-model.sh)")
    for name, info in make_all(a.smollm, a.gemma, a.out).items():
        print(f"{name}: {info['file']} ({info['n_tokens']} tokens)")


if __name__ == "__main__":
    main()
