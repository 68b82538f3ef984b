// The cuBLASLt (hipBLASLt) wrapper: row-major products through a column-major library, with plans
// cached per shape (see blas.h for why).
#include "backend/gpu/blas.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <unordered_map>
#include <utility>

#include "backend/gpu/blas_kernels.h"
#include "backend/gpu/blas_port.h"
#include "backend/gpu/convert.h"
#include "backend/gpu/gemm_epilogue.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu {

#if PARITY_GPU_HAVE_BLASLT

namespace {

const char* math_name(GemmMath m) {
  switch (m) {
    case GemmMath::fp32:
      return "fp32";
    case GemmMath::tf32:
      return "tf32";
    case GemmMath::bf16:
      return "bf16";
  }
  return "?";
}

// Largest power of two (up to 256) that divides the address: the alignment the library may assume.
std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a == 0) return 256;
  const std::uintptr_t low = a & (~a + 1);
  return static_cast<std::uint32_t>(low > 256 ? 256 : low);
}

// Everything a plan depends on.
struct PlanKey {
  GemmMath math;
  Epilogue epilogue;
  bool ta, tb;
  bool d_bf16;
  std::int64_t m, n, k, lda, ldb, ldd, ldc;
  std::uint32_t align_a, align_b, align_d, align_c;

  bool operator==(const PlanKey& o) const {
    return math == o.math && epilogue == o.epilogue && ta == o.ta && tb == o.tb &&
           d_bf16 == o.d_bf16 && m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb &&
           ldd == o.ldd && ldc == o.ldc && align_a == o.align_a && align_b == o.align_b &&
           align_d == o.align_d && align_c == o.align_c;
  }
};

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& k) const {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    auto mix = [&h](std::uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(static_cast<std::uint64_t>(k.math) | static_cast<std::uint64_t>(k.epilogue) << 8 |
        static_cast<std::uint64_t>(k.ta) << 16 | static_cast<std::uint64_t>(k.tb) << 17 |
        static_cast<std::uint64_t>(k.d_bf16) << 18);
    for (std::int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldd, k.ldc})
      mix(static_cast<std::uint64_t>(v));
    mix(static_cast<std::uint64_t>(k.align_a) | static_cast<std::uint64_t>(k.align_b) << 16 |
        static_cast<std::uint64_t>(k.align_d) << 32 | static_cast<std::uint64_t>(k.align_c) << 48);
    return static_cast<std::size_t>(h);
  }
};

std::string describe(const PlanKey& k) {
  return fmt::format(
      "D[{}, {}] = {}A · {}B with k = {} (lda {}, ldb {}, ldd {}; alignments {}/{}/{} bytes), math "
      "{}{}",
      k.m, k.n, k.ta ? "transposed " : "", k.tb ? "transposed " : "", k.k, k.lda, k.ldb, k.ldd,
      k.align_a, k.align_b, k.align_d, math_name(k.math), k.d_bf16 ? ", bf16 output" : "");
}

// The shape class of a product: m and k rounded up to the next 2^e or 1.5 x 2^e (from 64 on).
// Products whose rows or depth change from call to call (the token count of jagged sequence
// batches) would otherwise ask the library's heuristic again at every new shape.
std::int64_t bucket_of(std::int64_t x) {
  if (x <= 64) return x;
  std::int64_t p = 64;
  while (p < x) {
    if (p + p / 2 >= x) return p + p / 2;
    p *= 2;
  }
  return p;
}
PlanKey class_of(PlanKey k, Epilogue e) {
  k.epilogue = e;
  k.m = bucket_of(k.m);
  k.k = bucket_of(k.k);
  return k;
}

void check_blas(blas::Status st, const char* what, const PlanKey* key = nullptr) {
  if (st == blas::kSuccess) return;
  throw GpuError(fmt::format("{} {}: {} ({}){}", blas::kLibrary, what, blas::status_name(st),
                             blas::status_code(st),
                             key != nullptr ? "; product " + describe(*key) : std::string()));
}

// The four column-major layouts of one product (the library's A is our B and vice versa).
struct Layouts {
  blas::Layout la = nullptr, lb = nullptr, ld = nullptr, lc = nullptr;
  Layouts() = default;
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
  ~Layouts() {
    if (la != nullptr) (void)blas::layout_destroy(la);
    if (lb != nullptr) (void)blas::layout_destroy(lb);
    if (ld != nullptr) (void)blas::layout_destroy(ld);
    if (lc != nullptr) (void)blas::layout_destroy(lc);
  }
};

// One cached product: descriptor, layouts and algorithm.
struct Plan {
  blas::MatmulDesc desc = nullptr;
  Layouts l;
  blas::Heuristic algo{};
  bool fused = true;        // the epilogue runs in the product (else in a kernel after it)
  bool class_algo = false;  // the algorithm was chosen for the shape class (see Impl::build)
  Epilogue epilogue = Epilogue::none;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (desc != nullptr) (void)blas::desc_destroy(desc);
  }
};

blas::EpilogueKind epilogue_kind(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return blas::kEpilogueDefault;
    case Epilogue::relu:
      return blas::kEpilogueRelu;
    case Epilogue::bias:
      return blas::kEpilogueBias;
    case Epilogue::relu_bias:
      return blas::kEpilogueReluBias;
  }
  return blas::kEpilogueDefault;
}

bool has_bias(Epilogue e) {
  return e == Epilogue::bias || e == Epilogue::relu_bias;
}

}  // namespace

struct Blas::Impl {
  // One shape class: its first shape, whose plan got the heuristic's answer for itself, and the
  // algorithm chosen for the class's rounded-up shape, which every later shape of it shares.
  struct ShapeClass {
    PlanKey first;
    bool has_algo = false;
    blas::Heuristic algo{};
  };
  // At most this many plans are cached: a run whose shapes never repeat rebuilds descriptors
  // (cheap) from its shape classes' algorithms, not the heuristic (not cheap).
  static constexpr std::size_t kMaxPlans = 4096;

  blas::Handle handle = nullptr;
  DeviceBuffer<std::byte> workspace;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  std::unordered_map<PlanKey, ShapeClass, PlanKeyHash> classes;
  std::int64_t fallbacks = 0;
  std::int64_t queries = 0;
  std::shared_ptr<const GemmCatalog> catalog;
  double hbm_bytes_per_s = 0;
  std::unordered_map<std::string, GemmDecision> decisions;  // by decision_key
  GemmSelectionCounts counts;
  std::set<std::string> fallback_said;  // kinds of product whose fallback was printed

  ~Impl() {
    plans.clear();
    if (handle != nullptr) (void)blas::destroy(handle);
  }

  // The plan for key: with the epilogue fused when the library has an algorithm for it, else
  // (counted in fallbacks) a plan without it whose caller applies bias and ReLU in a kernel.
  Plan& plan_for(const PlanKey& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    std::unique_ptr<Plan> p;
    try {
      p = build(key, key.epilogue);
    } catch (const GpuError&) {
      if (key.epilogue == Epilogue::none) throw;
      p = build(key, Epilogue::none);
      p->fused = false;
      ++fallbacks;
    }
    if (plans.size() >= kMaxPlans) plans.clear();
    return *plans.emplace(key, std::move(p)).first->second;
  }

  // The layouts of a product of `key`'s shape (leading dimensions raised to the rows where a
  // shape class rounds them past their matrix's).
  static void make_layouts(const PlanKey& key, Layouts& l) {
    const blas::DataType operand = key.math == GemmMath::bf16 ? blas::kBf16 : blas::kF32;
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    const auto ld = [](std::int64_t ld, std::int64_t rows) { return ld > rows ? ld : rows; };
    // Our B stored row-major is, column-major, [n, k] (not transposed) or [k, n] (transposed).
    check_blas(key.tb ? blas::layout_create(&l.la, operand, u(key.k), u(key.n), ld(key.ldb, key.k))
                      : blas::layout_create(&l.la, operand, u(key.n), u(key.k), ld(key.ldb, key.n)),
               "layout of B", &key);
    check_blas(key.ta ? blas::layout_create(&l.lb, operand, u(key.m), u(key.k), ld(key.lda, key.m))
                      : blas::layout_create(&l.lb, operand, u(key.k), u(key.m), ld(key.lda, key.k)),
               "layout of A", &key);
    const blas::DataType out = key.d_bf16 ? blas::kBf16 : blas::kF32;
    check_blas(blas::layout_create(&l.ld, out, u(key.n), u(key.m), ld(key.ldd, key.n)),
               "layout of D", &key);
    check_blas(blas::layout_create(&l.lc, out, u(key.n), u(key.m), ld(key.ldc, key.n)),
               "layout of C", &key);
  }

  // The heuristic's first algorithm for a product of `shape` under desc; false if it has none.
  bool query(const PlanKey& shape, blas::MatmulDesc desc, blas::Heuristic& algo) {
    ++queries;
    Layouts l;
    make_layouts(shape, l);
    blas::Preference pref = nullptr;
    check_blas(blas::pref_create(&pref), "preference", &shape);
    struct PrefGuard {
      blas::Preference p;
      ~PrefGuard() { (void)blas::pref_destroy(p); }
    } guard{pref};
    check_blas(blas::pref_set_workspace(pref, workspace.bytes()), "workspace preference", &shape);
    if constexpr (blas::kHasAlignmentPreferences) {
      check_blas(blas::pref_set_alignment(pref, 0, shape.align_b), "alignment preference", &shape);
      check_blas(blas::pref_set_alignment(pref, 1, shape.align_a), "alignment preference", &shape);
      check_blas(blas::pref_set_alignment(pref, 2, shape.align_c), "alignment preference", &shape);
      check_blas(blas::pref_set_alignment(pref, 3, shape.align_d), "alignment preference", &shape);
    }
    if constexpr (blas::kHasReductionSchemeMask) {
      check_blas(blas::pref_set_reduction_mask(pref, blas::kDeterministicReductions),
                 "reduction preference", &shape);
    }
    int found = 0;
    check_blas(blas::heuristic(handle, desc, l.la, l.lb, l.lc, l.ld, pref, 1, &algo, &found),
               "algorithm heuristic", &shape);
    return found >= 1;
  }

  // A plan's algorithm: the heuristic's for this shape when it is the first of its class (so a
  // model whose shapes never change gets exactly what it got before classes existed), else the
  // one chosen once for the class's rounded-up shape. Deterministic for a given order of shapes.
  std::unique_ptr<Plan> build(const PlanKey& key, Epilogue epilogue) {
    auto p = std::make_unique<Plan>();
    p->epilogue = epilogue;
    const blas::ComputeType compute =
        key.math == GemmMath::tf32 ? blas::kCompute32FFastTf32 : blas::kCompute32F;
    check_blas(blas::desc_create(&p->desc, compute, blas::kF32), "matmul descriptor", &key);
    // Dᵀ [n, m] = op(B)ᵀ · op(A)ᵀ in column-major terms: the library's A is our B.
    check_blas(blas::desc_set_transa(p->desc, key.tb ? blas::kOpT : blas::kOpN), "transa", &key);
    check_blas(blas::desc_set_transb(p->desc, key.ta ? blas::kOpT : blas::kOpN), "transb", &key);
    check_blas(blas::desc_set_epilogue(p->desc, epilogue_kind(epilogue)), "epilogue", &key);
    if (has_bias(epilogue))
      check_blas(blas::desc_set_bias_type(p->desc, key.d_bf16 ? blas::kBf16 : blas::kF32),
                 "bias type", &key);
    make_layouts(key, p->l);

    if (!decisions.empty() && from_decision(key, epilogue, *p)) return p;
    if (catalog != nullptr) {
      if (from_catalog(key, epilogue, *p)) return p;
    } else if (!decisions.empty()) {
      ++counts.heuristic;
    }
    const PlanKey cls = class_of(key, epilogue);
    auto [it, first] = classes.try_emplace(cls, ShapeClass{key});
    if (!first && !(it->second.first == key)) {
      ShapeClass& c = it->second;
      if (!c.has_algo) c.has_algo = query(cls, p->desc, c.algo);
      if (c.has_algo) {
        p->algo = c.algo;
        p->class_algo = true;
        return p;
      }
    }
    if (!query(key, p->desc, p->algo)) {
      throw GpuError(fmt::format(
          "{} has no algorithm for the product {} (epilogue {}); this shape/alignment is not "
          "supported by the library on this device",
          blas::kLibrary, describe(key), static_cast<int>(epilogue)));
    }
    return p;
  }

  // The product as the selection describes it (the catalog's kinds: operand type, transposes,
  // output type, epilogue).
  static GemmProblem problem_of(const PlanKey& key, Epilogue epilogue) {
    GemmProblem p;
    p.m = key.m;
    p.n = key.n;
    p.k = key.k;
    p.ta = key.ta;
    p.tb = key.tb;
    p.type = key.math == GemmMath::bf16   ? GemmType::bf16
             : key.math == GemmMath::tf32 ? GemmType::tf32
                                          : GemmType::f32;
    p.narrow_output = key.d_bf16;
    p.epilogue = static_cast<GemmEpilogue>(static_cast<int>(epilogue));
    p.lda = key.lda;
    p.ldb = key.ldb;
    p.ldd = key.ldd;
    p.align_a = static_cast<int>(key.align_a);
    p.align_b = static_cast<int>(key.align_b);
    // D's alignment and C's (its address and its rows), the smaller.
    p.align_d = std::min(static_cast<int>(std::min(key.align_d, key.align_c)),
                         operand_alignment(256, key.m, key.n, key.ldc, key.d_bf16 ? 2 : 4));
    return p;
  }

  // The plan's descriptor and layouts, the ones a configuration is checked against and runs with.
  static BlasDescriptors descriptors_of(const GemmProblem& problem, const Plan& plan) {
    BlasDescriptors d;
    d.problem = problem;
    d.desc = plan.desc;
    d.la = plan.l.la;
    d.lb = plan.l.lb;
    d.lc = plan.l.lc;
    d.ld = plan.l.ld;
    blas_types(problem, d);
    return d;
  }

  // Runs `plan` with configuration k if the library accepts it for the product; else false and
  // the library's reason in why.
  bool try_kernel(const BlasDescriptors& d, GemmKernel k, Plan& plan, std::string* why) {
    blas::Algo algo{};
    if (!configure(handle, d, workspace.bytes(), k, algo, why)) return false;
    plan.algo = blas::Heuristic{};
    plan.algo.algo = algo;
    // Not the heuristic's answer for this shape: a matmul the library still refuses asks the
    // heuristic (gemm(), own_algorithm()).
    plan.class_algo = true;
    return true;
  }

  // The plan's decision for a product, where it has one: its first configuration the library
  // accepts. Every one refused is printed with the library's reason; false when none is accepted
  // (the ranking then chooses) or the plan has no decision for this product.
  bool from_decision(const PlanKey& key, Epilogue epilogue, Plan& plan) {
    const GemmProblem problem = problem_of(key, epilogue);
    const auto it = decisions.find(decision_key(problem));
    if (it == decisions.end()) return false;
    const GemmDecision& dec = it->second;
    const BlasDescriptors d = descriptors_of(problem, plan);
    // One line a product: the configurations refused, each with the library's reason.
    std::string refused;
    for (const GemmKernel& k : dec.ranked) {
      std::string why;
      if (try_kernel(d, k, plan, &why)) {
        ++counts.planned;
        if (!refused.empty())
          std::fprintf(stderr,
                       "parity: kernel selection: %s (%s): %s refuses the plan's %s; its next, "
                       "%s, runs\n",
                       dec.op.c_str(), problem.describe().c_str(), blas::kLibrary, refused.c_str(),
                       k.key().c_str());
        return true;
      }
      refused += fmt::format("{}{} ({})", refused.empty() ? "" : ", ", k.key(), why);
    }
    std::fprintf(stderr,
                 "parity: kernel selection: %s (%s): %s refuses all %zu of the plan's "
                 "configurations: %s; the catalog's ranking or the library's heuristic chooses\n",
                 dec.op.c_str(), problem.describe().c_str(), blas::kLibrary, dec.ranked.size(),
                 refused.c_str());
    return false;
  }

  // The catalog's choice for a product: the ranking's first configuration the library accepts
  // (at most kTries asked). False (printed once per kind of product) when none is accepted.
  bool from_catalog(const PlanKey& key, Epilogue epilogue, Plan& plan) {
    static constexpr int kTries = 8;
    const GemmProblem problem = problem_of(key, epilogue);
    const auto ranked = rank_gemm_kernels(problem, *catalog, hbm_bytes_per_s);
    std::string why = ranked.empty() ? "the catalog has no configuration for this kind" : "";
    if (!ranked.empty()) {
      const BlasDescriptors d = descriptors_of(problem, plan);
      for (int i = 0; i < kTries && i < static_cast<int>(ranked.size()); ++i) {
        std::string reason;
        if (try_kernel(d, ranked[static_cast<std::size_t>(i)].kernel, plan, &reason)) {
          ++counts.ranked;
          return true;
        }
        if (why.empty()) why = reason;
      }
    }
    ++counts.heuristic;
    GemmProblem kind = problem;
    kind.m = kind.n = kind.k = 0;
    if (fallback_said.insert(kind.describe()).second)
      std::fprintf(
          stderr, "parity: kernel selection: %s takes the library heuristic's configuration (%s)\n",
          problem.describe().c_str(), why.c_str());
    return false;
  }

  // A class's algorithm the library refuses for one of its shapes: that shape gets its own.
  void own_algorithm(const PlanKey& key, Plan& p) {
    PlanKey shape = key;
    shape.epilogue = p.epilogue;
    if (!query(shape, p.desc, p.algo))
      throw GpuError(
          fmt::format("{} has no algorithm for the product {}", blas::kLibrary, describe(shape)));
    p.class_algo = false;
  }
};

Blas::Blas(std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  check_blas(blas::create(&impl_->handle), "create handle");
  impl_->workspace = DeviceBuffer<std::byte>(workspace_bytes, "BLAS workspace");
}

Blas::~Blas() = default;

std::int64_t Blas::plans() const {
  return static_cast<std::int64_t>(impl_->plans.size());
}

void Blas::gemm(Stream_t s, GemmMath math, const GemmArgs& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0)
    throw Error(fmt::format("gemm: negative shape [{}, {}] x k {}", g.m, g.n, g.k));
  if (g.m == 0 || g.n == 0) return;
  const bool relu = g.epilogue == Epilogue::relu || g.epilogue == Epilogue::relu_bias;
  if (has_bias(g.epilogue) && g.bias == nullptr)
    throw Error("gemm: a bias epilogue without a bias pointer");
  const bool own_c = g.c != nullptr && g.c != g.d && g.beta != 0.0f;
  if (g.d_bf16 && math != GemmMath::bf16) throw Error("gemm: a bf16 output needs bf16 math");
  const AMat d(g.d, g.d_bf16 ? DType::bf16 : DType::f32, g.m, g.n, g.ldd);
  if (g.k == 0) {
    if (g.d_bf16 && g.beta != 0.0f)
      throw Error(
          "gemm: an empty product (k = 0) into a bf16 output with beta != 0 is not supported");
    if (own_c) convert(s, CAMat(g.c, DType::f32, g.m, g.n, g.ldc), d);
    gemm_epilogue(s, d, g.beta, has_bias(g.epilogue) ? g.bias : nullptr, relu);
    return;
  }
  // The library may read the bias with vector loads: a bias that is not 16-byte aligned is
  // added by a kernel after the product instead.
  const bool bias_aligned = !has_bias(g.epilogue) || alignment_of(g.bias) >= 16;
  const int elem = math == GemmMath::bf16 ? 2 : 4;  // the operands' element bytes
  const int out = g.d_bf16 ? 2 : 4;                 // D's and C's
  const PlanKey key{
      math, bias_aligned ? g.epilogue : Epilogue::none, g.a.transposed, g.b.transposed, g.d_bf16,
      g.m, g.n, g.k, g.a.ld, g.b.ld, g.ldd, own_c ? g.ldc : g.ldd,
      // A matrix's alignment is its address's and its rows' (the library may
      // load or store any row with the vectors the preference allows).
      static_cast<std::uint32_t>(
          operand_alignment(static_cast<int>(alignment_of(g.a.data)), g.a.ld, elem)),
      static_cast<std::uint32_t>(
          operand_alignment(static_cast<int>(alignment_of(g.b.data)), g.b.ld, elem)),
      static_cast<std::uint32_t>(
          operand_alignment(static_cast<int>(alignment_of(g.d)), g.ldd, out)),
      static_cast<std::uint32_t>(operand_alignment(
          static_cast<int>(alignment_of(own_c ? g.c : g.d)), own_c ? g.ldc : g.ldd, out))};
  Plan& p = impl_->plan_for(key);
  if (rehearsing()) return;  // planned, not enqueued (RehearsalScope)
  const bool fused = p.fused && key.epilogue == g.epilogue;
  if (fused && has_bias(g.epilogue))
    check_blas(blas::desc_set_bias(p.desc, g.bias), "bias pointer", &key);
  const float alpha = 1.0f;
  const float beta = g.beta;
  auto run = [&] {
    return blas::matmul(impl_->handle, p.desc, &alpha, g.b.data, p.l.la, g.a.data, p.l.lb, &beta,
                        own_c ? g.c : g.d, p.l.lc, g.d, p.l.ld, p.algo, impl_->workspace.data(),
                        impl_->workspace.bytes(), s);
  };
  blas::Status st = run();
  if (st != blas::kSuccess && p.class_algo) {
    impl_->own_algorithm(key, p);
    st = run();
  }
  check_blas(st, "matmul", &key);
  if (!fused && g.epilogue != Epilogue::none)
    gemm_epilogue(s, d, 1.0f, has_bias(g.epilogue) ? g.bias : nullptr, relu);
}

std::int64_t Blas::epilogue_fallbacks() const {
  return impl_->fallbacks;
}

void Blas::use_catalog(std::shared_ptr<const GemmCatalog> catalog, double hbm_bytes_per_s,
                       std::vector<GemmDecision> decisions) {
  if (catalog != nullptr && !(hbm_bytes_per_s > 0))
    throw Error(fmt::format("kernel catalog {}: the memory rate for its ranking must be above 0",
                            catalog->source_file));
  impl_->catalog = std::move(catalog);
  impl_->hbm_bytes_per_s = hbm_bytes_per_s;
  impl_->decisions.clear();
  for (GemmDecision& d : decisions) {
    std::string k = decision_key(d.problem);
    impl_->decisions.insert_or_assign(std::move(k), std::move(d));
  }
}

GemmSelectionCounts Blas::selection_counts() const {
  return impl_->counts;
}

std::size_t Blas::library_version() {
  return blas::library_version();
}

std::int64_t Blas::heuristic_queries() const {
  return impl_->queries;
}

#else  // no BLASLt library in this build (the HIP compile check without hipBLASLt)

struct Blas::Impl {};

Blas::Blas(std::size_t) {
  throw GpuError(
      "the dense GPU path needs hipBLASLt, which is not available in this build (install "
      "hipblaslt-dev "
      "and rebuild)");
}
Blas::~Blas() = default;
std::int64_t Blas::plans() const {
  return 0;
}
std::int64_t Blas::epilogue_fallbacks() const {
  return 0;
}
std::int64_t Blas::heuristic_queries() const {
  return 0;
}
void Blas::use_catalog(std::shared_ptr<const GemmCatalog>, double, std::vector<GemmDecision>) {}
GemmSelectionCounts Blas::selection_counts() const {
  return {};
}
std::size_t Blas::library_version() {
  return 0;
}
void Blas::gemm(Stream_t, GemmMath, const GemmArgs&) {
  throw GpuError("gemm: hipBLASLt is not available in this build");
}

#endif

}  // namespace parity::gpu
