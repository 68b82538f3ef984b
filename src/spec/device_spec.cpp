// Device specs: one YAML file per accelerator in configs/devices/, every number
// with the public source it came from. The checks here catch the usual slips
// in such a table: a sparse peak where a dense one belongs (bf16 below fp32, or
// tf32 above bf16), a missing unit factor, a warp size copied from the other
// vendor, an NVIDIA arch on an AMD part.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <utility>

#include "parity/error.h"
#include "parity/spec.h"
#include "spec/yaml_util.h"

namespace parity {

std::string_view vendor_name(Vendor v) {
  return name_in(kVendorNames, v);
}

double DeviceSpec::dense_flops(DenseMath m) const {
  switch (m) {
    case DenseMath::fp32:
      return fp32_flops.value;
    case DenseMath::tf32:
      if (tf32_flops) return tf32_flops->value;
      if (tf32_emulation == Tf32Emulation::bf16x3) return bf16_flops.value / 3;
      throw Error(
          fmt::format("device '{}' ({}) has no TF32 math; use fp32 or bf16 dense math on it", name,
                      display_name));
    case DenseMath::bf16:
      return bf16_flops.value;
    case DenseMath::fp16:
      return fp16_flops.value;
  }
  throw Error("dense_flops: unknown dense math precision");
}

namespace {

using spec_yaml::Field;
using spec_yaml::MapView;

constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// What a number is, for the rules applied to it.
enum class Kind { rate, count, bytes_or_zero };

constexpr double kMinRate = 1e6;

struct ReadNumber {
  Sourced value;
  Field field;  // the {value, source} map, for messages that compare numbers
  Field value_field;
};

ReadNumber read_sourced(const MapView& parent, std::string_view key, std::string_view meaning,
                        Kind kind) {
  const Field f =
      parent.require(key, fmt::format("expected {{value: N, source: \"...\"}}: {}", meaning));
  if (f.node().IsScalar())
    f.fail(fmt::format(
        "expected {{value: N, source: \"...\"}}, got '{}' (every device number needs the public "
        "source it was taken from)",
        f.node().Scalar()));
  const MapView m = f.as_map({"value", "source"}, "{value: N, source: \"...\"}");
  const Field v = m.require("value", fmt::format("expected {}", meaning));
  const Field s =
      m.require("source", "every device number needs the public source it was taken from");
  ReadNumber out{{}, f, v};
  const bool integral = kind != Kind::rate;
  const bool zero_ok = kind == Kind::bytes_or_zero;
  const std::string expected = integral
                                   ? (zero_ok ? "a whole number >= 0" : "a positive whole number")
                                   : "a positive number";
  const double x = v.as_number(expected);
  if (!std::isfinite(x) || (zero_ok ? x < 0.0 : !(x > 0.0))) v.fail_expected(expected);
  // No accelerator moves or computes fewer than a million a second: a smaller rate is a unit
  // mistake (GB/s given for B/s), and would plan steps of years.
  if (kind == Kind::rate && x < kMinRate)
    v.fail(
        fmt::format("{:g} is not a plausible {} (expected at least {:g}: give bytes/s or "
                    "FLOP/s, not GB/s or TFLOP/s)",
                    x, meaning, kMinRate));
  if (integral && (std::trunc(x) != x || x > kMaxExactInteger)) v.fail_expected(expected);
  out.value.value = x;
  out.value.source = s.as_nonempty_string("a non-empty source (where the number comes from)");
  return out;
}

bool all_digits(std::string_view s, bool hex) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [hex](char c) {
    return (c >= '0' && c <= '9') || (hex && c >= 'a' && c <= 'f');
  });
}

bool is_nvidia_arch(std::string_view a) {
  // sm_90, sm_100, sm_90a, sm_100a
  if (a.substr(0, 3) != "sm_") return false;
  std::string_view rest = a.substr(3);
  if (!rest.empty() && rest.back() >= 'a' && rest.back() <= 'z') rest.remove_suffix(1);
  return rest.size() >= 2 && rest.size() <= 3 && all_digits(rest, false);
}

bool is_amd_arch(std::string_view a) {
  // gfx942, gfx950, gfx90a, gfx1100
  if (a.substr(0, 3) != "gfx") return false;
  std::string_view rest = a.substr(3);
  return rest.size() >= 3 && rest.size() <= 4 && all_digits(rest, true) && rest[0] >= '0' &&
         rest[0] <= '9';
}

void require_at_least(const ReadNumber& big, std::string_view big_name, const ReadNumber& small,
                      std::string_view small_name) {
  if (big.value.value < small.value.value)
    big.field.fail(
        fmt::format("{} peak ({:g} FLOP/s) is below the {} peak ({:g}); give dense peaks without "
                    "sparsity, in FLOP/s",
                    big_name, big.value.value, small_name, small.value.value));
}

DeviceSpec parse_device(const YAML::Node& root, const std::string& origin) {
  const Field top(root, "", &origin);
  const MapView m = top.as_map(
      {"name", "display_name", "vendor", "arch", "memory", "compute", "interconnect", "host"},
      "a map of device fields");
  DeviceSpec d;
  d.source_file = origin;
  const Field name = m.require("name", "expected the catalog key, e.g. name: h200");
  d.name = name.as_nonempty_string("a device key such as h200");
  for (char c : d.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      name.fail_expected("a device key made of letters, digits, '_', '-' or '.'");
  d.display_name = m.require("display_name", "expected a readable name, e.g. NVIDIA H200 SXM")
                       .as_nonempty_string("a non-empty display name");
  d.vendor = m.require("vendor", "expected nvidia or amd").as_choice(kVendorNames);
  const Field arch = m.require("arch", "expected sm_NN for nvidia or gfxNNN for amd");
  d.arch = arch.as_nonempty_string("an architecture such as sm_90 or gfx942");
  if (d.vendor == Vendor::nvidia && !is_nvidia_arch(d.arch))
    arch.fail(fmt::format(
        "expected an NVIDIA architecture such as sm_90 or sm_100 (vendor is nvidia), got '{}'",
        d.arch));
  if (d.vendor == Vendor::amd && !is_amd_arch(d.arch))
    arch.fail(fmt::format(
        "expected an AMD architecture such as gfx942 or gfx950 (vendor is amd), got '{}'", d.arch));

  // ---- memory ----
  const MapView mem =
      m.require("memory",
                "expected hbm_bytes, hbm_bandwidth, l2_bytes, llc_bytes, shared_memory_per_cu")
          .as_map({"hbm_bytes", "hbm_bandwidth", "l2_bytes", "llc_bytes", "shared_memory_per_cu"},
                  "a map of memory numbers");
  d.hbm_bytes = read_sourced(mem, "hbm_bytes", "bytes of device memory", Kind::count).value;
  d.hbm_bandwidth =
      read_sourced(mem, "hbm_bandwidth", "peak bytes/s of device memory", Kind::rate).value;
  d.l2_bytes = read_sourced(mem, "l2_bytes", "bytes of L2 cache", Kind::count).value;
  d.llc_bytes =
      read_sourced(mem, "llc_bytes", "bytes of cache beyond L2, 0 if none", Kind::bytes_or_zero)
          .value;
  d.shared_memory_per_cu = read_sourced(mem, "shared_memory_per_cu",
                                        "bytes of shared memory / LDS per SM or CU", Kind::count)
                               .value;

  // ---- compute ----
  const MapView comp =
      m.require("compute", "expected compute_units, warp_size and the dense FLOP/s peaks")
          .as_map({"compute_units", "warp_size", "fp32_flops", "tf32_flops", "bf16_flops",
                   "fp16_flops", "fp8_flops", "fp8_format", "tf32_emulation"},
                  "a map of compute numbers");
  d.compute_units = read_sourced(comp, "compute_units", "SMs or CUs", Kind::count).value;
  const ReadNumber warp =
      read_sourced(comp, "warp_size", "threads per warp / wavefront", Kind::count);
  d.warp_size = warp.value;
  const int want_warp = d.vendor == Vendor::nvidia ? 32 : 64;
  if (warp.value.value != want_warp)
    warp.value_field.fail(fmt::format("an {} GPU has warp size {}, got {:g}", vendor_name(d.vendor),
                                      want_warp, warp.value.value));
  const ReadNumber fp32 = read_sourced(comp, "fp32_flops", "dense fp32 FLOP/s", Kind::rate);
  const ReadNumber bf16 = read_sourced(comp, "bf16_flops", "dense bf16 FLOP/s", Kind::rate);
  const ReadNumber fp16 = read_sourced(comp, "fp16_flops", "dense fp16 FLOP/s", Kind::rate);
  d.fp32_flops = fp32.value;
  d.bf16_flops = bf16.value;
  d.fp16_flops = fp16.value;
  require_at_least(bf16, "bf16", fp32, "fp32");
  require_at_least(fp16, "fp16", fp32, "fp32");
  if (comp.has("tf32_flops")) {
    const ReadNumber tf32 = read_sourced(comp, "tf32_flops", "dense tf32 FLOP/s", Kind::rate);
    if (tf32.value.value < fp32.value.value || tf32.value.value > bf16.value.value)
      tf32.field.fail(fmt::format(
          "tf32 peak ({:g} FLOP/s) must lie between the fp32 peak ({:g}) and the bf16 peak "
          "({:g}); give dense peaks without sparsity, in FLOP/s",
          tf32.value.value, fp32.value.value, bf16.value.value));
    d.tf32_flops = tf32.value;
  }
  if (const auto emu = comp.get("tf32_emulation")) {
    d.tf32_emulation = emu->as_choice(kTf32EmulationNames);
    if (d.tf32_flops && d.tf32_emulation != Tf32Emulation::none)
      emu->fail(
          "tf32_emulation is for a device without TF32 units, and tf32_flops is given; give one");
  }
  const auto format_field = comp.get("fp8_format");
  if (comp.has("fp8_flops")) {
    const ReadNumber fp8 = read_sourced(comp, "fp8_flops", "dense fp8 FLOP/s", Kind::rate);
    require_at_least(fp8, "fp8", bf16, "bf16");
    d.fp8_flops = fp8.value;
    if (!format_field)
      comp.fail_missing("fp8_format",
                        "a device with fp8_flops needs its FP8 format: ocp (NVIDIA, CDNA4) or fnuz "
                        "(CDNA3)");
    d.fp8_format = format_field->as_choice(kFp8FormatNames);
  } else if (format_field) {
    format_field->fail("fp8_format is given but fp8_flops is not; give both or neither");
  }

  // ---- interconnect ----
  const MapView net =
      m.require(
           "interconnect",
           "expected scale_up_bandwidth, scale_up_domain, scale_out_bandwidth, host_link_bandwidth")
          .as_map({"scale_up_bandwidth", "scale_up_domain", "scale_out_bandwidth",
                   "host_link_bandwidth"},
                  "a map of interconnect numbers");
  d.scale_up_bandwidth = read_sourced(net, "scale_up_bandwidth",
                                      "bytes/s per GPU per direction (NVLink, xGMI)", Kind::rate)
                             .value;
  d.scale_up_domain =
      read_sourced(net, "scale_up_domain", "GPUs in one scale-up domain", Kind::count).value;
  d.scale_out_bandwidth =
      read_sourced(net, "scale_out_bandwidth", "bytes/s per GPU per direction across domains (NIC)",
                   Kind::rate)
          .value;
  d.host_link_bandwidth =
      read_sourced(net, "host_link_bandwidth",
                   "bytes/s per direction between device and host memory", Kind::rate)
          .value;

  // ---- host ----
  const MapView host = m.require("host", "expected host_memory_bytes")
                           .as_map({"host_memory_bytes"}, "a map of host numbers");
  d.host_memory_bytes =
      read_sourced(host, "host_memory_bytes", "bytes of host memory per GPU for host-placed tables",
                   Kind::count)
          .value;
  return d;
}

}  // namespace

DeviceSpec parse_device_spec(std::string_view yaml_text, const std::string& origin) {
  return spec_yaml::parse_spec(yaml_text, origin, "device spec", parse_device);
}

DeviceSpec load_device_spec(const std::filesystem::path& file) {
  return parse_device_spec(spec_yaml::read_text_file(file, "device spec"), file.string());
}

std::vector<DeviceSpec> load_device_catalog(const std::filesystem::path& dir) {
  const std::string prefix = fmt::format("cannot read device catalog '{}': ", dir.string());
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw InputError(prefix + "no such directory");
  std::vector<std::filesystem::path> files;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto& p = it->path();
    if (p.extension() == ".yaml" && it->is_regular_file(ec)) files.push_back(p);
  }
  if (ec) throw InputError(prefix + ec.message());
  if (files.empty()) throw InputError(prefix + "it holds no *.yaml files");
  std::sort(files.begin(), files.end());
  std::vector<DeviceSpec> devices;
  for (const auto& f : files) {
    DeviceSpec d = load_device_spec(f);
    for (const auto& other : devices)
      if (lower(other.name) == lower(d.name))
        throw InputError(
            fmt::format("{}: device name '{}' is also used by {} (catalog keys must be unique)",
                        f.string(), d.name, other.source_file));
    devices.push_back(std::move(d));
  }
  std::sort(devices.begin(), devices.end(),
            [](const DeviceSpec& a, const DeviceSpec& b) { return a.name < b.name; });
  return devices;
}

DeviceSpec find_device(std::string_view key_or_path, const std::filesystem::path& catalog_dir) {
  const std::filesystem::path as_path(key_or_path);
  const std::string ext = as_path.extension().string();
  if (ext == ".yaml" || ext == ".yml" || key_or_path.find('/') != std::string_view::npos)
    return load_device_spec(as_path);
  std::vector<DeviceSpec> devices = load_device_catalog(catalog_dir);
  const std::string key = lower(key_or_path);
  std::vector<std::string_view> names;
  for (auto& d : devices) {
    if (lower(d.name) == key) return std::move(d);
    names.push_back(d.name);
  }
  throw InputError(
      fmt::format("unknown device '{}'{}; available in {}: {} (or give the path to a device .yaml)",
                  key_or_path, spec_yaml::did_you_mean(key, names), catalog_dir.string(),
                  spec_yaml::join_or(names)));
}

std::optional<DeviceSpec> match_device(std::string_view runtime_name,
                                       const std::filesystem::path& catalog_dir) {
  std::set<std::string> words;  // the name's lower-case words
  std::string w;
  for (char c : lower(runtime_name) + " ") {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0) {
      w += c;
    } else if (!w.empty()) {
      words.insert(std::exchange(w, {}));
    }
  }
  // A form factor the runtime names (PCIe, NVL) must be the catalog entry's too: their clocks,
  // power and bandwidth differ from the SXM/OAM parts the catalog describes.
  std::optional<DeviceSpec> best;
  for (auto& dev : load_device_catalog(catalog_dir)) {
    if (words.count(dev.name) == 0 || (best && dev.name.size() <= best->name.size())) continue;
    const std::string display = lower(dev.display_name);
    bool same_form = true;
    for (const char* form : {"pcie", "nvl"})
      if (words.count(form) != 0 && display.find(form) == std::string::npos) same_form = false;
    if (same_form) best = std::move(dev);
  }
  return best;
}

}  // namespace parity
