# shellcheck shell=bash
# The plumbing every GPU-machine script shares (bench/*.sh, scripts/gpu-tests.sh). Sourced, not
# run:
#   . "$(dirname "$0")/common.sh" NAME          # from bench/; from scripts/: ../bench/common.sh
# Sourcing it moves to the repository root, makes $OUT (default out/NAME) and exports
# NCCL_NVLS_ENABLE=0 (NVLink multicast stays off on shared GPU machines). It defines:
#   say MSG...          a timestamped progress line
#   steady LOG          the steady examples/s of a `parity train` log, as a number
#   device_facts        the GPU (nvidia-smi) and the host (cores, memory, OS) into $OUT/device.txt
#   device_after        the GPU's clocks, temperature and power after the work, appended to it
#   find_binaries T...  sets BIN to a folder holding the targets T: the prebuilt folder named by
#                       PARITY_PREBUILT where its binaries start here, else a cmake build
#                       (Release, cpu;cuda) of the targets into build-gpu
#   binaries_and_tests T...  find_binaries for T plus the test binaries in TESTS, then the GPU
#                       tests (scripts/gpu-tests.sh, logs in $OUT/tests); with SKIP_TESTS set,
#                       T alone and no tests
#   capped MODEL CAP    a copy of configs/models/MODEL.yaml (or of MODEL, a .yaml path) in
#                       $SCRATCH with every table's rows capped at CAP (prints its path)
#   run_bin CMD...      runs CMD with the library path parity's binaries need: the prebuilt
#                       folder's lib/ (and compat/ where needed), the CUDA toolkit's lib64 and lib,
#                       and cuBLAS from PyTorch's wheel where the toolkit has none
#
# The prebuilt folder (scripts/make-prebuilt.sh makes it on a build machine without a GPU; its
# conventional name is build-prebuilt) holds the stripped binaries, lib/ with the build
# machine's libfmt.so.9, libyaml-cpp.so.0.7 and libgomp.so.1, compat/ with its libstdc++.so.6
# (used only where the binaries do not start with this machine's), and source-dir: the checkout
# it was built in, which the test binaries read configs/ from (linked to this checkout where that
# path does not exist here).

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-$PWD/out/${1:-bench}}
mkdir -p "$OUT"
# Scratch space for large intermediate files (datasets, id dumps, shapes), on the machine's
# temporary file system and removed when the script ends, unless SCRATCH names a folder to keep.
if [ -z "${SCRATCH:-}" ]; then
  SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/parity-bench.XXXXXX")
  trap 'rm -rf "$SCRATCH"' EXIT
fi
mkdir -p "$SCRATCH"
export NCCL_NVLS_ENABLE=0

say() { echo "== $(date +%H:%M:%S) $*"; }

# The steady examples/s of a `parity train` log ("(52.9k after the first 2 steps)"), as a number.
steady() {
  grep -m1 -E '^done' "$1" | grep -oE '\([0-9.]+[kM]? after' | grep -oE '[0-9.]+[kM]?' |
    awk '{v = $1 + 0; if ($1 ~ /k$/) v *= 1e3; if ($1 ~ /M$/) v *= 1e6; printf "%.0f", v}'
}

device_facts() {
  say "device"
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
      --format=csv 2>&1
    echo "host: $(nproc) cores, $(free -g 2>/dev/null | awk '/Mem:/ {print $2}') GiB," \
      "$(grep -m1 '^PRETTY_NAME=' /etc/os-release 2>/dev/null | cut -d= -f2 | tr -d '"')"
  } 2>&1 | tee "$OUT/device.txt"
}

device_after() {
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader \
    >>"$OUT/device.txt" 2>&1
}

# cuBLASLt (the dense products) from the CUDA toolkit, or else from PyTorch's wheel.
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas; print(list(nvidia.cublas.__path__)[0] + "/lib")' 2>/dev/null || true)
PARITY_LIB_PATH=""  # the prebuilt folder's libraries, with a trailing ':' when set
run_bin() {
  LD_LIBRARY_PATH="${PARITY_LIB_PATH}/usr/local/cuda/lib64:/usr/local/cuda/lib${CUBLAS_DIR:+:$CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
}

# A copy of model $1 with every rows: value above $2 set to $2 (the zoo's YAML writes rows as
# "rows: N" in flow mappings).
capped() {  # MODEL CAP: prints the copy's path (in $SCRATCH); MODEL is a zoo name or a .yaml path
  local src=configs/models/$1.yaml name=$1
  if [[ $1 == *.yaml ]]; then
    src=$1
    name=$(basename "$1" .yaml)
  fi
  awk -v cap="$2" '{
    line = $0; out = ""
    while (match(line, /rows: *[0-9]+/)) {
      n = substr(line, RSTART, RLENGTH); sub(/rows: */, "", n)
      out = out substr(line, 1, RSTART - 1) "rows: " (n + 0 > cap + 0 ? cap : n)
      line = substr(line, RSTART + RLENGTH)
    }
    print out line
  }' "$src" | sed "s/^name: .*/name: $name/" >"$SCRATCH/$name-capped.yaml"
  echo "$SCRATCH/$name-capped.yaml"
}

# Whether every TARGET's libraries resolve (ldd reports missing libraries and missing symbol
# versions, such as a libstdc++ older than the build machine's, as "not found").
libraries_resolve() {  # DIR TARGET...
  local dir=$1 t out
  shift
  for t in "$@"; do
    if ! out=$(run_bin ldd "$dir/$t" 2>&1) || [[ $out == *"not found"* ]]; then
      printf '%s:\n%s\n' "$dir/$t" "$out" >>"$OUT/build.log"
      return 1
    fi
  done
}

use_prebuilt() {  # DIR TARGET...
  local dir=$1 t libs
  shift
  for t in "$@"; do
    if [ ! -x "$dir/$t" ]; then
      echo "$dir/$t: not there (scripts/make-prebuilt.sh $t adds it)" >>"$OUT/build.log"
      return 1
    fi
  done
  for libs in "$dir/lib:" "$dir/lib:$dir/compat:"; do
    PARITY_LIB_PATH=$libs
    libraries_resolve "$dir" "$@" && return 0
  done
  PARITY_LIB_PATH=""
  return 1
}

# The test binaries read configs/ from the checkout they were built in (PARITY_SOURCE_DIR).
link_source_dir() {  # DIR
  local src
  src=$(cat "$1/source-dir" 2>/dev/null) || return 0
  if [ -n "$src" ] && [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then
    if mkdir -p "$(dirname "$src")" 2>/dev/null && ln -s "$PWD" "$src" 2>/dev/null; then
      say "linked $src (where the prebuilt binaries were built) to this checkout"
    else
      say "warning: cannot link $src to this checkout; tests that read configs/ from it will fail"
    fi
  fi
}

# shellcheck disable=SC2034  # BIN is for the scripts that source this file
find_binaries() {  # TARGET...
  BIN=""
  PARITY_LIB_PATH=""
  if [ -n "${PARITY_PREBUILT:-}" ]; then
    local dir=$PARITY_PREBUILT
    [[ $dir == /* ]] || dir=$PWD/$dir
    if use_prebuilt "$dir" "$@"; then
      BIN=$dir
      say "binaries: prebuilt in $PARITY_PREBUILT${PARITY_LIB_PATH:+ (libraries: $PARITY_LIB_PATH)}"
      link_source_dir "$dir"
      return 0
    fi
    say "the prebuilt binaries in $PARITY_PREBUILT do not start here ($OUT/build.log says why): building"
  fi
  say "build (cmake, Release, cpu;cuda) into build-gpu: $*"
  local start=$SECONDS
  if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "-DPARITY_BACKENDS=cpu;cuda" &&
    cmake --build build-gpu --target "$@"; } >>"$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    say "build failed (log: $OUT/build.log)"
    exit 1
  fi
  say "built in $((SECONDS - start)) s"
  BIN=$PWD/build-gpu
}

binaries_and_tests() {  # TARGET...
  local targets=("$@") tests
  read -ra tests <<<"${TESTS:-test_backend_gpu test_engine test_train}"
  [ -n "${SKIP_TESTS:-}" ] || targets+=("${tests[@]}")
  find_binaries "${targets[@]}"
  [ -z "${SKIP_TESTS:-}" ] || return 0
  say "GPU tests: ${tests[*]}"
  OUT=$OUT/tests TESTS="${tests[*]}" TEST_TIMEOUT=${TEST_TIMEOUT:-300} scripts/gpu-tests.sh
  say "GPU tests rc=$?"
}
