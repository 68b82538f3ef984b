// Fleet health: the quarantine ledger. A file shared by every run on a host (or a fleet's shared
// file system) records, per device UUID, whether the device is healthy, suspect or quarantined,
// with the history of what said so (parity doctor, a training run's replay, an operator).
// `parity doctor` writes it; `parity train` refuses a quarantined device unless told otherwise.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parity/error.h"
#include "parity/spec.h"  // NamedValue

namespace parity {

enum class DeviceHealth : std::uint8_t { healthy, suspect, quarantined };
inline constexpr NamedValue<DeviceHealth> kDeviceHealthNames[] = {
    {"healthy", DeviceHealth::healthy},
    {"suspect", DeviceHealth::suspect},
    {"quarantined", DeviceHealth::quarantined}};

struct LedgerEvent {
  std::string time;  // UTC, ISO 8601 ("2026-12-05T01:02:03Z")
  DeviceHealth status = DeviceHealth::healthy;
  std::string reason;  // what was found ("GEMM test: 3 elements differ from the first run")
  std::string source;  // who said so ("parity doctor --level quick", "operator")
  std::string host;    // where
};

struct LedgerEntry {
  std::string uuid;  // as nvidia-smi prints it ("GPU-5d3c...") or the vendor's equivalent
  std::string name;  // the device's name, for people ("NVIDIA H200")
  DeviceHealth status = DeviceHealth::healthy;
  std::vector<LedgerEvent> history;  // oldest first
};

// The ledger file: JSON, one object per device. Every change is a read-modify-write under an
// exclusive lock on FILE.lock, written to a temporary file, synced and renamed over FILE, so that
// concurrent writers (several runs, several doctors) never lose each other's events and a crash
// never leaves a torn ledger.
class HealthLedger {
 public:
  explicit HealthLedger(std::filesystem::path file);

  const std::filesystem::path& file() const { return file_; }
  // Every device, by UUID (empty when the file does not exist yet). Throws InputError naming the
  // file and the field when the file is not a ledger.
  std::map<std::string, LedgerEntry> read() const;
  std::optional<LedgerEntry> find(const std::string& uuid) const;
  // Adds an event to the device's history, atomically, and sets the device's status to the worse
  // of its status and the event's: only an explicit release (lower) makes a device healthier, so
  // an automatic "suspect" never undoes a quarantine. Returns the device's entry as written.
  LedgerEntry record(const std::string& uuid, const std::string& name, DeviceHealth status,
                     const std::string& reason, const std::string& source, bool lower = false);

 private:
  std::filesystem::path file_;
};

// This host's name, as the ledger records it ("unknown" where it cannot be read).
std::string host_name();

// The ledger a host uses: $PARITY_HEALTH_LEDGER when set, else
// $XDG_STATE_HOME/parity/health-ledger.json, else ~/.local/state/parity/health-ledger.json.
std::filesystem::path default_ledger_path();

// Whether a run may use the device, by the ledger: quarantined devices are refused (InputError
// naming the device, the ledger, when and why) unless allow_quarantined; the result is a warning
// to show (empty for a healthy or unknown device) where the device is suspect, or quarantined
// and allowed.
std::string check_device_allowed(const HealthLedger& ledger, const std::string& uuid,
                                 const std::string& name, bool allow_quarantined);

}  // namespace parity
