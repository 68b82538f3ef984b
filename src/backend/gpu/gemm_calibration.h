// Measuring the kernel catalog (parity/select.h) on this machine's GPU: every configuration the
// library accepts for each kind of product, timed on three shapes that separate its costs.
//
// Why it is built this way:
// - The selection model composes a configuration's time on any shape from three constants of
//   that configuration, t = fixed + waves · (tile + K · kstep) (select.h). Three shapes give
//   them: one wave of tiles at K = 4 and at K = 64 k steps (kstep, then tile + fixed), and two
//   waves at K = 64 (tile). The wave's tile count is the library's own (its check reports the
//   waves of a reference problem, whose tile count over them is the slots).
// - A few rates per kernel family cannot tell the library's configurations apart (measured:
//   docs/perf/kernel-selection.md); measured per configuration, once per device and library
//   version, they can. The shapes are not the products of any model.
// - What is kept: the configurations that rank first or within a few percent of first somewhere
//   on a grid of shapes (aligned and not), so the file holds the useful few hundred per kind.
// - Split-K variants are not measured one by one: the catalog records each configuration's
//   split support, and one reduction's own cost measured on a few configurations.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parity/select.h"

namespace parity::gpu {

struct GemmCalibrationRequest {
  std::vector<GemmType> types = {GemmType::bf16};
  std::string device;          // the device spec's name, written into the catalog
  double hbm_bytes_per_s = 0;  // the device's achieved memory rate (the ranking's floor)
  double target_ms = 0.5;      // timing of one run: back-to-back runs filling this
  std::function<void(const std::string&)> progress;
  std::function<void(const MeasuredKernel&)> measured;  // every configuration timed, kept or not
};

// Measures the catalog on the current GPU. Throws GpuError where no GPU is present.
GemmCatalog measure_gemm_catalog(const GemmCalibrationRequest& r);

}  // namespace parity::gpu
