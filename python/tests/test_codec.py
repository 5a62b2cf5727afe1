"""Codebook, Rotation and Quantizer against a NumPy reference of the math in
include/tq/quantizer.h (mse codes: y = Pi x / ||x||, idx_i = number of boundaries <= y_i,
stored norm ||x|| / ||c[idx]|| as float16, x_hat = norm * Pi^T c[idx]; 4-bit indices packed
little-endian, index 2i in the low nibble of byte i)."""
import numpy as np
import pytest

import turboquant as tq


def unpack(codes, bits, d):
    """Little-endian bit stream -> (n, d) indices (include/tq/bitpack.h)."""
    b = np.unpackbits(codes, axis=1, bitorder="little")[:, : d * bits].reshape(len(codes), d, bits)
    return (b * (1 << np.arange(bits))).sum(axis=2).astype(np.int64)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_codebook_shape_and_quantize(bits, rng):
    cb = tq.Codebook(64, bits)
    c, b = cb.centroids, cb.boundaries
    assert c.shape == (1 << bits,) and b.shape == ((1 << bits) - 1,)
    assert np.all(np.diff(c) > 0)
    np.testing.assert_allclose(b, (c[1:] + c[:-1]) / 2, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(c, -c[::-1], atol=1e-6)  # symmetric law
    y = rng.normal(0, 1 / 8, 1000).astype(np.float32)
    np.testing.assert_array_equal(cb.quantize(y), np.searchsorted(b, y, side="right"))
    assert cb.mse_per_vector == pytest.approx(64 * cb.mse_per_coord)


@pytest.mark.parametrize("kind", ["hadamard", "haar", "block32", "givens", "iso4", "identity"])
@pytest.mark.parametrize("d", [3, 64, 100])
def test_rotation_is_linear_orthogonal(kind, d, rng):
    if kind == "block32" and d < 32:
        pytest.skip("block32 needs d >= 32")
    r = tq.Rotation(d, kind, seed=7)
    M = r.forward(np.eye(d, dtype=np.float32))  # row i = Pi e_i
    np.testing.assert_allclose(M @ M.T, np.eye(d), atol=1e-5)
    x = rng.normal(size=(5, d)).astype(np.float32)
    np.testing.assert_allclose(r.forward(x), x @ M, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r.inverse(r.forward(x)), x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r.forward(x[0]), r.forward(x)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("d", [64, 100])
def test_mse_codec_equals_numpy_reference(bits, d, rng):
    q = tq.Quantizer(d, bits=bits, kind="mse", seed=11)
    assert q.code_bytes == 2 + (d * bits + 7) // 8
    x = rng.normal(size=(200, d)).astype(np.float32) * 3
    codes = q.encode(x)
    assert codes.dtype == np.uint8 and codes.shape == (200, q.code_bytes)
    cb = q.codebook
    rot = q.rotation
    # reference indices: nearest centroid of each rotated unit-vector coordinate
    s = np.linalg.norm(x.astype(np.float64), axis=1)
    y = rot.forward(x) / s[:, None]
    ref_idx = np.searchsorted(cb.boundaries, y, side="right")
    idx = unpack(codes[:, 2:], bits, d)
    # float rounding of y may move a value across a boundary in a handful of coordinates
    assert np.mean(idx == ref_idx) > 0.999
    c = cb.centroids[idx].astype(np.float64)
    ref_norm = (s / np.linalg.norm(c, axis=1)).astype(np.float16)
    norm = codes[:, :2].copy().view(np.float16)[:, 0]
    np.testing.assert_allclose(norm.astype(np.float64), ref_norm.astype(np.float64), rtol=2e-3)
    # decode = stored norm * Pi^T c[idx]
    ref_dec = rot.inverse(c.astype(np.float32)) * norm.astype(np.float32)[:, None]
    np.testing.assert_allclose(q.decode(codes), ref_dec, rtol=1e-4, atol=1e-4)
    # score = <q, x_hat> without decoding
    queries = rng.normal(size=(3, d)).astype(np.float32)
    np.testing.assert_allclose(q.score(queries, codes), queries @ ref_dec.T, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(q.score(queries[0], codes), q.score(queries, codes)[0], rtol=1e-6)
    # distortion of the unit vectors: the codebook's expected value, within 25%
    u = x / s[:, None]
    err = np.sum((q.decode(q.encode(u.astype(np.float32))) - u) ** 2, axis=1).mean()
    assert err == pytest.approx(cb.mse_per_vector, rel=0.25)


def test_prod_is_unbiased_in_the_mean(rng):
    d = 128
    q = tq.Quantizer(d, bits=3, kind="prod", seed=5)
    x = rng.normal(size=(2000, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    qv = rng.normal(size=d).astype(np.float32)
    est = q.score(qv, q.encode(x))
    true = x @ qv
    # mean error over 2000 vectors: small next to the per-vector error (unbiased estimator)
    assert abs(np.mean(est - true)) < 4 * np.std(est - true) / np.sqrt(len(x))


def test_codec_bad_input():
    q = tq.Quantizer(64, bits=4)
    x = np.zeros((4, 64), np.float32)
    with pytest.raises(TypeError, match="float32"):
        q.encode(x.astype(np.float64))
    with pytest.raises(tq.Error, match="64 columns"):
        q.encode(np.zeros((4, 63), np.float32))
    with pytest.raises(tq.Error, match="2 dimensions"):
        q.encode(np.zeros(64, np.float32))
    with pytest.raises(tq.Error, match="C-contiguous"):
        q.encode(np.zeros((4, 128), np.float32)[:, ::2])
    with pytest.raises(tq.Error, match="C-contiguous"):
        q.encode(np.asfortranarray(np.ones((4, 64), np.float32)))
    bad = np.ones((4, 64), np.float32)
    bad[2, 5] = np.nan
    with pytest.raises(tq.Error, match="(?i)finite|nan"):
        q.encode(bad)
    with pytest.raises(TypeError, match="uint8"):
        q.decode(np.zeros((4, q.code_bytes), np.int8))
    with pytest.raises(tq.Error, match="columns"):
        q.decode(np.zeros((4, q.code_bytes + 1), np.uint8))
    with pytest.raises(tq.Error, match="(?i)finite|nan"):
        q.score(bad[2], q.encode(x))
    with pytest.raises(tq.Error, match="nope"):
        tq.Quantizer(64, kind="nope")
    with pytest.raises(tq.Error):
        tq.Quantizer(64, bits=9)
    with pytest.raises(tq.Error):
        tq.Rotation(64, "bogus")
    with pytest.raises(tq.Error, match="(?i)finite"):
        tq.Rotation(4).forward(np.array([1, np.inf, 0, 0], np.float32))
    with pytest.raises(TypeError):
        q.encode([[0.0] * 64])  # a list is not an array: no silent conversion
    assert issubclass(tq.Error, ValueError)


def test_encode_reads_arrays_in_place_and_empty_batches():
    q = tq.Quantizer(32, bits=4)
    x = np.ones((3, 32), np.float32)
    x.setflags(write=False)  # read-only input is fine: nothing is written to it
    assert q.encode(x).shape == (3, q.code_bytes)
    assert q.encode(np.zeros((0, 32), np.float32)).shape == (0, q.code_bytes)
    assert "Quantizer" in repr(q) and "Rotation" in repr(q.rotation) and "Codebook" in repr(q.codebook)


def _blas_core_in_child(**env):
    """blas_core() of a fresh interpreter importing the package with env over this one's
    (without the OPENBLAS_CORETYPE that this process's import may have set)."""
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "TQ_NO_REEXEC")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", "import turboquant; print(turboquant.blas_core())"],
                         env=e, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_blas_kernels():
    """Importing the package never leaves OpenBLAS on its SSE3 Prescott fallback on a CPU with
    AVX2 (it sets OPENBLAS_CORETYPE before the library loads, as tq does); a value the user set
    is kept, and TQ_NO_REEXEC=1 leaves OpenBLAS's own choice."""
    with open("/proc/cpuinfo") as f:
        flags = set(next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), []))
    assert _blas_core_in_child(OPENBLAS_CORETYPE="Haswell").lower() == "haswell"
    got = _blas_core_in_child()
    assert got
    if {"avx2", "fma"} <= flags:
        assert got.lower() != "prescott"
    own = _blas_core_in_child(TQ_NO_REEXEC="1")
    assert own and (own.lower() == got.lower() or own.lower() == "prescott")


def test_blas_rule_for_another_library():
    """turboquant._blas_env.choose as the benchmark scripts call it for the OpenBLAS that FAISS's
    wheel bundles (bench/blas_env.py: a library path and a module for the probe to import
    first): in a fresh interpreter that has loaded no OpenBLAS, it sets OPENBLAS_CORETYPE exactly
    where that library falls back to Prescott on an AVX2 CPU, to the package's own choice, and
    keeps a value already set or TQ_NO_REEXEC=1."""
    import os
    import subprocess
    import sys

    path = os.path.join(os.path.dirname(tq.__file__), "_blas_env.py")

    def child(**env):
        e = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "TQ_NO_REEXEC")}
        e.update(env)
        # The file alone, loaded by path as bench/blas_env.py loads it (importing the package
        # would run its own choice first).
        prog = ("import importlib.util, os; s = importlib.util.spec_from_file_location('b', %r); "
                "b = importlib.util.module_from_spec(s); s.loader.exec_module(b); "
                "print(b.choose('libopenblas.so.0', probe_import='ctypes'), os.environ.get('OPENBLAS_CORETYPE'))"
                % path)
        out = subprocess.run([sys.executable, "-c", prog], env=e, capture_output=True, text=True, check=True)
        return out.stdout.split()

    own = _blas_core_in_child(TQ_NO_REEXEC="1").lower()
    picked = _blas_core_in_child()
    got = child()
    if own == "prescott" and picked.lower() != "prescott":
        assert [g.lower() for g in got] == [picked.lower(), picked.lower()]
    else:
        assert got == ["None", "None"]
    assert child(OPENBLAS_CORETYPE="Haswell") == ["None", "Haswell"]
    assert child(TQ_NO_REEXEC="1") == ["None", "None"]