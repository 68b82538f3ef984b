// Device specs: the catalog loads and is self-consistent, lookups work, and
// every kind of bad device file gets an InputError naming file, line and field.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "parity/error.h"
#include "parity/spec.h"
#include "spec_test_util.h"

namespace parity {
namespace {

using testing::device_dir;
using testing::input_error_of;
using testing::replaced;

// ------------------------------------------------------------- catalog ----

TEST(DeviceCatalog, EveryFileLoads) {
  const auto devices = load_device_catalog(device_dir());
  ASSERT_EQ(devices.size(), 8u);
  const std::vector<std::string> names = {"b200",   "gb200",  "h100",   "h200",
                                          "mi300x", "mi325x", "mi350x", "mi355x"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const DeviceSpec& d = devices[i];
    SCOPED_TRACE(d.name);
    EXPECT_EQ(d.name, names[i]) << "sorted by name";
    EXPECT_EQ(std::filesystem::path(d.source_file).stem().string(), d.name);
    EXPECT_FALSE(d.display_name.empty());
    for (const Sourced* s :
         {&d.hbm_bytes, &d.hbm_bandwidth, &d.fp32_flops, &d.bf16_flops, &d.fp16_flops,
          &d.compute_units, &d.warp_size, &d.l2_bytes, &d.llc_bytes, &d.shared_memory_per_cu,
          &d.scale_up_bandwidth, &d.scale_up_domain, &d.scale_out_bandwidth, &d.host_link_bandwidth,
          &d.host_memory_bytes})
      EXPECT_GE(s->source.size(), 10u) << "every number needs a real source";
    EXPECT_TRUE(d.fp8_flops.has_value());
    EXPECT_TRUE(d.fp8_format.has_value());
  }
}

TEST(DeviceCatalog, VendorFacts) {
  for (const auto& d : load_device_catalog(device_dir())) {
    SCOPED_TRACE(d.name);
    const bool amd = d.vendor == Vendor::amd;
    EXPECT_EQ(d.warp_size.value, amd ? 64 : 32);
    EXPECT_EQ(d.arch.substr(0, 3), amd ? "gfx" : "sm_");
    // FP8: OCP on Hopper, Blackwell and CDNA4; FNUZ on CDNA3.
    EXPECT_EQ(*d.fp8_format, d.arch == "gfx942" ? Fp8Format::fnuz : Fp8Format::ocp);
    // TF32 units everywhere except CDNA4, where hipBLASLt emulates TF32 with bf16 products.
    EXPECT_EQ(d.tf32_native(), d.arch != "gfx950");
    EXPECT_EQ(d.tf32_emulation, d.arch == "gfx950" ? Tf32Emulation::bf16x3 : Tf32Emulation::none);
    EXPECT_EQ(d.llc_bytes.value > 0, amd) << "only the AMD parts have an Infinity Cache";
  }
}

TEST(DeviceCatalog, SpotCheckReferenceNumbers) {
  const DeviceSpec h200 = find_device("h200", device_dir());
  EXPECT_DOUBLE_EQ(h200.hbm_bytes.value, 141e9);
  EXPECT_DOUBLE_EQ(h200.hbm_bandwidth.value, 4.8e12);
  EXPECT_DOUBLE_EQ(h200.dense_flops(DenseMath::bf16), 989e12);
  EXPECT_DOUBLE_EQ(h200.dense_flops(DenseMath::tf32), 495e12);
  EXPECT_DOUBLE_EQ(h200.compute_units.value, 132);
  const DeviceSpec mi300x = find_device("mi300x", device_dir());
  EXPECT_DOUBLE_EQ(mi300x.hbm_bytes.value, 192e9);
  EXPECT_DOUBLE_EQ(mi300x.compute_units.value, 304);
  EXPECT_DOUBLE_EQ(mi300x.dense_flops(DenseMath::fp16), 1307.4e12);
  const DeviceSpec gb200 = find_device("gb200", device_dir());
  EXPECT_DOUBLE_EQ(gb200.scale_up_domain.value, 72);
}

TEST(DeviceSpec, DenseFlopsTf32ThrowsWhereThereIsNone) {
  DeviceSpec d = find_device("mi350x", device_dir());
  d.tf32_emulation = Tf32Emulation::none;  // no TF32 units and no emulation
  EXPECT_FALSE(d.has_tf32());
  try {
    d.dense_flops(DenseMath::tf32);
    FAIL() << "expected parity::Error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "mi350x");
    EXPECT_CONTAINS(e.what(), "TF32");
  }
  EXPECT_GT(d.dense_flops(DenseMath::fp32), 0.0);
  EXPECT_GT(d.dense_flops(DenseMath::bf16), d.dense_flops(DenseMath::fp32));
  // The catalog's CDNA4 parts emulate it: a third of their bf16 peak.
  const DeviceSpec mi355x = find_device("mi355x", device_dir());
  EXPECT_DOUBLE_EQ(mi355x.dense_flops(DenseMath::tf32), mi355x.bf16_flops.value / 3);
}

TEST(FindDevice, ByKeyCaseInsensitiveOrByPath) {
  EXPECT_EQ(find_device("H200", device_dir()).name, "h200");
  EXPECT_EQ(find_device("MI350X", device_dir()).name, "mi350x");
  const auto path = (device_dir() / "b200.yaml").string();
  EXPECT_EQ(find_device(path, device_dir()).name, "b200");
}

TEST(FindDevice, UnknownKeyListsAvailable) {
  const std::string msg = input_error_of([] { find_device("h300", device_dir()); });
  EXPECT_CONTAINS(msg, "unknown device 'h300'");
  EXPECT_CONTAINS(msg, "did you mean");
  EXPECT_CONTAINS(msg, "b200, gb200, h100, h200, mi300x, mi325x, mi350x or mi355x");
  EXPECT_CONTAINS(input_error_of([] { find_device("nope/x.yaml", device_dir()); }),
                  "cannot read device spec 'nope/x.yaml': no such file");
  EXPECT_CONTAINS(input_error_of([] { find_device("h200", "/nonexistent-catalog"); }),
                  "cannot read device catalog '/nonexistent-catalog': no such directory");
}

TEST(DeviceCatalog, DuplicateNamesRejected) {
  const auto dir = std::filesystem::temp_directory_path() / "parity_test_catalog_dup";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(device_dir() / "h100.yaml", dir / "a.yaml");
  std::filesystem::copy_file(device_dir() / "h100.yaml", dir / "b.yaml");
  const std::string msg = input_error_of([&] { load_device_catalog(dir); });
  std::filesystem::remove_all(dir);
  EXPECT_CONTAINS(msg, "b.yaml: device name 'h100' is also used by");
  EXPECT_CONTAINS(msg, "a.yaml");
}

// ------------------------------------------------------------- parsing ----

// A valid device; the bad-input tests change one thing each. Line numbers matter.
const std::string kDevice =
    "name: testgpu\n"                                               // 1
    "display_name: Test GPU\n"                                      // 2
    "vendor: nvidia\n"                                              // 3
    "arch: sm_90\n"                                                 // 4
    "memory:\n"                                                     // 5
    "  hbm_bytes: {value: 80.0e9, source: \"s\"}\n"                 // 6
    "  hbm_bandwidth: {value: 3.35e12, source: \"s\"}\n"            // 7
    "  l2_bytes: {value: 52428800, source: \"s\"}\n"                // 8
    "  llc_bytes: {value: 0, source: \"none\"}\n"                   // 9
    "  shared_memory_per_cu: {value: 233472, source: \"s\"}\n"      // 10
    "compute:\n"                                                    // 11
    "  compute_units: {value: 132, source: \"s\"}\n"                // 12
    "  warp_size: {value: 32, source: \"s\"}\n"                     // 13
    "  fp32_flops: {value: 67.0e12, source: \"s\"}\n"               // 14
    "  tf32_flops: {value: 495.0e12, source: \"s\"}\n"              // 15
    "  bf16_flops: {value: 989.0e12, source: \"s\"}\n"              // 16
    "  fp16_flops: {value: 989.0e12, source: \"s\"}\n"              // 17
    "  fp8_flops: {value: 1979.0e12, source: \"s\"}\n"              // 18
    "  fp8_format: ocp\n"                                           // 19
    "interconnect:\n"                                               // 20
    "  scale_up_bandwidth: {value: 450.0e9, source: \"s\"}\n"       // 21
    "  scale_up_domain: {value: 8, source: \"s\"}\n"                // 22
    "  scale_out_bandwidth: {value: 50.0e9, source: \"s\"}\n"       // 23
    "  host_link_bandwidth: {value: 64.0e9, source: \"s\"}\n"       // 24
    "host:\n"                                                       // 25
    "  host_memory_bytes: {value: 274877906944, source: \"s\"}\n";  // 26

std::string device_error(const std::string& text) {
  return input_error_of([&] { parse_device_spec(text, "dev.yaml"); });
}

TEST(DeviceParse, BaseIsValid) {
  const DeviceSpec d = parse_device_spec(kDevice, "<string>");
  EXPECT_EQ(d.name, "testgpu");
  EXPECT_EQ(d.vendor, Vendor::nvidia);
  EXPECT_EQ(d.source_file, "<string>");
  EXPECT_DOUBLE_EQ(d.llc_bytes.value, 0.0);
  EXPECT_EQ(d.llc_bytes.source, "none");
  EXPECT_EQ(d.fp8_format, Fp8Format::ocp);
  EXPECT_DOUBLE_EQ(d.dense_flops(DenseMath::fp16), 989e12);
  EXPECT_EQ(vendor_name(Vendor::amd), "amd");
}

TEST(DeviceParse, UnknownFieldSuggestsClosest) {
  const std::string msg = device_error(replaced(kDevice, "  hbm_bytes:", "  hbm_byte:"));
  EXPECT_CONTAINS(msg,
                  "dev.yaml:6:3: unknown field 'hbm_byte' in 'memory' (did you mean 'hbm_bytes'?)");
}

TEST(DeviceParse, SyntaxError) {
  const std::string msg = device_error(replaced(kDevice, "source: \"none\"}", "source: \"none}"));
  EXPECT_CONTAINS(msg, "dev.yaml:");
  EXPECT_CONTAINS(msg, "YAML syntax error");
}

TEST(DeviceParse, WarpSizeMustMatchVendor) {
  std::string msg = device_error(replaced(kDevice, "{value: 32,", "{value: 64,"));
  EXPECT_CONTAINS(
      msg,
      "dev.yaml:13:22: field 'compute.warp_size.value': an nvidia GPU has warp size 32, got 64");
  msg =
      device_error(replaced(replaced(kDevice, "vendor: nvidia", "vendor: amd"), "sm_90", "gfx942"));
  EXPECT_CONTAINS(msg, "dev.yaml:13:");
  EXPECT_CONTAINS(msg, "an amd GPU has warp size 64, got 32");
}

TEST(DeviceParse, ArchMustMatchVendor) {
  std::string msg = device_error(replaced(kDevice, "arch: sm_90", "arch: gfx942"));
  EXPECT_CONTAINS(msg, "dev.yaml:4:7: field 'arch': expected an NVIDIA architecture such as sm_90");
  EXPECT_CONTAINS(msg, "got 'gfx942'");
  msg = device_error(
      replaced(replaced(kDevice, "vendor: nvidia", "vendor: amd"), "{value: 32,", "{value: 64,"));
  EXPECT_CONTAINS(msg, "dev.yaml:4:7: field 'arch': expected an AMD architecture");
  msg = device_error(replaced(kDevice, "vendor: nvidia", "vendor: nvdia"));
  EXPECT_CONTAINS(msg,
                  "dev.yaml:3:9: field 'vendor': expected one of nvidia or amd, got 'nvdia' "
                  "(did you mean 'nvidia'?)");
}

TEST(DeviceParse, EveryNumberNeedsASource) {
  std::string msg =
      device_error(replaced(kDevice, "{value: 3.35e12, source: \"s\"}", "{value: 3.35e12}"));
  EXPECT_CONTAINS(msg, "dev.yaml:7:18: missing field 'memory.hbm_bandwidth.source'");
  msg = device_error(replaced(kDevice, "{value: 3.35e12, source: \"s\"}", "3.35e12"));
  EXPECT_CONTAINS(
      msg,
      "dev.yaml:7:18: field 'memory.hbm_bandwidth': expected {value: N, source: \"...\"}, "
      "got '3.35e12'");
  msg = device_error(
      replaced(kDevice, "{value: 3.35e12, source: \"s\"}", "{value: 3.35e12, source: \"  \"}"));
  EXPECT_CONTAINS(msg, "field 'memory.hbm_bandwidth.source': expected a non-empty source");
}

TEST(DeviceParse, NumbersMustBePositiveAndWholeWhereCounted) {
  std::string msg = device_error(replaced(kDevice, "{value: 132,", "{value: 131.5,"));
  EXPECT_CONTAINS(msg,
                  "dev.yaml:12:26: field 'compute.compute_units.value': expected a positive whole "
                  "number, got '131.5'");
  msg = device_error(replaced(kDevice, "{value: 3.35e12,", "{value: -1,"));
  EXPECT_CONTAINS(msg, "field 'memory.hbm_bandwidth.value': expected a positive number, got '-1'");
  msg = device_error(
      replaced(kDevice, "{value: 0, source: \"none\"}", "{value: -1, source: \"none\"}"));
  EXPECT_CONTAINS(msg, "field 'memory.llc_bytes.value': expected a whole number >= 0");
  msg = device_error(replaced(kDevice, "{value: 8,", "{value: 0,"));
  EXPECT_CONTAINS(msg, "field 'interconnect.scale_up_domain.value'");
  msg = device_error(replaced(kDevice, "{value: 67.0e12,", "{value: .nan,"));
  EXPECT_CONTAINS(msg, "field 'compute.fp32_flops.value'");
  // Rates that are infinite, or so small that they are a unit mistake, would plan inf ms/step.
  msg = device_error(replaced(kDevice, "{value: 3.35e12,", "{value: .inf,"));
  EXPECT_CONTAINS(msg, "field 'memory.hbm_bandwidth.value': expected a positive number");
  msg = device_error(replaced(kDevice, "{value: 3.35e12,", "{value: 3.35,"));
  EXPECT_CONTAINS(msg, "field 'memory.hbm_bandwidth.value': 3.35 is not a plausible peak bytes/s");
  msg = device_error(replaced(kDevice, "{value: 67.0e12,", "{value: 1e-300,"));
  EXPECT_CONTAINS(msg, "give bytes/s or FLOP/s, not GB/s or TFLOP/s");
}

TEST(DeviceParse, PeakOrdering) {
  std::string msg = device_error(replaced(kDevice, "{value: 495.0e12,", "{value: 1200.0e12,"));
  EXPECT_CONTAINS(msg,
                  "dev.yaml:15:15: field 'compute.tf32_flops': tf32 peak (1.2e+15 FLOP/s) must lie "
                  "between the fp32 peak (6.7e+13) and the bf16 peak (9.89e+14)");
  msg = device_error(replaced(kDevice, "{value: 67.0e12,", "{value: 1000.0e12,"));
  EXPECT_CONTAINS(msg, "field 'compute.bf16_flops': bf16 peak");
  msg = device_error(replaced(kDevice, "{value: 1979.0e12,", "{value: 500.0e12,"));
  EXPECT_CONTAINS(msg, "dev.yaml:18:");
  EXPECT_CONTAINS(msg, "field 'compute.fp8_flops': fp8 peak");
  // TF32 may be absent.
  EXPECT_FALSE(parse_device_spec(
                   replaced(kDevice, "  tf32_flops: {value: 495.0e12, source: \"s\"}\n", ""), "x")
                   .has_tf32());
}

TEST(DeviceParse, Tf32EmulationOnlyWithoutTf32Units) {
  const std::string without = replaced(kDevice, "  tf32_flops: {value: 495.0e12, source: \"s\"}\n",
                                       "  tf32_emulation: bf16x3\n");
  const DeviceSpec d = parse_device_spec(without, "x");
  EXPECT_TRUE(d.has_tf32());
  EXPECT_FALSE(d.tf32_native());
  EXPECT_DOUBLE_EQ(d.dense_flops(DenseMath::tf32), d.bf16_flops.value / 3);
  std::string msg = device_error(replaced(without, "bf16x3", "xf32"));
  EXPECT_CONTAINS(msg, "field 'compute.tf32_emulation': expected one of none or bf16x3");
  msg = device_error(
      replaced(kDevice, "  fp8_format: ocp\n", "  fp8_format: ocp\n  tf32_emulation: bf16x3\n"));
  EXPECT_CONTAINS(msg,
                  "tf32_emulation is for a device without TF32 units, and tf32_flops is given");
}

TEST(DeviceParse, Fp8FormatIffFp8Flops) {
  std::string msg = device_error(replaced(kDevice, "  fp8_format: ocp\n", ""));
  EXPECT_CONTAINS(msg, "dev.yaml:12:3: missing field 'compute.fp8_format'");
  msg = device_error(replaced(kDevice, "  fp8_flops: {value: 1979.0e12, source: \"s\"}\n", ""));
  EXPECT_CONTAINS(msg, "field 'compute.fp8_format': fp8_format is given but fp8_flops is not");
  msg = device_error(replaced(kDevice, "fp8_format: ocp", "fp8_format: e4m3"));
  EXPECT_CONTAINS(msg, "dev.yaml:19:15: field 'compute.fp8_format': expected one of ocp or fnuz");
  const DeviceSpec d =
      parse_device_spec(replaced(replaced(kDevice, "  fp8_format: ocp\n", ""),
                                 "  fp8_flops: {value: 1979.0e12, source: \"s\"}\n", ""),
                        "x");
  EXPECT_FALSE(d.fp8_flops.has_value());
  EXPECT_FALSE(d.fp8_format.has_value());
}

TEST(DeviceParse, MissingSection) {
  const std::string msg = device_error(
      replaced(kDevice, "host:\n  host_memory_bytes: {value: 274877906944, source: \"s\"}\n", ""));
  EXPECT_CONTAINS(msg, "dev.yaml:1:1: missing field 'host'");
}

TEST(DeviceLoad, MissingFile) {
  EXPECT_EQ(input_error_of([] { load_device_spec("/nonexistent/h999.yaml"); }),
            "cannot read device spec '/nonexistent/h999.yaml': no such file");
}

}  // namespace
}  // namespace parity

namespace parity {
namespace {

// What the runtimes report, mapped to the catalog (parity train plans for the detected device).
TEST(MatchDevice, RuntimeNamesFindTheirCatalogEntry) {
  const auto dir = std::filesystem::path(PARITY_SOURCE_DIR) / "configs" / "devices";
  const std::pair<const char*, const char*> cases[] = {
      {"NVIDIA H200", "h200"},           {"NVIDIA H100 80GB HBM3", "h100"},
      {"NVIDIA B200", "b200"},           {"NVIDIA GB200", "gb200"},
      {"AMD Instinct MI300X", "mi300x"}, {"AMD Instinct MI355X", "mi355x"},
  };
  for (const auto& [name, key] : cases) {
    const auto dev = match_device(name, dir);
    ASSERT_TRUE(dev.has_value()) << name;
    EXPECT_EQ(dev->name, key) << name;
  }
  EXPECT_FALSE(match_device("NVIDIA GeForce RTX 4090", dir).has_value());
  // Other form factors than the catalog's SXM parts: not silently taken for them.
  EXPECT_FALSE(match_device("NVIDIA H200 NVL", dir).has_value());
  EXPECT_FALSE(match_device("NVIDIA H100 PCIe", dir).has_value());
  EXPECT_FALSE(match_device("", dir).has_value());
}

}  // namespace
}  // namespace parity
