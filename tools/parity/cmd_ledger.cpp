// parity ledger: the fleet's health ledger (parity/health.h): list it, show a device's history,
// quarantine a device by hand or release one that was mended.
#include <fmt/core.h>

#include <memory>
#include <string>
#include <tuple>

#include "common.h"
#include "parity/error.h"
#include "parity/health.h"

namespace parity::cli {
namespace {

struct LedgerArgs {
  std::string file;
  std::string uuid, reason, name;
};

HealthLedger open_ledger(const LedgerArgs& a) {
  return HealthLedger(a.file.empty() ? default_ledger_path() : std::filesystem::path(a.file));
}

void print_entry(const LedgerEntry& e, bool history) {
  fmt::print("{:<44} {:<12} {}\n", e.uuid, name_in(kDeviceHealthNames, e.status), e.name);
  if (!history) return;
  for (const LedgerEvent& ev : e.history)
    fmt::print("  {}  {:<12} {}  ({} on {})\n", ev.time, name_in(kDeviceHealthNames, ev.status),
               ev.reason, ev.source, ev.host);
}

}  // namespace

void add_ledger_command(CLI::App& app) {
  auto args = std::make_shared<LedgerArgs>();
  CLI::App* cmd = app.add_subcommand(
      "ledger",
      "The health ledger: which devices are healthy, suspect or quarantined, and why.\n\n"
      "Examples:\n"
      "  parity ledger list\n"
      "  parity ledger show GPU-5d3c...\n"
      "  parity ledger quarantine GPU-5d3c... --reason \"XID 79 twice this week\"\n"
      "  parity ledger release GPU-5d3c... --reason \"HBM replaced, doctor long passed\"");
  cmd->require_subcommand(1);
  cmd->add_option("--file", args->file,
                  "The ledger (default $PARITY_HEALTH_LEDGER, else "
                  "~/.local/state/parity/health-ledger.json)");
  CLI::App* list = cmd->add_subcommand("list", "Every device in the ledger and its status");
  list->callback([args] {
    const HealthLedger l = open_ledger(*args);
    const auto all = l.read();
    if (all.empty()) {
      fmt::print("the health ledger '{}' holds no device\n", l.file().string());
      return;
    }
    for (const auto& [uuid, e] : all) print_entry(e, false);
  });
  CLI::App* show = cmd->add_subcommand("show", "A device's status and history");
  show->add_option("uuid", args->uuid, "The device's UUID")->required();
  show->callback([args] {
    const HealthLedger l = open_ledger(*args);
    const auto e = l.find(args->uuid);
    if (!e)
      throw InputError(fmt::format("device '{}' is not in the health ledger '{}'", args->uuid,
                                   l.file().string()));
    print_entry(*e, true);
  });
  for (const auto& [verb, status, help] :
       {std::tuple{"quarantine", DeviceHealth::quarantined,
                   "Quarantine a device: parity train refuses it until it is released"},
        std::tuple{"release", DeviceHealth::healthy,
                   "Release a device (healthy again), saying why it can be trusted"}}) {
    CLI::App* sub = cmd->add_subcommand(verb, help);
    sub->add_option("uuid", args->uuid, "The device's UUID")->required();
    sub->add_option("--reason", args->reason, "Why (kept in the device's history)")->required();
    sub->add_option("--name", args->name, "The device's name, where the ledger has none yet");
    const DeviceHealth to = status;
    const std::string source = fmt::format("parity ledger {}", verb);
    sub->callback([args, to, source] {
      HealthLedger l = open_ledger(*args);
      // A release lowers the status; a quarantine by hand raises it.
      const LedgerEntry e = l.record(args->uuid, args->name, to, args->reason, source,
                                     /*lower=*/to == DeviceHealth::healthy);
      print_entry(e, true);
    });
  }
}

}  // namespace parity::cli
