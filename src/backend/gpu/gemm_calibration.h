// Measuring the kernel catalog (parity/select.h) on this machine's GPU: every configuration the
// library offers for each kind of product, timed on a few shapes that separate its costs.
//
// Why it is built this way:
// - The selection model composes a configuration's time on any shape from three constants of
//   that configuration, t = fixed + waves · (tile + K · kstep) (select.h). Six runs give them:
//   one wave of tiles at 4, 64 and enough k steps to fill tens of microseconds, two waves at the
//   shortest and the longest depth, three waves between; the constants are their non-negative
//   least-squares fit in relative error (fit_kernel_costs). The wave's tile count is the
//   library's own (its check reports the waves of a reference problem, whose tile count over
//   them is the slots).
// - Those runs keep their operands and output in L2; the products of a training step mostly do
//   not, and there the same configurations run slower by amounts that differ between them (the
//   ranking's misses on large products, docs/perf/kernel-selection.md). So two more runs of
//   many waves, their output at least twice L2, shallow and deep, give each configuration its
//   streaming costs (fit_stream_costs), which the ranking uses as a problem outgrows L2. L2 is
//   the runtime's figure; on a GPU with a last-level cache beyond it (AMD's Infinity Cache) that
//   cache is not counted yet, and the streaming runs would stay on chip.
// - The configurations: the library's walk of its algorithms' capability lists for a 4096³
//   reference, and its heuristic's answers on a grid of shapes, which name configurations the
//   lists do not (tiles, clusters, custom options) and which the best time of many products
//   needs (measured: docs/perf/kernel-selection.md).
// - A few rates per kernel family cannot tell the library's configurations apart; measured per
//   configuration, once per device and library version, they can. The shapes are not the
//   products of any model.
// - What is kept: the configurations that rank first or within a few percent of first somewhere
//   on a grid of shapes (every row alignment), useful_kernels in select.h.
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
