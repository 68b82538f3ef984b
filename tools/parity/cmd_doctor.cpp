// parity doctor: the GPU's health at a level (parity/doctor.h), its verdict written into the
// health ledger.
#include <fmt/core.h>

#include <charconv>
#include <cstdio>
#include <memory>
#include <string>

#include "common.h"
#include "parity/backend.h"
#include "parity/doctor.h"
#include "parity/error.h"
#include "parity/health.h"
#include "parity/perf.h"
#include "parity/spec.h"

namespace parity::cli {
namespace {

struct DoctorArgs {
  std::string level = "quick";
  bool json = false;
  std::string ledger;
  bool no_ledger = false;
  std::string device;
  std::string inject;
  double memory_fraction = 0.9;
};

// --inject-fault gemm:ELEMENT:BIT or memory:WORD:BIT.
DoctorFault parse_fault(const std::string& s) {
  const auto bad = [&] {
    return InputError(fmt::format(
        "--inject-fault '{}': expected gemm:ELEMENT:BIT (a bit of the product's second result) or "
        "memory:WORD:BIT (a bit of the tested memory), BIT from 0 to 31",
        s));
  };
  const std::size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  if (b == std::string::npos) throw bad();
  DoctorFault f;
  const std::string where = s.substr(0, a);
  if (where == "gemm")
    f.where = DoctorFault::Where::gemm;
  else if (where == "memory")
    f.where = DoctorFault::Where::memory;
  else
    throw bad();
  const std::string e = s.substr(a + 1, b - a - 1), bit = s.substr(b + 1);
  const auto r1 = std::from_chars(e.data(), e.data() + e.size(), f.element);
  const auto r2 = std::from_chars(bit.data(), bit.data() + bit.size(), f.bit);
  if (e.empty() || r1.ec != std::errc() || r1.ptr != e.data() + e.size() || bit.empty() ||
      r2.ec != std::errc() || r2.ptr != bit.data() + bit.size() || f.bit < 0 || f.bit > 31)
    throw bad();
  return f;
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "doctor",
      "Check this machine's GPU: driver telemetry (ECC, remapped rows, retired pages, error\n"
      "events, clocks, temperature, power), memory patterns over most of its free memory, the\n"
      "copy and dense product rates against its spec and calibration (below 95%: suspect), and\n"
      "one product repeated bit for bit and sampled against the host. The verdict (healthy,\n"
      "suspect, failed) goes into the health ledger, where `parity train` reads it (failed:\n"
      "quarantined). Exit status 0 healthy, 4 suspect, 5 failed, 2 where no GPU is usable.\n\n"
      "Levels: quick (seconds), medium (about two minutes: the product soaked 90 s, four memory\n"
      "passes), long (about fifteen).\n\n"
      "Examples:\n  parity doctor\n  parity doctor --level medium --json > doctor.json\n"
      "  parity doctor --inject-fault gemm:12345:30 --no-ledger   # must report suspect");
  cmd->add_option("--level", args->level, "quick, medium or long")
      ->check(CLI::IsMember({"quick", "medium", "long"}))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print the report as JSON (progress goes to stderr)");
  cmd->add_option("--ledger", args->ledger,
                  "The health ledger to write (default $PARITY_HEALTH_LEDGER, else "
                  "~/.local/state/parity/health-ledger.json)");
  cmd->add_flag("--no-ledger", args->no_ledger, "Write nothing into the ledger");
  cmd->add_option("--device", args->device,
                  "Device catalog key or YAML file whose spec and calibration give the expected "
                  "rates (default: the catalog device the GPU's name matches)");
  cmd->add_option("--memory-fraction", args->memory_fraction,
                  "Share of the free device memory the pattern test covers")
      ->check(CLI::Range(0.01, 0.98))
      ->capture_default_str();
  cmd->add_option("--inject-fault", args->inject,
                  "Plant a fault to see the doctor find it: gemm:ELEMENT:BIT flips a bit of the "
                  "product's second result, memory:WORD:BIT one of the tested memory");
  cmd->callback([args] {
    DoctorOptions o;
    for (const auto& n : kDoctorLevelNames)
      if (n.name == args->level) o.level = n.value;
    if (!args->inject.empty()) o.inject = parse_fault(args->inject);
    o.memory_fraction = args->memory_fraction;
    const std::string gpu = detect_gpu();
    if (gpu.empty())
      throw InputError(
          "no GPU is usable here (or this build has no GPU backend): parity doctor checks the GPU "
          "it runs on");
    const std::string uuid = detect_gpu_uuid();
    std::optional<DeviceSpec> dev;
    if (!args->device.empty())
      dev = find_device(args->device, configs_dir() / "devices");
    else
      dev = match_device(gpu, configs_dir() / "devices");
    auto progress = [json = args->json](const std::string& line) {
      std::FILE* to = json ? stderr : stdout;
      fmt::print(to, "  {}\n", line);
      std::fflush(to);
    };
    o.progress = progress;
    o.math = DenseMath::bf16;
    if (dev) {
      const Calibration cal = calibration_for(*dev, configs_dir());
      o.expected_copy_bytes_per_s = dev->hbm_bandwidth.value * cal.hbm_efficiency;
      o.expected_gemm_flops = dev->dense_flops(o.math) * cal.gemm_efficiency(o.math);
    } else {
      progress(
          fmt::format("'{}' is not in the device catalog ({}): rates are measured, not "
                      "compared (give --device)",
                      gpu, (configs_dir() / "devices").string()));
    }
    std::string why;
    std::unique_ptr<TelemetrySource> telemetry = open_nvml(&why);
    if (!telemetry) progress("no telemetry: " + why);
    const std::unique_ptr<Backend> backend = make_backend("gpu", o.math);
    if (!args->json)
      fmt::print("parity doctor --level {}: {} ({}){}\n", args->level, gpu, uuid,
                 dev ? fmt::format(", spec {}", dev->name) : std::string());
    const DoctorReport r = run_doctor(*backend, telemetry.get(), gpu, uuid, o);
    if (args->json)
      fmt::print("{}\n", doctor_report_json(r));
    else
      fmt::print("{}", doctor_report_text(r));
    if (!args->no_ledger && !uuid.empty()) {
      HealthLedger ledger(args->ledger.empty() ? default_ledger_path()
                                               : std::filesystem::path(args->ledger));
      std::string reason;
      if (r.reasons.empty()) {
        reason = fmt::format("{} checks passed", r.checks.size());
      } else {
        for (const std::string& s : r.reasons) reason += (reason.empty() ? "" : "; ") + s;
      }
      // The ledger keeps the worse of its status and this one: a pass does not release a
      // device that was quarantined (parity ledger release does).
      const LedgerEntry e = ledger.record(uuid, gpu, ledger_status(r.verdict), reason,
                                          fmt::format("parity doctor --level {}", args->level));
      if (!args->json)
        fmt::print("ledger {}: {} is {}\n", ledger.file().string(), uuid,
                   name_in(kDeviceHealthNames, e.status));
    }
    if (r.verdict == DoctorVerdict::suspect) throw CLI::RuntimeError(4);
    if (r.verdict == DoctorVerdict::failed) throw CLI::RuntimeError(5);
  });
}

}  // namespace parity::cli
