#!/usr/bin/env bash
# The HSTU attention kernels alone, in one call: the tensor-core kernels against the CPU reference
# (test_backend_gpu SequenceGpu.*Attention*), then attention_bench (forward and forward+backward
# TFLOP/s, full-length and jagged, n = 512 ... 8,192) and PyTorch's padded formulation on the same
# shapes (bench/hstu_attention_torch.py: eager, torch.compile, and a bf16 matmul's rate measured in
# the same run, the device's bf16 ceiling). Full logs under $OUT (default out/hstu-attention).
#
#   PARITY_PREBUILT=build-prebuilt bench/hstu-attention.sh
#
# Environment: LENGTHS (default 512,1024,2048,4096,8192), TOKENS (65536), HEADS (4), DIM (128),
# REPS (10), SKIP_TESTS=1, SKIP_TORCH=1.
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" hstu-attention
find_binaries attention_bench test_backend_gpu
lengths=${LENGTHS:-512,1024,2048,4096,8192}
shape=(--tokens "${TOKENS:-65536}" --heads "${HEADS:-4}" --dim "${DIM:-128}" --reps "${REPS:-10}")
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  say "test_backend_gpu SequenceGpu.*Attention*"
  run_bin timeout 300 "$BIN/test_backend_gpu" --gtest_filter='SequenceGpu.*Attention*' \
    >"$OUT/tests.log" 2>&1
  say "tests rc=$?"
  grep -h "FAILED\|Failure\|OK \]" "$OUT/tests.log" | head -20
fi
say "attention_bench"
run_bin timeout 300 "$BIN/attention_bench" --lengths "$lengths" "${shape[@]}" \
  --results "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log"
if [[ "${SKIP_TORCH:-0}" != 1 ]]; then
  say "PyTorch (padded, bf16)"
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/hstu_attention_torch.py --lengths "$lengths" \
    "${shape[@]}" 2>&1 | tee "$OUT/torch.log"
fi
