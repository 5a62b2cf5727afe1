#!/usr/bin/env bash
# Installs a built tree into a temporary prefix and builds a downstream consumer against it
# with find_package(turboquant) (shared and static) and with pkg-config. Used by ctest.
# Usage: scripts/check-install.sh BUILD_DIR
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(cd "$1" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
for mode in OFF ON; do
  cmake -S "$SRC/tests/install_consumer" -B "$TMP/c-$mode" -DCMAKE_PREFIX_PATH="$TMP/prefix" \
    -DTQ_CONSUMER_STATIC=$mode -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$TMP/c-$mode" >/dev/null
  out=$(LD_LIBRARY_PATH="$TMP/prefix/lib" "$TMP/c-$mode/consumer")
  [ "$out" = "66" ] || { echo "check-install: consumer (static=$mode) printed '$out', expected 66"; exit 1; }
  out=$(LD_LIBRARY_PATH="$TMP/prefix/lib" "$TMP/c-$mode/consumer_c")
  [ "$out" = "66" ] || { echo "check-install: C consumer (static=$mode) printed '$out', expected 66"; exit 1; }
done
flags=$(PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig" pkg-config --cflags --libs turboquant)
g++ -std=c++20 "$SRC/tests/install_consumer/main.cpp" $flags -o "$TMP/pc" -fopenmp
out=$(LD_LIBRARY_PATH="$TMP/prefix/lib" "$TMP/pc")
[ "$out" = "66" ] || { echo "check-install: pkg-config consumer printed '$out'"; exit 1; }
# The C API from C99 with pkg-config, linked to the shared library.
[ -f "$TMP/prefix/include/tq/tq.h" ] || { echo "check-install: tq/tq.h not installed"; exit 1; }
gcc -std=c99 -pedantic -Werror "$SRC/tests/install_consumer/main_c.c" $flags -o "$TMP/pc_c"
out=$(LD_LIBRARY_PATH="$TMP/prefix/lib" "$TMP/pc_c")
[ "$out" = "66" ] || { echo "check-install: pkg-config C consumer printed '$out'"; exit 1; }
echo "check-install: find_package (shared, static) and pkg-config consumers, C++ and C99 (tq/tq.h), OK"
