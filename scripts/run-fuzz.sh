#!/usr/bin/env bash
# Runs every libFuzzer target built in BUILD_DIR for SECONDS each and reports, per target:
# duration, executions, coverage (libFuzzer's `cov` = instrumented edges reached, `ft` =
# features), corpus size, and crashes. Exits non-zero when any target crashed.
#
#   scripts/run-fuzz.sh BUILD_DIR SECONDS [target ...]     (default: all fuzz_* in BUILD_DIR)
#   (SECONDS = 0 only writes missing seed folders, or all of them with REGEN_SEEDS=1)
#
# Seeds come from fuzz/corpus/<target>/ (committed; made by the project's own writers: when a
# seed folder is missing or REGEN_SEEDS=1, the target writes them itself, see fuzz/fuzz_util.h).
# The growing working corpus, logs and crash inputs go to BUILD_DIR/fuzz-work/<target>/.
# Environment: FUZZ_RSS_MB (default 2048), FUZZ_TIMEOUT per input (default 25 s),
# FUZZ_JOBS (default 1: targets run one after the other).
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS [target ...]" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
SECONDS_EACH=$2
shift 2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RSS=${FUZZ_RSS_MB:-2048}
TIMEOUT=${FUZZ_TIMEOUT:-25}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$BUILD"/fuzz_*; do
    [ -x "$f" ] && [ -f "$f" ] && targets+=("$(basename "$f")")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "run-fuzz: no fuzz_* executables in $BUILD (configure with -DTQ_BUILD_FUZZ=ON, CC=clang CXX=clang++)" >&2
  exit 2
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
WORK="$BUILD/fuzz-work"
mkdir -p "$WORK"
SUMMARY="$WORK/summary.$$.md"   # per invocation: runs may go on side by side
{
  echo "| target | seconds | execs | execs/s | cov (edges) | ft | corpus | crashes |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$SUMMARY.new"

status=0
for t in "${targets[@]}"; do
  exe="$BUILD/$t"
  [ -x "$exe" ] || { echo "run-fuzz: $exe missing" >&2; status=1; continue; }
  seeds="$ROOT/fuzz/corpus/$t"
  if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds" 2>/dev/null)" ] || [ "${REGEN_SEEDS:-0}" = 1 ]; then
    mkdir -p "$seeds"
    empty=$(mktemp -d)
    TQ_FUZZ_WRITE_SEEDS="$seeds" "$exe" -runs=0 "$empty" >/dev/null 2>&1 || true
    rmdir "$empty" 2>/dev/null || rm -rf "$empty"
    echo "run-fuzz: $t: wrote $(ls "$seeds" | wc -l) seeds into fuzz/corpus/$t"
  fi
  if [ "$SECONDS_EACH" = 0 ]; then continue; fi   # 0 seconds: only (re)write the seeds
  dir="$WORK/$t"
  mkdir -p "$dir/corpus" "$dir/crashes"
  log="$dir/log.txt"
  echo "run-fuzz: $t for ${SECONDS_EACH}s (log: $log)"
  start=$(date +%s)
  "$exe" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -rss_limit_mb="$RSS" \
    -timeout="$TIMEOUT" -artifact_prefix="$dir/crashes/" "$dir/corpus" "$seeds" > "$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  last=$(grep -E '^#[0-9]+' "$log" | grep 'cov:' | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*')
  corp=$(ls "$dir/corpus" | wc -l)
  crashes=$(ls "$dir/crashes" | grep -cE '^(crash|leak|timeout|oom)-' || true)
  slow=$(ls "$dir/crashes" | grep -c '^slow-unit-' || true)
  [ "$slow" != 0 ] && echo "run-fuzz: $t: $slow slow input(s) (> 10 s) kept in $dir/crashes (not failures)"
  row="| $t | $took | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | $corp | $crashes |"
  echo "$row" >> "$SUMMARY.new"
  echo "$row" > "$dir/result.md"   # kept per target (separate runs overwrite summary.md)
  echo "run-fuzz: $t: rc=$rc ${took}s execs=${execs:-?} cov=${cov:-?} ft=${ft:-?} corpus=$corp crashes=$crashes"
  if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
    status=1
    grep -E 'ERROR|SUMMARY|runtime error|fuzz property|Test unit written' "$log" | head -20
  fi
done
mv "$SUMMARY.new" "$SUMMARY"
cp "$SUMMARY" "$WORK/summary.md"
echo
cat "$SUMMARY"
exit $status
