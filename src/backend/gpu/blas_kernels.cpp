// Enumerating, describing and rebuilding the BLAS library's kernel configurations (see
// blas_kernels.h for why).
#include "backend/gpu/blas_kernels.h"

#if PARITY_GPU_HAVE_BLASLT

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "backend/gpu/runtime.h"

namespace parity::gpu {
namespace {

void check(blas::Status st, const char* what, const GemmProblem& p) {
  if (st == blas::kSuccess) return;
  throw GpuError(fmt::format("{} {}: {} ({}); product {}", blas::kLibrary, what,
                             blas::status_name(st), blas::status_code(st), p.describe()));
}

blas::EpilogueKind epilogue_kind(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none:
      return blas::kEpilogueDefault;
    case GemmEpilogue::relu:
      return blas::kEpilogueRelu;
    case GemmEpilogue::bias:
      return blas::kEpilogueBias;
    case GemmEpilogue::relu_bias:
      return blas::kEpilogueReluBias;
  }
  return blas::kEpilogueDefault;
}

// The library's ids and the sizes they stand for (cuBLASLt; empty where the library has no
// configuration fields).
struct IdSize {
  std::uint32_t id;
  int first, second;
};
#if defined(PARITY_GPU_HIP)
constexpr IdSize kTiles[] = {{0, 0, 0}};
constexpr IdSize kStages[] = {{0, 0, 0}};
constexpr IdSize kClusters[] = {{0, 0, 0}};
#else
#include "backend/gpu/blas_ids_cuda.inc"
constexpr IdSize kTiles[] = {PARITY_BLAS_TILES};
constexpr IdSize kStages[] = {PARITY_BLAS_STAGES};
constexpr IdSize kClusters[] = {PARITY_BLAS_CLUSTERS};
#endif

template <std::size_t N>
IdSize size_of_id(const IdSize (&table)[N], std::int64_t id) {
  for (const IdSize& e : table)
    if (e.id == id) return e;
  return {static_cast<std::uint32_t>(id), 0, 0};
}
// The id of a size; 0 (undefined / automatic) when the table has none.
template <std::size_t N>
std::uint32_t id_of_size(const IdSize (&table)[N], int first, int second) {
  if (first == 0 && second == 0) return 0;
  for (const IdSize& e : table)
    if (e.first == first && e.second == second) return e.id;
  return 0;
}

SplitReduction reduction_of(std::int64_t scheme) {
  if (scheme == blas::kReductionInPlace) return SplitReduction::in_place;
  if (scheme == blas::kReductionComputeType) return SplitReduction::compute_type;
  if (scheme == blas::kReductionOutputType) return SplitReduction::output_type;
  return SplitReduction::none;
}
std::uint32_t scheme_of(SplitReduction r) {
  switch (r) {
    case SplitReduction::none:
      return blas::kReductionNone;
    case SplitReduction::in_place:
      return blas::kReductionInPlace;
    case SplitReduction::compute_type:
      return blas::kReductionComputeType;
    case SplitReduction::output_type:
      return blas::kReductionOutputType;
  }
  return blas::kReductionNone;
}

GemmKernel describe(const blas::Algo& a, const blas::Heuristic* checked) {
  GemmKernel k;
  if constexpr (blas::kHasAlgoConfig) {
    std::int64_t v = 0;
    (void)blas::algo_get(a, blas::AlgoField::id, &v);
    k.algo = static_cast<int>(v);
    (void)blas::algo_get(a, blas::AlgoField::tile, &v);
    // The library's tiles and clusters are of Dᵀ (column-major): its first size runs along our n.
    const IdSize t = size_of_id(kTiles, v);
    k.tile_m = t.second;
    k.tile_n = t.first;
    (void)blas::algo_get(a, blas::AlgoField::stages, &v);
    const IdSize st = size_of_id(kStages, v);
    k.tile_k = st.first;
    k.stages = st.second;
    (void)blas::algo_get(a, blas::AlgoField::cluster, &v);
    const IdSize c = size_of_id(kClusters, v);
    k.cluster_m = c.second;
    k.cluster_n = c.first;
    (void)blas::algo_get(a, blas::AlgoField::split_k, &v);
    k.split_k = std::max<int>(1, static_cast<int>(v));
    (void)blas::algo_get(a, blas::AlgoField::reduction, &v);
    k.reduction = reduction_of(v);
    (void)blas::algo_get(a, blas::AlgoField::swizzle, &v);
    k.swizzle = static_cast<int>(v);
    (void)blas::algo_get(a, blas::AlgoField::custom, &v);
    k.custom = static_cast<int>(v);
    (void)blas::algo_get(a, blas::AlgoField::inner, &v);
    k.inner = static_cast<int>(v);
  } else {
    k.algo = blas::solution_index(a);
  }
  if (checked != nullptr) {
    k.workspace_bytes = static_cast<std::int64_t>(blas::heuristic_workspace(*checked));
    k.waves = blas::heuristic_waves(*checked);
  }
  return k;
}

struct PrefGuard {
  blas::Preference p = nullptr;
  ~PrefGuard() {
    if (p != nullptr) (void)blas::pref_destroy(p);
  }
};

// The deterministic split-K reductions an algorithm offers (mask from its capabilities).
std::vector<SplitReduction> split_reductions(std::int64_t mask) {
  std::vector<SplitReduction> out;
  if (mask & blas::kReductionComputeType) out.push_back(SplitReduction::compute_type);
  if (mask & blas::kReductionOutputType) out.push_back(SplitReduction::output_type);
  return out;
}

}  // namespace

void blas_types(const GemmProblem& p, BlasDescriptors& d) {
  d.compute = p.type == GemmType::tf32 ? blas::kCompute32FFastTf32 : blas::kCompute32F;
  switch (p.type) {
    case GemmType::f32:
    case GemmType::tf32:
      d.operand = blas::kF32;
      break;
    case GemmType::bf16:
      d.operand = blas::kBf16;
      break;
    case GemmType::f16:
      d.operand = blas::kF16;
      break;
    case GemmType::e4m3:
      d.operand = blas::kE4M3;
      break;
  }
  if (p.narrow_output && (p.type == GemmType::f32 || p.type == GemmType::tf32))
    throw GpuError(fmt::format("a 16-bit output needs 16- or 8-bit operands: {}", p.describe()));
  d.output = !p.narrow_output ? blas::kF32 : p.type == GemmType::f16 ? blas::kF16 : blas::kBf16;
}

BlasOperation::BlasOperation(const GemmProblem& p) : p_(p) {
  BlasDescriptors t;
  blas_types(p, t);
  compute_ = t.compute;
  operand_ = t.operand;
  output_ = t.output;
  check(blas::desc_create(&desc_, compute_, blas::kF32), "matmul descriptor", p);
  check(blas::desc_set_transa(desc_, p.tb ? blas::kOpT : blas::kOpN), "transa", p);
  check(blas::desc_set_transb(desc_, p.ta ? blas::kOpT : blas::kOpN), "transb", p);
  check(blas::desc_set_epilogue(desc_, epilogue_kind(p.epilogue)), "epilogue", p);
  if (p.epilogue == GemmEpilogue::bias || p.epilogue == GemmEpilogue::relu_bias)
    check(blas::desc_set_bias_type(desc_, output_), "bias type", p);
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  check(p.tb ? blas::layout_create(&la_, operand_, u(p.k), u(p.n), p.lead_b())
             : blas::layout_create(&la_, operand_, u(p.n), u(p.k), p.lead_b()),
        "layout of B", p);
  check(p.ta ? blas::layout_create(&lb_, operand_, u(p.m), u(p.k), p.lead_a())
             : blas::layout_create(&lb_, operand_, u(p.k), u(p.m), p.lead_a()),
        "layout of A", p);
  check(blas::layout_create(&lc_, output_, u(p.n), u(p.m), p.lead_d()), "layout of C", p);
  check(blas::layout_create(&ld_, output_, u(p.n), u(p.m), p.lead_d()), "layout of D", p);
}

BlasOperation::~BlasOperation() {
  for (blas::Layout l : {la_, lb_, lc_, ld_})
    if (l != nullptr) (void)blas::layout_destroy(l);
  if (desc_ != nullptr) (void)blas::desc_destroy(desc_);
}

void BlasOperation::set_bias(const void* bias) const {
  check(blas::desc_set_bias(desc_, bias), "bias pointer", p_);
}

std::vector<LibraryKernel> heuristic_kernels(blas::Handle h, const BlasOperation& op,
                                             std::size_t workspace_bytes, int count) {
  const GemmProblem& p = op.problem();
  PrefGuard pref;
  check(blas::pref_create(&pref.p), "preference", p);
  check(blas::pref_set_workspace(pref.p, workspace_bytes), "workspace preference", p);
  if constexpr (blas::kHasAlignmentPreferences) {
    check(blas::pref_set_alignment(pref.p, 0, static_cast<std::uint32_t>(p.align_b)), "alignment",
          p);
    check(blas::pref_set_alignment(pref.p, 1, static_cast<std::uint32_t>(p.align_a)), "alignment",
          p);
    check(blas::pref_set_alignment(pref.p, 2, static_cast<std::uint32_t>(p.align_d)), "alignment",
          p);
    check(blas::pref_set_alignment(pref.p, 3, static_cast<std::uint32_t>(p.align_d)), "alignment",
          p);
  }
  if constexpr (blas::kHasReductionSchemeMask)
    check(blas::pref_set_reduction_mask(pref.p, blas::kDeterministicReductions), "reduction", p);
  std::vector<blas::Heuristic> found(static_cast<std::size_t>(std::max(count, 1)));
  int n = 0;
  const blas::Status st = blas::heuristic(h, op.desc(), op.la(), op.lb(), op.lc(), op.ld(), pref.p,
                                          count, found.data(), &n);
  std::vector<LibraryKernel> out;
  if (st != blas::kSuccess) return out;  // no algorithm for the problem
  for (int i = 0; i < n; ++i) out.push_back({describe(found[i].algo, &found[i]), found[i].algo});
  return out;
}

std::vector<LibraryKernel> enumerate_kernels(blas::Handle h, const BlasOperation& op,
                                             std::size_t workspace_bytes,
                                             const EnumerateLimits& limits, EnumerateStats* stats) {
  EnumerateStats local;
  EnumerateStats& s = stats != nullptr ? *stats : local;
  std::vector<LibraryKernel> out;
  const GemmProblem& p = op.problem();
  if constexpr (!blas::kHasAlgoConfig) {
    // hipBLASLt: the heuristic's answers are its enumeration.
    out = heuristic_kernels(h, op, workspace_bytes, 256);
    s.checked = s.accepted = static_cast<std::int64_t>(out.size());
    return out;
  } else {
    int ids[512];
    int n_ids = 0;
    check(blas::algo_ids(h, op.compute(), blas::kF32, op.operand_type(), op.operand_type(),
                         op.output_type(), op.output_type(), static_cast<int>(std::size(ids)), ids,
                         &n_ids),
          "algorithm ids", p);
    s.algorithms = n_ids;
    // Accepts one configuration if the library's check does; true when accepted.
    auto try_config = [&](const blas::Algo& a) {
      ++s.checked;
      blas::Heuristic r{};
      if (blas::algo_check(h, op.desc(), op.la(), op.lb(), op.lc(), op.ld(), a, &r) !=
              blas::kSuccess ||
          blas::heuristic_workspace(r) > workspace_bytes)
        return false;
      ++s.accepted;
      out.push_back({describe(a, &r), a});
      return true;
    };
    std::vector<std::uint32_t> clusters = {0};
    if (limits.cluster_shapes)
      for (auto [m, n] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}})
        clusters.push_back(id_of_size(kClusters, m, n));
    for (int i = 0; i < n_ids; ++i) {
      blas::Algo base{};
      if (blas::algo_init(h, op.compute(), blas::kF32, op.operand_type(), op.operand_type(),
                          op.output_type(), op.output_type(), ids[i], &base) != blas::kSuccess)
        continue;
      // The algorithm's tile and stages ids (one undefined id where it lists none).
      std::vector<std::uint32_t> tiles, stages;
      (void)blas::algo_cap_list(base, blas::AlgoCap::tiles, tiles);
      (void)blas::algo_cap_list(base, blas::AlgoCap::stages, stages);
      if (tiles.empty()) tiles.push_back(0);
      if (stages.empty()) stages.push_back(0);
      std::int64_t split_ok = 0, mask = 0, swizzle_ok = 0, custom_max = 0;
      (void)blas::algo_cap(base, blas::AlgoCap::split_k, &split_ok);
      (void)blas::algo_cap(base, blas::AlgoCap::reduction_mask, &mask);
      (void)blas::algo_cap(base, blas::AlgoCap::swizzle, &swizzle_ok);
      (void)blas::algo_cap(base, blas::AlgoCap::custom_max, &custom_max);
      const std::vector<SplitReduction> reductions = split_reductions(mask);
      for (const std::uint32_t tile : tiles)
        for (const std::uint32_t stage : stages)
          for (std::uint32_t cluster : clusters) {
            if (static_cast<int>(out.size()) >= limits.max_kernels) return out;
            blas::Algo a = base;
            if (blas::algo_set(&a, blas::AlgoField::tile, tile) != blas::kSuccess ||
                blas::algo_set(&a, blas::AlgoField::stages, stage) != blas::kSuccess ||
                blas::algo_set(&a, blas::AlgoField::cluster, cluster) != blas::kSuccess)
              continue;
            if (!try_config(a)) continue;
            const float waves = out.back().kernel.waves;
            for (int c = 1; c <= std::min<std::int64_t>(custom_max, 3); ++c) {
              blas::Algo v = a;
              if (blas::algo_set(&v, blas::AlgoField::custom, c) == blas::kSuccess) try_config(v);
            }
            if (swizzle_ok != 0) {
              blas::Algo v = a;
              if (blas::algo_set(&v, blas::AlgoField::swizzle, 1) == blas::kSuccess) try_config(v);
            }
            // Split-K pays where D's tiles leave the device idle (under two waves).
            if (split_ok == 0 || waves >= 2.0f) continue;
            for (int split : {2, 3, 4, 6, 8, 12, 16, 24, 32}) {
              if (split > limits.max_split_k || p.k / split < 128) break;
              for (SplitReduction red : reductions) {
                blas::Algo v = a;
                if (blas::algo_set(&v, blas::AlgoField::split_k, split) == blas::kSuccess &&
                    blas::algo_set(&v, blas::AlgoField::reduction, scheme_of(red)) ==
                        blas::kSuccess)
                  try_config(v);
              }
            }
          }
    }
    return out;
  }
}

bool configure(blas::Handle h, const BlasDescriptors& d, std::size_t workspace_bytes,
               GemmKernel& kernel, blas::Algo& algo, std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  const GemmProblem& p = d.problem;
  if constexpr (!blas::kHasAlgoConfig) {
    // hipBLASLt: the kernel is found again among the heuristic's answers by its index.
    BlasOperation op(p);
    for (const LibraryKernel& k : heuristic_kernels(h, op, workspace_bytes, 256))
      if (k.kernel.algo == kernel.algo) {
        algo = k.algo;
        kernel.workspace_bytes = k.kernel.workspace_bytes;
        return true;
      }
    return fail(
        fmt::format("{} offers no solution {} for {}", blas::kLibrary, kernel.algo, p.describe()));
  } else {
    if (blas::algo_init(h, d.compute, blas::kF32, d.operand, d.operand, d.output, d.output,
                        kernel.algo, &algo) != blas::kSuccess)
      return fail(fmt::format("{} has no algorithm {} for the types of {}", blas::kLibrary,
                              kernel.algo, p.describe()));
    const std::uint32_t tile = id_of_size(kTiles, kernel.tile_n, kernel.tile_m);
    const std::uint32_t stages = id_of_size(kStages, kernel.tile_k, kernel.stages);
    const std::uint32_t cluster = id_of_size(kClusters, kernel.cluster_n, kernel.cluster_m);
    const std::pair<blas::AlgoField, std::int64_t> fields[] = {
        {blas::AlgoField::tile, tile},
        {blas::AlgoField::stages, stages},
        {blas::AlgoField::cluster, cluster},
        {blas::AlgoField::split_k, kernel.split_k},
        {blas::AlgoField::reduction, scheme_of(kernel.reduction)},
        {blas::AlgoField::swizzle, kernel.swizzle},
        {blas::AlgoField::custom, kernel.custom},
        {blas::AlgoField::inner, kernel.inner}};
    for (const auto& [field, value] : fields)
      if (blas::algo_set(&algo, field, value) != blas::kSuccess)
        return fail(fmt::format("{} refuses the configuration {}", blas::kLibrary, kernel.key()));
    if (const std::string back = describe(algo, nullptr).key(); back != kernel.key())
      return fail(
          fmt::format("{} holds {} where {} was asked for", blas::kLibrary, back, kernel.key()));
    blas::Heuristic r{};
    const blas::Status st = blas::algo_check(h, d.desc, d.la, d.lb, d.lc, d.ld, algo, &r);
    if (st != blas::kSuccess)
      return fail(fmt::format("{} rejects {} for {}: {}", blas::kLibrary, kernel.key(),
                              p.describe(), blas::status_name(st)));
    if (blas::heuristic_workspace(r) > workspace_bytes)
      return fail(fmt::format("{} for {} needs {} bytes of workspace, {} available", kernel.key(),
                              p.describe(), blas::heuristic_workspace(r), workspace_bytes));
    kernel.workspace_bytes = static_cast<std::int64_t>(blas::heuristic_workspace(r));
    kernel.waves = blas::heuristic_waves(r);
    return true;
  }
}

blas::Status run_kernel(blas::Handle h, const BlasOperation& op, const blas::Algo& algo,
                        const void* a, const void* b, void* d, float beta, void* workspace,
                        std::size_t workspace_bytes, Stream_t s) {
  const float alpha = 1.0f;
  blas::Heuristic chosen{};
  chosen.algo = algo;
  return blas::matmul(h, op.desc(), &alpha, b, op.la(), a, op.lb(), &beta, d, op.lc(), d, op.ld(),
                      chosen, workspace, workspace_bytes, s);
}

KernelCaps kernel_caps(const blas::Algo& algo) {
  KernelCaps c;
  std::int64_t split = 0, mask = 0, a = 0, b = 0, d = 0;
  if (blas::algo_cap(algo, blas::AlgoCap::split_k, &split) == blas::kSuccess && split != 0 &&
      blas::algo_cap(algo, blas::AlgoCap::reduction_mask, &mask) == blas::kSuccess) {
    const std::vector<SplitReduction> r = split_reductions(mask);
    // The compute-type scheme keeps the partial sums in fp32 (the output-type one rounds them
    // to a 16-bit output's type).
    if (!r.empty()) {
      c.max_split_k = 32;
      c.split_reduction = r.front();
    }
  }
  // The library's A is our B.
  if (blas::algo_cap(algo, blas::AlgoCap::min_align_a, &b) == blas::kSuccess)
    c.min_align_b = static_cast<int>(b);
  if (blas::algo_cap(algo, blas::AlgoCap::min_align_b, &a) == blas::kSuccess)
    c.min_align_a = static_cast<int>(a);
  if (blas::algo_cap(algo, blas::AlgoCap::min_align_d, &d) == blas::kSuccess)
    c.min_align_d = static_cast<int>(d);
  return c;
}

double time_kernel_us(blas::Handle h, const BlasOperation& op, const blas::Algo& algo,
                      const void* a, const void* b, void* d, void* workspace,
                      std::size_t workspace_bytes, Stream_t s, double target_ms) {
  auto launch = [&] {
    return run_kernel(h, op, algo, a, b, d, 0.0f, workspace, workspace_bytes, s);
  };
  if (launch() != blas::kSuccess) return -1.0;
  Event t0, t1;
  t0.record(s);
  (void)launch();
  t1.record(s);
  const double one_ms = Event::elapsed_ms(t0, t1);
  const int reps = std::clamp(static_cast<int>(target_ms / std::max(one_ms, 1e-3)), 3, 200);
  t0.record(s);
  for (int r = 0; r < reps; ++r) (void)launch();
  t1.record(s);
  return 1e3 * Event::elapsed_ms(t0, t1) / reps;
}

std::size_t blas_library_version() {
  return blas::library_version();
}

}  // namespace parity::gpu

#endif  // PARITY_GPU_HAVE_BLASLT
