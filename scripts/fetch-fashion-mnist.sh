#!/usr/bin/env bash
# Fashion-MNIST (784-d uint8 images, L2) for the search benchmarks, from Debian's
# `dataset-fashion-mnist` package: `apt-get download` (no install, no root needed beyond apt's
# cache), extract, verify sha256 of what it ships, convert the IDX image files to .bvecs
# (int32 d = 784, then 784 uint8 per image), which `tq index ...` reads directly.
# Output (git-ignored): data/fashion-mnist/{train,test}.bvecs  (60,000 and 10,000 vectors).
# Idempotent: does nothing when the outputs exist and verify. Not run by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${FASHION_MNIST_DIR:-data/fashion-mnist}
mkdir -p "$OUT"

TRAIN_SHA=b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7  # train-images-idx3-ubyte.gz
TEST_SHA=cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa   # t10k-images-idx3-ubyte.gz

if [ -s "$OUT/train.bvecs" ] && [ -s "$OUT/test.bvecs" ] && [ -f "$OUT/SHA256SUMS" ] &&
   (cd "$OUT" && sha256sum --quiet -c SHA256SUMS); then
  echo "fetch-fashion-mnist: $OUT is up to date"
  exit 0
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && apt-get download dataset-fashion-mnist >/dev/null 2>&1) || {
  echo "fetch-fashion-mnist: 'apt-get download dataset-fashion-mnist' failed (run apt-get update?)" >&2
  exit 1
}
dpkg-deb -x "$TMP"/dataset-fashion-mnist_*.deb "$TMP/x"
SRC="$TMP/x/usr/share/datasets/fashion-mnist"
echo "$TRAIN_SHA  $SRC/train-images-idx3-ubyte.gz" | sha256sum --quiet -c -
echo "$TEST_SHA  $SRC/t10k-images-idx3-ubyte.gz" | sha256sum --quiet -c -

# IDX3: big-endian int32 magic 0x00000803, count, rows, cols, then count*rows*cols uint8.
python3 - "$SRC/train-images-idx3-ubyte.gz" "$OUT/train.bvecs" "$SRC/t10k-images-idx3-ubyte.gz" "$OUT/test.bvecs" <<'PY'
import gzip, os, struct, sys
args = sys.argv[1:]
for src, dst in zip(args[0::2], args[1::2]):
    with gzip.open(src, "rb") as f:
        data = f.read()
    magic, n, rows, cols = struct.unpack(">iiii", data[:16])
    if magic != 0x803:
        sys.exit(f"{src}: bad IDX3 magic {magic:#x}")
    d = rows * cols
    if len(data) != 16 + n * d:
        sys.exit(f"{src}: {len(data)} bytes, expected {16 + n * d}")
    head = struct.pack("<i", d)
    tmp = dst + ".tmp"
    with open(tmp, "wb") as out:
        for i in range(n):
            out.write(head)
            out.write(data[16 + i * d:16 + (i + 1) * d])
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, dst)
    print(f"fetch-fashion-mnist: {dst}: {n} vectors, d={d}")
PY
# The conversion is deterministic: pin its output too.
cat > "$OUT/SHA256SUMS" <<SUMS
8b78e89833781a1174fffbe3bdefa2adbd08ae32c334c4825d318ef660ddfe5e  train.bvecs
0fdd6b64a18ba738d3258ca4b84ca3845fda761324b6507fb49c8da222fb505c  test.bvecs
SUMS
(cd "$OUT" && sha256sum --quiet -c SHA256SUMS) || { echo "fetch-fashion-mnist: converted files do not match the pinned sha256" >&2; exit 1; }
