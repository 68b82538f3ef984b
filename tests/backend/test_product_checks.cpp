// Checksummed products on the cpu backend (Backend::set_product_checks): clean products never
// fail and keep their values bit for bit; a flipped high bit of an output element is caught at the
// rates the bound promises, by bit class, over 1,500 injections into random products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "parity/random.h"

namespace parity {
namespace {

// A random product: x [n, k] and w [m, k] in ±scale (values of every sign and size within it),
// bias or none, relu or not; a linear layer's or a cross layer's pair.
struct Case {
  std::int64_t n, k, m;
  float scale;
  bool bias, relu, cross;
};

Case random_case(std::uint64_t seed) {
  const std::uint64_t key = rng::key(0x5eed, seed);
  auto pick = [&](int i, int lo, int hi) {
    return lo + static_cast<int>(rng::uniform01(key, static_cast<std::uint64_t>(i)) * (hi - lo));
  };
  return {
      pick(0, 1, 96),     pick(1, 1, 80),     pick(2, 8, 64),    std::ldexp(1.0f, pick(3, -10, 10)),
      pick(4, 0, 2) == 1, pick(5, 0, 2) == 1, pick(6, 0, 4) == 0};
}

std::vector<float> values(std::int64_t count, float scale, std::uint64_t key) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(scale * (2 * rng::uniform01(key, i) - 1));
  return v;
}

// Runs the case with checks on (and a fault where given); returns the failures and the output.
std::pair<std::int64_t, std::vector<float>> run(CpuBackend& b, const Case& c, std::uint64_t seed,
                                                const Backend::ProductFault* fault) {
  b.set_product_checks(true);
  if (fault != nullptr) b.inject_product_fault(*fault);
  const auto x = values(c.n * c.k, c.scale, rng::key(seed, 1));
  std::vector<float> out;
  if (!c.cross) {
    const auto w = values(c.m * c.k, 1.0f, rng::key(seed, 2));
    const auto bias = values(c.m, c.scale, rng::key(seed, 3));
    out.assign(static_cast<std::size_t>(c.n * c.m), NAN);  // poisoned
    b.linear_forward(CAMat(CMat(x.data(), c.n, c.k)), CMat(w.data(), c.m, c.k),
                     c.bias ? bias.data() : nullptr, c.relu ? Activation::relu : Activation::none,
                     AMat(Mat(out.data(), c.n, c.m)));
  } else {  // N = k features, rank r = m / 4 + 1
    const std::int64_t N = c.k, r = c.m / 4 + 1;
    const auto x0 = values(c.n * N, c.scale, rng::key(seed, 4));
    const auto v = values(r * N, 1.0f, rng::key(seed, 5));
    const auto w = values(N * r, 1.0f, rng::key(seed, 6));
    const auto bias = values(N, c.scale, rng::key(seed, 7));
    std::vector<float> u(static_cast<std::size_t>(c.n * r), NAN),
        z(static_cast<std::size_t>(c.n * N), NAN), next(static_cast<std::size_t>(c.n * N), NAN);
    b.cross_forward(CAMat(CMat(x0.data(), c.n, N)), CAMat(CMat(x.data(), c.n, N)),
                    CMat(v.data(), r, N), CMat(w.data(), N, r), c.bias ? bias.data() : nullptr,
                    AMat(Mat(u.data(), c.n, r)), AMat(Mat(z.data(), c.n, N)),
                    AMat(Mat(next.data(), c.n, N)));
    out = u;
    out.insert(out.end(), z.begin(), z.end());
  }
  const Backend::ProductChecks s = b.product_checks();
  EXPECT_EQ(s.products, c.cross ? 2 : 1);
  return {s.failures, out};
}

TEST(ProductChecks, CleanProductsNeverFailAndKeepTheirValues) {
  CpuBackend checked, plain;
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    const Case c = random_case(seed);
    const auto [failures, out] = run(checked, c, seed, nullptr);
    EXPECT_EQ(failures, 0) << "seed " << seed << ": " << checked.product_checks().first_failure;
    plain.set_product_checks(false);
    const auto x = values(c.n * c.k, c.scale, rng::key(seed, 1));
    if (!c.cross) {  // the same bits as the product without checks
      const auto w = values(c.m * c.k, 1.0f, rng::key(seed, 2));
      const auto bias = values(c.m, c.scale, rng::key(seed, 3));
      std::vector<float> ref(static_cast<std::size_t>(c.n * c.m), NAN);
      plain.linear_forward(
          CAMat(CMat(x.data(), c.n, c.k)), CMat(w.data(), c.m, c.k), c.bias ? bias.data() : nullptr,
          c.relu ? Activation::relu : Activation::none, AMat(Mat(ref.data(), c.n, c.m)));
      ASSERT_EQ(std::memcmp(ref.data(), out.data(), ref.size() * sizeof(float)), 0)
          << "seed " << seed;
    }
  }
}

TEST(ProductChecks, NonFiniteInputsAreLeftToTheFiniteGuard) {
  // Divergence or bad data, not a wrong product: not counted.
  CpuBackend b;
  b.set_product_checks(true);
  std::vector<float> x = {1, 2, NAN, 4, 5, 6}, w = {1, 0, 1, 0, 1, 1}, y(4, 0.0f);
  b.linear_forward(CAMat(CMat(x.data(), 2, 3)), CMat(w.data(), 2, 3), nullptr, Activation::none,
                   AMat(Mat(y.data(), 2, 2)));
  x[2] = INFINITY;
  b.linear_forward(CAMat(CMat(x.data(), 2, 3)), CMat(w.data(), 2, 3), nullptr, Activation::relu,
                   AMat(Mat(y.data(), 2, 2)));
  EXPECT_EQ(b.product_checks().products, 2);
  EXPECT_EQ(b.product_checks().failures, 0) << b.product_checks().first_failure;
}

TEST(ProductChecks, FlippedHighBitsAreCaught) {
  CpuBackend b;
  // Bit classes of an fp32 element: the sign, the exponent, the top three mantissa bits.
  const std::map<std::string, std::vector<int>> classes = {
      {"sign", {31}},
      {"exponent", {23, 24, 25, 26, 27, 28, 29, 30}},
      {"high mantissa", {20, 21, 22}}};
  std::map<std::string, std::pair<int, int>> caught;  // class: (caught, injected)
  int total = 0, total_caught = 0;
  for (std::uint64_t trial = 0; trial < 1500; ++trial) {
    const Case c = random_case(10000 + trial);
    const std::string& cls = trial % 3 == 0   ? "sign"
                             : trial % 3 == 1 ? "exponent"
                                              : "high mantissa";
    const auto& bits = classes.at(cls);
    const int bit = bits[trial / 3 % bits.size()];
    const auto element = static_cast<std::int64_t>(rng::uniform01(rng::key(77, trial), 0) *
                                                   static_cast<double>(c.n * c.m));
    const Backend::ProductFault f{c.cross ? static_cast<std::int64_t>(trial % 2) : 0, element, bit};
    const auto [failures, out] = run(b, c, 10000 + trial, &f);
    auto& [got, tried] = caught[cls];
    ++tried;
    ++total;
    if (failures > 0) {
      ++got;
      ++total_caught;
    }
  }
  for (const auto& [cls, n] : caught)
    std::printf("  %-14s %4d of %4d caught (%.2f%%)\n", cls.c_str(), n.first, n.second,
                100.0 * n.first / n.second);
  EXPECT_GE(total_caught, total * 99 / 100) << total_caught << " of " << total;
  for (const auto& [cls, n] : caught) EXPECT_GE(n.first, n.second * 98 / 100) << cls;
}

}  // namespace
}  // namespace parity
