// The oracle of kernel selection: for every problem of the suite (src/select/suite.h) and each
// operand type asked for, the BLAS library's configurations are enumerated (blas_kernels.h),
// and a sample of them is timed: every answer of the library's heuristic (up to --heuristic),
// and --sample more drawn at random (seeded) from the accepted rest, or all of them where there
// are at most --all-below. Each timed configuration's result is compared with the heuristic's
// first on sampled elements, so that a configuration computing something else is reported and
// left out, never counted as fast.
//
// Output: one JSON object per problem (--out FILE, JSON lines) with the problem, the walk's
// counts and host time, and per timed configuration its fields, workspace, waves, heuristic rank
// and measured microseconds; a summary per type on stdout (the heuristic's first choice as a
// percentage of the best timed, geomean and worst).
// Method: operands uniform in [-1, 1] (fp8: random normal numbers of magnitude 2^-6 .. 2), one
// warm-up run, then back-to-back runs between device timing marks, as many as fill about
// --target-ms (at least 3, at most 200); operands stay in L2 where they fit, as in a training
// step whose producer just wrote them. --budget-s stops the run cleanly (the output so far is
// complete JSON lines).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/gpu/blas_kernels.h"
#include "backend/gpu/fill.h"
#include "backend/gpu/runtime.h"
#include "parity/dtype.h"
#include "parity/error.h"
#include "parity/perf.h"
#include "parity/select.h"
#include "parity/spec.h"
#include "select/suite.h"

namespace gpu = parity::gpu;
using parity::GemmKernel;
using parity::GemmProblem;
using parity::GemmType;
using Clock = std::chrono::steady_clock;
using parity::gpu::Stream_t;

namespace {

struct Options {
  std::vector<GemmType> types = {GemmType::bf16};
  std::string out = "gemm-oracle.jsonl";
  std::string models = PARITY_SOURCE_DIR "/configs/models";
  int heuristic = 32, sample = 64, all_below = 160;
  double target_ms = 2.0, budget_s = 540;
  int every = 1;  // time every n-th problem of the suite (per type)
  int limit = 0;  // at most this many problems per type (0: all)
  std::uint64_t seed = 2026;
  bool list = false;
  std::string catalog;          // a kernel catalog: the model's picks are timed beside the rest
  std::string device = "h200";  // its memory rate is the ranking's floor
  parity::SuiteOptions suite;
};

GemmType parse_type(const std::string& s) {
  if (s == "fp32") return GemmType::f32;
  if (s == "tf32") return GemmType::tf32;
  if (s == "bf16") return GemmType::bf16;
  if (s == "fp16") return GemmType::f16;
  if (s == "fp8") return GemmType::e4m3;
  throw parity::InputError(fmt::format("--types: '{}' is not fp32, tf32, bf16, fp16 or fp8", s));
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  while (b <= s.size()) {
    const std::size_t e = s.find(',', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

// Operand buffers, grown as problems need; each operand offset from its 256-byte base by its
// problem's alignment where that is below 256.
struct Operands {
  gpu::DeviceBuffer<std::byte> a, b, d, bias;
  std::size_t a_bytes = 0, b_bytes = 0, d_bytes = 0;
};

void grow(gpu::DeviceBuffer<std::byte>& buf, std::size_t bytes, const char* what) {
  if (buf.bytes() < bytes) buf = gpu::DeviceBuffer<std::byte>(bytes + 512, what);
}

parity::DType fill_type(GemmType t) {
  switch (t) {
    case GemmType::bf16:
      return parity::DType::bf16;
    case GemmType::f16:
      return parity::DType::f16;
    default:
      return parity::DType::f32;
  }
}

void fill_operand(Stream_t s, void* p, std::int64_t elements, GemmType t, std::uint64_t stream) {
  if (t != GemmType::e4m3) {
    gpu::fill_uniform(s, p, fill_type(t), elements, -1.0f, 1.0f, 2026, stream);
    return;
  }
  // e4m3 bytes: sign, exponent 1..8 of 15 (2^-6 .. 2), any mantissa; never NaN.
  std::vector<std::uint8_t> host(static_cast<std::size_t>(elements));
  std::mt19937_64 rng(stream);
  for (auto& v : host) {
    const auto r = rng();
    v = static_cast<std::uint8_t>(((r & 1) << 7) | ((1 + (r >> 1) % 8) << 3) | ((r >> 8) & 7));
  }
  gpu::check(gpu::memcpy_async(p, host.data(), host.size(), s), "upload");
  gpu::check(gpu::stream_synchronize(s), "upload");
}

std::int64_t stored_elements(std::int64_t rows_as_stored, std::int64_t ld) {
  return rows_as_stored * ld;
}

// The product's output, sampled: up to 64 elements at fixed positions, as floats.
std::vector<float> sample_output(const GemmProblem& p, const void* d) {
  std::vector<float> out;
  const std::int64_t ld = p.lead_d();
  const int bytes = p.output_bytes();
  std::mt19937_64 rng(7);
  for (int i = 0; i < 64; ++i) {
    const std::int64_t r = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(p.m));
    const std::int64_t c = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(p.n));
    const auto* src = static_cast<const std::byte*>(d) + (r * ld + c) * bytes;
    float v = 0;
    if (bytes == 4) {
      gpu::detail::copy_sync(&v, src, 4, "sample");
    } else {
      std::uint16_t h = 0;
      gpu::detail::copy_sync(&h, src, 2, "sample");
      v = p.type == GemmType::f16 ? parity::half_to_float(h) : parity::bf16_to_float(h);
    }
    out.push_back(v);
  }
  return out;
}

// The largest error of `got` against `ref`, relative to ref's root mean square.
double sample_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double rms = 0, worst = 0;
  for (float r : ref) rms += static_cast<double>(r) * r;
  rms = std::sqrt(rms / std::max<std::size_t>(ref.size(), 1)) + 1e-30;
  if (!std::isfinite(rms)) return 1e30;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    // A NaN (the poison left where nothing was written) or an infinity is never close.
    if (!std::isfinite(got[i])) return 1e30;
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - ref[i]) / rms);
  }
  return worst;
}

nlohmann::json kernel_json(const GemmKernel& k) {
  return {{"key", k.key()},           {"algo", k.algo},
          {"tile_m", k.tile_m},       {"tile_n", k.tile_n},
          {"tile_k", k.tile_k},       {"stages", k.stages},
          {"cluster_m", k.cluster_m}, {"cluster_n", k.cluster_n},
          {"split_k", k.split_k},     {"reduction", static_cast<int>(k.reduction)},
          {"swizzle", k.swizzle},     {"custom", k.custom},
          {"inner", k.inner},         {"workspace", k.workspace_bytes},
          {"waves", k.waves}};
}

nlohmann::json problem_json(const GemmProblem& p) {
  return {{"m", p.m},
          {"n", p.n},
          {"k", p.k},
          {"ta", p.ta},
          {"tb", p.tb},
          {"type", parity::gemm_type_name(p.type)},
          {"narrow_output", p.narrow_output},
          {"epilogue", static_cast<int>(p.epilogue)},
          {"lda", p.lead_a()},
          {"ldb", p.lead_b()},
          {"ldd", p.lead_d()},
          {"align_a", p.align_a},
          {"align_b", p.align_b},
          {"align_d", p.align_d}};
}

// Spearman's rank correlation of (predicted, measured) pairs (ties take their first rank).
double spearman(std::vector<std::pair<double, double>> v) {
  const std::size_t n = v.size();
  std::vector<double> rp(n), rm(n);
  auto ranks = [&](auto key, std::vector<double>& r) {
    std::vector<std::size_t> idx(n);
    for (std::size_t i = 0; i < n; ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(),
              [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    for (std::size_t i = 0; i < n; ++i) r[idx[i]] = static_cast<double>(i);
  };
  ranks([&](std::size_t i) { return v[i].first; }, rp);
  ranks([&](std::size_t i) { return v[i].second; }, rm);
  double d2 = 0;
  for (std::size_t i = 0; i < n; ++i) d2 += (rp[i] - rm[i]) * (rp[i] - rm[i]);
  const double nn = static_cast<double>(n);
  return 1.0 - 6.0 * d2 / (nn * (nn * nn - 1.0));
}

int usage(int code) {
  std::fputs(
      "usage: gemm_bench [--types bf16,fp16,tf32,fp32,fp8] [--out FILE.jsonl] [--heuristic N]\n"
      "                  [--sample N] [--all-below N] [--target-ms MS] [--budget-s S]\n"
      "                  [--every N] [--limit N] [--random N] [--seed N] [--models DIR] [--list]\n"
      "                  [--catalog FILE [--device NAME]]\n",
      code == 0 ? stdout : stderr);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw parity::InputError(fmt::format("{} needs a value", a));
        return argv[++i];
      };
      if (a == "--help") return usage(0);
      if (a == "--types") {
        o.types.clear();
        for (const auto& t : split(value())) o.types.push_back(parse_type(t));
      } else if (a == "--out") {
        o.out = value();
      } else if (a == "--models") {
        o.models = value();
      } else if (a == "--heuristic") {
        o.heuristic = std::stoi(value());
      } else if (a == "--sample") {
        o.sample = std::stoi(value());
      } else if (a == "--all-below") {
        o.all_below = std::stoi(value());
      } else if (a == "--target-ms") {
        o.target_ms = std::stod(value());
      } else if (a == "--budget-s") {
        o.budget_s = std::stod(value());
      } else if (a == "--every") {
        o.every = std::max(1, std::stoi(value()));
      } else if (a == "--limit") {
        o.limit = std::stoi(value());
      } else if (a == "--random") {
        o.suite.random = std::stoi(value());
      } else if (a == "--seed") {
        o.seed = std::stoull(value());
        o.suite.seed = o.seed;
      } else if (a == "--catalog") {
        o.catalog = value();
      } else if (a == "--device") {
        o.device = value();
      } else if (a == "--list") {
        o.list = true;
      } else {
        std::fprintf(stderr, "gemm_bench: unknown option %s\n", a.c_str());
        return usage(2);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 2;
  }

  try {
    if (o.list) {
      for (GemmType t : o.types)
        for (const auto& s : parity::gemm_suite(o.models, t, o.suite))
          std::printf("%s  %s\n", s.problem.describe().c_str(), s.origin.c_str());
      return 0;
    }
    const Clock::time_point start = Clock::now();
    gpu::Stream stream;
    const Stream_t s = stream.get();
    parity::gpu::blas::Handle h = nullptr;
    if (parity::gpu::blas::create(&h) != parity::gpu::blas::kSuccess)
      throw gpu::GpuError("cannot create the BLAS handle");
    const std::size_t workspace_bytes = std::size_t{32} << 20;
    gpu::DeviceBuffer<std::byte> workspace(workspace_bytes, "workspace");
    Operands ops;
    std::ofstream out(o.out);
    if (!out) throw parity::InputError(fmt::format("--out: cannot write {}", o.out));
    std::fprintf(stdout, "gemm_bench: %s %zu, workspace %zu MiB\n", parity::gpu::blas::kLibrary,
                 gpu::blas_library_version(), workspace_bytes >> 20);
    std::optional<parity::GemmCatalog> catalog;
    double hbm = 0;
    if (!o.catalog.empty()) {
      catalog = parity::load_gemm_catalog(o.catalog);
      const parity::DeviceSpec dev =
          parity::find_device(o.device, std::filesystem::path(o.models).parent_path() / "devices");
      hbm = dev.hbm_bandwidth.value *
            parity::calibration_for(dev, std::filesystem::path(o.models).parent_path())
                .hbm_efficiency;
      if (catalog->library_version != static_cast<std::int64_t>(gpu::blas_library_version()))
        std::printf("gemm_bench: the catalog was measured with %s %lld, this is %zu\n",
                    catalog->library.c_str(), static_cast<long long>(catalog->library_version),
                    gpu::blas_library_version());
    }
    bool out_of_time = false;
    for (GemmType type : o.types) {
      const auto suite = parity::gemm_suite(o.models, type, o.suite);
      // exec_pct: the model's pick, or the heuristic's first where the catalog offers none the
      // library accepts (what the GPU backend runs).
      std::vector<double> first_pct, model_pct, exec_pct, model_err, select_us, rank_corr;
      int model_none = 0;
      int problems = 0, no_kernel = 0, wrong = 0;
      double enum_us_total = 0;
      for (std::size_t pi = 0; pi < suite.size() && !out_of_time; pi += o.every) {
        if (o.limit > 0 && problems >= o.limit) break;
        if (std::chrono::duration<double>(Clock::now() - start).count() > o.budget_s) {
          out_of_time = true;
          break;
        }
        const GemmProblem& p = suite[pi].problem;
        const int e = parity::gemm_operand_bytes(p.type);
        const std::int64_t a_el = stored_elements(p.ta ? p.k : p.m, p.lead_a());
        const std::int64_t b_el = stored_elements(p.tb ? p.n : p.k, p.lead_b());
        const std::int64_t d_el = stored_elements(p.m, p.lead_d());
        grow(ops.a, static_cast<std::size_t>(a_el * e), "A");
        grow(ops.b, static_cast<std::size_t>(b_el * e), "B");
        grow(ops.d, static_cast<std::size_t>(d_el * p.output_bytes()), "D");
        grow(ops.bias, static_cast<std::size_t>(p.n * 4), "bias");
        std::byte* a = ops.a.data() + (p.align_a < 256 ? p.align_a : 0);
        std::byte* b = ops.b.data() + (p.align_b < 256 ? p.align_b : 0);
        std::byte* d = ops.d.data();
        fill_operand(s, a, a_el, p.type, 1);
        fill_operand(s, b, b_el, p.type, 2);
        // The bias is of the output's type.
        const parity::DType bias_type = !p.narrow_output          ? parity::DType::f32
                                        : p.type == GemmType::f16 ? parity::DType::f16
                                                                  : parity::DType::bf16;
        gpu::fill_uniform(s, ops.bias.data(), bias_type, p.n, -1.0f, 1.0f, 2026, 3);

        gpu::BlasOperation op(p);
        if (p.epilogue == parity::GemmEpilogue::bias ||
            p.epilogue == parity::GemmEpilogue::relu_bias)
          op.set_bias(ops.bias.data());
        const Clock::time_point w0 = Clock::now();
        const auto heur = gpu::heuristic_kernels(h, op, workspace_bytes, o.heuristic);
        const double heur_us = std::chrono::duration<double, std::micro>(Clock::now() - w0).count();
        gpu::EnumerateStats st;
        const Clock::time_point w1 = Clock::now();
        const auto all = gpu::enumerate_kernels(h, op, workspace_bytes, {}, &st);
        const double enum_us = std::chrono::duration<double, std::micro>(Clock::now() - w1).count();
        enum_us_total += enum_us;
        ++problems;
        nlohmann::json row = {{"origin", suite[pi].origin},
                              {"problem", problem_json(p)},
                              {"describe", p.describe()},
                              {"algorithms", st.algorithms},
                              {"checked", st.checked},
                              {"accepted", st.accepted},
                              {"enumerate_us", enum_us},
                              {"heuristic_us", heur_us},
                              {"heuristic", nlohmann::json::array()}};
        for (const auto& k : heur) row["heuristic"].push_back(k.kernel.key());
        if (heur.empty()) {
          ++no_kernel;
          out << row.dump() << "\n";
          continue;
        }
        // What is timed: the heuristic's answers, then a seeded sample of the rest.
        std::vector<const gpu::LibraryKernel*> timed;
        std::map<std::string, int> rank;
        for (std::size_t i = 0; i < heur.size(); ++i) {
          rank.emplace(heur[i].kernel.key(), static_cast<int>(i));
          timed.push_back(&heur[i]);
        }
        std::vector<const gpu::LibraryKernel*> rest;
        for (const auto& k : all)
          if (!rank.count(k.kernel.key())) rest.push_back(&k);
        const bool timed_all = static_cast<int>(rest.size()) <= o.all_below;
        if (!timed_all) {
          std::mt19937_64 rng(o.seed + pi);
          std::shuffle(rest.begin(), rest.end(), rng);
          rest.resize(std::min(rest.size(), static_cast<std::size_t>(std::max(o.sample, 0))));
        }
        timed.insert(timed.end(), rest.begin(), rest.end());
        row["timed_all"] = timed_all;
        // The model's first three configurations the library accepts here, timed too.
        std::vector<gpu::LibraryKernel> picks;
        std::map<std::string, double> predicted;
        std::map<std::string, int> model_rank;
        if (catalog) {
          const Clock::time_point w2 = Clock::now();
          const auto ranked = parity::rank_gemm_kernels(p, *catalog, hbm);
          const double sel = std::chrono::duration<double, std::micro>(Clock::now() - w2).count();
          select_us.push_back(sel);
          row["selection_us"] = sel;
          int refused = 0;
          for (const auto& e : ranked) {
            predicted.emplace(e.kernel.key(), e.seconds * 1e6);
            if (picks.size() >= 3) continue;
            GemmKernel k = e.kernel;
            parity::gpu::blas::Algo algo{};
            if (gpu::configure(h, op, workspace_bytes, k, algo, nullptr))
              picks.push_back({k, algo});
            else if (picks.empty())
              ++refused;
          }
          row["model_refused_before_pick"] = refused;
          if (picks.empty()) ++model_none;
          std::set<std::string> have;
          for (const auto* k : timed) have.insert(k->kernel.key());
          for (std::size_t i = 0; i < picks.size(); ++i) {
            model_rank.emplace(picks[i].kernel.key(), static_cast<int>(i));
            if (!have.count(picks[i].kernel.key())) timed.push_back(&picks[i]);
          }
        }

        std::vector<float> ref;
        double best_us = 1e30, first_us = 0;
        nlohmann::json cands = nlohmann::json::array();
        for (std::size_t ci = 0; ci < timed.size(); ++ci) {
          const gpu::LibraryKernel& k = *timed[ci];
          nlohmann::json c = kernel_json(k.kernel);
          const auto it = rank.find(k.kernel.key());
          c["heuristic_rank"] = it == rank.end() ? -1 : it->second;
          if (const auto mr = model_rank.find(k.kernel.key()); mr != model_rank.end())
            c["model_rank"] = mr->second;
          if (const auto pr = predicted.find(k.kernel.key()); pr != predicted.end())
            c["predicted_us"] = pr->second;
          auto launch = [&] {
            return gpu::run_kernel(h, op, k.algo, a, b, d, 0.0f, workspace.data(), workspace_bytes,
                                   s);
          };
          // Poisoned first, so a configuration that writes nothing is caught.
          gpu::check(
              gpu::memset_async(d, 0xff, static_cast<std::size_t>(d_el * p.output_bytes()), s),
              "poison D");
          if (launch() != parity::gpu::blas::kSuccess) {
            c["error"] = "launch refused";
            cands.push_back(c);
            continue;
          }
          stream.synchronize();
          const std::vector<float> got = sample_output(p, d);
          if (ci == 0) ref = got;
          const double err = sample_error(got, ref);
          c["error_rel_rms"] = err;
          // Far beyond any rounding difference between two ways of summing (fp8 and 16-bit
          // outputs round to 2^-8 .. 2^-3 of the values).
          if (err > 0.05) {
            ++wrong;
            c["wrong"] = true;
            cands.push_back(c);
            continue;
          }
          const double us = gpu::time_kernel_us(h, op, k.algo, a, b, d, workspace.data(),
                                                workspace_bytes, s, o.target_ms);
          c["us"] = us;
          best_us = std::min(best_us, us);
          if (ci == 0) first_us = us;
          cands.push_back(c);
        }
        row["candidates"] = cands;
        row["first_us"] = first_us;
        row["best_us"] = best_us;
        out << row.dump() << "\n";
        out.flush();
        if (first_us > 0) first_pct.push_back(best_us / first_us);
        // The model's pick against the best timed, its predicted time against its measured one,
        // and the rank correlation of predicted and measured times over the timed configurations.
        std::vector<std::pair<double, double>> pm;
        for (const auto& c : cands) {
          if (!c.contains("us") || !c.contains("predicted_us")) continue;
          pm.emplace_back(c["predicted_us"].get<double>(), c["us"].get<double>());
          if (c.contains("model_rank") && c["model_rank"].get<int>() == 0) {
            model_pct.push_back(best_us / c["us"].get<double>());
            exec_pct.push_back(best_us / c["us"].get<double>());
            model_err.push_back(c["predicted_us"].get<double>() / c["us"].get<double>());
          }
        }
        if (pm.size() >= 3) rank_corr.push_back(spearman(pm));
        if (catalog && picks.empty() && first_us > 0) exec_pct.push_back(best_us / first_us);
      }
      double lg = 0, worst = 1;
      for (double v : first_pct) {
        lg += std::log(v);
        worst = std::min(worst, v);
      }
      std::printf(
          "%s: %d problems (%d without a kernel, %d configurations computing something else), "
          "heuristic's first at %.1f%% of the best timed (geomean), worst %.1f%%; enumeration "
          "%.0f us per problem\n",
          parity::gemm_type_name(type), problems, no_kernel, wrong,
          first_pct.empty() ? 0.0 : 100.0 * std::exp(lg / first_pct.size()), 100.0 * worst,
          problems ? enum_us_total / problems : 0.0);
      if (catalog) {
        double lm = 0, wm = 1, le = 0, rc = 0;
        for (double v : model_pct) {
          lm += std::log(v);
          wm = std::min(wm, v);
        }
        for (double v : model_err) le += std::abs(std::log(v));
        double lx = 0, wx = 1;
        for (double v : exec_pct) {
          lx += std::log(v);
          wx = std::min(wx, v);
        }
        for (double v : rank_corr) rc += v;
        std::sort(select_us.begin(), select_us.end());
        std::printf(
            "%s: the model's pick at %.1f%% of the best timed (geomean), worst %.1f%% (%zu "
            "problems, %d with no configuration the library accepted); its predicted time off "
            "by %.1f%% (geomean); rank correlation %.3f (mean); selection %.1f us median, %.1f "
            "largest\n",
            parity::gemm_type_name(type),
            model_pct.empty() ? 0.0 : 100.0 * std::exp(lm / model_pct.size()), 100.0 * wm,
            model_pct.size(), model_none,
            model_err.empty() ? 0.0 : 100.0 * (std::exp(le / model_err.size()) - 1.0),
            rank_corr.empty() ? 0.0 : rc / rank_corr.size(),
            select_us.empty() ? 0.0 : select_us[select_us.size() / 2],
            select_us.empty() ? 0.0 : select_us.back());
        std::printf(
            "%s: as the backend runs it (the heuristic's first where the catalog offers none): "
            "%.1f%% of the best timed (geomean), worst %.1f%% (%zu problems)\n",
            parity::gemm_type_name(type),
            exec_pct.empty() ? 0.0 : 100.0 * std::exp(lx / exec_pct.size()), 100.0 * wx,
            exec_pct.size());
      }
      std::fflush(stdout);
    }
    if (out_of_time) std::printf("gemm_bench: stopped at --budget-s %.0f\n", o.budget_s);
    (void)parity::gpu::blas::destroy(h);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
}
