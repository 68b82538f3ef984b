// parity doctor: one device's health at a chosen depth, as the vendors' own diagnostics grade
// theirs (quick: seconds; medium: about two minutes; long: about fifteen), with a verdict and its
// reasons that `parity doctor` writes into the health ledger (parity/health.h).
//
// What it checks, all through the backend's own ops (so it tests what training uses):
// - telemetry from the driver (ECC counts, remapped rows, retired pages, critical error events,
//   clocks, temperature, power) behind TelemetrySource, which NVML implements and amd-smi can;
// - memory patterns over most of the free device memory (walking ones and zeros, address and its
//   inverse, random), each written in one pass and read back in another;
// - the device-to-device copy rate and the dense product rate against what the device's spec and
//   calibration expect (below `suspect_below` of it: suspect);
// - one product repeated, every result compared bit for bit with the first, and a sample of it
//   against a double-precision reference on the host.
// Verdicts: healthy; suspect (slow, or a product that does not repeat, or telemetry that warns);
// failed (a memory word that does not hold its value, rows the driver could not remap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parity/backend.h"
#include "parity/health.h"
#include "parity/spec.h"

namespace parity {

// ---- telemetry ----

// What the driver says of one device. Each value is set where it could be read; what could not
// be read is named in `unreadable` with the driver's reason.
struct DeviceTelemetry {
  std::string source;  // "NVML 12.580.159.04"
  std::optional<double> temperature_c, power_w, power_limit_w;
  std::optional<double> sm_clock_mhz, sm_clock_max_mhz, memory_clock_mhz;
  // ECC error counts: volatile (since the driver loaded) and aggregate (the device's lifetime).
  std::optional<std::uint64_t> ecc_corrected_volatile, ecc_uncorrected_volatile;
  std::optional<std::uint64_t> ecc_corrected_aggregate, ecc_uncorrected_aggregate;
  // HBM row remapping (Ampere and later): rows remapped for correctable and uncorrectable errors,
  // a remapping waiting for a reset, and a remapping that failed (no spare row left).
  std::optional<std::uint64_t> remapped_rows_correctable, remapped_rows_uncorrectable;
  std::optional<bool> remap_pending, remap_failed;
  // Page retirement (before Ampere): pages retired for repeated single-bit and for double-bit
  // errors, and a retirement waiting for a reset.
  std::optional<std::uint64_t> retired_pages_single_bit, retired_pages_double_bit;
  std::optional<bool> retirement_pending;
  // Why the clocks are held below their maximum now (NVML's clock event reason bits).
  std::optional<std::uint64_t> clock_event_reasons;
  std::vector<std::string> unreadable;
};

// Where telemetry comes from for one vendor's devices.
class TelemetrySource {
 public:
  virtual ~TelemetrySource() = default;
  virtual std::string name() const = 0;  // "NVML 12.580.159.04"
  // The device's telemetry now; throws Error where the device is unknown to the source.
  virtual DeviceTelemetry read(const std::string& uuid) = 0;
  // Starts listening for the device's critical error events (XIDs on NVIDIA); errors_seen()
  // returns those that came since (their codes), or a reason in *why where none can be heard.
  virtual void watch_errors(const std::string& uuid) = 0;
  virtual std::vector<std::uint64_t> errors_seen(std::string* why) = 0;
};

// NVML, loaded with dlopen("libnvidia-ml.so.1") (the library comes with the driver; no header is
// needed to build). nullptr, with the reason in *why, where the library or the driver is absent.
std::unique_ptr<TelemetrySource> open_nvml(std::string* why);

// ---- the doctor ----

enum class DoctorLevel : std::uint8_t { quick, medium, long_run };
inline constexpr NamedValue<DoctorLevel> kDoctorLevelNames[] = {{"quick", DoctorLevel::quick},
                                                                {"medium", DoctorLevel::medium},
                                                                {"long", DoctorLevel::long_run}};

enum class DoctorVerdict : std::uint8_t { healthy, suspect, failed };
const char* doctor_verdict_name(DoctorVerdict v);
// The ledger status a verdict records: failed devices are quarantined.
DeviceHealth ledger_status(DoctorVerdict v);

// How much each level does. Durations are the product soak's (the memory passes take seconds).
struct DoctorWork {
  int memory_passes = 1;       // each pass: every pattern over the tested memory
  double gemm_soak_s = 0;      // the product repeated for this long after the rate is measured
  int gemm_timed_runs = 30;    // runs timed for the rate (the median of blocks of ten)
  int gemm_repeat_checks = 4;  // results compared with the first, besides those of the soak
  int copy_timed_runs = 20;
};
DoctorWork doctor_work(DoctorLevel level);

// A fault planted to show that a check sees it: bit `bit` of element `element` of the product's
// second result (before it is compared with the first), or of word `element` of the memory after
// the first pattern is written.
struct DoctorFault {
  enum class Where : std::uint8_t { gemm, memory } where = Where::gemm;
  std::uint64_t element = 0;
  int bit = 30;
};

struct DoctorOptions {
  DoctorLevel level = DoctorLevel::quick;
  // What the device should reach (0: measured, not compared): the copy's bytes read plus written
  // per second, and the product's FLOP/s, each the spec's peak times the calibration's efficiency.
  double expected_copy_bytes_per_s = 0;
  double expected_gemm_flops = 0;
  double suspect_below = 0.95;  // a rate below this fraction of the expected one: suspect
  // The product's math (the operand rounding the host reference allows for) and size m = n = k.
  DenseMath math = DenseMath::bf16;
  std::int64_t gemm_size = 8192;
  // Memory tested: this fraction of what the backend reports free; where it reports nothing (the
  // cpu backend), memory_bytes.
  double memory_fraction = 0.9;
  std::size_t memory_bytes = std::size_t{64} << 20;
  std::size_t copy_bytes = std::size_t{2} << 30;  // each of the copy's source and destination
  std::uint64_t seed = 1;
  std::optional<DoctorFault> inject;
  std::function<void(const std::string&)> progress;  // one line per step, for people
};

struct DoctorCheck {
  std::string name;  // "memory patterns", "copy rate", "product rate", "product repeat", ...
  DoctorVerdict verdict = DoctorVerdict::healthy;
  std::string summary;                                 // one line: what was measured, against what
  std::vector<std::pair<std::string, double>> values;  // the figures, by name with their unit
};

struct DoctorReport {
  std::string device, uuid, backend, host;
  DoctorLevel level = DoctorLevel::quick;
  DoctorVerdict verdict = DoctorVerdict::healthy;
  std::vector<std::string> reasons;  // why not healthy, one per finding
  std::vector<DoctorCheck> checks;
  std::optional<DeviceTelemetry> telemetry;
  double seconds = 0;
};

// Runs the level's checks on the backend's device. `telemetry` may be null (nothing is read);
// device and uuid name the device in the report. Throws Error only where a check cannot run.
DoctorReport run_doctor(Backend& backend, TelemetrySource* telemetry, const std::string& device,
                        const std::string& uuid, const DoctorOptions& options);

// The verdict and reasons the telemetry alone gives (appended to `reasons`).
DoctorVerdict judge_telemetry(const DeviceTelemetry& t, std::vector<std::string>& reasons);

// The report as JSON (`parity doctor --json`) and as lines for people.
std::string doctor_report_json(const DoctorReport& r);
std::string doctor_report_text(const DoctorReport& r);

}  // namespace parity
