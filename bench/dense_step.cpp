// dense_bench's step: every dense op of a training step as Model::Impl::forward and backward
// (src/engine/model.cpp) call them, with the storage types, views and cross-backward modes the
// engine passes, each timed alone over rotated input sets (dense_bench.h).
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "dense_bench.h"

namespace parity::bench {
namespace {

TensorSpec weight(std::int64_t rows, std::int64_t cols) {
  TensorSpec t = matrix(DType::f32, rows, cols);
  t.lo = -0.05f;
  t.hi = 0.05f;
  return t;
}

class Step {
 public:
  Step(Backend& be, const Options& o, const StepShapes& sh, const std::vector<OpCost>& predicted,
       const Ceilings& c, const gpu::Stream* fill)
      : be_(be), o_(o), sh_(sh), predicted_(predicted), c_(c), fill_(fill) {}

  std::vector<OpResult> run() {
    const StepShapes& s = sh_;
    const std::int64_t b = s.batch;
    const std::size_t nb = s.bottom.size(), nt = s.top.size();
    // ---- forward ----
    for (std::size_t i = 0; i < nb; ++i) {
      const Layer& l = s.bottom[i];
      // The data's dense features (fp32, not held); the last layer writes x0[:, :D].
      const TensorSpec x = i == 0 ? matrix(DType::f32, b, l.in) : matrix(s.act, b, l.in, true);
      const TensorSpec y = i + 1 == nb ? columns(s.x0, b, l.out, s.n) : matrix(s.act, b, l.out);
      linear_forward(l, x, y);
    }
    if (s.dcn) {
      for (int l = 0; l < s.cross_layers; ++l) cross_forward(l);
    } else {
      dot_forward();
    }
    for (std::size_t i = 0; i < nt; ++i) {
      const Layer& l = s.top[i];
      const TensorSpec x = i == 0 ? top_input() : matrix(s.act, b, l.in, true);
      const TensorSpec y = i + 1 == nt ? matrix(DType::f32, b, l.out) : matrix(s.act, b, l.out);
      linear_forward(l, x, y);
    }
    // ---- loss, backward ----
    loss();
    for (std::size_t k = nt; k-- > 0;) {
      const Layer& l = s.top[k];
      const TensorSpec x = k == 0 ? top_input() : matrix(s.act, b, l.in, true);
      const TensorSpec y = matrix(k + 1 == nt ? DType::f32 : s.act, b, l.out, true);
      // dy comes fp32 from the loss or the layer above; layer 0's dx is the interaction's
      // output gradient.
      const TensorSpec dx = k == 0 ? matrix(s.grad, b, l.in) : matrix(DType::f32, b, l.in);
      linear_backward(l, x, y, matrix(DType::f32, b, l.out), dx);
    }
    if (s.dcn) {
      for (int l = s.cross_layers; l-- > 0;) cross_backward(l);
    } else {
      dot_backward();
    }
    for (std::size_t k = nb; k-- > 0;) {
      const Layer& l = s.bottom[k];
      const bool last = k + 1 == nb;
      const TensorSpec x = k == 0 ? matrix(DType::f32, b, l.in) : matrix(s.act, b, l.in, true);
      // The last layer's output is x0[:, :D], its gradient dx0[:, :D]; the first has no dx.
      const TensorSpec y =
          last ? columns(s.x0, b, l.out, s.n, true) : matrix(s.act, b, l.out, true);
      const TensorSpec dy = last ? columns(s.grad, b, l.out, s.n) : matrix(DType::f32, b, l.out);
      linear_backward(l, x, y, dy,
                      k == 0 ? std::nullopt : std::optional(matrix(DType::f32, b, l.in)));
    }
    return results_;
  }

 private:
  // The top MLP's input: the dot interaction's output (fp32), or the last cross layer's.
  TensorSpec top_input() const {
    return sh_.dcn ? matrix(sh_.act, sh_.batch, sh_.n, true)
                   : matrix(DType::f32, sh_.batch, sh_.inter_out, true);
  }

  void measure(const std::string& name, InputSets& in, Copies copies,
               const std::function<void(int)>& run) {
    in.allocate(be_, fill_);
    OpResult r;
    r.name = name;
    r.sets = in.count();
    r.ms = time_op(be_, o_, in, copies, run);
    const auto cost = std::find_if(predicted_.begin(), predicted_.end(),
                                   [&](const OpCost& p) { return p.op == name; });
    if (cost != predicted_.end()) {
      r.category = cost->category;
      r.flops = cost->flops;
      r.bytes = cost->bytes;
      r.predicted_ms = cost->seconds * 1e3;
    }
    print_op(r, c_);
    results_.push_back(r);
  }

  // y = act(x · wᵀ + bias).
  void linear_forward(const Layer& l, const TensorSpec& x, const TensorSpec& y) {
    InputSets in;
    const int ix = in.add(x), iw = in.add(weight(l.out, l.in)), ib = in.add(weight(1, l.out));
    const int iy = in.add(y);
    measure(l.name + " forward", in, Copies::each_call, [&](int k) {
      be_.linear_forward(in.view(k, ix), in.f32(k, iw), in.ptr(k, ib), l.act, in.view(k, iy));
    });
  }

  // dw, dbias and (where given) dx from dy through the saved output y.
  void linear_backward(const Layer& l, const TensorSpec& x, const TensorSpec& y,
                       const TensorSpec& dy, const std::optional<TensorSpec>& dx) {
    InputSets in;
    const int ix = in.add(x), iw = in.add(weight(l.out, l.in)), iy = in.add(y);
    const int idy = in.add(dy), idx = dx ? in.add(*dx) : -1;
    const int idw = in.add(matrix(DType::f32, l.out, l.in)),
              idb = in.add(matrix(DType::f32, 1, l.out));
    measure(l.name + " backward", in, Copies::before, [&](int k) {
      be_.linear_backward(in.view(k, ix), in.f32(k, iw), in.view(k, iy), in.view(k, idy), l.act,
                          idx >= 0 ? in.view(k, idx) : AMat(), in.f32(k, idw), in.ptr(k, idb));
    });
  }

  void cross_forward(int layer) {
    const StepShapes& s = sh_;
    InputSets in;
    const int x0 = in.add(matrix(s.x0, s.batch, s.n, true));
    const int xl = layer == 0 ? x0 : in.add(matrix(s.act, s.batch, s.n, true));
    const int v = in.add(weight(s.rank, s.n)), w = in.add(weight(s.n, s.rank));
    const int bias = in.add(weight(1, s.n));
    const int u = in.add(matrix(s.act, s.batch, s.rank)), z = in.add(matrix(s.act, s.batch, s.n));
    const int next = in.add(matrix(s.act, s.batch, s.n));
    measure(fmt::format("cross.{} forward", layer), in, Copies::each_call, [&](int k) {
      be_.cross_forward(in.view(k, x0), in.view(k, xl), in.f32(k, v), in.f32(k, w), in.ptr(k, bias),
                        in.view(k, u), in.view(k, z), in.view(k, next));
    });
  }

  // The last layer starts dx0; layer 0 (whose xl is x0) adds its dxl into dx0.
  void cross_backward(int layer) {
    const StepShapes& s = sh_;
    Backend::CrossBackwardMode mode;
    mode.first_into_dx0 = layer + 1 == s.cross_layers;
    mode.xl_is_x0 = layer == 0;
    InputSets in;
    const int x0 = in.add(matrix(s.x0, s.batch, s.n, true));
    const int xl = layer == 0 ? x0 : in.add(matrix(s.act, s.batch, s.n, true));
    const int v = in.add(weight(s.rank, s.n)), w = in.add(weight(s.n, s.rank));
    const int u = in.add(matrix(s.act, s.batch, s.rank, true));
    const int z = in.add(matrix(s.act, s.batch, s.n));
    const int g = in.add(matrix(s.grad, s.batch, s.n)), dx0 = in.add(matrix(s.grad, s.batch, s.n));
    const int dxl = mode.xl_is_x0 ? -1 : in.add(matrix(s.grad, s.batch, s.n));
    const int dv = in.add(matrix(DType::f32, s.rank, s.n));
    const int dw = in.add(matrix(DType::f32, s.n, s.rank));
    const int db = in.add(matrix(DType::f32, 1, s.n));
    measure(fmt::format("cross.{} backward", layer), in, Copies::before, [&](int k) {
      be_.cross_backward(in.view(k, x0), in.view(k, xl), in.f32(k, v), in.f32(k, w), in.view(k, u),
                         in.view(k, z), in.view(k, g), in.view(k, dx0),
                         dxl >= 0 ? in.view(k, dxl) : AMat(), in.f32(k, dv), in.f32(k, dw),
                         in.ptr(k, db), Mat(), mode);
    });
  }

  // x0 = [bottom output | embeddings], fp32 for the dot kernels.
  void dot_forward() {
    const StepShapes& s = sh_;
    InputSets in;
    const int x0 = in.add(matrix(DType::f32, s.batch, s.n, true));
    const int out = in.add(matrix(DType::f32, s.batch, s.inter_out));
    measure("dot forward", in, Copies::each_call, [&](int k) {
      const Mat x = in.f32(k, x0);
      be_.dot_interaction_forward(x.cols_slice(0, s.d), x.cols_slice(s.d, s.n - s.d), s.tables,
                                  in.f32(k, out));
    });
  }

  void dot_backward() {
    const StepShapes& s = sh_;
    InputSets in;
    const int x0 = in.add(matrix(DType::f32, s.batch, s.n, true));
    const int dout = in.add(matrix(DType::f32, s.batch, s.inter_out));
    const int dx0 = in.add(matrix(DType::f32, s.batch, s.n));
    measure("dot backward", in, Copies::before, [&](int k) {
      const Mat x = in.f32(k, x0), dx = in.f32(k, dx0);
      be_.dot_interaction_backward(x.cols_slice(0, s.d), x.cols_slice(s.d, s.n - s.d), s.tables,
                                   in.f32(k, dout), dx.cols_slice(0, s.d),
                                   dx.cols_slice(s.d, s.n - s.d));
    });
  }

  void loss() {
    InputSets in;
    const int logits = in.add(matrix(DType::f32, sh_.batch, 1));
    TensorSpec labels = matrix(DType::f32, sh_.batch, 1);
    labels.lo = 0.0f;  // soft labels in [0, 1): the kernel's work does not depend on them
    const int y = in.add(labels);
    const int dlogits = in.add(matrix(DType::f32, sh_.batch, 1));
    const int out = in.add(matrix(DType::f32, 1, 1));
    measure("loss", in, Copies::before, [&](int k) {
      be_.bce_with_logits(in.ptr(k, logits), in.ptr(k, y), sh_.batch, in.ptr(k, dlogits),
                          in.ptr(k, out));
    });
  }

  Backend& be_;
  const Options& o_;
  const StepShapes& sh_;
  const std::vector<OpCost>& predicted_;
  const Ceilings& c_;
  const gpu::Stream* fill_;
  std::vector<OpResult> results_;
};

}  // namespace

double roofline_ms(const OpResult& r, const Ceilings& c) {
  return 1e3 * std::max(r.flops / c.product_flops_per_s, r.bytes / c.copy_bytes_per_s);
}

void print_op_header() {
  fmt::print("{:<20} {:>9} {:>8} {:>9} {:>8} {:>6} {:>9} {:>7} {:>9} {:>7}\n", "op", "ms", "GFLOP",
             "MB", "TFLOP/s", "TB/s", "roof ms", "x roof", "pred ms", "x pred");
}

void print_op(const OpResult& r, const Ceilings& c) {
  const double s = r.ms * 1e-3;
  const double roof = roofline_ms(r, c);
  const std::string pred =
      r.predicted_ms >= 0 ? fmt::format("{:9.3f} {:7.2f}", r.predicted_ms, r.ms / r.predicted_ms)
                          : fmt::format("{:>9} {:>7}", "-", "-");
  fmt::print("{:<20} {:9.3f} {:8.2f} {:9.1f} {:8.1f} {:6.2f} {:9.3f} {:7.2f} {}\n", r.name, r.ms,
             r.flops / 1e9, r.bytes / 1e6, r.flops / s / 1e12, r.bytes / s / 1e12, roof,
             roof > 0 ? r.ms / roof : 0.0, pred);
  std::fflush(stdout);
}

std::vector<OpResult> measure_step(Backend& be, const Options& o, const StepShapes& sh,
                                   const std::vector<OpCost>& predicted, const Ceilings& c,
                                   const gpu::Stream* fill) {
  return Step(be, o, sh, predicted, c, fill).run();
}

}  // namespace parity::bench
