// The parts of the planner's search (planner.cpp) that lay the tables out for one recipe:
// how they are split and spread over the GPUs (sharding.cpp), and which move to host memory
// when a device is full (placement.cpp).
#pragma once

#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "parity/plan.h"

namespace parity::detail {

// Whether a plan on `dev` may take dense math `m`: tf32 needs the device's TF32 (units or the
// library's emulation), and the product checks cannot follow tf32's rounding of the operands
// inside the library (Plan::product_checks). Both planners ask.
inline bool dense_math_runs(DenseMath m, const DeviceSpec& dev, bool product_checks) {
  return m != DenseMath::tf32 || (dev.has_tf32() && !product_checks);
}

inline std::string gb(double bytes) {
  return fmt::format("{:.1f} GB", bytes / 1e9);
}

// The model's file as a plan records it: absolute, so that the plan can be used from any
// directory (empty for a model parsed from text).
inline std::string plan_model_file(const ModelSpec& m) {
  if (m.source_file.empty() || m.source_file == "<string>") return {};
  std::error_code ec;
  const auto abs = std::filesystem::absolute(m.source_file, ec);
  return ec ? m.source_file : abs.lexically_normal().string();
}

// The model trained at `batch` examples a step: `model` (as written, its own batch_size) with the
// recipe's learning-rate rule applied (with_batch), into m.
inline void scale_to_batch(ModelSpec& m, const ModelSpec& model, std::int64_t batch) {
  const ModelSpec at = with_batch(model, batch);
  m.batch_size = at.batch_size;
  m.embedding_optimizer.lr = at.embedding_optimizer.lr;
  m.dense_optimizer.lr = at.dense_optimizer.lr;
  m.lr_batch_scale = at.lr_batch_scale;
}

// How a plan's batch change moves the learning rates, for the change's reason: "learning rates
// scaled by 2 (recipe's linear rule), warmed up from the reference batch's over 500 steps".
inline std::string lr_change(const ModelSpec& model, std::int64_t batch) {
  const double scale = with_batch(model, batch).lr_batch_scale / model.lr_batch_scale;
  std::string s = fmt::format("learning rates scaled by {:.4g} (recipe's {} rule)", scale,
                              lr_scaling_name(model.lr_scaling));
  if (scale > 1.0 && model.lr_warmup_steps > 0)
    s += fmt::format(", warmed up from the reference batch's over {} steps", model.lr_warmup_steps);
  return s;
}

// Examples/s as the recipe changes' reasons print them ("3.21M", "36k", "812").
inline std::string si_rate(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.0f}k", v / 1e3);
  if (v >= 1e3) return fmt::format("{:.2f}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

// Refuses a prediction with a time or a peak that is not a finite number >= 0: a rate near zero
// in the device spec or the calibration overflows a time, and is refused where the numbers are
// known rather than planned as "inf ms/step". `where` names the plan.
void check_finite_prediction(const Prediction& p, const std::string& where, const DeviceSpec& dev,
                             const Calibration& cal);

// Bytes of a whole table with its optimizer state.
inline double table_bytes(const TablePlan& tp, const TableSpec& ts) {
  return static_cast<double>(ts.rows) * (ts.dim * static_cast<double>(dtype_size(tp.dtype)) +
                                         optimizer_state_bytes_per_row(tp.optimizer, ts.dim));
}

// How tables are split and spread over several GPUs. The variants do not depend on the
// device's memory size: memory only decides which tables the fit step moves to the host,
// coldest first. So a device with more HBM is offered the same candidates, each needing
// no more host placement than before, and the best predicted throughput can only rise.
struct ShardingVariant {
  double split_share = 1.0;    // split a table whose cost exceeds this share of a device's
  double split_bytes = 0;      // split every table larger than this (0: by cost alone)
  bool balance_bytes = false;  // spread pieces by bytes instead of by cost
};

// Searched when there are several GPUs. Splitting at a fraction of the fair share gives the
// balancing finer pieces; splitting every large table spreads memory; balancing by bytes
// keeps the devices' memory even.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr ShardingVariant kShardingVariants[] = {
    {1.0, 0, false},        {0.5, 0, false},       {1.0, 8 * kGiB, false},
    {0.5, 8 * kGiB, false}, {1.0, 8 * kGiB, true}, {0.25, 2 * kGiB, false},
};

// Sets the sharding and shards of every table of `p` (p.gpus > 1, p's batch, dtypes and
// optimizer set), all in HBM.
void shard_tables(Plan& p, const ShardingVariant& variant, const ModelSpec& m,
                  const DeviceSpec& dev, const Calibration& cal);

struct Fit {
  bool feasible = false;
  std::string why;       // when not feasible
  double shortfall = 0;  // bytes over budget on the worst device (or host)
};
// Moves the coldest tables of over-full devices to host memory until every device fits,
// then gives each device's spare HBM to its host-placed tables as cache.
Fit fit_memory(Plan& p, const ModelSpec& m, const DeviceSpec& dev, const Calibration& cal);

}  // namespace parity::detail
