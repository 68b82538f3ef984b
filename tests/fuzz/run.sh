#!/usr/bin/env bash
# ctest fuzz.readers: builds the fuzz targets of tests/fuzz (clang, libFuzzer, ASan + UBSan;
# cmake/ParityFuzz.cmake) in a build directory of their own, then runs each for a bounded time on
# a copy of its seed corpus (tests/fuzz/corpus/<target>, left unchanged). Fails on any finding: a
# crash, a sanitizer report, a leak, an input slower than the timeout, memory over the limit, or
# an exception other than parity::Error; the input that caused it is left in
# BUILD_DIR/run/<target>/ and its output printed. Skipped (exit 77) where clang or libFuzzer is
# not installed. docs/fuzzing.md says how to run the targets longer.
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET [TARGET...]]   (from the repository root)
set -euo pipefail
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET [TARGET...]]}
seconds=${2:-10}
shift $(($# < 2 ? $# : 2))
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$build"
build=$(cd "$build" && pwd)

skip() {
  echo "fuzz.readers: SKIPPED: $*"
  exit 77
}
cxx=$(command -v clang++ || true)
[ -n "$cxx" ] || skip "clang is not installed (Debian: apt-get install clang libclang-rt-14-dev libomp-dev)"
# Probe what the build needs from the toolchain, with messages better than a failed configure's.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/probe.cpp"
"$cxx" -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" 2>"$probe/log" ||
  skip "$cxx cannot link libFuzzer with ASan and UBSan (Debian: apt-get install libclang-rt-14-dev): $(head -c 300 "$probe/log")"
echo 'int main() { int n = 0;
#pragma omp parallel reduction(+ : n)
  n += 1;
  return n > 0 ? 0 : 1; }' >"$probe/omp.cpp"
"$cxx" -fopenmp "$probe/omp.cpp" -o "$probe/omp" 2>"$probe/log" ||
  skip "$cxx cannot build OpenMP code (Debian: apt-get install libomp-dev): $(head -c 300 "$probe/log")"

jobs=${PARITY_FUZZ_BUILD_JOBS:-2}
echo "fuzz.readers: building the fuzz targets in $build ($cxx, -j$jobs)"
# -O1 with line tables only: sanitized builds of the nlohmann::json readers take minutes at -O2 -g,
# and a report needs no more than file and line. Assertions stay on (no -DNDEBUG).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Fuzz \
  -DCMAKE_CXX_FLAGS_FUZZ="-O1 -gline-tables-only" -DPARITY_BACKENDS=cpu -DPARITY_BUILD_TESTS=OFF \
  -DPARITY_FUZZ=ON \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target fuzz_targets -j "$jobs" >"$build/build.log" 2>&1 ||
  { tail -n 60 "$build/build.log"; exit 1; }

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd "$root/tests/fuzz" && ls fuzz_*.cpp | sed 's/\.cpp$//')
fi
# Leaks are findings; UB stops the process (also compiled in: -fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1
failed=()
for t in "${targets[@]}"; do
  seeds="$root/tests/fuzz/corpus/$t"
  [ -d "$seeds" ] || { echo "fuzz.readers: $t has no seed corpus ($seeds)"; failed+=("$t"); continue; }
  work="$build/run/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/tmp"
  cp "$seeds"/* "$work/corpus/"
  # -timeout: one input slower than this is a hang; -rss_limit_mb also bounds each allocation.
  if (cd "$work" && TMPDIR="$work/tmp" "$build/$t" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/" corpus \
        >"$work/log" 2>&1); then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
    cov=$(grep -Eo 'DONE +cov: [0-9]+ ft: [0-9]+' "$work/log" | tail -n 1 | tr -s ' ' || true)
    echo "fuzz.readers: $t: no finding in ${seconds}s, ${runs:-?} inputs (${cov#DONE })"
  else
    echo "fuzz.readers: $t: FINDING (input and log in $work)"
    tail -n 80 "$work/log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.readers: findings in ${failed[*]}"
  exit 1
fi
echo "fuzz.readers: ${#targets[@]} targets, ${seconds}s each, no finding"
