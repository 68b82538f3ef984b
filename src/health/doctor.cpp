// parity doctor's checks (parity/doctor.h). Each check runs through the backend's own ops and
// times itself with the backend's timing marks (device events on a GPU), so that what it measures
// is what training would get from the same device.
#include "parity/doctor.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "parity/error.h"

namespace parity {

const char* doctor_verdict_name(DoctorVerdict v) {
  switch (v) {
    case DoctorVerdict::healthy:
      return "healthy";
    case DoctorVerdict::suspect:
      return "suspect";
    case DoctorVerdict::failed:
      return "failed";
  }
  return "?";
}

DeviceHealth ledger_status(DoctorVerdict v) {
  switch (v) {
    case DoctorVerdict::healthy:
      return DeviceHealth::healthy;
    case DoctorVerdict::suspect:
      return DeviceHealth::suspect;
    case DoctorVerdict::failed:
      return DeviceHealth::quarantined;
  }
  return DeviceHealth::suspect;
}

DoctorWork doctor_work(DoctorLevel level) {
  DoctorWork w;
  switch (level) {
    case DoctorLevel::quick:
      break;
    case DoctorLevel::medium:
      w.memory_passes = 4;
      w.gemm_soak_s = 90;
      w.copy_timed_runs = 50;
      break;
    case DoctorLevel::long_run:
      w.memory_passes = 20;
      w.gemm_soak_s = 780;
      w.copy_timed_runs = 200;
      break;
  }
  return w;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The unit roundoff of a stored type, and of the operands a dense math rounds its inputs to.
double storage_roundoff(DType t) {
  switch (t) {
    case DType::bf16:
      return std::ldexp(1.0, -8);
    case DType::f16:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -24);
  }
}
double operand_roundoff(DenseMath m) {
  switch (m) {
    case DenseMath::bf16:
      return std::ldexp(1.0, -8);
    case DenseMath::fp16:
    case DenseMath::tf32:
      return std::ldexp(1.0, -11);
    default:
      return 0;
  }
}

// Flips one bit of backend memory, through the host: a planted fault.
void flip_bit(Backend& b, void* p, std::size_t byte, int bit) {
  unsigned char v = 0;
  auto* at = static_cast<unsigned char*>(p) + byte;
  b.copy_to_host(&v, at, 1);
  v = static_cast<unsigned char>(v ^ (1u << bit));
  b.copy_to_device(at, &v, 1);
  b.synchronize();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

class Doctor {
 public:
  Doctor(Backend& b, const DoctorOptions& o, DoctorReport& r)
      : b_(b), o_(o), r_(r), work_(doctor_work(o.level)) {}

  void say(const std::string& line) const {
    if (o_.progress) o_.progress(line);
  }

  void add(DoctorCheck c) {
    if (c.verdict != DoctorVerdict::healthy) r_.reasons.push_back(c.name + ": " + c.summary);
    r_.verdict = std::max(r_.verdict, c.verdict);
    say(fmt::format("{}: {} ({})", c.name, c.summary, doctor_verdict_name(c.verdict)));
    r_.checks.push_back(std::move(c));
  }

  // A measured rate against the expected one.
  DoctorCheck rate_check(const std::string& name, double rate, double expected, double scale,
                         const char* unit) const {
    DoctorCheck c{name, DoctorVerdict::healthy, "", {{unit, rate / scale}}};
    if (expected <= 0) {
      c.summary =
          fmt::format("{:.1f} {} (nothing to compare with: no device spec)", rate / scale, unit);
      return c;
    }
    const double share = rate / expected;
    c.values.push_back({fmt::format("expected {}", unit), expected / scale});
    c.values.push_back({"fraction of expected", share});
    c.summary = fmt::format("{:.1f} {}, {:.1f}% of the expected {:.1f}", rate / scale, unit,
                            100 * share, expected / scale);
    if (share < o_.suspect_below) {
      c.verdict = DoctorVerdict::suspect;
      c.summary += fmt::format(" (below {:.0f}%)", 100 * o_.suspect_below);
    }
    return c;
  }

  void copy_rate() {
    const std::size_t free = b_.free_memory_bytes();
    std::size_t bytes = o_.copy_bytes;
    if (free > 0) bytes = std::min(bytes, free / 4);
    bytes -= bytes % 16;
    if (bytes == 0) return;
    Buffer src(b_, bytes), dst(b_, bytes);
    b_.memory_pattern_write(src.get(), bytes, MemoryPattern::random, o_.seed);
    for (int i = 0; i < 2; ++i) b_.copy_within(dst.get(), src.get(), bytes);  // warm-up
    b_.timing_mark(0);
    for (int i = 0; i < work_.copy_timed_runs; ++i) b_.copy_within(dst.get(), src.get(), bytes);
    b_.timing_mark(1);
    const double s = b_.timing_elapsed_ms(0, 1) / 1e3;
    const double rate = 2.0 * static_cast<double>(bytes) * work_.copy_timed_runs / s;
    DoctorCheck c = rate_check("copy rate", rate, o_.expected_copy_bytes_per_s, 1e9, "GB/s");
    c.values.push_back({"bytes copied each run", static_cast<double>(bytes)});
    add(std::move(c));
  }

  void products() {
    const std::int64_t n = o_.gemm_size;
    const DType act = b_.activation_dtype();
    const std::size_t es = dtype_size(act);
    const auto elems = static_cast<std::size_t>(n * n);
    Buffer x(b_, elems * es), w(b_, elems * sizeof(float)), y(b_, elems * es);
    b_.fill_uniform(x.get(), act, n * n, -1.0f, 1.0f, o_.seed, 1);
    b_.fill_uniform(w.get(), DType::f32, n * n, -1.0f, 1.0f, o_.seed, 2);
    // The operands are constant from here on: a backend that converts fp32 weights to the math's
    // type (bf16) once per held operand does so once, so that the rate is the product's own.
    b_.hold_constant(w.get(), w.bytes());
    b_.hold_constant(x.get(), x.bytes());
    const CAMat xv(x.get(), act, n, n);
    const CMat wv(w.as<float>(), n, n);
    const AMat yv(y.get(), act, n, n);
    auto run = [&] { b_.linear_forward(xv, wv, nullptr, Activation::none, yv); };
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * n;

    // The rate: the median of blocks of ten products after three to warm up.
    for (int i = 0; i < 3; ++i) run();
    auto block_rate = [&] {
      b_.timing_mark(0);
      for (int i = 0; i < 10; ++i) run();
      b_.timing_mark(1);
      return 10 * flops / (b_.timing_elapsed_ms(0, 1) / 1e3);
    };
    std::vector<double> rates;
    for (int i = 0; i < std::max(1, work_.gemm_timed_runs / 10); ++i) rates.push_back(block_rate());
    add(rate_check(fmt::format("product rate ({}^3, {} math)", n, dense_math_name(o_.math)),
                   median(rates), o_.expected_gemm_flops, 1e12, "TFLOP/s"));

    // The repeat: every result compared bit for bit with the first.
    std::vector<unsigned char> first(elems * es), again(elems * es);
    b_.copy_to_host(first.data(), y.get(), first.size());
    std::int64_t compared = 0, differing_results = 0, differing_elements = 0;
    std::string first_difference;
    auto compare = [&](bool plant) {
      run();
      if (plant && o_.inject && o_.inject->where == DoctorFault::Where::gemm) {
        const std::uint64_t e = o_.inject->element % elems;
        flip_bit(b_, y.get(), e * es + static_cast<std::size_t>(o_.inject->bit) / 8,
                 o_.inject->bit % 8);
        say(fmt::format("planted: bit {} of product element {} flipped", o_.inject->bit, e));
      }
      b_.copy_to_host(again.data(), y.get(), again.size());
      ++compared;
      std::int64_t diff = 0;
      for (std::size_t i = 0; i < elems; ++i)
        if (std::memcmp(&first[i * es], &again[i * es], es) != 0) {
          if (diff++ == 0 && first_difference.empty())
            first_difference = fmt::format(
                "element ({}, {}) was {} and is {} in result {}", i / static_cast<std::size_t>(n),
                i % static_cast<std::size_t>(n), load_element(first.data(), act, std::int64_t(i)),
                load_element(again.data(), act, std::int64_t(i)), compared);
        }
      if (diff > 0) ++differing_results;
      differing_elements += diff;
    };
    for (int i = 0; i < work_.gemm_repeat_checks; ++i) compare(i == 0);
    // The soak: products back to back, one result in ten compared, the rate measured again at the
    // end (a device that slows down when hot shows it here).
    double soak_rate = 0;
    if (work_.gemm_soak_s > 0) {
      say(fmt::format("soak: the product repeated for {:.0f} s", work_.gemm_soak_s));
      const auto start = Clock::now();
      while (seconds_since(start) < work_.gemm_soak_s) {
        for (int i = 0; i < 9; ++i) run();
        compare(false);
      }
      std::vector<double> end_rates;
      for (int i = 0; i < 3; ++i) end_rates.push_back(block_rate());
      soak_rate = median(end_rates);
    }
    DoctorCheck rep{"product repeat", DoctorVerdict::healthy, "", {}};
    rep.values = {{"results compared", static_cast<double>(compared)},
                  {"results differing", static_cast<double>(differing_results)},
                  {"elements differing", static_cast<double>(differing_elements)}};
    if (differing_results > 0) {
      rep.verdict = DoctorVerdict::suspect;
      rep.summary = fmt::format("{} of {} results differ from the first in {} elements; first: {}",
                                differing_results, compared, differing_elements, first_difference);
    } else {
      rep.summary = fmt::format("{} results identical to the first, bit for bit", compared);
    }
    add(std::move(rep));
    if (soak_rate > 0)
      add(rate_check("product rate after the soak", soak_rate, o_.expected_gemm_flops, 1e12,
                     "TFLOP/s"));
    reference_sample(first, act, x, w);
    b_.release_constants();
  }

  // A sample of the first result against double-precision sums over the same stored inputs,
  // within the rounding the device's math allows: the operands' rounding to the math's type and
  // fp32 accumulation over Σ|x||w|, and the output's storage rounding.
  void reference_sample(const std::vector<unsigned char>& y, DType act, const Buffer& x,
                        const Buffer& w) {
    const std::int64_t n = o_.gemm_size;
    const auto elems = static_cast<std::size_t>(n * n);
    std::vector<unsigned char> xh(elems * dtype_size(act));
    std::vector<float> wh(elems);
    b_.copy_to_host(xh.data(), x.get(), xh.size());
    b_.copy_to_host(wh.data(), w.get(), elems * sizeof(float));
    const double u_sum = operand_roundoff(o_.math) + static_cast<double>(n) * std::ldexp(1.0, -24);
    const double u_out = storage_roundoff(act);
    std::mt19937_64 pick(o_.seed);
    int bad = 0;
    double worst = 0;
    std::string first_bad;
    const int samples = 64;
    for (int s = 0; s < samples; ++s) {
      const auto r = static_cast<std::int64_t>(pick() % static_cast<std::uint64_t>(n));
      const auto c = static_cast<std::int64_t>(pick() % static_cast<std::uint64_t>(n));
      double ref = 0, mag = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double a = load_element(xh.data(), act, r * n + j);
        const double bw = wh[static_cast<std::size_t>(c * n + j)];
        ref += a * bw;
        mag += std::fabs(a * bw);
      }
      const double got = load_element(y.data(), act, r * n + c);
      const double bound = u_sum * mag + u_out * (std::fabs(ref) + u_sum * mag);
      const double err = std::fabs(got - ref);
      worst = std::max(worst, bound > 0 ? err / bound : (err > 0 ? 1e9 : 0));
      if (!(err <= bound) && bad++ == 0)
        first_bad = fmt::format("({}, {}) is {} against {} (bound {:.3g})", r, c, got, ref, bound);
    }
    DoctorCheck c{"product against the host",
                  DoctorVerdict::healthy,
                  "",
                  {{"elements compared", samples},
                   {"elements outside the bound", bad},
                   {"largest error / bound", worst}}};
    if (bad > 0) {
      c.verdict = DoctorVerdict::suspect;
      c.summary = fmt::format("{} of {} sampled elements outside the rounding bound; first: {}",
                              bad, samples, first_bad);
    } else {
      c.summary =
          fmt::format("{} sampled elements within the rounding bound (largest error {:.2f} of it)",
                      samples, worst);
    }
    add(std::move(c));
  }

  void memory() {
    const std::size_t free = b_.free_memory_bytes();
    std::size_t target =
        free > 0 ? static_cast<std::size_t>(static_cast<double>(free) * o_.memory_fraction)
                 : o_.memory_bytes;
    const std::size_t chunk_max = std::size_t{1} << 30;
    std::vector<Buffer> chunks;
    std::size_t held = 0;
    while (held + 16 <= target) {
      std::size_t bytes = std::min(chunk_max, target - held);
      bytes -= bytes % 16;
      try {
        chunks.emplace_back(b_, bytes);
      } catch (const Error&) {
        break;  // the device had less than it said: test what was allocated
      }
      held += bytes;
    }
    say(fmt::format("memory: {:.2f} GB in {} buffers, {} patterns, {} pass(es)",
                    static_cast<double>(held) / 1e9, chunks.size(), std::size(kMemoryPatterns),
                    work_.memory_passes));
    const auto start = Clock::now();
    std::uint64_t errors = 0, words = 0;
    std::string first_error;
    bool planted = false;
    for (int pass = 0; pass < work_.memory_passes; ++pass)
      for (const MemoryPattern p : kMemoryPatterns) {
        auto seed = [&](std::size_t i) {
          return o_.seed + static_cast<std::uint64_t>(pass) * 1000003u + i;
        };
        for (std::size_t i = 0; i < chunks.size(); ++i)
          b_.memory_pattern_write(chunks[i].get(), chunks[i].bytes(), p, seed(i));
        if (!planted && o_.inject && o_.inject->where == DoctorFault::Where::memory &&
            !chunks.empty()) {
          const std::uint64_t word = o_.inject->element % (chunks[0].bytes() / 4);
          flip_bit(b_, chunks[0].get(), word * 4 + static_cast<std::size_t>(o_.inject->bit) / 8,
                   o_.inject->bit % 8);
          say(fmt::format("planted: bit {} of memory word {} flipped", o_.inject->bit, word));
          planted = true;
        }
        for (std::size_t i = 0; i < chunks.size(); ++i) {
          const Backend::MemoryCheck c =
              b_.memory_pattern_check(chunks[i].get(), chunks[i].bytes(), p, seed(i));
          words += chunks[i].bytes() / 4;
          if (c.errors > 0 && errors == 0) {
            std::uint32_t found = 0;
            b_.copy_to_host(
                &found, static_cast<const std::byte*>(chunks[i].get()) + c.first_error_word * 4, 4);
            first_error = fmt::format(
                "{} pattern, buffer {} (bytes {:.2f} GB into the tested memory), word {}: "
                "expected {:#010x}, read {:#010x}",
                memory_pattern_name(p), i,
                static_cast<double>(i * chunk_max + c.first_error_word * 4) / 1e9,
                c.first_error_word, memory_pattern_word(p, c.first_error_word, seed(i)), found);
          }
          errors += c.errors;
        }
      }
    const double s = seconds_since(start);
    DoctorCheck c{"memory patterns",
                  DoctorVerdict::healthy,
                  "",
                  {{"bytes tested", static_cast<double>(held)},
                   {"words checked", static_cast<double>(words)},
                   {"words wrong", static_cast<double>(errors)},
                   {"seconds", s}}};
    if (errors > 0) {
      c.verdict = DoctorVerdict::failed;
      c.summary =
          fmt::format("{} of {} words read back wrong; first: {}", errors, words, first_error);
    } else {
      c.summary = fmt::format("{:.2f} GB, {} words checked, all read back as written ({:.1f} s)",
                              static_cast<double>(held) / 1e9, words, s);
    }
    add(std::move(c));
  }

 private:
  Backend& b_;
  const DoctorOptions& o_;
  DoctorReport& r_;
  DoctorWork work_;
};

std::string fmt_opt(const std::optional<double>& v, const char* unit) {
  return v ? fmt::format("{:.0f} {}", *v, unit) : std::string("-");
}

}  // namespace

DoctorVerdict judge_telemetry(const DeviceTelemetry& t, std::vector<std::string>& reasons) {
  DoctorVerdict v = DoctorVerdict::healthy;
  auto worse = [&](DoctorVerdict w, std::string why) {
    v = std::max(v, w);
    reasons.push_back("telemetry: " + std::move(why));
  };
  // Row remapping (NVIDIA's guidance for Ampere and later): a failed remapping means the device
  // has run out of spare rows; a pending one takes effect at the next reset.
  if (t.remap_failed.value_or(false))
    worse(DoctorVerdict::failed, "an HBM row remapping failed (no spare row left)");
  if (t.remap_pending.value_or(false))
    worse(DoctorVerdict::suspect, "an HBM row remapping is pending: reset the GPU to apply it");
  if (t.retirement_pending.value_or(false))
    worse(DoctorVerdict::suspect, "a page retirement is pending: reset the GPU to apply it");
  if (t.ecc_uncorrected_volatile.value_or(0) > 0)
    worse(DoctorVerdict::suspect, fmt::format("{} uncorrectable ECC errors since the driver loaded",
                                              *t.ecc_uncorrected_volatile));
  return v;
}

DoctorReport run_doctor(Backend& backend, TelemetrySource* telemetry, const std::string& device,
                        const std::string& uuid, const DoctorOptions& options) {
  const auto start = Clock::now();
  DoctorReport r;
  r.device = device;
  r.uuid = uuid;
  r.backend = backend.name();
  r.host = host_name();
  r.level = options.level;
  Doctor d(backend, options, r);
  std::string telemetry_why;
  if (telemetry != nullptr && !uuid.empty()) telemetry->watch_errors(uuid);
  d.copy_rate();
  d.products();
  d.memory();
  if (telemetry != nullptr && !uuid.empty()) {
    // Read after the load, so that clocks, temperature and power are those of a working device.
    r.telemetry = telemetry->read(uuid);
    const DoctorVerdict tv = judge_telemetry(*r.telemetry, r.reasons);
    const DeviceTelemetry& t = *r.telemetry;
    DoctorCheck c{
        "telemetry",
        tv,
        fmt::format("{}, {}, SM clock {} of {}, ECC uncorrected {} (volatile), "
                    "remapped rows {} / {}",
                    fmt_opt(t.temperature_c, "C"), fmt_opt(t.power_w, "W"),
                    fmt_opt(t.sm_clock_mhz, "MHz"), fmt_opt(t.sm_clock_max_mhz, "MHz"),
                    t.ecc_uncorrected_volatile ? std::to_string(*t.ecc_uncorrected_volatile)
                                               : std::string("-"),
                    t.remapped_rows_correctable ? std::to_string(*t.remapped_rows_correctable)
                                                : std::string("-"),
                    t.remapped_rows_uncorrectable ? std::to_string(*t.remapped_rows_uncorrectable)
                                                  : std::string("-")),
        {}};
    r.verdict = std::max(r.verdict, tv);
    d.say(fmt::format("telemetry: {} ({})", c.summary, doctor_verdict_name(tv)));
    r.checks.push_back(std::move(c));
    const std::vector<std::uint64_t> xids = telemetry->errors_seen(&telemetry_why);
    DoctorCheck e{"error events", DoctorVerdict::healthy, "", {}};
    if (!telemetry_why.empty()) {
      e.summary = "not heard: " + telemetry_why;
    } else if (xids.empty()) {
      e.summary = "no critical error event during the run";
    } else {
      std::string codes;
      for (const std::uint64_t x : xids) codes += (codes.empty() ? "" : ", ") + std::to_string(x);
      e.verdict = DoctorVerdict::suspect;
      e.summary =
          fmt::format("{} critical error event(s) during the run (XID {})", xids.size(), codes);
    }
    d.add(std::move(e));
  }
  r.seconds = seconds_since(start);
  return r;
}

std::string doctor_report_json(const DoctorReport& r) {
  nlohmann::ordered_json j;
  j["device"] = r.device;
  j["uuid"] = r.uuid;
  j["backend"] = r.backend;
  j["host"] = r.host;
  for (const auto& n : kDoctorLevelNames)
    if (n.value == r.level) j["level"] = n.name;
  j["verdict"] = doctor_verdict_name(r.verdict);
  j["reasons"] = r.reasons;
  j["seconds"] = r.seconds;
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const DoctorCheck& c : r.checks) {
    nlohmann::ordered_json cj;
    cj["name"] = c.name;
    cj["verdict"] = doctor_verdict_name(c.verdict);
    cj["summary"] = c.summary;
    nlohmann::ordered_json values = nlohmann::ordered_json::object();
    for (const auto& [k, v] : c.values) values[k] = v;
    cj["values"] = values;
    checks.push_back(cj);
  }
  j["checks"] = checks;
  if (r.telemetry) {
    const DeviceTelemetry& t = *r.telemetry;
    nlohmann::ordered_json tj;
    tj["source"] = t.source;
    auto put = [&](const char* k, const auto& v) {
      if (v) tj[k] = *v;
    };
    put("temperature_c", t.temperature_c);
    put("power_w", t.power_w);
    put("power_limit_w", t.power_limit_w);
    put("sm_clock_mhz", t.sm_clock_mhz);
    put("sm_clock_max_mhz", t.sm_clock_max_mhz);
    put("memory_clock_mhz", t.memory_clock_mhz);
    put("ecc_corrected_volatile", t.ecc_corrected_volatile);
    put("ecc_uncorrected_volatile", t.ecc_uncorrected_volatile);
    put("ecc_corrected_aggregate", t.ecc_corrected_aggregate);
    put("ecc_uncorrected_aggregate", t.ecc_uncorrected_aggregate);
    put("remapped_rows_correctable", t.remapped_rows_correctable);
    put("remapped_rows_uncorrectable", t.remapped_rows_uncorrectable);
    put("remap_pending", t.remap_pending);
    put("remap_failed", t.remap_failed);
    put("retired_pages_single_bit", t.retired_pages_single_bit);
    put("retired_pages_double_bit", t.retired_pages_double_bit);
    put("retirement_pending", t.retirement_pending);
    put("clock_event_reasons", t.clock_event_reasons);
    tj["unreadable"] = t.unreadable;
    j["telemetry"] = tj;
  }
  return j.dump(2);
}

std::string doctor_report_text(const DoctorReport& r) {
  std::string level;
  for (const auto& n : kDoctorLevelNames)
    if (n.value == r.level) level = n.name;
  std::string out = fmt::format("{} ({}, {}) on {}: {} after the {} checks ({:.1f} s)\n", r.device,
                                r.uuid.empty() ? "no uuid" : r.uuid, r.backend, r.host,
                                doctor_verdict_name(r.verdict), level, r.seconds);
  for (const DoctorCheck& c : r.checks)
    out += fmt::format("  {:<8} {}: {}\n", doctor_verdict_name(c.verdict), c.name, c.summary);
  if (r.telemetry && !r.telemetry->unreadable.empty()) {
    out += "  not readable here:";
    for (const std::string& u : r.telemetry->unreadable) out += " " + u + ";";
    out.back() = '\n';
  }
  return out;
}

}  // namespace parity
