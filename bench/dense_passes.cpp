// dense_bench's elementwise passes: each memory-bound pass of the dense step alone, through its
// op header (linear.h, cross.h, convert.h, column_sum.h, loss.h, dense_optimizer.h) at the
// model's shapes and the engine's storage types, against the measured copy bandwidth. The
// bytes are what the pass must move: each input read once, each output written once, counted
// from the shapes (scratch partial sums not counted).
#include <fmt/format.h>

#include <set>
#include <tuple>

#include "backend/gpu/column_sum.h"
#include "backend/gpu/convert.h"
#include "backend/gpu/cross.h"
#include "backend/gpu/dense_optimizer.h"
#include "backend/gpu/linear.h"
#include "backend/gpu/loss.h"
#include "backend/gpu/numerics.h"
#include "dense_bench.h"

namespace parity::bench {
namespace {

double size_of(DType t) {
  return static_cast<double>(dtype_size(t));
}

// Rows of a bf16 operand copy start 16-byte aligned, as the backend makes them (gpu_backend.cpp).
std::int64_t copy_ld(std::int64_t cols) {
  return (cols + 7) / 8 * 8;
}

class Passes {
 public:
  Passes(GpuBackend& be, const Options& o, const StepShapes& sh, const ModelSpec& m,
         const Ceilings& c)
      : be_(be), o_(o), sh_(sh), m_(m), c_(c), bf_(o.math == DenseMath::bf16) {}

  std::vector<PassResult> run() {
    const std::size_t nb = sh_.bottom.size();
    for (std::size_t k = sh_.top.size(); k-- > 0;)
      if (sh_.top[k].act == Activation::relu) relu_backward(sh_.top[k], false);
    for (std::size_t k = nb; k-- > 0;) relu_backward(sh_.bottom[k], k + 1 == nb);
    for (const Layer& l : sh_.top)
      if (l.act == Activation::none) column_sum(l);
    if (sh_.dcn) {
      cross_combine();
      std::set<std::pair<bool, bool>> seen;
      for (int l = sh_.cross_layers; l-- > 0;) {
        const bool overwrite = l + 1 == sh_.cross_layers, add_g = l == 0;
        if (seen.insert({overwrite, add_g}).second) cross_gradients(l, overwrite, add_g);
      }
    }
    if (bf_) conversions();
    bce();
    optimizer();
    return results_;
  }

 private:
  void measure(const std::string& name, InputSets& in, double bytes,
               const std::function<void(int)>& run) {
    in.allocate(be_, &s_);
    PassResult r;
    r.name = name;
    r.bytes = bytes;
    r.sets = in.count();
    r.ms = time_on_stream(s_, std::max(o_.warmup, r.sets), o_.reps,
                          [&](int call) { run(call % r.sets); });
    const double tbps = r.bytes / (r.ms * 1e-3) / 1e12;
    fmt::print("{:<48} {:9.3f} {:9.1f} {:6.2f} {:6.1f}%\n", r.name, r.ms, r.bytes / 1e6, tbps,
               100.0 * tbps * 1e12 / c_.copy_bytes_per_s);
    std::fflush(stdout);
    results_.push_back(r);
  }

  gpu::Bf16* bf16_ptr(const InputSets& in, int set, int t) const {
    return t >= 0 ? static_cast<gpu::Bf16*>(in.view(set, t).data) : nullptr;
  }

  // dz = dy ⊙ (y > 0) (and its bf16 copy under bf16 math, the only one written then), dbias
  // summed in the same pass. The last bottom layer's y and dy are x0[:, :D] and dx0[:, :D].
  void relu_backward(const Layer& l, bool into_x0) {
    const std::int64_t b = sh_.batch;
    InputSets in;
    const TensorSpec y = into_x0 ? columns(sh_.x0, b, l.out, sh_.n) : matrix(sh_.act, b, l.out);
    const TensorSpec dy =
        into_x0 ? columns(sh_.grad, b, l.out, sh_.n) : matrix(DType::f32, b, l.out);
    const int iy = in.add(y), idy = in.add(dy), idz = in.add(matrix(DType::f32, b, l.out));
    const int idz16 = bf_ ? in.add(matrix(DType::bf16, b, l.out)) : -1;
    const int idb = in.add(matrix(DType::f32, 1, l.out));
    const Buffer scratch(be_, static_cast<std::size_t>(gpu::gradient_sums_scratch_bytes(b, l.out)));
    const double bytes =
        static_cast<double>(b) * l.out * (size_of(y.dtype) + size_of(dy.dtype) + (bf_ ? 2 : 4)) +
        4.0 * l.out;
    measure(fmt::format("relu_backward {} [{}, {}]", l.name, b, l.out), in, bytes, [&](int k) {
      gpu::relu_backward(s_.get(), in.view(k, iy), in.view(k, idy), in.ptr(k, idz),
                         bf16_ptr(in, k, idz16), in.ptr(k, idb), scratch.get(), bf_);
    });
  }

  // The bias gradient of a layer without ReLU (the logit layer): a sum over its fp32 dz.
  void column_sum(const Layer& l) {
    const std::int64_t b = sh_.batch;
    InputSets in;
    const int im = in.add(matrix(DType::f32, b, l.out)),
              iout = in.add(matrix(DType::f32, 1, l.out));
    const Buffer scratch(be_, static_cast<std::size_t>(gpu::column_sum_scratch_bytes(b, l.out)));
    measure(
        fmt::format("column_sum {} [{}, {}]", l.name, b, l.out), in, 4.0 * (b + 1) * l.out,
        [&](int k) { gpu::column_sum(s_.get(), in.f32(k, im), in.ptr(k, iout), scratch.get()); });
  }

  // x_next = x0 ⊙ z + xl (read 3, write 1).
  void cross_combine() {
    const std::int64_t b = sh_.batch;
    InputSets in;
    const int x0 = in.add(matrix(sh_.x0, b, sh_.n)), z = in.add(matrix(sh_.act, b, sh_.n));
    const int xl = in.add(matrix(sh_.act, b, sh_.n)), next = in.add(matrix(sh_.act, b, sh_.n));
    measure(fmt::format("cross_combine [{}, {}]", b, sh_.n), in,
            4.0 * size_of(sh_.act) * static_cast<double>(b) * sh_.n, [&](int k) {
              gpu::cross_combine(s_.get(), in.view(k, x0), in.view(k, z), in.view(k, xl),
                                 in.view(k, next));
            });
  }

  // dz = g ⊙ x0 (bf16 copy only under bf16 math), dx0 (+)= g ⊙ z (+ g in layer 0), dbias.
  void cross_gradients(int layer, bool overwrite, bool add_g) {
    const std::int64_t b = sh_.batch;
    const int n = sh_.n;
    InputSets in;
    const int g = in.add(matrix(sh_.grad, b, n)), x0 = in.add(matrix(sh_.x0, b, n));
    const int z = in.add(matrix(sh_.act, b, n)), dz = in.add(matrix(DType::f32, b, n));
    const int dz16 = bf_ ? in.add(matrix(DType::bf16, b, n)) : -1;
    const int dx0 = in.add(matrix(sh_.grad, b, n)), db = in.add(matrix(DType::f32, 1, n));
    const Buffer scratch(be_, static_cast<std::size_t>(gpu::gradient_sums_scratch_bytes(b, n)));
    const double sg = size_of(sh_.grad);
    const double per =
        sg + size_of(sh_.x0) + size_of(sh_.act) + (overwrite ? 0 : sg) + sg + (bf_ ? 2 : 4);
    const char* what =
        overwrite ? (add_g ? "dx0 = gz + g" : "dx0 = gz") : (add_g ? "dx0 += gz + g" : "dx0 += gz");
    measure(fmt::format("cross_gradients cross.{} ({}) [{}, {}]", layer, what, b, n), in,
            static_cast<double>(b) * n * per + 4.0 * n, [&](int k) {
              gpu::cross_gradients(s_.get(), in.view(k, g), in.view(k, x0), in.view(k, z),
                                   in.ptr(k, dz), bf16_ptr(in, k, dz16), in.view(k, dx0),
                                   in.ptr(k, db), scratch.get(), {overwrite, add_g, bf_});
            });
  }

  void convert(const std::string& what, std::int64_t rows, std::int64_t cols) {
    InputSets in;
    const int src = in.add(matrix(DType::f32, rows, cols));
    const int dst = in.add(columns(DType::bf16, rows, cols, copy_ld(cols)));
    measure(fmt::format("convert {} [{}, {}] fp32 -> bf16", what, rows, cols), in,
            6.0 * static_cast<double>(rows) * cols,
            [&](int k) { gpu::convert(s_.get(), in.view(k, src), in.view(k, dst)); });
  }

  // The bf16 copies the products make of fp32 operands: the data's dense features, the dot
  // interaction's output, the largest weight.
  void conversions() {
    convert("dense features", sh_.batch, sh_.features);
    if (!sh_.dcn) convert("interaction output", sh_.batch, sh_.inter_out);
    const Layer* widest = &sh_.bottom.front();
    for (const auto* mlp : {&sh_.bottom, &sh_.top})
      for (const Layer& l : *mlp)
        if (static_cast<std::int64_t>(l.in) * l.out >
            static_cast<std::int64_t>(widest->in) * widest->out)
          widest = &l;
    convert(fmt::format("{} weight", widest->name), widest->out, widest->in);
  }

  // loss and dlogits from logits and labels (read 8 bytes, write 4 per example).
  void bce() {
    const std::int64_t b = sh_.batch;
    InputSets in;
    const int logits = in.add(matrix(DType::f32, b, 1));
    TensorSpec labels = matrix(DType::f32, b, 1);
    labels.lo = 0.0f;
    const int y = in.add(labels), dl = in.add(matrix(DType::f32, b, 1));
    const int out = in.add(matrix(DType::f32, 1, 1));
    const Buffer scratch(be_, static_cast<std::size_t>(gpu::bce_scratch_bytes()));
    measure(fmt::format("bce_with_logits [{}]", b), in, 12.0 * b + 4.0, [&](int k) {
      gpu::bce_with_logits(s_.get(), in.ptr(k, logits), in.ptr(k, y), b, in.ptr(k, dl),
                           in.ptr(k, out), scratch.get());
    });
  }

  // One step of the model's dense optimizer over every dense parameter: read the parameters,
  // gradients and state, write the parameters and state.
  void optimizer() {
    const std::int64_t n = m_.dense_parameters();
    const OptimizerSpec& spec = m_.dense_optimizer;  // as src/engine/layout.cpp resolves it
    const OptimizerParams p{.kind = spec.kind,
                            .lr = static_cast<float>(spec.lr),
                            .eps = static_cast<float>(spec.eps),
                            .beta1 = static_cast<float>(spec.beta1),
                            .beta2 = static_cast<float>(spec.beta2),
                            .weight_decay = static_cast<float>(spec.weight_decay)};
    const int k = optimizer_state_per_element(p.kind);
    InputSets in;
    TensorSpec w = matrix(DType::f32, 1, n), state = matrix(DType::f32, std::max(k, 1), n);
    w.lo = -0.05f;
    w.hi = 0.05f;
    state.lo = 0.001f;  // Adagrad's sum of squares and Adam's moments: positive
    state.hi = 0.1f;
    const int iw = in.add(w), ig = in.add(matrix(DType::f32, 1, n)), is = in.add(state);
    measure(fmt::format("dense_optimizer_step {} [{}]", optimizer_name(p.kind), n), in,
            4.0 * static_cast<double>(n) * (3 + 2 * k), [&](int set) {
              gpu::dense_optimizer_step(s_.get(), in.ptr(set, iw), in.ptr(set, ig),
                                        k > 0 ? in.ptr(set, is) : nullptr, n, p, 1 + calls_++);
            });
  }

  GpuBackend& be_;
  const Options& o_;
  const StepShapes& sh_;
  const ModelSpec& m_;
  const Ceilings& c_;
  const bool bf_;
  gpu::Stream s_;
  std::int64_t calls_ = 0;
  std::vector<PassResult> results_;
};

}  // namespace

std::vector<PassResult> measure_passes(GpuBackend& be, const Options& o, const StepShapes& sh,
                                       const ModelSpec& m, const Ceilings& c) {
  fmt::print("\n{:<48} {:>9} {:>9} {:>6} {:>7}\n", "elementwise pass alone", "ms", "MB", "TB/s",
             "% copy");
  return Passes(be, o, sh, m, c).run();
}

}  // namespace parity::bench
