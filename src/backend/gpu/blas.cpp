// The cuBLASLt (hipBLASLt) wrapper: row-major products through a column-major library, with plans
// cached per shape (see blas.h for why).
#include "backend/gpu/blas.h"

#include <fmt/format.h>

#include <cstring>
#include <unordered_map>
#include <utility>

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

void check_blas(blas::Status st, const char* what, const PlanKey* key = nullptr) {
  if (st == blas::kSuccess) return;
  throw GpuError(fmt::format("{} {}: {} ({}){}", blas::kLibrary, what, blas::status_name(st),
                             blas::status_code(st),
                             key != nullptr ? "; product " + describe(*key) : std::string()));
}

// One cached product: descriptor, layouts (the library's A is our B and vice versa) and algorithm.
struct Plan {
  blas::MatmulDesc desc = nullptr;
  blas::Layout la = nullptr, lb = nullptr, ld = nullptr, lc = nullptr;
  blas::Heuristic algo{};
  bool fused = true;  // the epilogue runs in the product (else in a kernel after it)

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (la != nullptr) (void)blas::layout_destroy(la);
    if (lb != nullptr) (void)blas::layout_destroy(lb);
    if (ld != nullptr) (void)blas::layout_destroy(ld);
    if (lc != nullptr) (void)blas::layout_destroy(lc);
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
  blas::Handle handle = nullptr;
  DeviceBuffer<std::byte> workspace;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  std::int64_t fallbacks = 0;

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
    return *plans.emplace(key, std::move(p)).first->second;
  }

  std::unique_ptr<Plan> build(const PlanKey& key, Epilogue epilogue) {
    auto p = std::make_unique<Plan>();
    const blas::DataType operand = key.math == GemmMath::bf16 ? blas::kBf16 : blas::kF32;
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
    // Our B stored row-major is, column-major, [n, k] (not transposed) or [k, n] (transposed).
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    check_blas(key.tb ? blas::layout_create(&p->la, operand, u(key.k), u(key.n), key.ldb)
                      : blas::layout_create(&p->la, operand, u(key.n), u(key.k), key.ldb),
               "layout of B", &key);
    check_blas(key.ta ? blas::layout_create(&p->lb, operand, u(key.m), u(key.k), key.lda)
                      : blas::layout_create(&p->lb, operand, u(key.k), u(key.m), key.lda),
               "layout of A", &key);
    const blas::DataType out = key.d_bf16 ? blas::kBf16 : blas::kF32;
    check_blas(blas::layout_create(&p->ld, out, u(key.n), u(key.m), key.ldd), "layout of D", &key);
    check_blas(blas::layout_create(&p->lc, out, u(key.n), u(key.m), key.ldc), "layout of C", &key);

    blas::Preference pref = nullptr;
    check_blas(blas::pref_create(&pref), "preference", &key);
    struct PrefGuard {
      blas::Preference p;
      ~PrefGuard() { (void)blas::pref_destroy(p); }
    } guard{pref};
    check_blas(blas::pref_set_workspace(pref, workspace.bytes()), "workspace preference", &key);
    if constexpr (blas::kHasAlignmentPreferences) {
      check_blas(blas::pref_set_alignment(pref, 0, key.align_b), "alignment preference", &key);
      check_blas(blas::pref_set_alignment(pref, 1, key.align_a), "alignment preference", &key);
      check_blas(blas::pref_set_alignment(pref, 2, key.align_c), "alignment preference", &key);
      check_blas(blas::pref_set_alignment(pref, 3, key.align_d), "alignment preference", &key);
    }
    if constexpr (blas::kHasReductionSchemeMask) {
      check_blas(blas::pref_set_reduction_mask(pref, blas::kDeterministicReductions),
                 "reduction preference", &key);
    }
    int found = 0;
    check_blas(
        blas::heuristic(handle, p->desc, p->la, p->lb, p->lc, p->ld, pref, 1, &p->algo, &found),
        "algorithm heuristic", &key);
    if (found < 1) {
      throw GpuError(fmt::format(
          "{} has no algorithm for the product {} (epilogue {}); this shape/alignment is not "
          "supported by the library on this device",
          blas::kLibrary, describe(key), static_cast<int>(epilogue)));
    }
    return p;
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
  const PlanKey key{math,
                    bias_aligned ? g.epilogue : Epilogue::none,
                    g.a.transposed,
                    g.b.transposed,
                    g.d_bf16,
                    g.m,
                    g.n,
                    g.k,
                    g.a.ld,
                    g.b.ld,
                    g.ldd,
                    own_c ? g.ldc : g.ldd,
                    alignment_of(g.a.data),
                    alignment_of(g.b.data),
                    alignment_of(g.d),
                    alignment_of(own_c ? g.c : g.d)};
  Plan& p = impl_->plan_for(key);
  if (rehearsing()) return;  // planned, not enqueued (RehearsalScope)
  const bool fused = p.fused && key.epilogue == g.epilogue;
  if (fused && has_bias(g.epilogue))
    check_blas(blas::desc_set_bias(p.desc, g.bias), "bias pointer", &key);
  const float alpha = 1.0f;
  const float beta = g.beta;
  check_blas(blas::matmul(impl_->handle, p.desc, &alpha, g.b.data, p.la, g.a.data, p.lb, &beta,
                          own_c ? g.c : g.d, p.lc, g.d, p.ld, p.algo, impl_->workspace.data(),
                          impl_->workspace.bytes(), s),
             "matmul", &key);
  if (!fused && g.epilogue != Epilogue::none)
    gemm_epilogue(s, d, 1.0f, has_bias(g.epilogue) ? g.bias : nullptr, relu);
}

std::int64_t Blas::epilogue_fallbacks() const {
  return impl_->fallbacks;
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
void Blas::gemm(Stream_t, GemmMath, const GemmArgs&) {
  throw GpuError("gemm: hipBLASLt is not available in this build");
}

#endif

}  // namespace parity::gpu
