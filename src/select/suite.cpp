// The kernel-selection suite (see suite.h).
#include "select/suite.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <tuple>

#include "parity/spec.h"

namespace parity {
namespace {

bool narrow_types(GemmType t) {
  return t == GemmType::bf16 || t == GemmType::f16 || t == GemmType::e4m3;
}

// A linear layer y = x Wᵀ (+ bias) with W [out, in], as the engine computes it: forward (y in the
// operands' 16-bit type under a 16-bit math, bias fused), input gradient dx = dy W (fp32) and
// weight gradient dW = dyᵀ x (fp32, k = the batch).
void add_linear(std::vector<SuiteProblem>& out, const std::string& origin, std::int64_t rows,
                std::int64_t in, std::int64_t outs, GemmType t, bool first_layer) {
  GemmProblem f;
  f.m = rows;
  f.n = outs;
  f.k = in;
  f.tb = true;
  f.type = t;
  f.narrow_output = narrow_types(t);
  f.epilogue = GemmEpilogue::bias;
  out.push_back({origin + " forward", f});
  if (t == GemmType::e4m3) return;  // fp8: the tensor cores take A · Bᵀ only
  if (!first_layer) {
    GemmProblem d;
    d.m = rows;
    d.n = in;
    d.k = outs;
    d.type = t;
    out.push_back({origin + " dgrad", d});
  }
  GemmProblem w;
  w.m = outs;
  w.n = in;
  w.k = rows;
  w.ta = true;
  w.type = t;
  out.push_back({origin + " wgrad", w});
}

void add_model(std::vector<SuiteProblem>& out, const ModelSpec& m, GemmType t,
               const SuiteOptions& o) {
  if (m.kind == ModelKind::hstu) {
    const HstuSpec& h = *m.hstu;
    const std::int64_t d = h.model_dim, hv = static_cast<std::int64_t>(h.heads) * h.value_dim;
    const std::int64_t proj = 2 * hv + 2 * static_cast<std::int64_t>(h.heads) * h.attention_dim;
    for (const std::int64_t tokens : o.tokens) {
      add_linear(out, fmt::format("{} uvqk t{}", m.name, tokens), tokens, d, proj, t, false);
      add_linear(out, fmt::format("{} output t{}", m.name, tokens), tokens, hv, d, t, false);
    }
    return;
  }
  for (const std::int64_t b : o.batches) {
    int in = m.dense_features;
    for (std::size_t i = 0; i < m.bottom_mlp.size(); ++i) {
      add_linear(out, fmt::format("{} bottom.{} b{}", m.name, i, b), b, in, m.bottom_mlp[i], t,
                 i == 0);
      in = m.bottom_mlp[i];
    }
    if (m.interaction.kind == InteractionKind::dcnv2) {
      const std::int64_t n = m.interaction_input_dim(), r = m.interaction.low_rank;
      add_linear(out, fmt::format("{} cross.v b{}", m.name, b), b, n, r, t, false);
      add_linear(out, fmt::format("{} cross.u b{}", m.name, b), b, r, n, t, false);
    }
    in = m.interaction_output_dim();
    for (std::size_t i = 0; i < m.top_mlp.size(); ++i) {
      add_linear(out, fmt::format("{} top.{} b{}", m.name, i, b), b, in, m.top_mlp[i], t, false);
      in = m.top_mlp[i];
    }
  }
}

// Random shapes: sizes log-uniform in [8, 32768] (at most 2^36 multiply-adds), any transposes,
// and a third of them with leading dimensions padded by an odd count (rows not 16-byte aligned).
void add_random(std::vector<SuiteProblem>& out, GemmType t, const SuiteOptions& o) {
  std::mt19937_64 rng(o.seed ^ (static_cast<std::uint64_t>(t) * 0x9e3779b97f4a7c15ULL));
  std::uniform_real_distribution<double> lg(std::log(8.0), std::log(32768.0));
  std::uniform_int_distribution<int> coin(0, 1), third(0, 2), pad(1, 7);
  for (int i = 0; i < o.random;) {
    GemmProblem p;
    p.type = t;
    p.m = static_cast<std::int64_t>(std::exp(lg(rng)));
    p.n = static_cast<std::int64_t>(std::exp(lg(rng)));
    p.k = static_cast<std::int64_t>(std::exp(lg(rng)));
    if (static_cast<double>(p.m) * p.n * p.k > std::ldexp(1.0, 36)) continue;
    p.ta = t != GemmType::e4m3 && coin(rng) == 1;
    p.tb = t == GemmType::e4m3 || coin(rng) == 1;
    p.narrow_output = narrow_types(t) && coin(rng) == 1;
    if (third(rng) == 0) {
      p.lda = (p.ta ? p.m : p.k) + pad(rng);
      p.ldb = (p.tb ? p.k : p.n) + pad(rng);
      const int e = gemm_operand_bytes(t);
      p.align_a = p.align_b = std::min(256, e);
    }
    out.push_back({fmt::format("random {}", i), p});
    ++i;
  }
}

}  // namespace

std::vector<SuiteProblem> gemm_suite(const std::filesystem::path& models_dir, GemmType type,
                                     const SuiteOptions& o) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(models_dir))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<SuiteProblem> all;
  for (const auto& f : files) add_model(all, load_model_spec(f), type, o);
  add_random(all, type, o);
  // One entry per distinct problem.
  std::vector<SuiteProblem> out;
  std::set<std::string> seen;
  for (SuiteProblem& s : all) {
    const GemmProblem& p = s.problem;
    const std::string key = fmt::format("{} {} {} {} {} {} {} {} {} {}", p.describe(), p.lda, p.ldb,
                                        p.ldd, p.align_a, p.align_b, p.align_d, p.m, p.n, p.k);
    if (seen.insert(key).second) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace parity
