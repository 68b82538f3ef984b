// The plan's kernel choices: every matrix product of a DLRM step as the GPU backend runs it,
// ranked with the device's kernel catalog (src/select), so that the choice the backend executes
// is made, and can be read and edited, in the plan.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <system_error>
#include <utility>

#include "parity/plan.h"

namespace parity {
namespace {

// How many of the ranking's configurations a choice keeps: the first, and what the backend tries
// next where this machine's library refuses it.
constexpr std::size_t kRankedKept = 4;

std::int64_t pad8(std::int64_t v) {
  return (v + 7) / 8 * 8;
}

GemmType gemm_type_of(DenseMath m) {
  switch (m) {
    case DenseMath::fp32:
      return GemmType::f32;
    case DenseMath::tf32:
      return GemmType::tf32;
    case DenseMath::bf16:
      return GemmType::bf16;
    case DenseMath::fp16:
      return GemmType::f16;
  }
  return GemmType::f32;
}

// Builds the products of the GpuBackend's dense layers. Under a 16-bit math the backend reads an
// fp32 operand through a bf16 copy whose rows are padded to 8 elements (ld = pad8(cols)); where
// both operands are such copies along k, the product runs over the padded k; where the second
// operand of an fp32 output is such a copy with n not a multiple of 8, over the padded n.
class Products {
 public:
  Products(DenseMath math, std::int64_t batch)
      : narrow_(math == DenseMath::bf16 || math == DenseMath::fp16),
        type_(gemm_type_of(math)),
        b_(batch) {}

  // y [B, out] = x [B, in] · wᵀ (+ bias) (relu); x fp32 (the data, the dot interaction's output)
  // or an activation; y an activation, or the logits (fp32).
  void forward(const std::string& op, std::int64_t in, std::int64_t out, bool x_f32, bool relu,
               bool y_activation, std::int64_t ldy = 0) {
    GemmProblem p = base(b_, out, in, false, true);
    p.ldd = ldy;
    if (narrow_) {
      p.ldb = pad8(in);
      if (x_f32) p.k = p.lda = pad8(in);
      p.narrow_output = y_activation;
    }
    p.epilogue = relu ? GemmEpilogue::relu_bias : GemmEpilogue::bias;
    add(op + " forward", p);
  }

  // dw [out, in] = dzᵀ · x and (want_dx) dx [B, in] = dz · w; dx an activation-typed gradient
  // (dx_narrow) or fp32.
  void backward(const std::string& op, std::int64_t in, std::int64_t out, bool x_f32, bool want_dx,
                bool dx_narrow) {
    GemmProblem w = base(out, in, b_, true, false);
    if (narrow_ && x_f32) w.n = w.ldb = pad8(in);
    add(op + " weight gradient", w);
    if (!want_dx) return;
    GemmProblem d = base(b_, in, out, false, false);
    if (narrow_) {
      d.ldb = pad8(in);
      d.narrow_output = dx_narrow;
      if (!dx_narrow) d.n = d.ldd = pad8(in);
    }
    add(op + " data gradient", d);
  }

  // The DCNv2 cross layer of width n and rank r: u = xl · vᵀ, z = u · wᵀ + bias; backward
  // dw = dzᵀ · u, du = dz · w, dv = duᵀ · xl, dxl = du · v (+ g).
  void cross_forward(const std::string& op, std::int64_t n, std::int64_t r) {
    GemmProblem u = base(b_, r, n, false, true);
    GemmProblem z = base(b_, n, r, false, true);
    z.epilogue = GemmEpilogue::bias;
    if (narrow_) {
      u.ldb = pad8(n);
      z.ldb = pad8(r);
      u.narrow_output = z.narrow_output = true;
    }
    add(op + " forward u", u);
    add(op + " forward z", z);
  }
  void cross_backward(const std::string& op, std::int64_t n, std::int64_t r) {
    GemmProblem dw = base(n, r, b_, true, false);
    GemmProblem du = base(b_, r, n, false, false);
    GemmProblem dv = base(r, n, b_, true, false);
    GemmProblem dx = base(b_, n, r, false, false);
    dx.accumulate = true;
    if (narrow_) {
      du.ldb = pad8(r);
      dx.ldb = pad8(n);
      du.narrow_output = dx.narrow_output = true;
    }
    add(op + " weight gradient w", dw);
    add(op + " data gradient u", du);
    add(op + " weight gradient v", dv);
    add(op + " data gradient x", dx);
  }

  std::vector<StepProduct> take() { return std::move(out_); }

 private:
  GemmProblem base(std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb) const {
    GemmProblem p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.ta = ta;
    p.tb = tb;
    p.type = type_;
    return p;
  }
  void add(std::string op, const GemmProblem& p) { out_.push_back({std::move(op), p}); }

  bool narrow_;
  GemmType type_;
  std::int64_t b_;
  std::vector<StepProduct> out_;
};

}  // namespace

std::vector<StepProduct> dense_products(const ModelSpec& m, std::int64_t per_device_batch,
                                        DenseMath math) {
  require_dlrm(m, "the step's matrix products");
  Products ps(math, per_device_batch);
  const bool dcn = m.interaction.kind == InteractionKind::dcnv2;
  const std::int64_t n = m.interaction_input_dim(), r = m.interaction.low_rank;
  const int layers = dcn ? m.interaction.cross_layers : 0;
  struct Layer {
    std::string name;
    std::int64_t in, out;
    bool x_f32, relu, first_bottom, top0;
    bool last_top;
  };
  std::vector<Layer> bottom, top;
  std::int64_t in = m.dense_features;
  for (std::size_t i = 0; i < m.bottom_mlp.size(); ++i) {
    bottom.push_back(
        {fmt::format("bottom.{}", i), in, m.bottom_mlp[i], i == 0, true, i == 0, false, false});
    in = m.bottom_mlp[i];
  }
  in = m.interaction_output_dim();
  for (std::size_t i = 0; i < m.top_mlp.size(); ++i) {
    const bool last = i + 1 == m.top_mlp.size();
    top.push_back(
        {fmt::format("top.{}", i), in, m.top_mlp[i], i == 0 && !dcn, !last, false, i == 0, last});
    in = m.top_mlp[i];
  }
  // The last bottom layer writes the first columns of x0 [B, n], the interaction's input: stored
  // like the activations under DCNv2, in fp32 for the dot interaction's kernels.
  for (std::size_t i = 0; i < bottom.size(); ++i) {
    const bool last = i + 1 == bottom.size();
    ps.forward(bottom[i].name, bottom[i].in, bottom[i].out, bottom[i].x_f32, bottom[i].relu,
               dcn || !last, last ? n : 0);
  }
  for (int c = 0; c < layers; ++c) ps.cross_forward(fmt::format("cross.{}", c), n, r);
  for (const Layer& l : top) ps.forward(l.name, l.in, l.out, l.x_f32, l.relu, !l.last_top);
  // The gradient of top.0's input (the interaction's output) is stored like the activations
  // under DCNv2, in fp32 for the dot interaction; the MLPs' own gradients are fp32.
  for (auto l = top.rbegin(); l != top.rend(); ++l)
    ps.backward(l->name, l->in, l->out, l->x_f32, true, l->top0 && dcn);
  for (int c = layers - 1; c >= 0; --c) ps.cross_backward(fmt::format("cross.{}", c), n, r);
  for (auto l = bottom.rbegin(); l != bottom.rend(); ++l)
    ps.backward(l->name, l->in, l->out, l->x_f32, !l->first_bottom, false);
  return ps.take();
}

std::vector<KernelChoice> plan_kernel_choices(const Plan& p, const ModelSpec& m,
                                              const DeviceSpec& dev, const Calibration& cal,
                                              const GemmCatalog* catalog) {
  std::vector<KernelChoice> out;
  if (m.kind != ModelKind::dlrm) return out;  // HSTU's token counts change every step
  const double hbm = dev.hbm_bandwidth.value * cal.hbm_efficiency;
  for (const StepProduct& sp : dense_products(m, p.per_device_batch, p.dense_math)) {
    const GemmProblem& q = sp.problem;
    KernelChoice kc;
    kc.op = sp.op;
    kc.m = q.m;
    kc.n = q.n;
    kc.k = q.k;
    const auto ranked =
        catalog != nullptr ? rank_gemm_kernels(q, *catalog, hbm) : std::vector<KernelEstimate>{};
    if (!ranked.empty()) {
      kc.problem = q;
      for (std::size_t i = 0; i < ranked.size() && i < kRankedKept; ++i)
        kc.ranked.push_back(ranked[i].kernel.key());
      const CountedTile t = counted_tile(ranked.front().kernel);
      kc.tile_m = static_cast<int>(t.m);
      kc.tile_n = static_cast<int>(t.n);
      kc.predicted_s = ranked.front().seconds;
    } else {
      const GemmEstimate e = gemm_best({q.m, q.n, q.k, p.dense_math}, dev, cal);
      kc.tile_m = e.tile.m;
      kc.tile_n = e.tile.n;
      kc.predicted_s = e.seconds;
    }
    out.push_back(std::move(kc));
  }
  return out;
}

ProductTimes planned_product_times(const Plan& plan, const ModelSpec& model) {
  ProductTimes out;
  if (model.kind != ModelKind::dlrm || plan.kernels.empty()) return out;
  std::map<std::string, std::string> step;  // op -> the product's kind and shape
  for (const StepProduct& s : dense_products(model, plan.per_device_batch, plan.dense_math))
    step[s.op] = decision_key(s.problem);
  for (const KernelChoice& k : plan.kernels) {
    if (k.ranked.empty() || !(k.predicted_s > 0)) continue;
    const auto it = step.find(k.op);
    if (it != step.end() && it->second == decision_key(k.problem)) out[k.op] = k.predicted_s;
  }
  return out;
}

std::shared_ptr<const GemmCatalog> gemm_catalog_for(const DeviceSpec& dev,
                                                    const std::filesystem::path& configs_dir,
                                                    const std::filesystem::path& file) {
  std::filesystem::path f = file;
  if (f.empty()) {
    f = configs_dir / "calibration" / (dev.name + "-gemm.json");
    std::error_code ec;
    if (!std::filesystem::exists(f, ec)) return nullptr;
  }
  // Read once a process: a catalog is megabytes of JSON and every make_plan asks for it. Keyed by
  // the file and its modification time, so a catalog measured again is read again.
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::filesystem::file_time_type>,
                  std::shared_ptr<const GemmCatalog>>
      cache;
  std::error_code ec;
  const auto key = std::make_pair(f.string(), std::filesystem::last_write_time(f, ec));
  std::shared_ptr<const GemmCatalog> c;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto& slot = cache[key];
    if (ec || slot == nullptr) slot = std::make_shared<const GemmCatalog>(load_gemm_catalog(f));
    c = slot;
  }
  if (c->device != dev.name)
    throw InputError(
        fmt::format("kernel catalog {}: field 'device' is '{}', the plan's device is "
                    "'{}' (measure one with parity calibrate --device {})",
                    f.string(), c->device, dev.name, dev.name));
  return c;
}

}  // namespace parity
