#!/usr/bin/env bash
# Installs what parity needs to build and test, from Debian packages (Debian 12 or
# later, Ubuntu 24.04). Run as root or with sudo available. Does nothing when
# everything is already installed.
set -euo pipefail

# clang, libclang-rt-14-dev (libFuzzer and the sanitizer runtimes) and libomp-dev (clang's OpenMP)
# build the fuzz targets of ctest fuzz.readers (tests/fuzz/run.sh); python3 runs
# bench/fleet_report.py in ctest cli.fleet_report; Open MPI is the collectives' CPU engine (src/dist,
# ctest dist.mpi_*).
packages=(build-essential cmake ninja-build pkg-config
          libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          libgtest-dev libgmock-dev clang-format
          clang libclang-rt-14-dev libomp-dev python3
          libopenmpi-dev openmpi-bin)
# Optional: hipcc compiles the GPU kernels for AMD (ctest gpu.hip_compile; Debian 12 ships ROCm
# 5.2's hipcc and HIP runtime headers). Installed where the distribution has them; the check is
# skipped, with a message, where it does not.
optional=(hipcc libamdhip64-dev)

# Tests on captured output, not `cmd | grep -q`: under pipefail, grep -q leaving early kills the
# writer with SIGPIPE and the pipeline reads as false even when the line was found.
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == *"install ok installed"* ]]; }
has_candidate() { [[ $(apt-cache policy "$1" 2>/dev/null) =~ Candidate:\ [0-9] ]]; }

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
missing_optional=()
for p in "${optional[@]}"; do
  installed "$p" || missing_optional+=("$p")
done
if [ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: run as root (missing: ${missing[*]})" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#missing_optional[@]} -gt 0 ]; then
  available=()
  for p in "${missing_optional[@]}"; do
    has_candidate "$p" && available+=("$p")
  done
  if [ ${#available[@]} -gt 0 ]; then
    echo "setup.sh: installing optional ${available[*]}"
    $sudo apt-get install -y -qq --no-install-recommends "${available[@]}" >/dev/null ||
      echo "setup.sh: optional ${available[*]} did not install; the HIP compile check will be skipped" >&2
  fi
fi
