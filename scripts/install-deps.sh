#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the fetch scripts need.
# Idempotent: packages already present at an acceptable version are left alone.
# Versions are those of Debian 12 (bookworm); the build checks the minimums it relies on
# (Highway 1.0.3 API, Eigen 3.4, CLI11 2.x, nlohmann-json 3.11).
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config ninja-build
  libhwy-dev            # Google Highway 1.0.3: SIMD with runtime dispatch
  libeigen3-dev         # 3.4.0: QR for the Haar rotation
  libopenblas-dev       # 0.3.21: GEMM for model prefill
  libcli11-dev          # 2.1.2: CLI parsing
  nlohmann-json3-dev    # 3.11.2: JSON output
  libxxhash-dev         # 0.8.1: checksums in file formats
  libpcre2-dev          # 10.42: Unicode-aware pre-tokenizer regexes
  libgtest-dev googletest libbenchmark-dev
  clang libclang-rt-14-dev   # libFuzzer and sanitizers
  libomp-dev            # clang's OpenMP runtime (fuzz and TSan builds)
  python3 python3-pip python3-venv unzip ca-certificates ccache
  libcpp-httplib-dev    # 0.11: HTTP server of `tq serve`
  chromium              # headless browser for the chat page test of `tq serve`
  python3-dev           # Python headers: the turboquant extension (pip install ., make wheel)
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
