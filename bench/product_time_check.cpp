// Which predicts a matrix product's time better: the roofline model (gemm_best) or the kernel
// catalog's model for the configuration it picks (rank_gemm_kernels, the time a plan's kernel
// choice carries)? Read from a kernel-selection oracle run (gemm_bench --catalog's JSON lines on
// stdin: per problem every timed configuration with the catalog's predicted and the measured
// time), both predictions against the measured time of the catalog's pick, per operand type:
// the geomean of predicted / measured, the rms of its log, the share within 15%, and the
// time-weighted ratio by the pick's measured time (under 20 us, 20-200 us, longer). Host only.
//
//   zcat docs/perf/data/kernel-selection-h200-2026-12-04-streaming.jsonl.gz |
//     build/product_time_check [--device KEY]
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parity/error.h"
#include "parity/perf.h"

namespace {

struct Sample {
  double measured, catalog, roofline;
};

struct Summary {
  std::vector<Sample> all;
  std::map<int, Sample> by_size;  // sums by size class
};

parity::DenseMath math_of(const std::string& type) {
  if (type == "bf16") return parity::DenseMath::bf16;
  if (type == "fp16") return parity::DenseMath::fp16;
  if (type == "tf32") return parity::DenseMath::tf32;
  return parity::DenseMath::fp32;
}

std::string fit(const std::vector<Sample>& v, double Sample::*predicted) {
  double logs = 0, squares = 0;
  int within = 0;
  for (const Sample& s : v) {
    const double l = std::log(s.*predicted / s.measured);
    logs += l;
    squares += l * l;
    within += std::fabs(l) < std::log(1.15);
  }
  const double n = static_cast<double>(v.size());
  return fmt::format("{:.2f} {:.2f} {:>4.0f}%", std::exp(logs / n), std::sqrt(squares / n),
                     100.0 * within / n);
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string key = "h200";
  if (argc == 3 && std::string(argv[1]) == "--device") {
    key = argv[2];
  } else if (argc != 1) {
    fmt::print(stderr, "usage: product_time_check [--device KEY] < ORACLE.jsonl\n");
    return 2;
  }
  try {
    const fs::path configs = fs::path(PARITY_SOURCE_DIR) / "configs";
    const parity::DeviceSpec dev = parity::find_device(key, configs / "devices");
    const parity::Calibration cal = parity::calibration_for(dev, configs);
    std::map<std::string, Summary> by_type;
    std::string line;
    int skipped = 0;
    while (std::getline(std::cin, line)) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      const auto& p = j.at("problem");
      const nlohmann::json* pick = nullptr;
      for (const auto& c : j.at("candidates"))
        if (c.value("model_rank", -1) == 0) pick = &c;
      if (pick == nullptr || pick->at("us").get<double>() <= 0) {
        ++skipped;
        continue;
      }
      const std::string type = p.at("type");
      const int out = p.value("narrow_output", false) ? 2 : 4;
      const parity::GemmEstimate e =
          parity::gemm_best({p.at("m"), p.at("n"), p.at("k"), math_of(type), out}, dev, cal);
      const Sample s{pick->at("us").get<double>(), pick->at("predicted_us").get<double>(),
                     e.seconds * 1e6};
      Summary& sum = by_type[type];
      sum.all.push_back(s);
      Sample& c = sum.by_size[s.measured < 20 ? 0 : s.measured < 200 ? 1 : 2];
      c.measured += s.measured;
      c.catalog += s.catalog;
      c.roofline += s.roofline;
    }
    fmt::print(
        "predicted / measured time of the catalog's pick, on {} (calibration {}); {} problems "
        "without a timed pick left out\n",
        dev.display_name, cal.source.substr(0, cal.source.find(" (")), skipped);
    fmt::print("{:<6} {:>8}  {:<26} {:<26} {}\n", "type", "problems", "catalog: geomean rms within",
               "roofline: geomean rms within",
               "time-weighted catalog / roofline: <20us, 20-200us, longer");
    for (const auto& [type, s] : by_type) {
      std::string sizes;
      for (int c = 0; c < 3; ++c) {
        const auto it = s.by_size.find(c);
        sizes += it == s.by_size.end()
                     ? "   -        "
                     : fmt::format("{:.2f} / {:.2f}  ", it->second.catalog / it->second.measured,
                                   it->second.roofline / it->second.measured);
      }
      fmt::print("{:<6} {:>8}  {:<26} {:<26} {}\n", type, s.all.size(),
                 fit(s.all, &Sample::catalog), fit(s.all, &Sample::roofline), sizes);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "product_time_check: {}\n", e.what());
    return 2;
  }
  return 0;
}
