// The dense ops of a training step, one entry per section of the engine's step profile
// (src/engine/model.cpp), each with the matrix products and elementwise passes the GPU
// backend makes for it: the plan's dense time is their sum (evaluate.cpp), and a benchmark
// prints each one beside its measurement.
#include "dense_cost.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>

namespace parity {
namespace {

OpCost& add_op(std::vector<OpCost>& ops, std::string category, std::string op) {
  ops.push_back({std::move(category), std::move(op)});
  return ops.back();
}

// What the implementation moves besides the products (GpuBackend, measured with the step
// profile, docs/perf/training.md). Activations are stored in the product operands' type (`s`
// bytes: bf16 under bf16 math, where the products read and write them as they are; fp32
// otherwise), except the dot interaction's input and output (fp32); gradients are fp32. The
// data's dense features (fp32) are converted for the first product (read 4 bytes, write 2).
struct Bytes {
  explicit Bytes(const ModelSpec& m, DenseMath math)
      : s(dense_operand_bytes(math)),
        narrow(s < 4.0),
        convert(narrow ? 6.0 : 0.0),
        grad_operand(narrow ? 2.0 : 4.0),
        dcn(m.interaction.kind == InteractionKind::dcnv2),
        sg(dcn ? s : 4.0) {}
  double s;
  bool narrow;
  double convert;       // bytes per element of one fp32 -> bf16 conversion
  double grad_operand;  // a gradient the products read: its bf16 copy under narrow math
  bool dcn;
  // With DCNv2 x0 and the cross stack's gradients (dx0 included) are stored like the
  // activations; the dot interaction's input, output and their gradients are fp32.
  double sg;
};

struct MlpLayer {
  bool bottom;
  std::size_t index;
  int in, out;
  bool last;
};

// Whether a layer's input is fp32 (the data's dense features; the dot interaction's output): it
// is converted once, and under a 16-bit math read through a bf16 copy padded to 8 columns.
bool reads_fp32(const MlpLayer& l, const Bytes& by) {
  return l.index == 0 && (l.bottom || !by.dcn);
}

// Whether the GPU backend holds a cross layer's u for its combine (GpuBackend::cross_forward):
// with the checks on, both of the layer's products in one kernel (fused: on this device; bf16
// math, bf16 activations, both depths multiples of 8). The combine then sums u's input terms as it
// reads xl, and the last layer's combine the first top layer's (not the logits') as it writes
// x_next: 3 doubles a row each, in slots of their own.
bool cross_held(const ModelSpec& m, DenseMath math, bool product_checks, bool fused) {
  return product_checks && fused && math == DenseMath::bf16 &&
         m.interaction.kind == InteractionKind::dcnv2 && m.interaction.cross_layers > 0 &&
         m.interaction_input_dim() % 8 == 0 && m.interaction.low_rank % 8 == 0;
}

std::vector<MlpLayer> mlp_layers(const ModelSpec& m, bool bottom) {
  const std::vector<int>& sizes = bottom ? m.bottom_mlp : m.top_mlp;
  int in = bottom ? m.dense_features : m.interaction_output_dim();
  std::vector<MlpLayer> layers;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    layers.push_back({bottom, i, in, sizes[i], i + 1 == sizes.size()});
    in = sizes[i];
  }
  return layers;
}

std::string layer_op(const MlpLayer& l, const char* pass) {
  return fmt::format("{}.{} {}", l.bottom ? "bottom" : "top", l.index, pass);
}

// The step's products into their ops: each by its name (StepProduct::op), at the plan's kernel
// choice's time where `times` has it (the roofline model's work and traffic kept for the floor),
// else at the roofline model's; forward products checked row by row where the checks are on.
class Products {
 public:
  Products(const detail::OpBuilder& ob, bool checked, const ProductTimes* times)
      : ob_(ob), checked_(checked), times_(times) {}

  void product(OpCost& op, const std::string& name, std::int64_t m, std::int64_t n,
               std::int64_t k) const {
    if (times_ != nullptr)
      if (const auto it = times_->find(name); it != times_->end()) {
        ob_.product_at(op, m, n, k, it->second);
        return;
      }
    ob_.product(op, m, n, k);
  }
  // narrow: the output is stored in the math's operand type (all but the logits, fp32).
  // terms_elsewhere, fp32_input: as OpBuilder::checked_product.
  void forward(OpCost& op, const std::string& name, std::int64_t m, std::int64_t n, std::int64_t k,
               bool narrow = true, bool terms_elsewhere = false, bool fp32_input = false) const {
    if (checked_)
      ob_.checked_product(op, m, n, k, narrow, terms_elsewhere, fp32_input);
    else
      product(op, name, m, n, k);
  }

 private:
  const detail::OpBuilder& ob_;
  bool checked_;
  const ProductTimes* times_;
};

// terms_elsewhere: the layer's input terms summed by the op that wrote its input (OpBuilder).
void mlp_forward(std::vector<OpCost>& ops, const detail::OpBuilder& ob, const Products& ps,
                 const Bytes& by, const MlpLayer& l, std::int64_t batch,
                 bool terms_elsewhere = false) {
  OpCost& op = add_op(ops, "mlp", layer_op(l, "forward"));
  // fp32 inputs of a product are converted once: the data's dense features, and the dot
  // interaction's output.
  const bool fp32_input = reads_fp32(l, by);
  ps.forward(op, op.op, batch, l.out, l.in, l.bottom || !l.last, terms_elsewhere, fp32_input);
  if (fp32_input) ob.pass(op, static_cast<double>(batch) * l.in * by.convert);
}

void mlp_backward(std::vector<OpCost>& ops, const detail::OpBuilder& ob, const Products& ps,
                  const Bytes& by, const MlpLayer& l, std::int64_t batch) {
  OpCost& op = add_op(ops, "mlp", layer_op(l, "backward"));
  const double b = static_cast<double>(batch);
  // The first bottom layer needs no input gradient (its input is the data).
  if (l.index > 0 || !l.bottom) ps.product(op, layer_op(l, "data gradient"), batch, l.in, l.out);
  ps.product(op, layer_op(l, "weight gradient"), l.out, l.in, batch);
  // ReLU mask of the gradient (read y and dy, write dz as the products read it) with dbias
  // summed in the same pass; without ReLU, dbias is a pass over dy (and dy is converted).
  const bool relu = l.bottom || !l.last;
  const double dy = l.bottom && l.last ? by.sg : 4.0;  // the last bottom layer's dy is dx0
  ob.pass(op, b * l.out * (relu ? by.s + dy + by.grad_operand : 4.0 + by.convert));
}

}  // namespace

std::vector<OpCost> dense_op_costs(const ModelSpec& m, std::int64_t per_device_batch,
                                   DenseMath math, const DeviceSpec& dev, const Calibration& cal,
                                   bool product_checks, const ProductTimes* times) {
  require_dlrm(m, "the dense cost model");
  detail::OpBuilder ob(math, dev, cal);
  const Products ps(ob, product_checks, times);
  const Bytes by(m, math);
  const double b = static_cast<double>(per_device_batch);
  const std::int64_t n = m.interaction_input_dim();
  const auto bottom = mlp_layers(m, true), top = mlp_layers(m, false);
  std::vector<OpCost> ops;

  // ---- forward ----
  for (const auto& l : bottom) mlp_forward(ops, ob, ps, by, l, per_device_batch);
  const int layers = by.dcn ? m.interaction.cross_layers : 0;
  const std::int64_t r = m.interaction.low_rank;
  const bool held = cross_held(m, math, product_checks, fused_checked_products(dev));
  const bool feeds_top = held && top.size() > 1;  // the first top layer's weights' sums first
  const double f = m.num_tables() + 1;            // dot: the vectors paired
  const double dot_flops = 2.0 * b * f * f * m.bottom_mlp.back();
  const double dot_bytes = b * (f * m.bottom_mlp.back() + m.interaction_output_dim()) * 4.0;
  if (by.dcn) {
    for (int l = 0; l < layers; ++l) {
      OpCost& op = add_op(ops, "interaction", fmt::format("cross.{} forward", l));
      const std::string name = fmt::format("cross.{} forward", l);
      ps.forward(op, name + " u", per_device_batch, r, n, true, held);
      ps.forward(op, name + " z", per_device_batch, n, r);
      // x_next = x0 * z + xl (read 3, write 1, activations).
      ob.pass(op, b * 4.0 * by.s * n);
      if (held) ob.pass(op, b * 24.0);
      if (feeds_top && l + 1 == layers) {
        const double m0 = top.front().out;
        ob.pass(op, 4.0 * m0 * n + 2.0 * detail::pad8(m0 + 2) * detail::pad8(n) + b * 24.0);
      }
    }
  } else {
    ob.batched(add_op(ops, "interaction", "dot forward"), dot_flops, dot_bytes);
  }
  for (const auto& l : top)
    mlp_forward(ops, ob, ps, by, l, per_device_batch, feeds_top && l.index == 0);

  // ---- backward ----
  ob.pass(add_op(ops, "loss", "loss"), b * 12);
  for (auto l = top.rbegin(); l != top.rend(); ++l)
    mlp_backward(ops, ob, ps, by, *l, per_device_batch);
  if (by.dcn) {
    for (int l = layers - 1; l >= 0; --l) {
      OpCost& op = add_op(ops, "interaction", fmt::format("cross.{} backward", l));
      // dz = g * x0 and dx0 += g * z (read g, x0, z and dx0, except in the last layer, which
      // starts dx0; write dz as the products read it, and dx0) with dbias summed in the same
      // pass; dxl = g + du * v reads g (layer 0: dx0) as the product's addend and writes dxl
      // (layer 0: into dx0). du is written by its product as the next ones read it. The
      // gradients g, dx0 and dxl are stored like the activations (s bytes).
      const double dx0_read = l + 1 == layers ? 0.0 : by.s;
      const double s = by.s;
      ob.pass(op, b * n * (s + 2.0 * s + dx0_read + by.grad_operand + s + 2.0 * s));
      const std::string name = fmt::format("cross.{}", l);
      ps.product(op, name + " weight gradient w", n, r, per_device_batch);
      ps.product(op, name + " data gradient u", per_device_batch, r, n);
      ps.product(op, name + " weight gradient v", r, n, per_device_batch);
      ps.product(op, name + " data gradient x", per_device_batch, n, r);
    }
  } else {
    ob.batched(add_op(ops, "interaction", "dot backward"), 2 * dot_flops, 2 * dot_bytes);
  }
  for (auto l = bottom.rbegin(); l != bottom.rend(); ++l)
    mlp_backward(ops, ob, ps, by, *l, per_device_batch);
  return ops;
}

namespace detail {

double fused_row_sums_bytes(double cols) {
  return 16 * std::ceil(cols / 128) + 8;
}

// As GpuBackend's forward_product runs it with the checks on (src/backend/gpu/product_checks.cu).
// Under a 16-bit math: the weights' bf16 copy with its two checksum rows (w read in fp32, the copy
// [pad8(m + 2), pad8(k)] written), then
// - where the product runs in one kernel (bf16 math, fused_checked_products: a bf16 output, k a
//   multiple of 8): the product over 256 x 128 tiles at the calibrated fused_check_gemm_efficiency,
//   its epilogue added (the bf16 output, a double pair a row and column tile, the checksum
//   columns) at fused_check_epilogue_efficiency of the copy rate, a fit that takes in the part
//   of it the kernel hides under its products, and the rows pass reading the input and the pairs;
// - else the product over those m + 2 columns into fp32 without an epilogue, and the rows pass
//   reading the input as the product read it and the m + 2 fp32 columns, and storing d (the
//   output's type).
// Under fp32: the product into d as unchecked, the weights' column sums (w read), and the rows pass
// reading the input and d and writing d. The rows pass runs at the calibrated
// product_check_efficiency of the copy rate.
bool OpBuilder::fused_check(std::int64_t k, bool narrow) const {
  const double in = dense_operand_bytes(math_);
  const double stored = !narrow ? 4.0 : output_bytes_ > 0 ? output_bytes_ : in;
  return math_ == DenseMath::bf16 && stored == 2.0 && k % 8 == 0 && fused_checked_products(dev_);
}

void OpBuilder::checked_product(OpCost& op, std::int64_t n, std::int64_t m, std::int64_t k,
                                bool narrow, bool terms_elsewhere, bool fp32_input) const {
  const double rows = static_cast<double>(n), mm = static_cast<double>(m);
  const double kk = static_cast<double>(k);
  const double in = dense_operand_bytes(math_);
  const double stored = !narrow ? 4.0 : output_bytes_ > 0 ? output_bytes_ : in;
  // The depth the product runs over: an fp32 input's bf16 copy is padded to a multiple of 8.
  const std::int64_t depth = fp32_input && in < 4.0 ? (k + 7) / 8 * 8 : k;
  if (fused_check(depth, narrow)) {
    pass(op, 4.0 * mm * kk + 2.0 * pad8(mm + 2) * pad8(kk));
    Calibration fused = cal_;
    fused.gemm_efficiency_bf16 = fused.gemm_efficiency_fp16 = cal_.fused_check_gemm_efficiency;
    const GemmEstimate e = gemm_time({n, m, depth, math_, 2}, {256, 128, 1, 1}, dev_, fused);
    const double sums = rows * fused_row_sums_bytes(mm);
    op.flops += e.flops;
    op.bytes += e.bytes + sums;
    op.seconds += e.compute_s +
                  memory_pass_time((rows * mm * 2.0 + sums) / cal_.fused_check_epilogue_efficiency,
                                   dev_, cal_);
    // The input's part: read here, or 3 doubles a row that the op that writes or reads the
    // input anyway wrote (costed there) and read here.
    check_pass(op, (terms_elsewhere ? rows * 24.0 : rows * in * kk) + sums);
  } else if (in < 4.0) {
    const double width = pad8(mm + 2);
    pass(op, 4.0 * mm * kk + 2.0 * width * pad8(kk));
    const GemmEstimate e =
        gemm_best({n, static_cast<std::int64_t>(width), k, math_, 4}, dev_, cal_);
    op.flops += e.flops;
    op.bytes += e.bytes;
    op.seconds += e.seconds;
    check_pass(op, rows * (in * kk + 4.0 * (mm + 2) + stored * mm));
  } else {
    product(op, n, m, k);
    pass(op, 4.0 * mm * kk);
    check_pass(op, rows * (in * kk + 2.0 * stored * mm));
  }
}

double DenseMemory::scratch_bytes(double b) const {
  // a16 holds the input's copy; b16 the input's or a weight's, whichever is larger.
  const double input = b * input_copy_bytes_per_example;
  const double padded = std::max(b * padded_bytes_per_example, padded_weight_bytes);
  return kScratchGrowth * (b * dz_bytes_per_example + input + std::max(input, weight_copy_bytes) +
                           padded + b * checked_bytes_per_example + checks_fixed_bytes) +
         b * held_copy_bytes_per_example;
}

DenseMemory dense_memory(const ModelSpec& m, DenseMath math, bool product_checks, bool fused) {
  const Bytes by(m, math);
  DenseMemory w;
  double widest = std::max(m.dense_features, m.interaction_output_dim());
  auto saved_mlp = [&](bool bottom) {
    for (const auto& l : mlp_layers(m, bottom)) {
      w.saved_bytes_per_example += l.out * (!l.bottom && l.last ? 4.0 : by.s);  // logits: fp32
      widest = std::max<double>(widest, l.out);
    }
  };
  saved_mlp(true);
  const double n = m.interaction_input_dim();
  if (by.dcn) {
    w.saved_bytes_per_example += n * by.s;  // x0
    for (int l = 0; l < m.interaction.cross_layers; ++l)
      w.saved_bytes_per_example += (2.0 * n + m.interaction.low_rank) * by.s;  // z, x_next, u
    // The second gradient buffer between cross layers (s bytes).
    w.grad_bytes_per_example += n * by.s;
  } else {
    // x0 and the interaction output (fp32 for the dot kernels).
    w.saved_bytes_per_example += n * 4.0;
    w.saved_bytes_per_example += m.interaction_output_dim() * 4.0;
  }
  saved_mlp(false);
  // dx0 and the interaction output's gradient (sg), the MLP backward's fp32 ping-pong pair, the
  // predicted probabilities.
  w.grad_bytes_per_example += (n + m.interaction_output_dim()) * by.sg + 2 * widest * 4.0 + 4.0;
  // The backend's scratch: dz [B, widest product output] in fp32 (plus bf16), the cross layers'
  // du [B, r] (bf16 under a 16-bit math, else fp32), and under a 16-bit math the bf16 copies of
  // fp32 operands (the dense input [B, F] and the widest weight), each row padded to 8.
  double dz_cols = by.dcn ? n : 0;
  double widest_weight = 0;
  for (const bool bottom : {true, false})
    for (const auto& l : mlp_layers(m, bottom)) {
      dz_cols = std::max<double>(dz_cols, l.out);
      widest_weight = std::max(widest_weight, l.out * pad8(l.in));
    }
  if (by.dcn) widest_weight = std::max(widest_weight, n * pad8(m.interaction.low_rank));
  w.dz_bytes_per_example = dz_cols * (4.0 + (by.narrow ? 2.0 : 0.0));
  if (by.dcn) w.dz_bytes_per_example += m.interaction.low_rank * (by.narrow ? 2.0 : 4.0);
  if (by.narrow) {
    w.input_copy_bytes_per_example = 2.0 * pad8(m.dense_features);
    w.weight_copy_bytes = 2.0 * widest_weight;
    // Products into fp32 whose width n is not a multiple of 8 run over the padded n into a slot of
    // their own and are copied out (GpuBackend's product): the data gradients of the layers whose
    // dx is fp32 (every layer's but the first bottom one's, and under DCNv2 the first top one's,
    // stored like the activations), and the weight gradients of the layers whose input is fp32
    // (the dense features; the dot interaction's output).
    for (const bool bottom : {true, false})
      for (const auto& l : mlp_layers(m, bottom)) {
        if (static_cast<int>(pad8(l.in)) == l.in) continue;
        const bool first = l.index == 0;
        if (!(bottom && first) && !(!bottom && first && by.dcn))
          w.padded_bytes_per_example = std::max(w.padded_bytes_per_example, 4.0 * pad8(l.in));
        if (first && (bottom || !by.dcn))
          w.padded_weight_bytes = std::max(w.padded_weight_bytes, 4.0 * l.out * pad8(l.in));
      }
    if (!by.dcn) w.held_copy_bytes_per_example = 2.0 * pad8(m.interaction_output_dim());
  }
  if (product_checks) {
    // The checks' slots (GpuBackend's forward_product): the sums of the deepest product's
    // columns (4k + 1025 doubles: product_check_sums) and, under a 16-bit math, a bf16 output's
    // bias and the largest of the products' fp32 outputs over m + 2 columns padded to 8 (or, in
    // one kernel, their row sums), beside the weights' copy with its two checksum rows.
    double deepest = 0, widest_out = 0, widest_copy = 0, checked = 0;
    // fp32_input: read through a bf16 copy padded to a multiple of 8 columns (OpBuilder).
    const auto forward = [&](double out, double in, bool bf16_out, bool fp32_input = false) {
      deepest = std::max(deepest, in);
      widest_out = std::max(widest_out, out);
      widest_copy = std::max(widest_copy, pad8(out + 2) * pad8(in));
      // In one kernel its row sums; through the library the fp32 product.
      const double depth = fp32_input ? pad8(in) : in;
      const bool one = fused && math == DenseMath::bf16 && bf16_out && std::fmod(depth, 8.0) == 0;
      checked = std::max(checked, one ? fused_row_sums_bytes(out) : 4 * pad8(out + 2));
    };
    for (const bool bottom : {true, false})
      for (const auto& l : mlp_layers(m, bottom))
        forward(l.out, l.in, l.bottom || !l.last, reads_fp32(l, by));
    if (by.dcn) {
      forward(m.interaction.low_rank, n, true);
      forward(n, m.interaction.low_rank, true);
    }
    w.checks_fixed_bytes = (4 * deepest + 1025) * 8;
    if (by.narrow) {
      w.checks_fixed_bytes += 4 * widest_out;
      w.checked_bytes_per_example = checked;
      w.weight_copy_bytes = std::max(w.weight_copy_bytes, 2 * widest_copy);
    }
    // A cross layer's u held for its combine keeps its row sums, its input's terms (3 doubles a
    // row) and its weights' sums in slots of their own; the first top layer's input terms,
    // summed by the last combine, and its weights' sums too.
    const std::int64_t r = m.interaction.low_rank;
    if (cross_held(m, math, product_checks, fused)) {
      w.checked_bytes_per_example += fused_row_sums_bytes(static_cast<double>(r)) + 24;
      w.checks_fixed_bytes += (4.0 * n + 1025) * 8;
      // The product the last layer feeds: its input's terms and its weights' sums.
      if (m.top_mlp.size() > 1) {
        w.checked_bytes_per_example += 24;
        w.checks_fixed_bytes += (4.0 * n + 1025) * 8;
      }
    }
  }
  return w;
}

}  // namespace detail
}  // namespace parity
