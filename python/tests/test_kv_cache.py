"""turboquant.KVCache: attention on an f16 cache equals a NumPy softmax attention over the
f16-rounded keys and values; the fused tq kernels equal the library's reference
(reference=True, every row dequantized); caches are built from labels; bad input raises."""
import numpy as np
import pytest

import turboquant as tq


def numpy_attention(q, k, v, scale):
    """q: (n_q, H, D) at the last n_q positions of k, v: (T, KVH, D); causal, GQA."""
    nq, H, D = q.shape
    T, KVH, _ = k.shape
    out = np.zeros_like(q, dtype=np.float64)
    for i in range(nq):
        pos = T - nq + i
        for h in range(H):
            g = h // (H // KVH)
            w = (k[: pos + 1, g].astype(np.float64) @ q[i, h]) * scale
            w = np.exp(w - w.max())
            out[i, h] = (w / w.sum()) @ v[: pos + 1, g]
    return out


def test_f16_cache_equals_numpy(rng):
    L, KVH, H, D, T = 2, 2, 6, 64, 50
    c = tq.KVCache("f16", n_layers=L, n_kv_heads=KVH, head_dim=D, max_tokens=64)
    k = rng.normal(size=(T, KVH, D)).astype(np.float32)
    v = rng.normal(size=(T, KVH, D)).astype(np.float32)
    c.append(1, k[:30], v[:30])
    c.append(1, k[30:], v[30:])
    assert c.n_tokens(1) == T and c.n_tokens(0) == 0 and c.bytes_used > 0
    q = rng.normal(size=(3, H, D)).astype(np.float32)
    out = c.attention(1, q)
    assert out.shape == q.shape and out.dtype == np.float32
    k16 = k.astype(np.float16).astype(np.float32)
    v16 = v.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(out, numpy_attention(q, k16, v16, 1 / np.sqrt(D)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c.attention(1, q, scale=0.05), numpy_attention(q, k16, v16, 0.05),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("label", ["tq4/tq3 plain", "tq4", "q8_0/q4_0", "tq3/tq3 w16"])
def test_tq_cache_fused_equals_reference(label, rng):
    KVH, H, D, T = 2, 4, 64, 200
    c = tq.KVCache(label, n_layers=1, n_kv_heads=KVH, head_dim=D, max_tokens=256, rope_base=10000.0, rope_dim=D)
    k = rng.normal(size=(T, KVH, D)).astype(np.float32)
    v = rng.normal(size=(T, KVH, D)).astype(np.float32)
    c.append(0, k, v)
    q = rng.normal(size=(1, H, D)).astype(np.float32)
    fused = c.attention(0, q, threads=1)
    ref = c.attention(0, q, reference=True)
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-4)
    # quantized, so not the f16 answer, but near it
    exact = numpy_attention(q, k, v, 1 / np.sqrt(D))
    assert np.linalg.norm(fused - exact) / np.linalg.norm(exact) < 0.5
    assert c.bytes_per_token < 2 * KVH * D * 2  # below f16


def test_neox_cache_equals_normal_cache_on_interleaved_rows(rng):
    """rope_neox=True on rows in the model's order (pairs i, i + D/2) answers exactly as a normal
    cache on the same rows interleaved (pairs 2i, 2i + 1), queries likewise."""
    KVH, H, D, T = 2, 4, 64, 100
    k = rng.normal(size=(T, KVH, D)).astype(np.float32)
    v = rng.normal(size=(T, KVH, D)).astype(np.float32)
    q = rng.normal(size=(1, H, D)).astype(np.float32)

    def interleave(x):
        return np.ascontiguousarray(np.stack([x[..., :D // 2], x[..., D // 2:]], axis=-1).reshape(x.shape))

    neox = tq.KVCache("tq4/tq3", n_layers=1, n_kv_heads=KVH, head_dim=D, max_tokens=128, rope_base=1e4,
                      rope_dim=D, rope_neox=True)
    normal = tq.KVCache("tq4/tq3", n_layers=1, n_kv_heads=KVH, head_dim=D, max_tokens=128, rope_base=1e4,
                        rope_dim=D)
    neox.append(0, k, v)
    normal.append(0, interleave(k), v)
    np.testing.assert_array_equal(neox.attention(0, q, threads=1), normal.attention(0, interleave(q), threads=1))


def test_kv_cache_bad_input(rng):
    with pytest.raises(tq.Error, match="RoPE"):
        tq.KVCache("tq4/tq4", n_layers=1, n_kv_heads=2, head_dim=32, max_tokens=8)
    c = tq.KVCache("tq4/tq4 plain", n_layers=1, n_kv_heads=2, head_dim=32, max_tokens=8)
    k = np.ones((4, 2, 32), np.float32)
    with pytest.raises(TypeError, match="float32"):
        c.append(0, k.astype(np.float64), k)
    with pytest.raises(tq.Error, match="shape"):
        c.append(0, np.ones((4, 3, 32), np.float32), np.ones((4, 3, 32), np.float32))
    with pytest.raises(tq.Error, match="C-contiguous"):
        c.append(0, np.ones((4, 2, 64), np.float32)[:, :, ::2], k)
    bad = k.copy()
    bad[0, 0, 0] = np.inf
    with pytest.raises(tq.Error, match="NaN or Inf"):
        c.append(0, bad, k)
    with pytest.raises(tq.Error, match="layer"):
        c.append(1, k, k)
    c.append(0, k, k)
    with pytest.raises(tq.Error):
        c.append(0, np.ones((5, 2, 32), np.float32), np.ones((5, 2, 32), np.float32))  # past max_tokens
    with pytest.raises(tq.Error, match="(?i)head"):
        c.attention(0, np.ones((1, 3, 32), np.float32))  # 3 query heads over 2 kv heads
    with pytest.raises(tq.Error, match="tq99"):
        tq.KVCache("tq99 plain")
    with pytest.raises(tq.Error):
        tq.KVCache("f16", n_layers=0)
    assert "KVCache" in repr(c) and "tq4" in repr(c)
    assert "tq4" in tq.kv_types() and "f16" in tq.kv_types()
