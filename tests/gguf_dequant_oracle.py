#!/usr/bin/env python3
"""The dequantization oracle of the tests: the numpy dequantizers of the `gguf` PyPI package
(gguf.quants, pinned in scripts/requirements-test.txt), which nobody here wrote.

Two modes, both driven by tests/test_gguf_oracle.cpp (GgufOracle.*):

  random --out FILE.gguf [--seed N]
      For every ggml type tq reads (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K), a
      tensor '<TYPE>.blocks' of random blocks (random bytes; the fp16 scale fields replaced by
      random *finite* fp16 bit patterns, subnormals, zeros and negative zero included; float
      types: random finite bit patterns) and '<TYPE>.expected', the F32 values gguf's numpy
      code dequantizes them to. Written with gguf.GGUFWriter.

  model --model FILE.gguf --out FILE.json
      For every tensor of a real GGUF (read with gguf.GGUFReader): its type, element count and
      two checksums of the float32 bit patterns u[i] of gguf's dequantization, in ggml order:
        c1 = sum_i u[i] * (2 i + 1)  mod 2^64      c2 = sum_i u[i] * u[i]  mod 2^64
      (c1: any one differing value changes it, since 2 i + 1 is odd and |delta| < 2^32).
"""
import argparse
import json
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# type -> (values per block, bytes per block, byte offsets of the fp16 scales in a block)
LAYOUT = {
    T.Q4_0: (32, 18, [0]),
    T.Q4_1: (32, 20, [0, 2]),
    T.Q5_0: (32, 22, [0]),
    T.Q5_1: (32, 24, [0, 2]),
    T.Q8_0: (32, 34, [0]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
}
FLOATS = {T.F32: 4, T.F16: 2, T.BF16: 2}


def finite_f16(rng, n):
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    inf_nan = ((h >> 10) & 0x1F) == 0x1F
    h = np.where(inf_nan, h ^ 0x4000, h)  # exponent 31 -> 15: finite
    # A few exact zeros, negative zeros and subnormals.
    k = max(1, n // 64)
    h[rng.integers(0, n, size=k)] = 0x0000
    h[rng.integers(0, n, size=k)] = 0x8000
    h[rng.integers(0, n, size=k)] = rng.integers(1, 0x400, size=k) | (rng.integers(0, 2, size=k) << 15)
    return h.astype(np.uint16)


def random_tensor(qtype, rng, rows, cols):
    """uint8 bytes (rows, row_bytes) of random blocks (or floats) of qtype."""
    if qtype in FLOATS:
        es = FLOATS[qtype]
        if qtype == T.F32:
            u = rng.integers(0, 1 << 32, size=rows * cols, dtype=np.uint64).astype(np.uint32)
            u = np.where(((u >> 23) & 0xFF) == 0xFF, u ^ 0x40000000, u)
            return u.view(np.uint8).reshape(rows, cols * es)
        if qtype == T.F16:
            return finite_f16(rng, rows * cols).view(np.uint8).reshape(rows, cols * es)
        u = rng.integers(0, 1 << 16, size=rows * cols, dtype=np.uint32)
        u = np.where(((u >> 7) & 0xFF) == 0xFF, u ^ 0x4000, u).astype(np.uint16)
        return u.view(np.uint8).reshape(rows, cols * es)
    bs, bb, scale_at = LAYOUT[qtype]
    assert cols % bs == 0
    nb = rows * cols // bs
    b = rng.integers(0, 256, size=(nb, bb), dtype=np.uint16).astype(np.uint8)
    for off in scale_at:
        b[:, off:off + 2] = finite_f16(rng, nb).view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, cols // bs * bb)


def cmd_random(args):
    rng = np.random.default_rng(args.seed)
    w = gguf.GGUFWriter(args.out, "tq-oracle")
    n_types = 0
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]:
        bs = LAYOUT[qtype][0] if qtype in LAYOUT else 1
        cols = 256 * 3 if bs == 256 else 32 * 25  # 3 super-blocks / 25 blocks a row
        rows = 96
        raw = random_tensor(qtype, rng, rows, cols)
        expected = dequantize(raw, qtype).astype(np.float32, copy=False)
        assert expected.shape == (rows, cols), (qtype.name, expected.shape)
        w.add_tensor(qtype.name + ".blocks", raw, raw_shape=raw.shape, raw_dtype=qtype)
        w.add_tensor(qtype.name + ".expected", np.ascontiguousarray(expected))
        n_types += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"gguf_dequant_oracle: {n_types} types written to {args.out}")


def checksums(u, i0):
    """c1, c2 (see the module docstring) of the uint32 bit patterns u at indices i0...; uint64
    arithmetic wraps mod 2^64."""
    u = u.astype(np.uint64)
    idx = np.arange(i0, i0 + u.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        c1 = int(np.sum(u * (np.uint64(2) * idx + np.uint64(1)), dtype=np.uint64))
        c2 = int(np.sum(u * u, dtype=np.uint64))
    return c1, c2


def cmd_model(args):
    r = gguf.GGUFReader(args.model)
    out = {}
    for t in r.tensors:
        data = t.data
        rows = data.shape[0] if data.ndim > 1 else 1
        data2 = data.reshape(rows, -1)
        c1 = c2 = 0
        i0 = 0
        step = max(1, (1 << 22) // max(1, data2.shape[1]))
        for r0 in range(0, rows, step):
            f = dequantize(np.ascontiguousarray(data2[r0:r0 + step]), t.tensor_type)
            u = np.ascontiguousarray(f, dtype=np.float32).reshape(-1).view(np.uint32)
            a, b = checksums(u, i0)
            c1 = (c1 + a) % (1 << 64)
            c2 = (c2 + b) % (1 << 64)
            i0 += u.size
        out[t.name] = {"type": t.tensor_type.name, "n": i0, "c1": str(c1), "c2": str(c2)}
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"gguf_dequant_oracle: {len(out)} tensors of {args.model} checksummed into {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("random")
    a.add_argument("--out", required=True)
    a.add_argument("--seed", type=int, default=31)
    b = sub.add_parser("model")
    b.add_argument("--model", required=True)
    b.add_argument("--out", required=True)
    args = p.parse_args()
    return cmd_random(args) if args.mode == "random" else cmd_model(args)


if __name__ == "__main__":
    sys.exit(main())
