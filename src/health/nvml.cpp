// Telemetry from NVML, loaded at run time with dlopen: the library comes with the NVIDIA driver,
// and no NVML header is installed where parity is built, so the few functions used are declared
// here with the signatures of NVML's public API reference (docs.nvidia.com/deploy/nvml-api).
// Each value is read on its own: a device or a virtual machine that does not expose one (row
// remapping on older GPUs, retired pages on newer ones, events inside some sandboxes) gives a
// reason in `unreadable`, never a failure of the whole read.
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parity/doctor.h"
#include "parity/error.h"

namespace parity {

namespace {

// NVML's C types, as its API reference gives them.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlEventSet_t = struct nvmlEventSet_st*;
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kInsufficientSize = 7;
constexpr nvmlReturn_t kTimeout = 10;
constexpr int kTemperatureGpu = 0;                           // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1, kClockMem = 2;                   // NVML_CLOCK_SM, NVML_CLOCK_MEM
constexpr int kCorrected = 0, kUncorrected = 1;              // nvmlMemoryErrorType_t
constexpr int kVolatile = 0, kAggregate = 1;                 // nvmlEccCounterType_t
constexpr int kRetiredSingleBit = 0, kRetiredDoubleBit = 1;  // nvmlPageRetirementCause_t
constexpr unsigned long long kEventXidCritical = 0x8;        // nvmlEventTypeXidCriticalError

class Nvml final : public TelemetrySource {
 public:
  explicit Nvml(void* lib) : lib_(lib) {}
  ~Nvml() override {
    if (events_ != nullptr && event_set_free_ != nullptr) event_set_free_(events_);
    if (shutdown_ != nullptr) shutdown_();
    ::dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Resolves the functions and starts NVML; the reason on failure.
  std::string start() {
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(lib_, name));
      return f != nullptr;
    };
    if (!sym(init_, "nvmlInit_v2") || !sym(shutdown_, "nvmlShutdown") ||
        !sym(error_string_, "nvmlErrorString") || !sym(by_uuid_, "nvmlDeviceGetHandleByUUID"))
      return "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlShutdown, nvmlErrorString or "
             "nvmlDeviceGetHandleByUUID";
    // Optional: a missing one makes its value unreadable.
    sym(driver_version_, "nvmlSystemGetDriverVersion");
    sym(temperature_, "nvmlDeviceGetTemperature");
    sym(power_, "nvmlDeviceGetPowerUsage");
    sym(power_limit_, "nvmlDeviceGetEnforcedPowerLimit");
    sym(clock_, "nvmlDeviceGetClockInfo");
    sym(max_clock_, "nvmlDeviceGetMaxClockInfo");
    sym(ecc_, "nvmlDeviceGetTotalEccErrors");
    sym(remapped_, "nvmlDeviceGetRemappedRows");
    sym(retired_, "nvmlDeviceGetRetiredPages");
    sym(retired_pending_, "nvmlDeviceGetRetiredPagesPendingStatus");
    if (!sym(reasons_, "nvmlDeviceGetCurrentClocksEventReasons"))
      sym(reasons_, "nvmlDeviceGetCurrentClocksThrottleReasons");
    sym(event_set_create_, "nvmlEventSetCreate");
    sym(register_events_, "nvmlDeviceRegisterEvents");
    sym(event_set_wait_, "nvmlEventSetWait_v2");
    sym(event_set_free_, "nvmlEventSetFree");
    if (const nvmlReturn_t e = init_(); e != kSuccess) {
      shutdown_ = nullptr;  // not started: nothing to shut down
      return fmt::format("nvmlInit failed: {}", error_string_(e));
    }
    char v[96] = {};
    name_ = "NVML";
    if (driver_version_ != nullptr && driver_version_(v, sizeof v) == kSuccess)
      name_ += fmt::format(" (driver {})", v);
    return {};
  }

  std::string name() const override { return name_; }

  DeviceTelemetry read(const std::string& uuid) override {
    nvmlDevice_t d = device(uuid);
    DeviceTelemetry t;
    t.source = name_;
    auto note = [&](const char* what, nvmlReturn_t e) {
      t.unreadable.push_back(fmt::format("{}: {}", what, error_string_(e)));
    };
    auto missing = [&](const char* what) {
      t.unreadable.push_back(fmt::format("{}: not in this NVML", what));
    };
    unsigned u = 0, u2 = 0, u3 = 0, u4 = 0;
    unsigned long long ull = 0;
    if (temperature_ == nullptr) {
      missing("temperature");
    } else if (const auto e = temperature_(d, kTemperatureGpu, &u); e == kSuccess) {
      t.temperature_c = u;
    } else {
      note("temperature", e);
    }
    if (power_ == nullptr) {
      missing("power");
    } else if (const auto e = power_(d, &u); e == kSuccess) {
      t.power_w = u / 1000.0;
    } else {
      note("power", e);
    }
    if (power_limit_ != nullptr) {
      if (const auto e = power_limit_(d, &u); e == kSuccess)
        t.power_limit_w = u / 1000.0;
      else
        note("power limit", e);
    }
    if (clock_ != nullptr) {
      if (const auto e = clock_(d, kClockSm, &u); e == kSuccess)
        t.sm_clock_mhz = u;
      else
        note("SM clock", e);
      if (const auto e = clock_(d, kClockMem, &u); e == kSuccess)
        t.memory_clock_mhz = u;
      else
        note("memory clock", e);
    }
    if (max_clock_ != nullptr) {
      if (const auto e = max_clock_(d, kClockSm, &u); e == kSuccess)
        t.sm_clock_max_mhz = u;
      else
        note("SM clock maximum", e);
    }
    if (ecc_ == nullptr) {
      missing("ECC counts");
    } else {
      struct Count {
        int type, counter;
        std::optional<std::uint64_t>* into;
        const char* what;
      };
      for (const Count& c :
           {Count{kCorrected, kVolatile, &t.ecc_corrected_volatile, "ECC corrected (volatile)"},
            Count{kUncorrected, kVolatile, &t.ecc_uncorrected_volatile,
                  "ECC uncorrected (volatile)"},
            Count{kCorrected, kAggregate, &t.ecc_corrected_aggregate, "ECC corrected (aggregate)"},
            Count{kUncorrected, kAggregate, &t.ecc_uncorrected_aggregate,
                  "ECC uncorrected (aggregate)"}}) {
        if (const auto e = ecc_(d, c.type, c.counter, &ull); e == kSuccess)
          *c.into = ull;
        else
          note(c.what, e);
      }
    }
    if (remapped_ == nullptr) {
      missing("remapped rows");
    } else if (const auto e = remapped_(d, &u, &u2, &u3, &u4); e == kSuccess) {
      t.remapped_rows_correctable = u;
      t.remapped_rows_uncorrectable = u2;
      t.remap_pending = u3 != 0;
      t.remap_failed = u4 != 0;
    } else {
      note("remapped rows", e);
    }
    if (retired_ != nullptr) {
      // A count of zero asks for the count alone (INSUFFICIENT_SIZE where there are pages).
      for (const int cause : {kRetiredSingleBit, kRetiredDoubleBit}) {
        unsigned count = 0;
        const auto e = retired_(d, cause, &count, nullptr);
        if (e == kSuccess || e == kInsufficientSize) {
          (cause == kRetiredSingleBit ? t.retired_pages_single_bit : t.retired_pages_double_bit) =
              count;
        } else {
          note(cause == kRetiredSingleBit ? "retired pages (single-bit)"
                                          : "retired pages (double-bit)",
               e);
        }
      }
    }
    if (retired_pending_ != nullptr) {
      int pending = 0;
      if (const auto e = retired_pending_(d, &pending); e == kSuccess)
        t.retirement_pending = pending != 0;
      else
        note("page retirement pending", e);
    }
    if (reasons_ != nullptr) {
      if (const auto e = reasons_(d, &ull); e == kSuccess)
        t.clock_event_reasons = ull;
      else
        note("clock event reasons", e);
    }
    return t;
  }

  void watch_errors(const std::string& uuid) override {
    events_why_.clear();
    if (event_set_create_ == nullptr || register_events_ == nullptr || event_set_wait_ == nullptr) {
      events_why_ = "this NVML has no event sets";
      return;
    }
    if (events_ == nullptr) {
      if (const auto e = event_set_create_(&events_); e != kSuccess) {
        events_ = nullptr;
        events_why_ = fmt::format("nvmlEventSetCreate: {}", error_string_(e));
        return;
      }
    }
    if (const auto e = register_events_(device(uuid), kEventXidCritical, events_); e != kSuccess)
      events_why_ = fmt::format("nvmlDeviceRegisterEvents: {}", error_string_(e));
  }

  std::vector<std::uint64_t> errors_seen(std::string* why) override {
    std::vector<std::uint64_t> xids;
    if (!events_why_.empty() || events_ == nullptr) {
      if (why != nullptr) *why = events_why_.empty() ? "not watched" : events_why_;
      return xids;
    }
    for (int i = 0; i < 1000; ++i) {  // everything that arrived; none waits
      nvmlEventData_t data{};
      const auto e = event_set_wait_(events_, &data, 0);
      if (e == kTimeout) break;
      if (e != kSuccess) {
        if (why != nullptr) *why = fmt::format("nvmlEventSetWait: {}", error_string_(e));
        break;
      }
      if (data.eventType == kEventXidCritical) xids.push_back(data.eventData);
    }
    return xids;
  }

 private:
  nvmlDevice_t device(const std::string& uuid) {
    nvmlDevice_t d = nullptr;
    if (const auto e = by_uuid_(uuid.c_str(), &d); e != kSuccess)
      throw Error(fmt::format("NVML does not know device {}: {}", uuid, error_string_(e)));
    return d;
  }

  void* lib_;
  std::string name_;
  nvmlEventSet_t events_ = nullptr;
  std::string events_why_ = "not watched";
  nvmlReturn_t (*init_)() = nullptr;
  nvmlReturn_t (*shutdown_)() = nullptr;
  const char* (*error_string_)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*driver_version_)(char*, unsigned) = nullptr;
  nvmlReturn_t (*by_uuid_)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*temperature_)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*power_)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*power_limit_)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*clock_)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*max_clock_)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*ecc_)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*remapped_)(nvmlDevice_t, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*retired_)(nvmlDevice_t, int, unsigned*, unsigned long long*) = nullptr;
  nvmlReturn_t (*retired_pending_)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*reasons_)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*event_set_create_)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*register_events_)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*event_set_wait_)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
  nvmlReturn_t (*event_set_free_)(nvmlEventSet_t) = nullptr;
};

}  // namespace

std::unique_ptr<TelemetrySource> open_nvml(std::string* why) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    if (why != nullptr) {
      const char* e = ::dlerror();
      *why = fmt::format(
          "libnvidia-ml.so.1 could not be loaded ({}): NVIDIA's driver is not "
          "installed here",
          e != nullptr ? e : "no reason given");
    }
    return nullptr;
  }
  auto nvml = std::make_unique<Nvml>(lib);
  if (std::string e = nvml->start(); !e.empty()) {
    if (why != nullptr) *why = std::move(e);
    return nullptr;
  }
  return nvml;
}

}  // namespace parity
