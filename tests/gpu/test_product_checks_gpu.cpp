// Checksummed products on the GPU (GpuBackend::set_product_checks, product_checks.cu), under fp32
// and bf16 dense math: clean products never fail, and give the values the unchecked products give;
// a flipped high bit of an output element is caught, by bit class, over 1,500 injections into
// random products (linear layers with and without bias and ReLU, cross layers' two products).
// Under bf16 math, on a device that runs it, half the cases take the fused product
// (checked_product.cu), the others the library and the row pass; and the two paths agree.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <optional>

#include "backend/gpu/product_checks.h"
#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

// An activation in the backend's storage type (fp32, or bf16 under bf16 math).
class Act {
 public:
  Act(GpuBackend& gpu, const HostMat& h) {
    if (gpu.activation_dtype() == DType::bf16)
      bf_.emplace(gpu, HostBf16(h));
    else
      f32_.emplace(gpu, h);
  }
  AMat view() const { return bf_ ? bf_->view() : AMat(f32_->view()); }
  HostMat download() const { return bf_ ? bf_->download().to_float() : f32_->download(); }

 private:
  std::optional<DevMat> f32_;
  std::optional<DevBf16> bf_;
};

// A random product: n rows, depth k, m outputs; inputs in [lo, scale] (lo = 0: one sign, as after
// a ReLU), weights in ±1/√k, or in [0, 1/√k] (one sign: every partial sum grows, the mean path
// the bound counts); bias or none; relu or not; a linear layer's or a cross layer's pair (N = k
// features, rank m / 4 + 1).
struct Case {
  std::int64_t n, k, m;
  float scale;
  bool one_sign, bias, relu, cross;
};

Case random_case(Rand& r) {
  Case c{};
  c.n = r.integer(1, 160);
  c.k = r.integer(1, 600);
  c.m = r.integer(1, 300);
  c.scale = std::ldexp(1.0f, static_cast<int>(r.integer(-8, 8)));
  c.one_sign = r.integer(0, 3) == 0;
  c.bias = r.integer(0, 1) == 1;
  c.relu = r.integer(0, 1) == 1;
  c.cross = r.integer(0, 3) == 0;
  if (c.cross) c.m = std::min<std::int64_t>(c.m, 64);
  // Half the cases with depths a multiple of 8, which the fused bf16 product takes (a cross
  // layer's z has depth m / 4 + 1); the others go through the library.
  if (r.integer(0, 1) == 1) {
    c.k = (c.k + 7) / 8 * 8;
    if (c.cross) c.m = 4 * (8 * r.integer(1, 2) - 1);
  }
  return c;
}

struct Outcome {
  std::int64_t products = 0, failures = 0;
  std::string first;
  std::vector<float> out;  // the stored outputs (u then z for a cross layer)
};

Outcome run(GpuBackend& gpu, const Case& c, std::uint64_t seed, bool checks,
            const Backend::ProductFault* fault, std::int64_t* fused = nullptr) {
  gpu.set_product_checks(checks);
  if (fault != nullptr) gpu.inject_product_fault(*fault);
  Rand rand(seed);
  const float lo = c.one_sign ? 0.0f : -c.scale;
  const float wr = 1.0f / std::sqrt(static_cast<float>(c.k));
  const float wlo = c.one_sign ? 0.0f : -wr;
  Outcome o;
  auto append = [&](const HostMat& h) {
    for (std::int64_t i = 0; i < h.rows; ++i)
      for (std::int64_t j = 0; j < h.cols; ++j) o.out.push_back(h.at(i, j));
  };
  if (!c.cross) {
    const HostMat x = HostMat::random(c.n, c.k, 0, rand, lo, c.scale);
    const HostMat w = HostMat::random(c.m, c.k, 1, rand, wlo, wr);
    const HostMat bias = random_vec(c.m, rand, -c.scale, c.scale);
    const Act dx(gpu, x);
    const DevMat dw(gpu, w), db(gpu, bias);
    const Act dy(gpu, HostMat(c.n, c.m, c.m).poisoned());
    gpu.linear_forward(dx.view(), dw.view(), c.bias ? db.data() : nullptr,
                       c.relu ? Activation::relu : Activation::none, dy.view());
    append(dy.download());
  } else {
    const std::int64_t N = c.k, r = c.m / 4 + 1;
    const HostMat x0 = HostMat::random(c.n, N, 0, rand, lo, c.scale);
    const HostMat xl = HostMat::random(c.n, N, 0, rand, lo, c.scale);
    const HostMat v = HostMat::random(r, N, 0, rand, wlo, wr);
    const HostMat w = HostMat::random(N, r, 0, rand, -1.0f, 1.0f);
    const HostMat bias = random_vec(N, rand, -c.scale, c.scale);
    const Act g0(gpu, x0), gl(gpu, xl);
    const DevMat gv(gpu, v), gw(gpu, w), gb(gpu, bias);
    const Act gu(gpu, HostMat(c.n, r, r)), gz(gpu, HostMat(c.n, N, N)), gn(gpu, HostMat(c.n, N, N));
    gpu.cross_forward(g0.view(), gl.view(), gv.view(), gw.view(), c.bias ? gb.data() : nullptr,
                      gu.view(), gz.view(), gn.view());
    append(gu.download());
    append(gz.download());
  }
  if (fused != nullptr) *fused += gpu.fused_checks();
  const Backend::ProductChecks s = gpu.product_checks();
  o.products = s.products;
  o.failures = s.failures;
  o.first = s.first_failure;
  return o;
}

class ProductChecksGpu : public ::testing::TestWithParam<DenseMath> {};

TEST_P(ProductChecksGpu, CleanProductsNeverFailAndGiveTheUncheckedValues) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(GetParam());
  gpu.use_fused_checks(true);  // bf16 products in one kernel where they can (half the cases)
  const bool bf = GetParam() == DenseMath::bf16;
  Rand cases(7);
  std::int64_t products = 0, fused = 0;
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    const Case c = random_case(cases);
    const Outcome checked = run(gpu, c, seed, true, nullptr, &fused);
    EXPECT_EQ(checked.products, c.cross ? 2 : 1);
    EXPECT_EQ(checked.failures, 0) << "seed " << seed << ": " << checked.first;
    products += checked.products;
    const Outcome plain = run(gpu, c, seed, false, nullptr);
    ASSERT_EQ(plain.out.size(), checked.out.size());
    // The library may run another kernel for an fp32 output than for a bf16 one: the values
    // agree to the output's rounding, not always bit for bit.
    // (Under bf16 math the unchecked product adds its bias in bf16; the checked one in fp32.)
    double rms = 0;
    for (const float v : plain.out) rms += static_cast<double>(v) * v;
    rms = std::sqrt(rms / static_cast<double>(std::max<std::size_t>(plain.out.size(), 1)));
    int bad = 0;
    for (std::size_t i = 0; i < plain.out.size(); ++i) {
      const double a = plain.out[i], b = checked.out[i];
      const double tol = (bf ? std::ldexp(1.0, -6) : 1e-5) * (std::fabs(a) + rms);
      if (!(std::fabs(a - b) <= tol) && ++bad <= 3)
        ADD_FAILURE() << "seed " << seed << " [" << i << "]: checked " << b << ", unchecked " << a;
    }
  }
  std::printf("[ measured ] %s: %lld clean products checked (%lld in one kernel), none failed\n",
              std::string(dense_math_name(GetParam())).c_str(), static_cast<long long>(products),
              static_cast<long long>(fused));
}

// The fused bf16 product (one kernel: checked_product.cu) and the library's path with the row
// pass give the same outputs to bf16's rounding, and neither fails a clean product; each catches
// the same planted flips.
TEST(ProductChecksGpuFused, AgreesWithTheLibraryPath) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::bf16);
  if (!gpu::product_check_fused_available()) GTEST_SKIP() << "no fused product on this device";
  Rand cases(17);
  std::int64_t fused = 0, library = 0, caught_fused = 0, caught_library = 0, flips = 0;
  for (std::uint64_t seed = 0; seed < 120; ++seed) {
    Case c = random_case(cases);
    c.k = (c.k + 7) / 8 * 8;
    if (c.cross) c.m = 4 * (8 * static_cast<std::int64_t>(seed % 2 + 1) - 1);
    if (seed % 3 == 0) c.n = 1000 + static_cast<std::int64_t>(seed);  // several row tiles
    // More tiles than multiprocessors: each block of the persistent grid takes several.
    if (seed % 20 == 7) c.n = 40000 + static_cast<std::int64_t>(seed);
    // Deep tiles, which run one a block (checked_product.cu).
    if (seed % 10 == 4) c.k = 1032 + 8 * static_cast<std::int64_t>(seed % 40);
    if (seed % 5 == 0) c.m = 300 + static_cast<std::int64_t>(seed % 7);  // several column tiles
    if (c.cross) c.m = std::min<std::int64_t>(c.m, 60);
    // Outputs whose squares fall below fp32's normal range, which the fused product sums in
    // double (checked_product.cu), as it does the flipped exponents' below.
    if (seed % 20 == 11) c.scale = std::ldexp(1.0f, -70);
    gpu.use_fused_checks(true);
    const Outcome one = run(gpu, c, seed, true, nullptr, &fused);
    gpu.use_fused_checks(false);
    const Outcome lib = run(gpu, c, seed, true, nullptr, &library);
    EXPECT_EQ(one.failures, 0) << "seed " << seed << ": " << one.first;
    EXPECT_EQ(lib.failures, 0) << "seed " << seed << ": " << lib.first;
    ASSERT_EQ(one.out.size(), lib.out.size());
    double rms = 0;
    for (const float v : lib.out) rms += static_cast<double>(v) * v;
    rms = std::sqrt(rms / static_cast<double>(std::max<std::size_t>(lib.out.size(), 1)));
    int bad = 0;
    for (std::size_t i = 0; i < lib.out.size(); ++i) {
      const double a = lib.out[i], b = one.out[i];
      if (!(std::fabs(a - b) <= std::ldexp(1.0, -7) * (std::fabs(a) + rms)) && ++bad <= 3)
        ADD_FAILURE() << "seed " << seed << " [" << i << "]: fused " << b << ", library " << a;
    }
    // A flip of the top exponent bit in the same element, through each path.
    const std::int64_t elements = c.n * (c.cross ? c.m / 4 + 1 : c.m);
    const Backend::ProductFault f{0, static_cast<std::int64_t>(seed * 7919) % elements, 14};
    gpu.use_fused_checks(true);
    caught_fused += run(gpu, c, seed, true, &f).failures > 0;
    gpu.use_fused_checks(false);
    caught_library += run(gpu, c, seed, true, &f).failures > 0;
    ++flips;
  }
  EXPECT_GT(fused, 0);
  EXPECT_EQ(library, 0);
  // A flip that lowers an element small beside its row may hide in the bound, on either path.
  EXPECT_GE(caught_fused, flips * 98 / 100);
  EXPECT_GE(caught_library, flips * 98 / 100);
  std::printf(
      "[ measured ] fused: %lld products in one kernel agree with the library's; flips "
      "caught %lld / %lld of %lld\n",
      static_cast<long long>(fused), static_cast<long long>(caught_fused),
      static_cast<long long>(caught_library), static_cast<long long>(flips));
}

TEST_P(ProductChecksGpu, NonFiniteInputsAreLeftToTheFiniteGuard) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(GetParam());
  gpu.use_fused_checks(true);  // bf16 products in one kernel where they can (half the cases)
  gpu.set_product_checks(true);
  Rand rand(1);
  HostMat x = HostMat::random(2, 3, 0, rand);
  x.at(0, 2) = NAN;
  x.at(1, 1) = INFINITY;
  const HostMat w = HostMat::random(2, 3, 0, rand);
  const Act dx(gpu, x), dy(gpu, HostMat(2, 2, 2));
  const DevMat dw(gpu, w);
  gpu.linear_forward(dx.view(), dw.view(), nullptr, Activation::relu, dy.view());
  EXPECT_EQ(gpu.product_checks().products, 1);
  EXPECT_EQ(gpu.product_checks().failures, 0) << gpu.product_checks().first_failure;
}

TEST_P(ProductChecksGpu, FlippedHighBitsAreCaught) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(GetParam());
  gpu.use_fused_checks(true);  // bf16 products in one kernel where they can (half the cases)
  // Bit classes of a stored element: its sign, its exponent, the top three bits of its mantissa
  // (of an fp32 element, or of a bf16 one where the output is stored so).
  const bool bf = gpu.activation_dtype() == DType::bf16;
  const std::map<std::string, std::vector<int>> classes =
      bf ? std::map<std::string, std::vector<int>>{{"sign", {15}},
                                                   {"exponent", {7, 8, 9, 10, 11, 12, 13, 14}},
                                                   {"high mantissa", {4, 5, 6}}}
         : std::map<std::string, std::vector<int>>{{"sign", {31}},
                                                   {"exponent", {23, 24, 25, 26, 27, 28, 29, 30}},
                                                   {"high mantissa", {20, 21, 22}}};
  std::map<std::string, std::pair<int, int>> caught;  // class: (caught, injected)
  int total = 0, total_caught = 0;
  Rand cases(11), picks(13);
  std::int64_t fused = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    const Case c = random_case(cases);
    const std::string cls = trial % 3 == 0 ? "sign" : trial % 3 == 1 ? "exponent" : "high mantissa";
    const auto& bits = classes.at(cls);
    const int bit = bits[static_cast<std::size_t>(trial / 3) % bits.size()];
    const std::int64_t product = c.cross ? picks.integer(0, 1) : 0;
    const std::int64_t elements =
        product == 0 && c.cross ? c.n * (c.m / 4 + 1) : c.n * (c.cross ? c.k : c.m);
    const Backend::ProductFault f{product, picks.integer(0, elements - 1), bit};
    const Outcome o = run(gpu, c, 50000 + static_cast<std::uint64_t>(trial), true, &f, &fused);
    auto& [got, tried] = caught[cls];
    ++tried;
    ++total;
    if (o.failures > 0) {
      ++got;
      ++total_caught;
    }
  }
  for (const auto& [cls, n] : caught)
    std::printf("[ measured ] %s %-14s %4d of %4d caught (%.2f%%)\n",
                std::string(dense_math_name(GetParam())).c_str(), cls.c_str(), n.first, n.second,
                100.0 * n.first / n.second);
  std::printf("[ measured ] %s: %lld of the %d products in one kernel\n",
              std::string(dense_math_name(GetParam())).c_str(), static_cast<long long>(fused),
              total);
  EXPECT_GE(total_caught, total * 99 / 100) << total_caught << " of " << total;
}

INSTANTIATE_TEST_SUITE_P(Dense, ProductChecksGpu,
                         ::testing::Values(DenseMath::fp32, DenseMath::bf16), math_label);

// A cross layer that feeds a product (cross_feeds_product, as the engine does for the first top
// layer) sums that product's input terms in its combine: the product then reads no input of its
// own. Its outputs are those without the hint, no clean product fails, every planted top-exponent
// flip in it is caught, and a hint that does not match the next product is dropped.
TEST(ProductChecksGpuFused, ACrossLayerFeedsTheNextProductsCheck) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::bf16);
  if (!gpu::product_check_fused_available()) GTEST_SKIP() << "no fused product on this device";
  Rand rand(29);
  const std::int64_t n = 777, N = 96, r = 16, m = 200;
  const HostMat x0 = HostMat::random(n, N, 0, rand, -1.0f, 1.0f);
  const HostMat xl = HostMat::random(n, N, 0, rand, -1.0f, 1.0f);
  const HostMat v = HostMat::random(r, N, 0, rand, -0.1f, 0.1f);
  const HostMat w = HostMat::random(N, r, 0, rand, -0.25f, 0.25f);
  const HostMat top = HostMat::random(m, N, 0, rand, -0.1f, 0.1f);
  const HostMat other = HostMat::random(m, N, 0, rand, -0.1f, 0.1f);
  const HostMat bias = random_vec(N, rand, -0.5f, 0.5f), top_bias = random_vec(m, rand, -1, 1);
  const Act g0(gpu, x0), gl(gpu, xl);
  const DevMat gv(gpu, v), gw(gpu, w), gb(gpu, bias), gt(gpu, top), go(gpu, other),
      gtb(gpu, top_bias);
  const Act gu(gpu, HostMat(n, r, r)), gz(gpu, HostMat(n, N, N)), gn(gpu, HostMat(n, N, N));
  // The layer, then the product it feeds (weights `next`), with or without the hint.
  auto step = [&](bool hint, const DevMat& next, const Backend::ProductFault* fault) {
    gpu.set_product_checks(true);
    if (fault != nullptr) gpu.inject_product_fault(*fault);
    if (hint) gpu.cross_feeds_product(gt.view());
    gpu.cross_forward(g0.view(), gl.view(), gv.view(), gw.view(), gb.data(), gu.view(), gz.view(),
                      gn.view());
    const Act y(gpu, HostMat(n, m, m).poisoned());
    gpu.linear_forward(gn.view(), next.view(), gtb.data(), Activation::relu, y.view());
    std::pair<HostMat, Backend::ProductChecks> out{y.download(), gpu.product_checks()};
    return out;
  };
  const auto [plain, plain_checks] = step(false, gt, nullptr);
  const auto [fed, fed_checks] = step(true, gt, nullptr);
  EXPECT_EQ(plain_checks.failures, 0) << plain_checks.first_failure;
  EXPECT_EQ(fed_checks.failures, 0) << fed_checks.first_failure;
  EXPECT_EQ(fed_checks.products, 3);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < m; ++j) ASSERT_EQ(fed.at(i, j), plain.at(i, j)) << i << ", " << j;
  // A hint for other weights than the product's: dropped, and nothing fails.
  gpu.set_product_checks(true);
  gpu.cross_feeds_product(gt.view());
  gpu.cross_forward(g0.view(), gl.view(), gv.view(), gw.view(), gb.data(), gu.view(), gz.view(),
                    gn.view());
  {
    const Act y(gpu, HostMat(n, m, m).poisoned());
    gpu.linear_forward(gn.view(), go.view(), gtb.data(), Activation::relu, y.view());
    const Backend::ProductChecks c = gpu.product_checks();
    EXPECT_EQ(c.failures, 0) << c.first_failure;
  }
  // Flips of the top exponent bit in the fed product (the third), spread over its elements.
  int caught = 0;
  constexpr int kFlips = 40;
  for (int f = 0; f < kFlips; ++f) {
    const Backend::ProductFault fault{2, (f * 7919 + 13) % (n * m), 14};
    const auto [y, c] = step(true, gt, &fault);
    caught += c.failures > 0;
  }
  EXPECT_GE(caught, kFlips - 1);  // as above: a flip that lowers a small element may hide
  std::printf("[ measured ] fed product: clean none failed; flips caught %d of %d\n", caught,
              kFlips);
}

TEST(ProductChecksGpuTf32, AreRefusedWithTheReason) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::tf32);
  try {
    gpu.set_product_checks(true);
    FAIL() << "tf32 checks accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tf32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parity::gpu::test
