// The quarantine ledger: events recorded and read back, concurrent writers from several processes
// losing none of each other's events, a malformed file refused by name, and the train-time check.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "parity/health.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

class Ledger : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("parity-ledger-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(Ledger, EventsAreRecordedWithTheirHistory) {
  HealthLedger l(dir_ / "sub" / "ledger.json");  // the directory is made on the first write
  EXPECT_TRUE(l.read().empty());
  EXPECT_FALSE(l.find("GPU-1").has_value());
  l.record("GPU-1", "NVIDIA H200", DeviceHealth::healthy, "quick: all checks passed", "doctor");
  l.record("GPU-2", "NVIDIA H200", DeviceHealth::suspect, "GEMM rate 81% of expected", "doctor");
  const LedgerEntry e =
      l.record("GPU-1", "", DeviceHealth::quarantined, "bit flip in GEMM test", "replay");
  EXPECT_EQ(e.name, "NVIDIA H200");  // a nameless event keeps the name
  const auto all = l.read();
  ASSERT_EQ(all.size(), 2u);
  const LedgerEntry& g1 = all.at("GPU-1");
  EXPECT_EQ(g1.status, DeviceHealth::quarantined);
  ASSERT_EQ(g1.history.size(), 2u);
  EXPECT_EQ(g1.history[0].status, DeviceHealth::healthy);
  EXPECT_EQ(g1.history[1].reason, "bit flip in GEMM test");
  EXPECT_EQ(g1.history[1].source, "replay");
  EXPECT_EQ(g1.history[1].time.size(), 20u);  // 2026-12-05T01:02:03Z
  EXPECT_FALSE(g1.history[1].host.empty());
  EXPECT_EQ(all.at("GPU-2").status, DeviceHealth::suspect);
}

TEST_F(Ledger, ConcurrentWritersLoseNothing) {
  const fs::path file = dir_ / "ledger.json";
  constexpr int kWriters = 4, kEach = 25;
  std::vector<pid_t> children;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        HealthLedger l(file);
        for (int i = 0; i < kEach; ++i)
          l.record(i % 2 == 0 ? "GPU-A" : "GPU-B", "dev", DeviceHealth::suspect,
                   "writer " + std::to_string(w) + " event " + std::to_string(i), "test");
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const auto all = HealthLedger(file).read();
  std::size_t events = 0;
  std::set<std::string> reasons;
  for (const auto& [uuid, e] : all)
    for (const LedgerEvent& ev : e.history) {
      ++events;
      reasons.insert(ev.reason);
    }
  EXPECT_EQ(events, static_cast<std::size_t>(kWriters * kEach));
  EXPECT_EQ(reasons.size(), static_cast<std::size_t>(kWriters * kEach));
}

TEST_F(Ledger, AMalformedFileIsRefusedByName) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "ledger.json";
  std::ofstream(file) << R"({"format": "parity-health-ledger-1", "devices": {"GPU-1": )"
                      << R"({"name": "x", "status": "sick", "history": []}}})";
  try {
    (void)HealthLedger(file).read();
    FAIL() << "read";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(file.string()), std::string::npos) << m;
    EXPECT_NE(m.find("device 'GPU-1': status 'sick', expected healthy, suspect or quarantined"),
              std::string::npos)
        << m;
  }
  std::ofstream(file) << "{ torn";
  EXPECT_THROW((void)HealthLedger(file).read(), InputError);
  // A write refuses to replace what it cannot read (it would lose the history).
  EXPECT_THROW(HealthLedger(file).record("GPU-1", "x", DeviceHealth::healthy, "r", "s"),
               InputError);
}

TEST_F(Ledger, TrainingRefusesAQuarantinedDeviceUnlessAllowed) {
  HealthLedger l(dir_ / "ledger.json");
  EXPECT_EQ(check_device_allowed(l, "GPU-1", "H200", false), "");  // unknown: allowed
  l.record("GPU-1", "H200", DeviceHealth::suspect, "bandwidth 90% of expected", "doctor");
  EXPECT_NE(check_device_allowed(l, "GPU-1", "H200", false).find("is suspect"), std::string::npos);
  l.record("GPU-1", "H200", DeviceHealth::quarantined, "HBM rows pending remap", "doctor");
  try {
    (void)check_device_allowed(l, "GPU-1", "H200", false);
    FAIL() << "allowed";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("device GPU-1 (H200) is quarantined"), std::string::npos) << m;
    EXPECT_NE(m.find("HBM rows pending remap"), std::string::npos) << m;
    EXPECT_NE(m.find("--allow-quarantined"), std::string::npos) << m;
  }
  EXPECT_NE(check_device_allowed(l, "GPU-1", "H200", true).find("is quarantined"),
            std::string::npos);
  // An automatic "suspect" does not undo a quarantine; only a release lowers the status.
  EXPECT_EQ(l.record("GPU-1", "", DeviceHealth::suspect, "product check", "train").status,
            DeviceHealth::quarantined);
  EXPECT_EQ(l.record("GPU-1", "", DeviceHealth::healthy, "HBM replaced", "operator", true).status,
            DeviceHealth::healthy);
  EXPECT_EQ(check_device_allowed(l, "GPU-1", "H200", false), "");
  EXPECT_EQ(check_device_allowed(l, "", "cpu", false), "");  // no UUID: nothing to check
}

}  // namespace
}  // namespace parity
