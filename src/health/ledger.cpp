// The quarantine ledger (parity/health.h).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "parity/health.h"

namespace parity {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "parity-health-ledger-1";

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

DeviceHealth parse_status(const std::string& s, const std::string& where) {
  for (const auto& n : kDeviceHealthNames)
    if (n.name == s) return n.value;
  throw InputError(fmt::format("{} '{}', expected healthy, suspect or quarantined", where, s));
}

// The exclusive lock of one change: FILE.lock, a file of its own (FILE itself is replaced by
// each write, so a lock on it would not hold).
class LedgerLock {
 public:
  explicit LedgerLock(const fs::path& file) {
    const fs::path lock = fs::path(file.string() + ".lock");
    fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw InputError(fmt::format("cannot write the health ledger '{}': {}", lock.string(),
                                   std::strerror(errno)));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd_);
      throw InputError(fmt::format("cannot lock the health ledger '{}': {}", lock.string(), why));
    }
  }
  ~LedgerLock() { ::close(fd_); }
  LedgerLock(const LedgerLock&) = delete;
  LedgerLock& operator=(const LedgerLock&) = delete;

 private:
  int fd_ = -1;
};

std::map<std::string, LedgerEntry> parse(const fs::path& file) {
  std::map<std::string, LedgerEntry> out;
  const std::string where = fmt::format("health ledger '{}'", file.string());
  std::error_code ec;
  const bool here = fs::exists(file, ec);
  if (ec)  // not "absent": a ledger that cannot be looked at must not be written over
    throw InputError(fmt::format("cannot look at the {}: {}", where, ec.message()));
  if (!here) return out;
  std::ifstream in(file);
  if (!in) throw InputError(fmt::format("cannot read the {}", where));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw InputError(
        fmt::format("{} is not JSON: {} (fix or move the file; every change to it is "
                    "written whole, so only an edit by hand breaks it)",
                    where, e.what()));
  }
  try {
    if (j.at("format").get<std::string>() != kFormat)
      throw InputError(fmt::format("{}: format '{}', expected '{}'", where,
                                   j.at("format").get<std::string>(), kFormat));
    for (const auto& [uuid, d] : j.at("devices").items()) {
      const std::string dw = fmt::format("{}: device '{}'", where, uuid);
      LedgerEntry e;
      e.uuid = uuid;
      e.name = d.at("name").get<std::string>();
      e.status = parse_status(d.at("status").get<std::string>(), dw + ": status");
      for (const auto& h : d.at("history")) {
        LedgerEvent ev;
        ev.time = h.at("time").get<std::string>();
        ev.status = parse_status(h.at("status").get<std::string>(), dw + ": history status");
        ev.reason = h.at("reason").get<std::string>();
        ev.source = h.at("source").get<std::string>();
        ev.host = h.at("host").get<std::string>();
        e.history.push_back(std::move(ev));
      }
      out.emplace(uuid, std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{} is not a health ledger: {}", where, e.what()));
  }
  return out;
}

void write(const fs::path& file, const std::map<std::string, LedgerEntry>& devices) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  nlohmann::ordered_json all = nlohmann::ordered_json::object();
  for (const auto& [uuid, e] : devices) {
    nlohmann::ordered_json history = nlohmann::ordered_json::array();
    for (const LedgerEvent& ev : e.history)
      history.push_back({{"time", ev.time},
                         {"status", std::string(name_in(kDeviceHealthNames, ev.status))},
                         {"reason", ev.reason},
                         {"source", ev.source},
                         {"host", ev.host}});
    all[uuid] = {{"name", e.name},
                 {"status", std::string(name_in(kDeviceHealthNames, e.status))},
                 {"history", history}};
  }
  j["devices"] = all;
  const std::string text = j.dump(1) + "\n";
  AtomicFile out(file, "health ledger");
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("unknown");
}

HealthLedger::HealthLedger(fs::path file) : file_(std::move(file)) {}

std::map<std::string, LedgerEntry> HealthLedger::read() const {
  return parse(file_);
}

std::optional<LedgerEntry> HealthLedger::find(const std::string& uuid) const {
  auto all = read();
  const auto it = all.find(uuid);
  if (it == all.end()) return std::nullopt;
  return it->second;
}

LedgerEntry HealthLedger::record(const std::string& uuid, const std::string& name,
                                 DeviceHealth status, const std::string& reason,
                                 const std::string& source, bool lower) {
  if (uuid.empty()) throw Error("HealthLedger::record: a device without a UUID");
  std::error_code ec;
  if (file_.has_parent_path()) fs::create_directories(file_.parent_path(), ec);
  const LedgerLock lock(file_);
  std::map<std::string, LedgerEntry> all = parse(file_);
  const bool known = all.count(uuid) > 0;
  LedgerEntry& e = all[uuid];
  e.uuid = uuid;
  if (!name.empty()) e.name = name;
  e.status = lower || !known ? status : std::max(e.status, status);
  e.history.push_back({now_utc(), status, reason, source, host_name()});
  write(file_, all);
  return e;
}

fs::path default_ledger_path() {
  if (const char* p = std::getenv("PARITY_HEALTH_LEDGER"); p != nullptr && *p != '\0') return p;
  if (const char* s = std::getenv("XDG_STATE_HOME"); s != nullptr && *s != '\0')
    return fs::path(s) / "parity" / "health-ledger.json";
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr && *home != '\0' ? home : ".") / ".local" / "state" / "parity" /
         "health-ledger.json";
}

std::string check_device_allowed(const HealthLedger& ledger, const std::string& uuid,
                                 const std::string& name, bool allow_quarantined) {
  if (uuid.empty()) return {};
  const std::optional<LedgerEntry> e = ledger.find(uuid);
  if (!e || e->status == DeviceHealth::healthy) return {};
  const LedgerEvent* last = e->history.empty() ? nullptr : &e->history.back();
  const std::string why = last == nullptr ? std::string("no history")
                                          : fmt::format("since {}: {} (by {} on {})", last->time,
                                                        last->reason, last->source, last->host);
  const std::string device = fmt::format("device {} ({})", uuid, name.empty() ? e->name : name);
  if (e->status == DeviceHealth::quarantined && !allow_quarantined)
    throw InputError(fmt::format(
        "{} is quarantined in the health ledger '{}' {}; check it with the vendor's diagnostics, "
        "release it with `parity ledger release {} --reason ...` once it is mended, or give "
        "--allow-quarantined to use it anyway",
        device, ledger.file().string(), why, uuid));
  return fmt::format("{} is {} in the health ledger '{}' {}", device,
                     name_in(kDeviceHealthNames, e->status), ledger.file().string(), why);
}

}  // namespace parity
