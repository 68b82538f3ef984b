#!/usr/bin/env bash
# The tree's C++, CUDA and HIP sources are formatted as .clang-format says: `clang-format
# --dry-run -Werror` over every tracked source file (ctest style.clang_format; scripts/setup.sh
# installs Debian's clang-format). Formatting differs between clang-format releases, so the check
# runs with the release the tree is formatted with and is skipped (exit 77) with another.
# Usage: cmake/format-check.sh   (from the repository root)
set -euo pipefail
want=14
fmt=$(command -v "clang-format-$want" || command -v clang-format || true)
if [ -z "$fmt" ]; then
  echo "style.clang_format: SKIPPED: clang-format is not installed (Debian: apt-get install clang-format)"
  exit 77
fi
version=$("$fmt" --version | sed -nE 's/.*version ([0-9]+)\..*/\1/p')
if [ "$version" != "$want" ]; then
  echo "style.clang_format: SKIPPED: $fmt is release $version; the tree is formatted with release $want"
  exit 77
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "style.clang_format: SKIPPED: not a git checkout (the check reads the tracked files)"
  exit 77
fi
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
"$fmt" --dry-run -Werror "${files[@]}"
echo "style.clang_format: ${#files[@]} files formatted as .clang-format says ($fmt, release $version)"
