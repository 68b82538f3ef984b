// Calibration: the achieved fractions and fixed costs the analytical model needs
// beyond the datasheet. Built-in values live in named tables per architecture family
// (the way NCCL's tuning tables do), each value with where it comes from; a YAML file
// measured on the device (configs/calibration/<device>.yaml) overrides any of them.
#include <yaml-cpp/yaml.h>

#include <array>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>
#include <string_view>

#include "parity/error.h"
#include "parity/perf.h"
#include "spec/yaml_util.h"

namespace parity {
namespace {

struct Field {
  std::string_view key;
  double Calibration::*member;
  double lo, hi;  // valid range
};

constexpr std::array<Field, 17> kFields{{
    {"gemm_efficiency_fp32", &Calibration::gemm_efficiency_fp32, 0.01, 1.0},
    {"gemm_efficiency_tf32", &Calibration::gemm_efficiency_tf32, 0.01, 1.0},
    {"gemm_efficiency_bf16", &Calibration::gemm_efficiency_bf16, 0.01, 1.0},
    {"gemm_efficiency_fp16", &Calibration::gemm_efficiency_fp16, 0.01, 1.0},
    {"hbm_efficiency", &Calibration::hbm_efficiency, 0.01, 1.0},
    {"embedding_forward_efficiency", &Calibration::embedding_forward_efficiency, 0.01, 1.0},
    {"embedding_backward_efficiency", &Calibration::embedding_backward_efficiency, 0.01, 1.0},
    {"sort_bytes_per_id", &Calibration::sort_bytes_per_id, 0.0, 4096.0},
    {"host_link_efficiency", &Calibration::host_link_efficiency, 0.01, 1.0},
    {"scale_up_efficiency", &Calibration::scale_up_efficiency, 0.01, 1.0},
    {"scale_out_efficiency", &Calibration::scale_out_efficiency, 0.01, 1.0},
    {"collective_latency_up_s", &Calibration::collective_latency_up_s, 0.0, 1.0},
    {"collective_latency_out_s", &Calibration::collective_latency_out_s, 0.0, 1.0},
    {"kernel_launch_s", &Calibration::kernel_launch_s, 0.0, 1.0},
    {"allreduce_overlap", &Calibration::allreduce_overlap, 0.0, 1.0},
    {"workspace_bytes", &Calibration::workspace_bytes, 0.0, 1e13},
    {"reserved_bytes", &Calibration::reserved_bytes, 0.0, 1e13},
}};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// NVIDIA Hopper and Blackwell. Estimates until a device is measured: GEMM fractions
// below the ~0.8 measured for bf16 on one H200 (DESIGN.md "Measuring"), copy bandwidth
// ~0.87 of the datasheet (same source), embedding fractions at issue 4's targets (75% /
// 50% of copy bandwidth), NVLink busbw ~0.8 of the link, NCCL latencies of tens of µs,
// a CUDA kernel launch of a few µs.
Calibration nvidia_table() {
  Calibration c;
  c.source = "built-in estimates for NVIDIA GPUs (src/perf/calibration.cpp)";
  c.gemm_efficiency_fp32 = 0.70;
  c.gemm_efficiency_tf32 = 0.75;
  c.gemm_efficiency_bf16 = 0.75;
  c.gemm_efficiency_fp16 = 0.75;
  c.hbm_efficiency = 0.85;
  c.embedding_forward_efficiency = 0.75;
  c.embedding_backward_efficiency = 0.50;
  c.sort_bytes_per_id = 96;  // 4 radix passes x (8 B key + 4 B position) read and written
  c.host_link_efficiency = 0.80;
  c.scale_up_efficiency = 0.80;
  c.scale_out_efficiency = 0.85;
  c.collective_latency_up_s = 15e-6;
  c.collective_latency_out_s = 30e-6;
  c.kernel_launch_s = 4e-6;
  c.allreduce_overlap = 0.8;
  c.workspace_bytes = 256 * kMiB;
  c.reserved_bytes = 2 * kGiB;
  return c;
}

// AMD CDNA3 and CDNA4. Estimates: hipBLASLt reaches a lower fraction of the (higher)
// datasheet peaks than cuBLASLt on Hopper; wave64 embedding kernels start from lower
// fractions until measured; larger launch latency.
Calibration amd_table() {
  Calibration c = nvidia_table();
  c.source = "built-in estimates for AMD GPUs (src/perf/calibration.cpp)";
  c.gemm_efficiency_fp32 = 0.60;
  c.gemm_efficiency_tf32 = 0.60;
  c.gemm_efficiency_bf16 = 0.65;
  c.gemm_efficiency_fp16 = 0.65;
  c.hbm_efficiency = 0.80;
  c.embedding_forward_efficiency = 0.65;
  c.embedding_backward_efficiency = 0.40;
  c.scale_up_efficiency = 0.70;
  c.kernel_launch_s = 6e-6;
  return c;
}

}  // namespace

double Calibration::gemm_efficiency(DenseMath m) const {
  switch (m) {
    case DenseMath::fp32: return gemm_efficiency_fp32;
    case DenseMath::tf32: return gemm_efficiency_tf32;
    case DenseMath::bf16: return gemm_efficiency_bf16;
    case DenseMath::fp16: return gemm_efficiency_fp16;
  }
  return gemm_efficiency_fp32;
}

Calibration default_calibration(const DeviceSpec& device) {
  return device.vendor == Vendor::amd ? amd_table() : nvidia_table();
}

Calibration load_calibration(const std::filesystem::path& file, const DeviceSpec& device) {
  // The same reader as the model and device specs: unknown and repeated keys rejected (with the
  // closest known one suggested), every error naming file:line:col and the field.
  const std::string origin = file.string();
  const YAML::Node root =
      spec_yaml::parse_document(spec_yaml::read_text_file(file, "calibration"), origin, "calibration");
  std::vector<std::string_view> known{"device", "source", "measured", "command"};
  for (const auto& k : kFields) known.push_back(k.key);
  const spec_yaml::MapView map = spec_yaml::Field(root, "", &origin).as_map(known, "a map of calibration values");
  Calibration c = default_calibration(device);
  c.source = origin;
  if (const auto d = map.get("device"); d && d->as_string() != device.name)
    d->fail("calibration is for device '" + d->as_string() + "', not '" + device.name + "'");
  if (const auto src = map.get("source")) c.source = origin + " (" + src->as_string() + ")";
  for (const auto& f : kFields) {
    const auto v = map.get(f.key);
    if (!v) continue;
    const std::string range = "a number in [" + std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]";
    const double x = v->as_number(range);
    if (x < f.lo || x > f.hi) v->fail_expected(range);
    c.*(f.member) = x;
  }
  return c;
}

Calibration calibration_for(const DeviceSpec& device, const std::filesystem::path& configs_dir) {
  const auto file = configs_dir / "calibration" / (device.name + ".yaml");
  std::error_code ec;
  if (std::filesystem::exists(file, ec)) return load_calibration(file, device);
  return default_calibration(device);
}

}  // namespace parity
