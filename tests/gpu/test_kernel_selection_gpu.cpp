// Kernel selection on the GPU: the library's configurations, enumerated and rebuilt from their
// descriptions, compute the product (against the CPU reference); the backend runs the kernel
// catalog's choice, and a choice the library refuses falls back to its heuristic, counted; a
// plan's decision runs its first configuration the library accepts, before any ranking.
#include <gtest/gtest.h>

#include "backend/gpu/blas_kernels.h"
#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

// The linear forward's kind of product under fp32 math: y = x · wᵀ + bias, fp32 out.
GemmProblem linear_forward_kind(std::int64_t batch, std::int64_t in, std::int64_t out) {
  GemmProblem p;
  p.m = batch;
  p.n = out;
  p.k = in;
  p.tb = true;
  p.type = GemmType::f32;
  p.epilogue = GemmEpilogue::bias;
  return p;
}

// A catalog whose one group is the linear forward's, holding `kernels` at equal made-up costs.
std::shared_ptr<const GemmCatalog> catalog_of(const std::vector<GemmKernel>& kernels) {
  auto c = std::make_shared<GemmCatalog>();
  c->device = "h200";
  c->library = "test";
  CatalogGroup g;
  g.type = GemmType::f32;
  g.tb = true;
  g.epilogue = GemmEpilogue::bias;
  for (const GemmKernel& k : kernels) {
    CatalogKernel ck;
    ck.kernel = k;
    ck.kernel.waves = 0;
    ck.kernel.workspace_bytes = 0;
    ck.slots = 132;
    ck.fixed_s = 5e-6;
    ck.tile_s = 1e-6;
    ck.kstep_s = 1e-7;
    g.kernels.push_back(ck);
  }
  c->groups.push_back(g);
  return c;
}

// A linear forward's inputs and its CPU reference (ref) with the magnitudes its error is judged
// against (mag).
struct LinearCase {
  Rand rand;
  HostMat x, w, bias, ref, mag;
  LinearCase(std::int64_t batch, std::int64_t in, std::int64_t out, std::uint64_t seed)
      : rand(seed),
        x(HostMat::random(batch, in, 0, rand)),
        w(HostMat::random(out, in, 0, rand, -0.5f, 0.5f)),
        bias(random_vec(out, rand)),
        ref(batch, out, out),
        mag(ref.poisoned()) {
    CpuBackend cpu;
    cpu.linear_forward(x.cview(), w.cview(), bias.v.data(), Activation::none, ref.view());
    const HostMat abias = bias.abs();
    cpu.linear_forward(x.abs().cview(), w.abs().cview(), abias.v.data(), Activation::none,
                       mag.view());
  }
};

// The configurations the library accepts for the linear forward of `c` (fp32, bias fused), in
// the order it enumerates them.
std::vector<LibraryKernel> accepted_kernels(const LinearCase& c, std::int64_t batch,
                                            std::int64_t in, std::int64_t out) {
  GpuBackend probe(DenseMath::fp32);
  const DevMat db(probe, c.bias);
  blas::Handle h = nullptr;
  EXPECT_EQ(blas::create(&h), blas::kSuccess);
  BlasOperation op(linear_forward_kind(batch, in, out));
  op.set_bias(db.data());
  auto kernels = enumerate_kernels(h, op, std::size_t{32} << 20, {});
  (void)blas::destroy(h);
  return kernels;
}

TEST(KernelSelectionGpu, EnumeratedConfigurationsComputeTheProduct) {
  PARITY_REQUIRE_GPU();
  const std::int64_t batch = 300, in = 96, out = 200;
  const LinearCase c(batch, in, out, 41);
  const HostMat &x = c.x, &w = c.w, &bias = c.bias, &ref = c.ref, &mag = c.mag;

  GpuBackend gpu(DenseMath::fp32);
  const DevMat dx(gpu, x), dw(gpu, w), db(gpu, bias);
  const GemmProblem p = linear_forward_kind(batch, in, out);
  blas::Handle h = nullptr;
  ASSERT_EQ(blas::create(&h), blas::kSuccess);
  DeviceBuffer<std::byte> ws(std::size_t{32} << 20, "workspace");
  BlasOperation op(p);
  op.set_bias(db.data());
  EnumerateStats st;
  const auto kernels = enumerate_kernels(h, op, ws.bytes(), {}, &st);
  ASSERT_FALSE(kernels.empty());
  check(device_synchronize(), "uploads");  // the products run on the default stream
  // Every n-th configuration, rebuilt from its description alone.
  const std::size_t stride = std::max<std::size_t>(1, kernels.size() / 24);
  int ran = 0;
  for (std::size_t i = 0; i < kernels.size(); i += stride) {
    GemmKernel k = kernels[i].kernel;
    blas::Algo algo{};
    std::string why;
    ASSERT_TRUE(configure(h, op, ws.bytes(), k, algo, &why))
        << kernels[i].kernel.key() << ": " << why;
    const DevMat dy(gpu, ref.poisoned());
    check(device_synchronize(), "poison");  // uploaded on the backend's stream
    ASSERT_EQ(run_kernel(h, op, algo, dx.data(), dw.data(), dy.data(), 0.0f, ws.data(), ws.bytes(),
                         nullptr),
              blas::kSuccess)
        << k.key();
    check(device_synchronize(), "product");
    expect_close("configuration " + k.key(), dy.download(), ref, mag, tol_for(DenseMath::fp32));
    ++ran;
  }
  (void)blas::destroy(h);
  std::cout << "[ measured ] " << st.accepted << " configurations accepted of " << st.checked
            << " checked over " << st.algorithms << " algorithms; " << ran << " run\n";
}

TEST(KernelSelectionGpu, TheBackendRunsTheCatalogsChoiceOrFallsBack) {
  PARITY_REQUIRE_GPU();
  const std::int64_t batch = 256, in = 64, out = 128;
  const LinearCase c(batch, in, out, 42);
  const HostMat &x = c.x, &w = c.w, &bias = c.bias, &ref = c.ref, &mag = c.mag;

  // A configuration the library accepts for this product: the first it enumerates.
  const auto kernels = accepted_kernels(c, batch, in, out);
  ASSERT_FALSE(kernels.empty());
  const GemmKernel accepted = kernels.back().kernel;
  GemmKernel refused = accepted;
  refused.algo = 99999;  // no such algorithm

  for (const bool good : {true, false}) {
    GpuBackend gpu(DenseMath::fp32);
    gpu.use_gemm_catalog(catalog_of({good ? accepted : refused}), 4e12);
    const DevMat dx(gpu, x), dw(gpu, w), db(gpu, bias), dy(gpu, ref.poisoned());
    gpu.linear_forward(dx.view(), dw.view(), db.data(), Activation::none, dy.view());
    expect_close(good ? "the catalog's choice" : "the heuristic after a refused choice",
                 dy.download(), ref, mag, tol_for(DenseMath::fp32));
    const GemmSelectionCounts n = gpu.gemm_selection_counts();
    EXPECT_EQ(n.ranked, good ? 1 : 0) << accepted.key();
    EXPECT_EQ(n.heuristic, good ? 0 : 1);
    EXPECT_EQ(n.planned, 0);
  }
}

TEST(KernelSelectionGpu, ThePlansDecisionRunsItsFirstAcceptedConfiguration) {
  PARITY_REQUIRE_GPU();
  const std::int64_t batch = 256, in = 64, out = 128;
  const LinearCase c(batch, in, out, 43);
  const HostMat &x = c.x, &w = c.w, &bias = c.bias, &ref = c.ref, &mag = c.mag;

  // Two configurations the library accepts for this product, and one it cannot have.
  const auto kernels = accepted_kernels(c, batch, in, out);
  ASSERT_GE(kernels.size(), 2u);
  const std::vector<GemmKernel> accepted = {kernels.front().kernel, kernels.back().kernel};
  GemmKernel refused = accepted[0];
  refused.algo = 99999;  // no such algorithm

  struct Case {
    std::vector<GemmKernel> ranked;  // the plan's decision
    GemmSelectionCounts expected;
  };
  const Case cases[] = {
      {{refused, accepted[1]}, {1, 0, 0}},  // the plan's next after a refusal
      {{refused}, {0, 1, 0}},               // none runs: the catalog's ranking
  };
  for (const Case& k : cases) {
    GpuBackend gpu(DenseMath::fp32);
    GemmDecision d{"layer forward", linear_forward_kind(batch, in, out), k.ranked};
    // The catalog holds only the first accepted configuration.
    gpu.use_gemm_catalog(catalog_of({accepted[0]}), 4e12, {d});
    const DevMat dx(gpu, x), dw(gpu, w), db(gpu, bias), dy(gpu, ref.poisoned());
    gpu.linear_forward(dx.view(), dw.view(), db.data(), Activation::none, dy.view());
    expect_close("the plan's decision", dy.download(), ref, mag, tol_for(DenseMath::fp32));
    const GemmSelectionCounts n = gpu.gemm_selection_counts();
    EXPECT_EQ(n.planned, k.expected.planned);
    EXPECT_EQ(n.ranked, k.expected.ranked);
    EXPECT_EQ(n.heuristic, k.expected.heuristic);
  }
}

}  // namespace
}  // namespace parity::gpu::test
