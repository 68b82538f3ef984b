// The backends the engine tests run on, one test body for each (as ggml's
// tests/test-backend-ops.cpp runs every op on every backend): "cpu" always, and each GPU backend
// this build has. A GPU backend that cannot run here (no GPU) is still a parameter, and its tests
// skip with the reason; a backend this build lacks is no parameter at all.
//
// What is built is asked of make_backend (an unbuilt backend is an InputError), never of a
// compile definition, so that one test source serves every build.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/gpu/gpu_backend.h"
#include "parity/backend.h"
#include "parity/engine.h"

namespace parity::testing {

// "cpu", then the GPU backends this build has.
const std::vector<std::string>& engine_backends();
// Why `name` cannot run here ("" where it can: cpu always, a GPU backend where a GPU is present).
const std::string& unusable_reason(const std::string& name);

inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

// Skips the test where the backend cannot run here.
#define PARITY_REQUIRE_BACKEND(name)                                                         \
  do {                                                                                       \
    if (const std::string& why_ = ::parity::testing::unusable_reason(name); !why_.empty()) { \
      GTEST_SKIP() << "skipped: backend " << (name) << ": " << why_;                         \
    }                                                                                        \
  } while (0)

// A test run once per backend; GetParam() is the backend's name.
class OnEachBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { PARITY_REQUIRE_BACKEND(GetParam()); }
  bool is_cpu() const { return GetParam() == "cpu"; }
  std::unique_ptr<Backend> backend(DenseMath math = DenseMath::fp32) const {
    return make_backend(GetParam(), math);
  }
};

// What a GPU backend counts (allocations, scratch growths, library plans, host reads:
// GpuBackend::counters), for the checks that a steady step allocates and plans nothing; none for
// a backend that counts nothing (cpu) or in a build without a GPU backend.
std::optional<GpuBackend::Counters> gpu_counters(Backend& backend);

// A tensor's bytes, copied from backend memory.
std::vector<std::uint8_t> host_bytes(Backend& backend, const TensorRef& t);

}  // namespace parity::testing
