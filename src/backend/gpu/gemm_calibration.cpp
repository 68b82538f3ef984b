// Measuring the kernel catalog (see gemm_calibration.h for why it is built this way).
#include "backend/gpu/gemm_calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "backend/gpu/blas_kernels.h"
#include "backend/gpu/fill.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu {

#if PARITY_GPU_HAVE_BLASLT

namespace {

constexpr std::int64_t kReference = 4096;  // the reference problem's m, n and k
constexpr int kShortSteps = 4, kLongSteps = 64;

bool narrow_type(GemmType t) {
  return t == GemmType::bf16 || t == GemmType::f16 || t == GemmType::e4m3;
}

// The kinds of product a training step makes, per operand type (gpu_backend.cpp's products):
// forwards x · wᵀ with the bias fused, with and without ReLU, or without either (the cross
// layers' low-rank product), their output in the operands' 16-bit type under a 16-bit math, and
// in fp32 for the layers whose output stays fp32 (the logits, the dot interaction's input); the
// input gradient dy · w and the weight gradient dyᵀ · x (fp32).
std::vector<GemmProblem> kinds(GemmType t) {
  std::vector<GemmProblem> out;
  for (const bool narrow : {true, false}) {
    if (narrow && !narrow_type(t)) continue;
    for (const GemmEpilogue e : {GemmEpilogue::bias, GemmEpilogue::relu_bias, GemmEpilogue::none}) {
      if (!narrow && narrow_type(t) && e != GemmEpilogue::bias) continue;
      GemmProblem f;
      f.type = t;
      f.tb = true;
      f.narrow_output = narrow;
      f.epilogue = e;
      out.push_back(f);
    }
  }
  if (t == GemmType::e4m3) return out;  // the tensor cores take A · Bᵀ alone
  GemmProblem d;
  d.type = t;
  out.push_back(d);
  GemmProblem w;
  w.type = t;
  w.ta = true;
  out.push_back(w);
  return out;
}

DType fill_type(GemmType t) {
  return t == GemmType::bf16 ? DType::bf16 : t == GemmType::f16 ? DType::f16 : DType::f32;
}

struct Buffers {
  DeviceBuffer<std::byte> a, b, d, bias;
  void grow(DeviceBuffer<std::byte>& buf, std::size_t bytes, const char* what, Stream_t s,
            GemmType t, std::uint64_t stream) {
    if (buf.bytes() >= bytes) return;
    buf = DeviceBuffer<std::byte>(bytes, what);
    if (t == GemmType::e4m3) {
      check(memset_async(buf.data(), 0x38, bytes, s), "fill");  // e4m3 1.0
    } else {
      const int e = gemm_operand_bytes(t) == 2 ? 2 : 4;
      fill_uniform(s, buf.data(), fill_type(t), static_cast<std::int64_t>(bytes / e), -1.0f, 1.0f,
                   2026, stream);
    }
  }
};

// One timed run of `kernel` on the problem `p` (its description configured afresh); negative
// when the library refuses the configuration for this shape.
double time_on(blas::Handle h, const GemmProblem& p, const GemmKernel& kernel, Buffers& buf,
               DeviceBuffer<std::byte>& ws, Stream_t s, double target_ms) {
  const int e = gemm_operand_bytes(p.type);
  buf.grow(buf.a, static_cast<std::size_t>((p.ta ? p.k : p.m) * p.lead_a() * e), "A", s, p.type, 1);
  buf.grow(buf.b, static_cast<std::size_t>((p.tb ? p.n : p.k) * p.lead_b() * e), "B", s, p.type, 2);
  buf.grow(buf.d, static_cast<std::size_t>(p.m * p.lead_d() * p.output_bytes()), "D", s,
           p.narrow_output ? GemmType::bf16 : GemmType::f32, 3);
  // The bias is of the output's type (bf16 for bf16 and fp8 operands, fp16 for fp16).
  const GemmType bias_type = !p.narrow_output          ? GemmType::f32
                             : p.type == GemmType::f16 ? GemmType::f16
                                                       : GemmType::bf16;
  buf.grow(buf.bias, static_cast<std::size_t>(p.n * 4), "bias", s, bias_type, 4);
  BlasOperation op(p);
  if (p.epilogue == GemmEpilogue::bias || p.epilogue == GemmEpilogue::relu_bias)
    op.set_bias(buf.bias.data());
  GemmKernel k = kernel;
  blas::Algo algo{};
  if (!configure(h, op, ws.bytes(), k, algo, nullptr)) return -1.0;
  return time_kernel_us(h, op, algo, buf.a.data(), buf.b.data(), buf.d.data(), ws.data(),
                        ws.bytes(), s, target_ms) *
         1e-6;
}

GemmProblem shaped(GemmProblem p, std::int64_t m, std::int64_t n, std::int64_t k) {
  p.m = m;
  p.n = n;
  p.k = k;
  return p;
}

// The configurations worth keeping: first or within 3% of first, or among the first three, on
// some shape of a grid (aligned rows, and rows 2 bytes short of alignment).
std::vector<CatalogKernel> keep_useful(const CatalogGroup& g, double reduction_fixed_s,
                                       double hbm) {
  GemmCatalog one;
  one.reduction_fixed_s = reduction_fixed_s;
  one.groups.push_back(g);
  std::set<std::string> keep;
  const std::int64_t sizes[] = {64, 256, 1024, 4096, 16384, 65536};
  const std::int64_t depths[] = {64, 512, 4096, 32768};
  for (const std::int64_t m : sizes)
    for (const std::int64_t n : sizes)
      for (const std::int64_t k : depths)
        for (const bool odd : {false, true}) {
          const GemmProblem p = shaped(g.kind(), m, n, odd ? k + 1 : k);
          const auto r = rank_gemm_kernels(p, one, hbm);
          for (std::size_t i = 0; i < r.size(); ++i) {
            if (i >= 3 && r[i].seconds > 1.03 * r[0].seconds) break;
            GemmKernel base = r[i].kernel;
            base.split_k = 1;
            base.reduction = SplitReduction::none;
            keep.insert(base.key());
          }
        }
  std::vector<CatalogKernel> out;
  for (const CatalogKernel& k : g.kernels)
    if (keep.count(k.kernel.key())) out.push_back(k);
  return out;
}

}  // namespace

GemmCatalog measure_gemm_catalog(const GemmCalibrationRequest& req) {
  if (!(req.hbm_bytes_per_s > 0))
    throw Error("measuring the kernel catalog: the device's memory rate must be above 0");
  auto say = [&](const std::string& s) {
    if (req.progress) req.progress(s);
  };
  GemmCatalog cat;
  cat.device = req.device;
  cat.library = blas::kLibrary;
  cat.library_version = static_cast<std::int64_t>(blas_library_version());
  Stream stream;
  const Stream_t s = stream.get();
  blas::Handle h = nullptr;
  if (blas::create(&h) != blas::kSuccess) throw GpuError("cannot create the BLAS library handle");
  struct HandleGuard {
    blas::Handle h;
    ~HandleGuard() { (void)blas::destroy(h); }
  } guard{h};
  DeviceBuffer<std::byte> ws(std::size_t{32} << 20, "BLAS workspace");
  Buffers buf;
  std::vector<double> reductions;
  for (const GemmType type : req.types)
    for (GemmProblem kind : kinds(type)) {
      const GemmProblem ref = shaped(kind, kReference, kReference, kReference);
      BlasOperation ref_op(ref);
      Buffers& b = buf;
      b.grow(b.bias, static_cast<std::size_t>(kReference * 4), "bias", s, GemmType::f32, 4);
      if (ref.epilogue == GemmEpilogue::bias || ref.epilogue == GemmEpilogue::relu_bias)
        ref_op.set_bias(b.bias.data());
      EnumerateLimits lim;
      lim.max_split_k = 1;
      EnumerateStats st;
      const auto configs = enumerate_kernels(h, ref_op, ws.bytes(), lim, &st);
      CatalogGroup g = CatalogGroup::of_kind(kind);
      for (const LibraryKernel& lk : configs) {
        const GemmKernel& k = lk.kernel;
        const auto [tm, tn, tk] = counted_tile(k);
        const double ref_tiles =
            static_cast<double>(((kReference + tm - 1) / tm) * ((kReference + tn - 1) / tn));
        // The wave's size comes from the library's wave count; a configuration without one
        // cannot be placed on the wave scale and is left out.
        if (!(k.waves > 0)) continue;
        const double slots = std::max(1.0, std::round(ref_tiles / k.waves));
        // One wave of tiles, its sides multiples of the cluster's.
        const std::int64_t cm = std::max(k.cluster_m, 1), cn = std::max(k.cluster_n, 1);
        std::int64_t tiles_n =
            std::max<std::int64_t>(cn, static_cast<std::int64_t>(std::sqrt(slots)) / cn * cn);
        std::int64_t tiles_m =
            std::max<std::int64_t>(cm, static_cast<std::int64_t>(slots) / tiles_n / cm * cm);
        const double t1 = time_on(h, shaped(kind, tiles_m * tm, tiles_n * tn, kShortSteps * tk), k,
                                  b, ws, s, req.target_ms);
        const double t2 = time_on(h, shaped(kind, tiles_m * tm, tiles_n * tn, kLongSteps * tk), k,
                                  b, ws, s, req.target_ms);
        // Two waves: twice the rows where a whole wave was formed, else a wave's worth more.
        const double wave_tiles = static_cast<double>(tiles_m * tiles_n);
        const std::int64_t rows2 = static_cast<std::int64_t>(std::ceil(
                                       (wave_tiles + slots) / static_cast<double>(tiles_n) / cm)) *
                                   cm;
        const double t3 = time_on(h, shaped(kind, rows2 * tm, tiles_n * tn, kLongSteps * tk), k, b,
                                  ws, s, req.target_ms);
        if (t1 <= 0 || t2 <= 0 || t3 <= 0) continue;
        CatalogKernel ck;
        ck.kernel = k;
        ck.kernel.waves = 0;
        ck.kernel.workspace_bytes = 0;
        const KernelCaps caps = kernel_caps(lk.algo);
        ck.max_split_k = caps.max_split_k;
        ck.split_reduction = caps.split_reduction;
        ck.min_align_a = caps.min_align_a;
        ck.min_align_b = caps.min_align_b;
        ck.min_align_d = caps.min_align_d;
        ck.slots = slots;
        ck.kstep_s = std::max((t2 - t1) / (kLongSteps - kShortSteps), 1e-12);
        const double waves2 = std::ceil(static_cast<double>(rows2 * tiles_n) / slots);
        const double per_wave = (t3 - t2) / std::max(waves2 - 1.0, 1.0);
        ck.tile_s = std::max(per_wave - kLongSteps * ck.kstep_s, 0.0);
        ck.fixed_s = std::max(t2 - (ck.tile_s + kLongSteps * ck.kstep_s), 0.0);
        g.kernels.push_back(ck);
      }
      // One split-K reduction's own cost: a one-tile product split in two against the same
      // product of half the depth, less the partial results' traffic (up to 8 configurations).
      for (const CatalogKernel& ck : g.kernels) {
        if (ck.max_split_k < 2 || reductions.size() >= 8) continue;
        const GemmKernel& k = ck.kernel;
        const auto [tm, tn, tk] = counted_tile(k);
        GemmKernel split = k;
        split.split_k = 2;
        split.reduction = ck.split_reduction;
        const double half =
            time_on(h, shaped(kind, tm, tn, kLongSteps * tk), k, b, ws, s, req.target_ms);
        const double two =
            time_on(h, shaped(kind, tm, tn, 2 * kLongSteps * tk), split, b, ws, s, req.target_ms);
        if (half > 0 && two > 0)
          reductions.push_back(two - half -
                               5.0 * static_cast<double>(tm * tn) * 4.0 / req.hbm_bytes_per_s);
      }
      if (!reductions.empty()) {
        std::vector<double> sorted = reductions;
        std::sort(sorted.begin(), sorted.end());
        cat.reduction_fixed_s = std::max(sorted[sorted.size() / 2], 0.0);
      }
      const std::size_t measured = g.kernels.size();
      g.kernels = keep_useful(g, cat.reduction_fixed_s, req.hbm_bytes_per_s);
      say(fmt::format("{}: {} configurations accepted of {} checked, {} measured, {} kept",
                      ref.describe(), configs.size(), st.checked, measured, g.kernels.size()));
      cat.groups.push_back(std::move(g));
    }
  return cat;
}

#else

GemmCatalog measure_gemm_catalog(const GemmCalibrationRequest&) {
  throw GpuError("measuring the kernel catalog needs hipBLASLt, which this build does not have");
}

#endif

}  // namespace parity::gpu
