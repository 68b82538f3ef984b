// The HSTU plan's memory prediction is the engine's allocation: for every category the model
// allocates (tables, their state, dense parameters, activations, gradients, staged inputs), the
// plan's bytes at its batch and token capacity match what HstuModel allocates, with and without
// recompute.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/cpu_backend.h"
#include "parity/engine.h"
#include "parity/perf.h"
#include "parity/plan.h"
#include "parity/spec.h"

namespace parity {
namespace {

TEST(HstuPlanMemory, PredictionIsTheEnginesAllocation) {
  const std::filesystem::path configs = PARITY_SOURCE_DIR "/configs";
  ModelSpec m = load_model_spec(configs / "models/hstu-tiny.yaml");
  m.max_global_batch = 512;
  PlannerOptions opt;
  opt.configs_dir = configs;
  const DeviceSpec dev = find_device("h200", configs / "devices");
  const Plan planned = make_plan(m, dev, 1, opt);
  for (const bool recompute : {false, true}) {
    Plan p = planned;
    p.recompute = recompute;
    p.prediction = evaluate_plan(p, m, dev, calibration_for(dev, configs));
    CpuBackend be;
    HstuModel::Options o;
    o.token_capacity = p.token_capacity;
    o.recompute = recompute;
    const ModelSpec applied = apply_plan(m, p);
    HstuModel model(applied, be, p.per_device_batch, 1, o);
    EXPECT_EQ(model.token_capacity(), p.token_capacity);
    for (const auto& [category, bytes] : model.allocated_bytes_by_category()) {
      ASSERT_TRUE(p.prediction.memory_bytes.count(category)) << category;
      const double predicted = p.prediction.memory_bytes.at(category);
      // Exact but for the engine's alignment of table offsets and its one-element minimum.
      EXPECT_NEAR(predicted, static_cast<double>(bytes), 0.002 * static_cast<double>(bytes) + 256)
          << category << (recompute ? " (recompute)" : "");
    }
  }
}

}  // namespace
}  // namespace parity
