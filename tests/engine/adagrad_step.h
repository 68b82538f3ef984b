// Adagrad's first step with an initial accumulator (OptimizerSpec::initial_accumulator), checked
// against the same model's first step without one: both take the same gradient g from the same
// weights w0, so where the model without one holds the state g² and took the step lr·g/(|g|+eps),
// the model with accumulator a must hold a + g² and have taken lr·g/(sqrt(a + g²) + eps). One
// state may serve several weights (per_state: a table's dim under rowwise Adagrad, whose state
// is the row's mean square).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "backends.h"
#include "parity/backend.h"
#include "parity/engine.h"
#include "parity/error.h"

namespace parity::testing {

// A tensor's values by name, copied to the host.
template <class M>
std::vector<float> tensor_floats(Backend& be, M& model, const std::string& name) {
  for (const TensorRef& t : model.tensors()) {
    if (t.name != name) continue;
    const auto bytes = host_bytes(be, t);
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
  throw Error("no tensor " + name);
}

// The dense parameters in the order of their optimizer state: by address in their one buffer.
template <class M>
std::vector<float> dense_floats(Backend& be, M& model) {
  std::vector<TensorRef> ts;
  for (const TensorRef& t : model.tensors())
    if (t.name.rfind("embedding.", 0) != 0 && t.name.rfind("optimizer.", 0) != 0) ts.push_back(t);
  std::sort(ts.begin(), ts.end(),
            [](const TensorRef& x, const TensorRef& y) { return x.data < y.data; });
  std::vector<float> v;
  for (const TensorRef& t : ts) {
    const auto bytes = host_bytes(be, t);
    const std::size_t at = v.size();
    v.resize(at + bytes.size() / 4);
    std::memcpy(v.data() + at, bytes.data(), bytes.size());
  }
  return v;
}

// w0: the weights before the step; wz, sz: the weights and states after it without an
// accumulator; wa, sa: with accumulator `held`.
inline void expect_first_adagrad_step(const std::vector<float>& w0, const std::vector<float>& wz,
                                      const std::vector<float>& wa, const std::vector<float>& sz,
                                      const std::vector<float>& sa, double held, double eps,
                                      int per_state, const std::string& what) {
  ASSERT_EQ(w0.size(), wz.size()) << what;
  ASSERT_EQ(wa.size(), wz.size()) << what;
  ASSERT_EQ(sz.size() * static_cast<std::size_t>(per_state), w0.size()) << what;
  ASSERT_EQ(sa.size(), sz.size()) << what;
  int moved = 0;
  for (std::size_t i = 0; i < w0.size(); ++i) {
    const std::size_t k = i / static_cast<std::size_t>(per_state);
    const double g2 = sz[k];
    ASSERT_NEAR(sa[k], held + g2, 1e-6 * (held + g2)) << what << " state " << k;
    const double step_z = static_cast<double>(w0[i]) - wz[i];
    const double want = step_z * (std::sqrt(g2) + eps) / (std::sqrt(held + g2) + eps);
    const double got = static_cast<double>(w0[i]) - wa[i];
    ASSERT_NEAR(got, want, 1e-6 + 1e-5 * std::abs(want)) << what << " element " << i;
    moved += step_z != 0.0;
  }
  EXPECT_GT(moved, 0) << what;
}

}  // namespace parity::testing
