// Calibration: the achieved fractions and fixed costs the analytical model needs beyond the
// datasheet. Built-in values live in one table (the way NCCL's tuning tables do: every field
// with its key, its valid range, its NVIDIA and AMD values and where they come from); a YAML
// file measured on the device (configs/calibration/<device>.yaml) overrides any of them.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parity/error.h"
#include "parity/perf.h"
#include "spec/yaml_util.h"

namespace parity {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

struct Field {
  std::string_view key;
  double Calibration::*member;
  double lo, hi;       // valid range
  double nvidia, amd;  // built-in values: Hopper and Blackwell; CDNA3 and CDNA4
  std::string_view origin;
};

// The built-in values are estimates until a device is measured; the measured H200 file
// (configs/calibration/h200.yaml) is where the NVIDIA estimates are anchored.
constexpr std::array<Field, 25> kFields{{
    {"gemm_efficiency_fp32", &Calibration::gemm_efficiency_fp32, 0.01, 1.0, 0.70, 0.60,
     "below the 0.75 measured on one H200 at 8192^3 (configs/calibration/h200.yaml); "
     "hipBLASLt reaches a lower fraction of the (higher) datasheet peaks than cuBLASLt on Hopper"},
    {"gemm_efficiency_tf32", &Calibration::gemm_efficiency_tf32, 0.01, 1.0, 0.75, 0.60,
     "below the 0.82 measured on one H200 at 8192^3; AMD lower, as for fp32"},
    {"gemm_efficiency_bf16", &Calibration::gemm_efficiency_bf16, 0.01, 1.0, 0.75, 0.65,
     "below the 0.79 measured on one H200 at 8192^3; AMD lower, as for fp32"},
    {"gemm_efficiency_fp16", &Calibration::gemm_efficiency_fp16, 0.01, 1.0, 0.75, 0.65,
     "below the 0.76 measured on one H200 at 8192^3; AMD lower, as for fp32"},
    {"hbm_efficiency", &Calibration::hbm_efficiency, 0.01, 1.0, 0.85, 0.80,
     "a device-to-device copy reaches 0.875 of the datasheet on one H200; AMD a little lower"},
    {"embedding_forward_efficiency", &Calibration::embedding_forward_efficiency, 0.01, 1.0, 0.75,
     0.65,
     "the target of the table-batched forward, 75% of the copy rate (0.81 measured on one H200); "
     "wave64 kernels start lower until measured"},
    {"embedding_backward_efficiency", &Calibration::embedding_backward_efficiency, 0.01, 1.0, 0.50,
     0.40,
     "the target of the backward fused with the update, 50% of the copy rate (0.62 measured on "
     "one H200); wave64 kernels start lower until measured"},
    {"embedding_update_efficiency_16bit", &Calibration::embedding_update_efficiency_16bit, 0.01,
     1.0, 0.35, 0.28,
     "estimates: a 16-bit table's update does the same work a row as an fp32 one in half the "
     "bytes (one H200 measures its own, configs/calibration/h200.yaml); AMD lower, as above"},
    {"embedding_backward_fixed_s", &Calibration::embedding_backward_fixed_s, 0.0, 1.0, 0.09e-3,
     0.13e-3,
     "one backward's fixed cost, about 0.09 ms on one H200 (configs/calibration/h200.yaml); AMD "
     "estimated by the ratio of the launch costs (6 us to 4), its sort being the portable one"},
    {"embedding_heavy_fixed_s", &Calibration::embedding_heavy_fixed_s, 0.0, 1.0, 0.09e-3, 0.13e-3,
     "the heavy-row stages' fixed cost, about 0.09 ms on one H200; AMD as the above"},
    {"embedding_heavy_lookup_s", &Calibration::embedding_heavy_lookup_s, 0.0, 1e-6, 0.13e-9,
     0.16e-9,
     "about 0.13 ns an id in a heavy row on one H200; AMD estimated 1.25x (the ratio of the "
     "backward efficiencies' estimates, wave64 groups holding fewer rows in flight)"},
    {"product_check_efficiency", &Calibration::product_check_efficiency, 0.01, 1.0, 0.50, 0.40,
     "the checks' row pass sums in double: 0.56 of the copy rate measured on one H200 under bf16 "
     "math (configs/calibration/h200.yaml); wave64 kernels start lower until measured"},
    {"fused_check_gemm_efficiency", &Calibration::fused_check_gemm_efficiency, 0.01, 1.0, 0.68,
     0.68,
     "the checked bf16 product in one kernel: its main loop at 0.68 of the bf16 peak on one H100 "
     "(the MLPerf cross layers' products, docs/reliability.md, 2026-12-06); no such kernel on AMD"},
    {"fused_check_epilogue_efficiency", &Calibration::fused_check_epilogue_efficiency, 0.01, 1.0,
     0.98, 0.98,
     "and its epilogue at 0.98 of the copy rate, most of it under the products of the next tile "
     "where tiles are short (fitted with the above to the cross layers' two shapes on one H100, "
     "docs/reliability.md, 2026-12-06); no such kernel on AMD"},
    {"host_link_efficiency", &Calibration::host_link_efficiency, 0.01, 1.0, 0.80, 0.80,
     "PCIe and C2C copies reach about 0.8 of the link rate"},
    {"host_gather_efficiency", &Calibration::host_gather_efficiency, 0.01, 1.0, 0.25, 0.25,
     "the forward's reads of single host rows, one per missed lookup, are bound by the link's "
     "outstanding requests, not its rate: 15.8 GB/s of PCIe Gen5 x16's 64 on one H200 "
     "(docs/perf/host-tables.md, 2026-12-02); AMD estimated alike"},
    {"scale_up_efficiency", &Calibration::scale_up_efficiency, 0.01, 1.0, 0.80, 0.70,
     "nccl-tests bus bandwidth about 0.8 of NVLink; xGMI estimated lower"},
    {"scale_out_efficiency", &Calibration::scale_out_efficiency, 0.01, 1.0, 0.85, 0.85,
     "nccl-tests bus bandwidth over one NIC per GPU"},
    {"collective_latency_up_s", &Calibration::collective_latency_up_s, 0.0, 1.0, 15e-6, 15e-6,
     "NCCL and RCCL latencies of tens of microseconds within a domain"},
    {"collective_latency_out_s", &Calibration::collective_latency_out_s, 0.0, 1.0, 30e-6, 30e-6,
     "and twice that across domains"},
    {"kernel_launch_s", &Calibration::kernel_launch_s, 0.0, 1.0, 4e-6, 6e-6,
     "a CUDA kernel launch without graph capture takes a few microseconds; HIP's more"},
    {"allreduce_overlap", &Calibration::allreduce_overlap, 0.0, 1.0, 0.8, 0.8,
     "bucketed all-reduce during the backward, as DDP does, hides most of it"},
    {"workspace_bytes", &Calibration::workspace_bytes, 0.0, 1e13, 256 * kMiB, 256 * kMiB,
     "GEMM workspace and sort temporaries"},
    {"reserved_bytes", &Calibration::reserved_bytes, 0.0, 1e13, 2 * kGiB, 2 * kGiB,
     "runtime context, collective buffers and allocator slack"},
    {"hstu_attention_scalar_efficiency", &Calibration::hstu_attention_scalar_efficiency, 0.0001,
     1.0, 0.013, 0.010,
     "the fp32 scalar kernels on one H200 (hstu-feed-1k's step profile: 0.87 and 0.95 TFLOP/s "
     "of 67); wave64 estimated lower"},
}};

}  // namespace

double Calibration::gemm_efficiency(DenseMath m) const {
  switch (m) {
    case DenseMath::fp32:
      return gemm_efficiency_fp32;
    case DenseMath::tf32:
      return gemm_efficiency_tf32;
    case DenseMath::bf16:
      return gemm_efficiency_bf16;
    case DenseMath::fp16:
      return gemm_efficiency_fp16;
  }
  return gemm_efficiency_fp32;
}

// The tensor-core attention's times per (token, head), seconds, forward and backward, at full
// length n and head dim 64 and 128: attention_bench on one H200 (65,536 tokens, 4 heads,
// 2026-12-02, docs/perf/hstu.md), the NVIDIA estimate until a device is measured. AMD has no
// tensor-core form yet (its attention runs the scalar kernels), so no table.
constexpr Calibration::AttentionPoint kH200Attention[] = {
    {64, 16, 1.740e-9, 9.251e-9},     {64, 32, 0.977e-9, 6.313e-9},
    {64, 64, 0.637e-9, 4.688e-9},     {64, 128, 0.607e-9, 4.478e-9},
    {64, 256, 0.843e-9, 5.997e-9},    {64, 512, 1.308e-9, 8.602e-9},
    {64, 1024, 2.071e-9, 12.394e-9},  {64, 2048, 3.139e-9, 17.471e-9},
    {64, 4096, 4.776e-9, 24.952e-9},  {64, 8192, 7.580e-9, 37.334e-9},
    {128, 16, 1.537e-9, 11.177e-9},   {128, 32, 0.900e-9, 7.339e-9},
    {128, 64, 0.721e-9, 5.329e-9},    {128, 128, 0.721e-9, 5.024e-9},
    {128, 256, 0.980e-9, 6.767e-9},   {128, 512, 1.476e-9, 9.682e-9},
    {128, 1024, 2.373e-9, 14.256e-9}, {128, 2048, 3.742e-9, 20.863e-9},
    {128, 4096, 6.096e-9, 31.071e-9}, {128, 8192, 10.391e-9, 48.733e-9},
};

Calibration default_calibration(const DeviceSpec& device) {
  const bool amd = device.vendor == Vendor::amd;
  Calibration c;
  c.source = fmt::format("built-in estimates for {} GPUs (src/perf/calibration.cpp)",
                         amd ? "AMD" : "NVIDIA");
  for (const Field& f : kFields) c.*(f.member) = amd ? f.amd : f.nvidia;
  if (!amd) c.hstu_attention.assign(std::begin(kH200Attention), std::end(kH200Attention));
  return c;
}

Calibration load_calibration(const std::filesystem::path& file, const DeviceSpec& device) {
  // The same reader as the model and device specs: unknown and repeated keys rejected (with the
  // closest known one suggested), every error naming file:line:col and the field.
  const std::string origin = file.string();
  const YAML::Node root = spec_yaml::parse_document(spec_yaml::read_text_file(file, "calibration"),
                                                    origin, "calibration");
  // Keys of earlier releases, refused with what replaced them.
  constexpr std::pair<std::string_view, std::string_view> kRemoved[] = {
      {"sort_bytes_per_id",
       "the radix sort's bytes are computed from the sort's key bits (radix_sort_bytes in perf.h)"},
      {"host_pageable_efficiency",
       "the engine stages an HSTU batch's layout in pinned memory, copied at "
       "host_link_efficiency"},
  };
  std::vector<std::string_view> known{"device", "source", "measured", "command", "hstu_attention"};
  for (const auto& [key, why] : kRemoved) known.push_back(key);
  for (const auto& k : kFields) known.push_back(k.key);
  const spec_yaml::MapView map =
      spec_yaml::Field(root, "", &origin).as_map(known, "a map of calibration values");
  Calibration c = default_calibration(device);
  c.source = origin;
  if (const auto d = map.get("device"); d && d->as_string() != device.name)
    d->fail(fmt::format("calibration is for device '{}', not '{}'", d->as_string(), device.name));
  for (const auto& [key, why] : kRemoved)
    if (const auto r = map.get(key))
      r->fail(fmt::format("{} is no longer a calibration value: {}; remove the line", key, why));
  if (const auto src = map.get("source"))
    c.source = fmt::format("{} ({})", origin, src->as_string());
  if (const auto t = map.get("hstu_attention")) {
    // [{dim: D, n: N, forward_s: F, backward_s: B}, ...]: replaces the built-in table.
    c.hstu_attention.clear();
    for (const spec_yaml::Field& e :
         t->as_list("a list of {dim, n, forward_s, backward_s} (seconds per token and head)")) {
      const spec_yaml::MapView pt =
          e.as_map({"dim", "n", "forward_s", "backward_s"}, "{dim, n, forward_s, backward_s}");
      Calibration::AttentionPoint a;
      a.dim = static_cast<int>(pt.require("dim", "the head dim").as_int(1, 1024, "a head dim"));
      a.n = static_cast<int>(pt.require("n", "the sequence length").as_int(1, 1 << 20, "a length"));
      for (auto [key, member] :
           {std::pair{"forward_s", &Calibration::AttentionPoint::forward_s},
            std::pair{"backward_s", &Calibration::AttentionPoint::backward_s}}) {
        const spec_yaml::Field v = pt.require(key, "seconds per token and head");
        const double x = v.as_number("seconds per token and head, > 0");
        if (!(x > 0) || x > 1) v.fail_expected("seconds per token and head in (0, 1]");
        a.*member = x;
      }
      c.hstu_attention.push_back(a);
    }
  }
  for (const auto& f : kFields) {
    const auto v = map.get(f.key);
    if (!v) continue;
    const std::string range = fmt::format("a number in [{:f}, {:f}]", f.lo, f.hi);
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
