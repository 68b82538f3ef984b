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
constexpr int kDeepestSteps = 8192;                   // the most k steps of a calibration run
constexpr double kLongRunS = 40e-6;                   // a long run's time at least, where it can
constexpr double kOperandBytesCap = 1.5 * (1 << 30);  // A and B of one run at most
constexpr int kMostWaves = 3;
// The streaming runs: output of at least this many L2s, these many waves at least and at most,
// the deep run's time about kStreamRunS where its depth allows.
constexpr double kStreamL2s = 2.0;
constexpr int kStreamMinWaves = 8, kStreamMaxWaves = 1024;
constexpr double kStreamRunS = 500e-6;

bool narrow_type(GemmType t) {
  return t == GemmType::bf16 || t == GemmType::f16 || t == GemmType::e4m3;
}

// The kinds of product a training step makes, per operand type (gpu_backend.cpp's products):
// forwards x · wᵀ with the bias fused, with and without ReLU, or without either (the cross
// layers' low-rank product), their output in the operands' 16-bit type under a 16-bit math, and
// in fp32 with the bias fused, with and without ReLU, for the layers whose output stays fp32
// (the logits, the dot interaction's input); the input gradient dy · w (fp32, and under a 16-bit
// math also in the operands' type: the DCNv2 stack's gradients) and the weight gradient dyᵀ · x
// (fp32).
std::vector<GemmProblem> kinds(GemmType t) {
  std::vector<GemmProblem> out;
  for (const bool narrow : {true, false}) {
    if (narrow && !narrow_type(t)) continue;
    for (const GemmEpilogue e : {GemmEpilogue::bias, GemmEpilogue::relu_bias, GemmEpilogue::none}) {
      // fp32 outputs under a 16-bit math: the logits (bias) and the dot interaction's input
      // (bias and ReLU).
      if (!narrow && narrow_type(t) && e == GemmEpilogue::none) continue;
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
  if (narrow_type(t)) {
    d.narrow_output = true;
    out.push_back(d);
  }
  GemmProblem w;
  w.type = t;
  w.ta = true;
  out.push_back(w);
  return out;
}

// Points a bias epilogue's operation at the bias buffer.
void bias_for(const BlasOperation& op, const void* bias) {
  const GemmEpilogue e = op.problem().epilogue;
  if (e == GemmEpilogue::bias || e == GemmEpilogue::relu_bias) op.set_bias(bias);
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
  bias_for(op, buf.bias.data());
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

// The library's heuristic answers for a grid of shapes of the kind (every alignment a row can
// have), split-K taken off, that the walk did not find: the heuristic knows configurations that
// the algorithms' capability lists do not name (tiles, clusters, custom options). Each is kept
// where the library accepts it for the reference problem, with that check's wave count.
void add_heuristic_answers(blas::Handle h, const GemmProblem& kind, const BlasOperation& ref_op,
                           const void* bias, std::size_t workspace_bytes,
                           std::vector<LibraryKernel>& configs) {
  std::set<std::string> have;
  for (const LibraryKernel& k : configs) have.insert(k.kernel.key());
  const std::int64_t sizes[] = {64, 512, 4096, 32768};
  const std::int64_t depths[] = {64, 1024, 16384};
  for (const std::int64_t m : sizes)
    for (const std::int64_t n : sizes)
      for (const std::int64_t k : depths)
        for (const std::int64_t past : {0, 1, 2, 4}) {
          BlasOperation op(shaped(kind, m + past, n + past, k + past));
          bias_for(op, bias);
          for (const LibraryKernel& answer : heuristic_kernels(h, op, workspace_bytes, 32)) {
            GemmKernel base = answer.kernel;
            base.split_k = 1;
            base.reduction = SplitReduction::none;
            if (!have.insert(base.key()).second) continue;
            blas::Algo algo{};
            if (configure(h, ref_op, workspace_bytes, base, algo, nullptr))
              configs.push_back({base, algo});
          }
        }
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
  cat.multiprocessors = device_info().multiprocessor_count;
  cat.l2_bytes = device_info().l2_cache_bytes;
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
      bias_for(ref_op, b.bias.data());
      EnumerateLimits lim;
      lim.max_split_k = 1;
      EnumerateStats st;
      // The cheapest call: a 16 x 16 x 16 product of the kind with the heuristic's first
      // configuration that runs (the smallest over the kinds).
      {
        const GemmProblem tiny = shaped(kind, 16, 16, 16);
        BlasOperation tiny_op(tiny);
        bias_for(tiny_op, b.bias.data());
        for (const LibraryKernel& answer : heuristic_kernels(h, tiny_op, ws.bytes(), 8)) {
          const double t = time_on(h, tiny, answer.kernel, b, ws, s, req.target_ms);
          if (t <= 0) continue;
          cat.call_s = cat.call_s > 0 ? std::min(cat.call_s, t) : t;
          break;
        }
      }
      std::vector<LibraryKernel> configs = enumerate_kernels(h, ref_op, ws.bytes(), lim, &st);
      const std::size_t walked = configs.size();
      add_heuristic_answers(h, kind, ref_op, b.bias.data(), ws.bytes(), configs);
      CatalogGroup g = CatalogGroup::of_kind(kind);
      double peak = 0;
      std::vector<double> fit_errors;
      std::vector<MeasuredKernel> runs;  // for req.measured
      for (const LibraryKernel& lk : configs) {
        const GemmKernel& k = lk.kernel;
        // Plain copies (lambdas below capture them).
        const CountedTile counted = counted_tile(k);
        const std::int64_t tm = counted.m, tn = counted.n, tk = counted.k;
        const double ref_tiles =
            static_cast<double>(((kReference + tm - 1) / tm) * ((kReference + tn - 1) / tn));
        // The wave's size comes from the library's wave count; a configuration without one
        // cannot be placed on the wave scale and is left out.
        if (!(k.waves > 0)) continue;
        const double slots = std::max(1.0, std::round(ref_tiles / k.waves));
        // One wave of tiles, its sides multiples of the cluster's.
        const std::int64_t cm = std::max(k.cluster_m, 1), cn = std::max(k.cluster_n, 1);
        const std::int64_t tiles_n =
            std::max<std::int64_t>(cn, static_cast<std::int64_t>(std::sqrt(slots)) / cn * cn);
        const std::int64_t tiles_m =
            std::max<std::int64_t>(cm, static_cast<std::int64_t>(slots) / tiles_n / cm * cm);
        // The rows of tiles that make `waves` waves: the wave's rows times waves, rounded up to
        // the cluster.
        const auto rows_for = [&](int waves) {
          const double tiles = std::max(static_cast<double>(tiles_m * tiles_n), waves * slots);
          return static_cast<std::int64_t>(
                     std::ceil(tiles / static_cast<double>(tiles_n) / static_cast<double>(cm))) *
                 cm;
        };
        std::vector<CostSample> samples;
        std::vector<GemmProblem> shapes;
        bool refused = false;
        const auto sample = [&](int waves, std::int64_t steps) {
          if (refused) return 0.0;
          const std::int64_t rows = waves == 1 ? tiles_m : rows_for(waves);
          const GemmProblem p = shaped(kind, rows * tm, tiles_n * tn, steps * tk);
          const double t = time_on(h, p, k, b, ws, s, req.target_ms);
          if (t <= 0) {
            refused = true;
            return 0.0;
          }
          const double counted =
              catalog_waves(catalog_tiles(k, p.m, p.n), slots, cat.multiprocessors);
          samples.push_back({counted, static_cast<double>(steps), t});
          shapes.push_back(p);
          peak = std::max(peak, 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) *
                                    static_cast<double>(p.k) / t);
          return t;
        };
        // The long depth: enough k steps that they, not the fixed costs, fill the time, within
        // the operands' memory cap.
        const double probe = sample(1, kLongSteps);
        std::int64_t long_steps = kLongSteps;
        const double operand_row_bytes =
            static_cast<double>(rows_for(kMostWaves) * tm + tiles_n * tn) * tk *
            gemm_operand_bytes(kind.type);
        while (probe > 0 && long_steps < kDeepestSteps &&
               probe * static_cast<double>(long_steps) / kLongSteps < kLongRunS &&
               2.0 * static_cast<double>(long_steps) * operand_row_bytes <= kOperandBytesCap)
          long_steps *= 2;
        (void)sample(1, kShortSteps);
        if (long_steps > kLongSteps) (void)sample(1, long_steps);
        (void)sample(2, long_steps);
        (void)sample(kMostWaves, std::max<std::int64_t>(kShortSteps, long_steps / 4));
        (void)sample(2, kShortSteps);
        if (refused) continue;
        const CostFit fit = fit_kernel_costs(samples);
        // The streaming costs: many waves whose output outgrows L2 (and the deep run's operands
        // with it), at the shallowest depth and a deep one.
        CostFit stream;
        std::vector<CostSample> stream_samples;
        std::vector<GemmProblem> stream_shapes;
        if (cat.l2_bytes > 0) {
          const double wave_output = slots * static_cast<double>(tm * tn) * kind.output_bytes();
          const int waves = static_cast<int>(
              std::clamp(std::ceil(kStreamL2s * static_cast<double>(cat.l2_bytes) / wave_output),
                         double{kStreamMinWaves}, double{kStreamMaxWaves}));
          const std::int64_t m = rows_for(waves) * tm, n = tiles_n * tn;
          // The deep run's depth: about kStreamRunS by the L2 fit, at most the long runs' depth
          // and the operands' memory cap, at least four times the shallow run's.
          const double per_wave = std::max(kStreamRunS / waves - fit.tile_s, 0.0);
          const double operand_steps =
              kOperandBytesCap / (static_cast<double>(m + n) *
                                  static_cast<double>(tk * gemm_operand_bytes(kind.type)));
          double deep_steps = std::min(static_cast<double>(long_steps), operand_steps);
          if (fit.kstep_s > 0) deep_steps = std::min(deep_steps, per_wave / fit.kstep_s);
          const auto deep = static_cast<std::int64_t>(std::max(deep_steps, 4.0 * kShortSteps));
          for (const std::int64_t steps : {std::int64_t{kShortSteps}, deep}) {
            if (static_cast<double>(steps) > operand_steps) break;
            const GemmProblem p = shaped(kind, m, n, steps * tk);
            const double t = time_on(h, p, k, b, ws, s, req.target_ms);
            if (t <= 0) break;
            stream_samples.push_back(
                {catalog_waves(catalog_tiles(k, p.m, p.n), slots, cat.multiprocessors),
                 static_cast<double>(steps), t});
            stream_shapes.push_back(p);
            peak = std::max(peak, 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) *
                                      static_cast<double>(p.k) / t);
          }
          // A configuration without streaming costs would rank on its cheaper L2 costs where
          // the others pay for streaming: it stays out of a catalog that has them.
          if (stream_samples.size() != 2) continue;
          stream = fit_stream_costs(fit.fixed_s, stream_samples[0], stream_samples[1]);
        }
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
        ck.fixed_s = fit.fixed_s;
        ck.tile_s = fit.tile_s;
        ck.kstep_s = fit.kstep_s;
        ck.stream_tile_s = stream.tile_s;
        ck.stream_kstep_s = stream.kstep_s;
        fit_errors.push_back(fit.rms_relative_error);
        if (req.measured)
          runs.push_back({kind, ck, std::move(shapes), std::move(samples), std::move(stream_shapes),
                          std::move(stream_samples), fit.rms_relative_error, false});
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
      g.peak_flops_per_s = peak;
      g.kernels = useful_kernels(cat, g, req.hbm_bytes_per_s);
      if (req.measured) {
        std::set<std::string> kept;
        for (const CatalogKernel& ck : g.kernels) kept.insert(ck.kernel.key());
        for (MeasuredKernel& m : runs) {
          m.kept = kept.count(m.kernel.kernel.key()) > 0;
          req.measured(m);
        }
      }
      std::sort(fit_errors.begin(), fit_errors.end());
      say(fmt::format(
          "{}: {} configurations accepted of {} checked, {} more from the library's heuristic, "
          "{} measured (their formula's rms error on the runs: median {:.1f}%, 90th percentile "
          "{:.1f}%), {} kept; peak {:.1f} TFLOP/s",
          ref.describe(), walked, st.checked, configs.size() - walked, measured,
          fit_errors.empty() ? 0.0 : 100 * fit_errors[fit_errors.size() / 2],
          fit_errors.empty() ? 0.0 : 100 * fit_errors[fit_errors.size() * 9 / 10], g.kernels.size(),
          peak / 1e12));
      // A kind the library has no configuration for (fp8 with a wide output and a bias) stays
      // out: its products take the library's heuristic.
      if (!g.kernels.empty()) cat.groups.push_back(std::move(g));
    }
  return cat;
}

#else

GemmCatalog measure_gemm_catalog(const GemmCalibrationRequest&) {
  throw GpuError("measuring the kernel catalog needs hipBLASLt, which this build does not have");
}

#endif

}  // namespace parity::gpu
