// Helpers shared by the planner's tests: the shipped configs and the options that read them.
#pragma once

#include <filesystem>
#include <string>

#include "parity/plan.h"

namespace parity::plan_test {

inline const std::filesystem::path kConfigs = std::filesystem::path(PARITY_SOURCE_DIR) / "configs";

inline DeviceSpec device(const std::string& key) {
  return find_device(key, kConfigs / "devices");
}
inline ModelSpec model(const std::string& name) {
  return load_model_spec(kConfigs / "models" / (name + ".yaml"));
}
// The planner's options over the shipped configs; product_checks: Plan::product_checks.
inline PlannerOptions options(bool product_checks = false) {
  PlannerOptions o;
  o.configs_dir = kConfigs;
  o.product_checks = product_checks;
  return o;
}

// A one-GPU plan by hand: every table whole in HBM, fp32, under rowwise Adagrad.
inline Plan whole_tables_plan(const ModelSpec& m, const DeviceSpec& d, DenseMath math,
                              std::int64_t batch) {
  Plan p;
  p.model = m.name;
  p.device = d.name;
  p.gpus = 1;
  p.per_device_batch = p.global_batch = batch;
  p.dense_math = math;
  p.embedding_optimizer = OptimizerKind::rowwise_adagrad;
  for (const auto& t : m.tables)
    p.tables.push_back({t.name,
                        DType::f32,
                        OptimizerKind::rowwise_adagrad,
                        Sharding::table,
                        Placement::hbm,
                        0,
                        {{0, 0, t.rows, 0, t.dim}}});
  return p;
}

}  // namespace parity::plan_test
