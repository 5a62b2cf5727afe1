"""turboquant.Model on the project's GGUF model (SmolLM2-135M; skipped when absent):
perplexity on a cache label and greedy generation equal the CLI's (`tq perplexity --sweep`,
`tq generate`) on the same text; tokenize round-trips; bad input raises."""
import numpy as np
import pytest

import turboquant as tq
from conftest import ROOT, run_cli

TEXT_CHARS = 6000


@pytest.fixture(scope="module")
def model(model_path):
    return tq.Model.load(str(model_path), threads=1)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    corpus = ROOT / "data" / "debian-reference.en.txt"
    if not corpus.exists():
        pytest.skip(f"no corpus at {corpus} (scripts/fetch-corpus.sh)")
    p = tmp_path_factory.mktemp("ppl") / "text.txt"
    p.write_text(corpus.read_text(encoding="utf-8", errors="replace")[:TEXT_CHARS], encoding="utf-8")
    return p


def test_tokenize_roundtrip(model):
    ids = model.tokenize("Debian is a free operating system.")
    assert ids[0] != ids[1] and all(0 <= i < model.n_vocab for i in ids)
    no_bos = model.tokenize("Debian is a free operating system.", add_bos=False)
    assert model.detokenize(no_bos).decode() == "Debian is a free operating system."
    assert "Model" in repr(model) and model.n_layers == 30


@pytest.mark.parametrize("cache", ["tq4/tq3", "f16"])
def test_perplexity_equals_cli(model, model_path, text_file, tq_cli, cache):
    cli = run_cli(tq_cli, "perplexity", "-m", model_path, "-f", text_file, "-c", 128, "--chunks", 2,
                  "-t", 1, "--sweep", cache)
    ref = cli["results"][0]
    r = model.perplexity(text_file.read_text(encoding="utf-8"), cache=cache, n_ctx=128, n_chunks=2)
    assert r["n_chunks"] == 2 and r["n_scored"] == cli["scored_tokens"]
    # same tokens, same cache; float summation may differ with the BLAS kernel set
    assert r["ppl"] == pytest.approx(ref["ppl"], rel=2e-3)
    assert r["kv_bytes_per_token"] == pytest.approx(ref["kv_bytes_per_token"])
    # token ids in, the same result
    ids = model.tokenize(text_file.read_text(encoding="utf-8"))
    assert model.perplexity(ids, cache=cache, n_ctx=128, n_chunks=2)["ppl"] == pytest.approx(r["ppl"], rel=1e-9)


def test_perplexity_compare_and_cache_from_model(model, text_file):
    r = model.perplexity(text_file.read_text(encoding="utf-8"), cache="tq3/tq3", n_ctx=128, n_chunks=1,
                         compare=True)
    assert r["kld_mean"] > 0 and 0 < r["top1_agreement"] <= 1 and r["ppl_ref"] > 0
    c = model.new_cache("tq4/tq3", max_tokens=64)
    assert c.n_layers == model.n_layers and c.n_kv_heads == model.n_kv_heads and c.head_dim == model.head_dim


def test_generate_equals_cli(model, model_path, tq_cli):
    prompt = "The Debian package manager is"
    cli = run_cli(tq_cli, "generate", "-m", model_path, "-p", prompt, "-n", 8, "-t", 1, "-ctk", "tq4",
                  "-ctv", "tq4")
    text, ids = model.generate(prompt, max_tokens=8, cache="tq4/tq4")
    assert text == cli["text"]
    assert len(ids) == cli["generated_tokens"]


def test_model_bad_input(model, tmp_path):
    with pytest.raises(tq.Error, match="nonexistent"):
        tq.Model.load(str(tmp_path / "nonexistent.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(tq.Error):
        tq.Model.load(str(tmp_path / "junk.gguf"))
    with pytest.raises(tq.Error, match="tq99"):
        model.perplexity("some text " * 100, cache="tq99", n_ctx=64)
    with pytest.raises(tq.Error, match="vocabulary"):
        model.perplexity([1, 2, 10 ** 7], n_ctx=64)
    with pytest.raises(TypeError):
        model.perplexity(3.5)
    with pytest.raises(tq.Error, match="max_tokens"):
        model.generate("Hello", max_tokens=-1)
    with pytest.raises(tq.Error, match="chat"):
        model.generate([1, 2, 3], chat=True)
