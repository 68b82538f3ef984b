#!/usr/bin/env bash
# Configures and builds parity into build/ (Release). Extra arguments go to cmake's
# configure step, e.g. scripts/build.sh -DPARITY_BACKENDS=cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build
