#!/usr/bin/env bash
# Makes the prebuilt folder that the GPU-machine scripts (bench/*.sh, scripts/gpu-tests.sh) use
# through PARITY_PREBUILT, on a build machine without a GPU: a CUDA build (Release, cpu;cuda) of
# the targets into build-gpu, stripped copies of them, the host libraries they load that a GPU
# machine may lack (copied with cp -L into lib/; libstdc++ and libgcc_s into compat/, used only
# where the machine's own are older), the checkout's path (source-dir) and what was built
# (manifest.txt).
#
#   scripts/make-prebuilt.sh                  # every binary the GPU scripts run
#   scripts/make-prebuilt.sh dense_bench      # only what bench/dense-ops.sh needs (SKIP_TESTS=1)
#
# Then, on the GPU machine, with the folder beside the checkout's files (it is git-ignored, so
# copy or carry it explicitly):  PARITY_PREBUILT=build-prebuilt bench/dense-ops.sh
# Each binary holds every GPU kernel (about 9 MB stripped): make only those the call needs.
# Environment: PARITY_PREBUILT (the folder, default build-prebuilt), BUILD_DIR (default
# build-gpu), JOBS (parallel build jobs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${PARITY_PREBUILT:-build-prebuilt}
build=${BUILD_DIR:-build-gpu}
targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  targets=(parity test_backend_gpu test_engine test_train embedding_bench dense_bench)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DPARITY_BACKENDS=cpu;cuda" >/dev/null
cmake --build "$build" --target "${targets[@]}" -j "${JOBS:-2}"

rm -rf "$dir"
mkdir -p "$dir/lib" "$dir/compat"
for t in "${targets[@]}"; do
  strip -o "$dir/$t" "$build/$t"
  # Libraries resolved on this machine, except the C runtime and the CUDA libraries (the GPU
  # machine's own match its driver): copied once each, following links.
  ldd "$build/$t" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case $name in
      linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libcu* | libnv*) ;;
      libstdc++.so* | libgcc_s.so*) [ -e "$dir/compat/$name" ] || cp -L "$path" "$dir/compat/$name" ;;
      *) [ -e "$dir/lib/$name" ] || cp -L "$path" "$dir/lib/$name" ;;
    esac
  done
done
echo "$PWD" >"$dir/source-dir"
{
  echo "targets: ${targets[*]}"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | grep -m1 release)"
  echo "libraries: $(cd "$dir" && echo lib/* compat/*)"
} >"$dir/manifest.txt"
cat "$dir/manifest.txt"
echo "$dir: $(du -sh "$dir" | cut -f1)"
