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

}  // namespace parity::plan_test
