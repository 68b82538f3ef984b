// The dense part of a step as the plan evaluation needs it beside dense_op_costs (plan.h):
// the activation and gradient memory per example.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "parity/plan.h"

namespace parity::detail {

// Adds products and memory-bound passes to an op: the cost functions of perf.h summed into it.
class OpBuilder {
 public:
  // output_bytes: per element of a product's output (0: the operands', GemmShape).
  OpBuilder(DenseMath math, const DeviceSpec& dev, const Calibration& cal, int output_bytes = 0)
      : math_(math), dev_(dev), cal_(cal), output_bytes_(output_bytes) {}

  void product(OpCost& op, std::int64_t m, std::int64_t n, std::int64_t k) const {
    const GemmEstimate e = gemm_best({m, n, k, math_, output_bytes_}, dev_, cal_);
    op.flops += e.flops;
    op.bytes += e.bytes;
    op.seconds += e.seconds;
  }
  // A product at a time known otherwise (a kernel catalog's prediction for the configuration that
  // runs it), its work and traffic the roofline model's.
  void product_at(OpCost& op, std::int64_t m, std::int64_t n, std::int64_t k,
                  double seconds) const {
    const GemmEstimate e = gemm_best({m, n, k, math_, output_bytes_}, dev_, cal_);
    op.flops += e.flops;
    op.bytes += e.bytes;
    op.seconds += seconds;
  }
  void pass(OpCost& op, double bytes) const {
    op.bytes += bytes;
    op.seconds += memory_pass_time(bytes, dev_, cal_);
  }
  // The checked products' row pass: a pass over `bytes` at the calibrated fraction of the copy
  // rate.
  void check_pass(OpCost& op, double bytes) const {
    op.bytes += bytes;
    op.seconds += memory_pass_time(bytes / cal_.product_check_efficiency, dev_, cal_);
  }
  // A forward product d [n, m] = a [n, k] · wᵀ (+ bias) checked row by row, as the GPU backend
  // runs it with the checks on (Backend::set_product_checks), in place of product(op, n, m, k).
  // narrow: d is stored in the math's operand type (or the builder's output bytes), not fp32.
  // terms_elsewhere: the input's part of the check is summed by another op that reads the input
  // anyway (a cross layer's combine, for its u), which writes 3 doubles a row for the rows pass.
  // fp32_input: the input is fp32, read through a bf16 copy padded with zeros to a multiple of 8
  // columns under a 16-bit math, so the product runs over that depth.
  void checked_product(OpCost& op, std::int64_t n, std::int64_t m, std::int64_t k,
                       bool narrow = true, bool terms_elsewhere = false,
                       bool fp32_input = false) const;
  // Whether that product runs in one kernel (GpuBackend's forward_product): bf16 math, a stored
  // output of 2 bytes, k a multiple of 8, on a device with fused_checked_products.
  bool fused_check(std::int64_t k, bool narrow = true) const;
  // A batched product bound by the larger of its compute and its memory time (the dot
  // interaction's kernels).
  void batched(OpCost& op, double flops, double bytes) const {
    const double peak = dev_.dense_flops(math_) * cal_.gemm_efficiency(math_);
    op.flops += flops;
    op.bytes += bytes;
    op.seconds += std::max(flops / peak, memory_pass_time(bytes, dev_, cal_));
  }

 private:
  DenseMath math_;
  const DeviceSpec& dev_;
  const Calibration& cal_;
  int output_bytes_;
};

// A width or depth as the GPU backend pads its 16-bit copies and padded products (to 8).
inline double pad8(double c) {
  return std::ceil(c / 8) * 8;
}

struct DenseMemory {
  double saved_bytes_per_example = 0;  // activations kept for the backward
  double grad_bytes_per_example = 0;   // the engine's gradient buffers
  // The GPU backend's own scratch (src/backend/gpu/gpu_backend.cpp, scratch.h) for b examples:
  // the widest product gradient dz in fp32 (and its bf16 copy under a 16-bit math), the cross
  // layers' du, and under a 16-bit math the two slots of bf16 copies of fp32 operands (the dense
  // input, or the widest weight), and the slot of fp32 products over a width padded to 8 (an
  // fp32 gradient whose width is not a multiple of 8, copied out). Each slot grows to
  // kScratchGrowth times its largest request. Besides the slots, the bf16 copy of the dot
  // interaction's output that the backend holds for a step (Backend::hold_constant). With the
  // product checks on, their slots too.
  double scratch_bytes(double b) const;
  double dz_bytes_per_example = 0;          // dz, dz16, du
  double input_copy_bytes_per_example = 0;  // the dense input in bf16 (0 under fp32 math)
  double weight_copy_bytes = 0;             // the widest weight in bf16 (0 under fp32 math)
  double padded_bytes_per_example = 0;      // a data gradient over its padded width, fp32
  double padded_weight_bytes = 0;           // a weight gradient over its padded width, fp32
  double held_copy_bytes_per_example = 0;   // the dot interaction output's bf16 copy
  // With the product checks on (Plan::product_checks): the widest forward product in fp32 over
  // its width plus two checksum columns (16-bit math), and the slots that do not grow with the
  // batch (the column sums, a bf16 output's bias).
  double checked_bytes_per_example = 0;
  double checks_fixed_bytes = 0;
};
// What the GPU backend's scratch slots allocate beyond a request (a quarter more,
// src/backend/gpu/scratch.cpp), so that a slowly growing shape does not reallocate every call.
inline constexpr double kScratchGrowth = 1.25;
// The bytes an example's row sums take in a checked bf16 product of `cols` outputs run in one
// kernel (src/backend/gpu/checked_product.cu): a double pair (sum, squares) a column tile of 128
// and the two checksum columns in fp32.
double fused_row_sums_bytes(double cols);
// fused: checked bf16 products run in one kernel on the device (fused_checked_products).
DenseMemory dense_memory(const ModelSpec& m, DenseMath math, bool product_checks = false,
                         bool fused = false);

}  // namespace parity::detail
