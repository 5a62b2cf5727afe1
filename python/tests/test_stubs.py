"""The committed type stub python/turboquant/_turboquant.pyi is what nanobind's stubgen
writes for the built module (regenerate: python -m nanobind.stubgen -m turboquant._turboquant
-o python/turboquant/_turboquant.pyi, with the build's module on PYTHONPATH)."""
import pathlib
import subprocess
import sys

import pytest

import turboquant

STUB = pathlib.Path(__file__).resolve().parents[1] / "turboquant" / "_turboquant.pyi"


def test_stub_matches_module(tmp_path):
    pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_turboquant.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "turboquant._turboquant", "-o", str(out)],
                   check=True)
    assert STUB.read_text() == out.read_text(), f"{STUB} is stale: regenerate it (see this test's docstring)"


def test_docstrings():
    for name in ("Index", "Quantizer", "KVCache", "Model", "Codebook", "Rotation"):
        assert getattr(turboquant, name).__doc__
    assert "scores" in turboquant.Index.search.__doc__
