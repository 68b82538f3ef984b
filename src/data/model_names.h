// How the data readers name a model and its tables in their errors, so that the synthetic
// generator and the Criteo reader say it the same way: "model 'tiny' (configs/models/tiny.yaml)"
// and "model 'tiny' (configs/models/tiny.yaml): table 't0' (#0)".
//
// Internal to src/data; not part of the public API.
#pragma once

#include <fmt/core.h>

#include <string>

#include "parity/spec.h"

namespace parity::data_detail {

inline std::string model_where(const ModelSpec& model) {
  if (model.source_file.empty()) return fmt::format("model '{}'", model.name);
  return fmt::format("model '{}' ({})", model.name, model.source_file);
}

inline std::string table_where(const ModelSpec& model, int t) {
  return fmt::format("{}: table '{}' (#{})", model_where(model),
                     model.tables[static_cast<std::size_t>(t)].name, t);
}

}  // namespace parity::data_detail
