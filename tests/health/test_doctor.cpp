// parity doctor's checks on the cpu backend (its memory is the host's, its products double-
// accumulated): a clean run is healthy; a planted product bit flip makes it suspect, a planted
// memory bit flip failed, each naming what it found; a rate under what is expected is suspect;
// telemetry that warns is judged as the vendor's guidance says. The same checks run on a GPU
// through the GPU backend's ops (docs/reliability.md has the H200's figures).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "parity/doctor.h"

namespace parity {
namespace {

DoctorOptions small_options() {
  DoctorOptions o;
  o.gemm_size = 48;
  o.memory_bytes = std::size_t{1} << 20;
  o.copy_bytes = std::size_t{1} << 20;
  o.math = DenseMath::fp32;
  o.seed = 7;
  return o;
}

const DoctorCheck& check_named(const DoctorReport& r, const std::string& prefix) {
  for (const DoctorCheck& c : r.checks)
    if (c.name.rfind(prefix, 0) == 0) return c;
  throw std::runtime_error("no check named " + prefix);
}

TEST(Doctor, CleanRunIsHealthy) {
  auto b = make_cpu_backend();
  const DoctorReport r = run_doctor(*b, nullptr, "cpu", "", small_options());
  EXPECT_EQ(r.verdict, DoctorVerdict::healthy) << doctor_report_text(r);
  EXPECT_TRUE(r.reasons.empty());
  const DoctorCheck& mem = check_named(r, "memory patterns");
  // Five patterns over 1 MiB of 32-bit words, one pass.
  ASSERT_FALSE(mem.values.empty());
  EXPECT_EQ(mem.values[1].second, 5.0 * (1 << 18));
  EXPECT_EQ(mem.values[2].second, 0.0);
  EXPECT_NE(check_named(r, "product repeat").summary.find("identical to the first"),
            std::string::npos);
  EXPECT_NE(check_named(r, "product against the host").summary.find("within the rounding bound"),
            std::string::npos);
  // Nothing to compare rates with: measured, not judged.
  EXPECT_NE(check_named(r, "copy rate").summary.find("nothing to compare"), std::string::npos);
}

TEST(Doctor, PlantedProductFlipIsSuspect) {
  auto b = make_cpu_backend();
  for (const int bit : {31, 30, 23, 20}) {  // sign, exponent, high mantissa
    DoctorOptions o = small_options();
    o.inject = DoctorFault{DoctorFault::Where::gemm, 1234, bit};
    const DoctorReport r = run_doctor(*b, nullptr, "cpu", "", o);
    EXPECT_EQ(r.verdict, DoctorVerdict::suspect) << "bit " << bit << "\n" << doctor_report_text(r);
    const DoctorCheck& rep = check_named(r, "product repeat");
    EXPECT_EQ(rep.verdict, DoctorVerdict::suspect);
    // 1234 = row 25, column 34 of the 48 x 48 result; one result of the four differs, by one
    // element.
    EXPECT_NE(rep.summary.find("1 of 4 results differ from the first in 1 elements"),
              std::string::npos)
        << rep.summary;
    EXPECT_NE(rep.summary.find("element (25, 34)"), std::string::npos) << rep.summary;
  }
}

TEST(Doctor, PlantedMemoryFlipFails) {
  auto b = make_cpu_backend();
  DoctorOptions o = small_options();
  o.inject = DoctorFault{DoctorFault::Where::memory, 4321, 3};
  const DoctorReport r = run_doctor(*b, nullptr, "cpu", "", o);
  EXPECT_EQ(r.verdict, DoctorVerdict::failed);
  const DoctorCheck& mem = check_named(r, "memory patterns");
  EXPECT_EQ(mem.verdict, DoctorVerdict::failed);
  EXPECT_NE(mem.summary.find("1 of 1310720 words read back wrong"), std::string::npos)
      << mem.summary;
  EXPECT_NE(mem.summary.find("walking ones pattern, buffer 0"), std::string::npos) << mem.summary;
  EXPECT_NE(mem.summary.find("word 4321"), std::string::npos) << mem.summary;
  EXPECT_EQ(ledger_status(r.verdict), DeviceHealth::quarantined);
}

TEST(Doctor, SlowRatesAreSuspect) {
  auto b = make_cpu_backend();
  DoctorOptions o = small_options();
  o.expected_copy_bytes_per_s = 1e18;  // no host copies at an exabyte a second
  o.expected_gemm_flops = 1e-3;        // any host multiplies faster than this
  const DoctorReport r = run_doctor(*b, nullptr, "cpu", "", o);
  EXPECT_EQ(r.verdict, DoctorVerdict::suspect);
  EXPECT_EQ(check_named(r, "copy rate").verdict, DoctorVerdict::suspect);
  EXPECT_NE(check_named(r, "copy rate").summary.find("(below 95%)"), std::string::npos);
  EXPECT_EQ(check_named(r, "product rate").verdict, DoctorVerdict::healthy);
  ASSERT_EQ(r.reasons.size(), 1u);
  EXPECT_EQ(r.reasons[0].rfind("copy rate: ", 0), 0u) << r.reasons[0];
}

TEST(Doctor, PatternsGiveEveryWordItsValue) {
  // Address patterns differ word to word and seed to seed; walking patterns have one bit set
  // (clear) in each of 32 positions; the two inverses are inverses.
  for (std::uint64_t i = 0; i < 64; ++i) {
    const std::uint32_t a = memory_pattern_word(MemoryPattern::address, i, 3);
    EXPECT_NE(a, memory_pattern_word(MemoryPattern::address, i + 1, 3));
    EXPECT_NE(a, memory_pattern_word(MemoryPattern::address, i, 4));
    EXPECT_NE(a, memory_pattern_word(MemoryPattern::address, i + (std::uint64_t{1} << 32), 3));
    EXPECT_EQ(~a, memory_pattern_word(MemoryPattern::inverse_address, i, 3));
    const std::uint32_t w = memory_pattern_word(MemoryPattern::walking_ones, i, 0);
    EXPECT_EQ(w, 1u << (i % 32));
    EXPECT_EQ(~w, memory_pattern_word(MemoryPattern::walking_zeros, i, 0));
  }
}

TEST(Doctor, TelemetryVerdicts) {
  DeviceTelemetry t;
  std::vector<std::string> reasons;
  EXPECT_EQ(judge_telemetry(t, reasons), DoctorVerdict::healthy);  // nothing readable: no finding
  EXPECT_TRUE(reasons.empty());
  t.remap_pending = true;
  EXPECT_EQ(judge_telemetry(t, reasons), DoctorVerdict::suspect);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("remapping is pending"), std::string::npos);
  t.remap_failed = true;
  reasons.clear();
  EXPECT_EQ(judge_telemetry(t, reasons), DoctorVerdict::failed);
  t = {};
  t.ecc_uncorrected_volatile = 2;
  t.ecc_corrected_volatile = 1000;  // corrected errors alone are the ECC doing its work
  reasons.clear();
  EXPECT_EQ(judge_telemetry(t, reasons), DoctorVerdict::suspect);
  EXPECT_NE(reasons[0].find("2 uncorrectable ECC errors"), std::string::npos);
}

TEST(Doctor, JsonReport) {
  auto b = make_cpu_backend();
  DoctorOptions o = small_options();
  o.level = DoctorLevel::quick;
  o.inject = DoctorFault{DoctorFault::Where::gemm, 5, 30};
  const DoctorReport r = run_doctor(*b, nullptr, "cpu", "CPU-0", o);
  const auto j = nlohmann::json::parse(doctor_report_json(r));
  EXPECT_EQ(j["verdict"], "suspect");
  EXPECT_EQ(j["level"], "quick");
  EXPECT_EQ(j["uuid"], "CPU-0");
  EXPECT_EQ(j["reasons"].size(), 1u);
  bool found = false;
  for (const auto& c : j["checks"])
    if (c["name"] == "product repeat") {
      found = true;
      EXPECT_EQ(c["verdict"], "suspect");
      EXPECT_EQ(c["values"]["results differing"], 1.0);
    }
  EXPECT_TRUE(found);
}

TEST(Doctor, NvmlAbsentIsAReasonNotACrash) {
  std::string why;
  const std::unique_ptr<TelemetrySource> t = open_nvml(&why);
  if (t) GTEST_SKIP() << "NVML is present here: " << t->name();
  EXPECT_NE(why.find("libnvidia-ml.so.1"), std::string::npos) << why;
}

}  // namespace
}  // namespace parity
