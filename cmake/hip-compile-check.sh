#!/usr/bin/env bash
# Compiles every GPU backend source (src/backend/gpu/*.cu and *.cpp) as HIP for AMD GPUs with hipcc, the way
# CI checks that the one kernel source builds for both vendors. No AMD GPU is needed.
# Usage: cmake/hip-compile-check.sh OUT_DIR "gfx90a;gfx940"   (run from the repository root)
# Exit 77 (ctest: skipped) where hipcc is not installed.
set -euo pipefail
out=${1:-build/hip-check}
archs=${2:-gfx90a;gfx940}
hipcc=$(command -v hipcc || true)
if [ -z "$hipcc" ]; then
  echo "gpu.hip_compile: SKIPPED: hipcc is not installed (Debian: apt-get install hipcc libamdhip64-dev)"
  exit 77
fi
mkdir -p "$out"
flags=(-x hip -std=c++20 -O3 -Wall -Wextra -Werror -DPARITY_GPU_HIP=1 -Iinclude -Isrc)
IFS=';' read -ra arch_list <<< "$archs"
for a in "${arch_list[@]}"; do flags+=("--offload-arch=$a"); done
srcs=(src/backend/gpu/*.cu src/backend/gpu/*.cpp)
ver=$( { "$hipcc" --version 2>/dev/null || true; } | grep -m1 -i "HIP version" || true)
echo "gpu.hip_compile: hipcc (${ver:-version unknown}), targets ${archs}"
# One job per core: the CI machine has 2.
jobs=$(nproc 2>/dev/null || echo 2)
fail=0
pids=()
for s in "${srcs[@]}"; do
  n=$(basename "$s")
  ( start=$(date +%s)
    if "$hipcc" "${flags[@]}" -c "$s" -o "$out/$n.o" 2> "$out/$n.log"; then
      echo "  ok   $s ($(( $(date +%s) - start )) s)"
    else
      echo "  FAIL $s"; cat "$out/$n.log"; exit 1
    fi ) &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [ $fail -ne 0 ]; then echo "gpu.hip_compile: FAILED"; exit 1; fi
echo "gpu.hip_compile: all ${#srcs[@]} sources compile for ${archs}"
