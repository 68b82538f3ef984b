// The kernel catalog <-> JSON, every field checked on the way in.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/input_file.h"
#include "core/json_reader.h"
#include "parity/error.h"
#include "parity/select.h"

namespace parity {
namespace {

using nlohmann::ordered_json;
using json = nlohmann::json;

constexpr const char* kFormat = "parity-gemm-catalog-4";
// The format before the streaming costs and the L2 size, still read (without them).
constexpr const char* kFormatWithoutStreaming = "parity-gemm-catalog-3";

struct TypeName {
  std::string_view name;
  GemmType value;
};
constexpr TypeName kTypeNames[] = {{"fp32", GemmType::f32},
                                   {"tf32", GemmType::tf32},
                                   {"bf16", GemmType::bf16},
                                   {"fp16", GemmType::f16},
                                   {"fp8e4m3", GemmType::e4m3}};
struct EpilogueName {
  std::string_view name;
  GemmEpilogue value;
};
constexpr EpilogueName kEpilogueNames[] = {{"none", GemmEpilogue::none},
                                           {"relu", GemmEpilogue::relu},
                                           {"bias", GemmEpilogue::bias},
                                           {"relu_bias", GemmEpilogue::relu_bias}};
struct ReductionName {
  std::string_view name;
  SplitReduction value;
};
constexpr ReductionName kReductionNames[] = {{"none", SplitReduction::none},
                                             {"in_place", SplitReduction::in_place},
                                             {"compute_type", SplitReduction::compute_type},
                                             {"output_type", SplitReduction::output_type}};

template <class Entry, std::size_t N, class E>
std::string name_of(const Entry (&table)[N], E v) {
  for (const auto& e : table)
    if (e.value == v) return std::string(e.name);
  return "?";
}

constexpr std::int64_t kMaxSize = 1 << 16;  // no tile, stage count or split is larger

CatalogKernel read_kernel(const JsonReader& r, bool streaming) {
  if (streaming)
    r.only({"algo", "tile", "k_step", "stages", "cluster", "swizzle", "custom", "inner",
            "max_split_k", "split_reduction", "min_align", "slots", "fixed_s", "tile_s", "kstep_s",
            "stream_tile_s", "stream_kstep_s"});
  else
    r.only({"algo", "tile", "k_step", "stages", "cluster", "swizzle", "custom", "inner",
            "max_split_k", "split_reduction", "min_align", "slots", "fixed_s", "tile_s",
            "kstep_s"});
  CatalogKernel k;
  GemmKernel& g = k.kernel;
  g.algo = static_cast<int>(r.at("algo").integer(0, 1 << 30));
  const JsonReader tile = r.at("tile");
  if (tile.size() != 2) tile.fail("expected [m, n]");
  g.tile_m = static_cast<int>(tile.at(std::size_t{0}).integer(0, kMaxSize));
  g.tile_n = static_cast<int>(tile.at(std::size_t{1}).integer(0, kMaxSize));
  g.tile_k = static_cast<int>(r.at("k_step").integer(0, kMaxSize));
  g.stages = static_cast<int>(r.at("stages").integer(0, kMaxSize));
  const JsonReader cluster = r.at("cluster");
  if (cluster.size() != 2) cluster.fail("expected [m, n]");
  g.cluster_m = static_cast<int>(cluster.at(std::size_t{0}).integer(0, 64));
  g.cluster_n = static_cast<int>(cluster.at(std::size_t{1}).integer(0, 64));
  g.swizzle = static_cast<int>(r.at("swizzle").integer(0, 1 << 16));
  g.custom = static_cast<int>(r.at("custom").integer(0, 1 << 16));
  g.inner = static_cast<int>(r.at("inner").integer(0, 1 << 16));
  k.max_split_k = static_cast<int>(r.at("max_split_k").integer(1, 1024));
  k.split_reduction = r.at("split_reduction").choice(kReductionNames);
  if (k.max_split_k > 1 && k.split_reduction == SplitReduction::none)
    r.at("split_reduction").fail("a configuration with split-K needs its reduction");
  if (k.split_reduction == SplitReduction::in_place)
    r.at("split_reduction")
        .fail("the in-place reduction sums in the output in no fixed order: not deterministic");
  const JsonReader align = r.at("min_align");
  if (align.size() != 3) align.fail("expected [a, b, d] in bytes");
  k.min_align_a = static_cast<int>(align.at(std::size_t{0}).integer(0, 256));
  k.min_align_b = static_cast<int>(align.at(std::size_t{1}).integer(0, 256));
  k.min_align_d = static_cast<int>(align.at(std::size_t{2}).integer(0, 256));
  k.slots = r.at("slots").number();
  if (k.slots < 1) r.at("slots").fail(fmt::format("expected at least 1 tile, got {}", k.slots));
  k.fixed_s = r.at("fixed_s").number();
  k.tile_s = r.at("tile_s").number();
  k.kstep_s = r.at("kstep_s").number();
  if (k.tile_s + k.kstep_s <= 0)
    r.fail("tile_s and kstep_s are both 0: the configuration would take no time per tile");
  if (streaming) {
    // Both 0: not measured streaming (the L2 costs are used everywhere).
    k.stream_tile_s = r.at("stream_tile_s").number();
    k.stream_kstep_s = r.at("stream_kstep_s").number();
  }
  return k;
}

}  // namespace

GemmProblem CatalogGroup::kind() const {
  GemmProblem p;
  p.type = type;
  p.ta = ta;
  p.tb = tb;
  p.narrow_output = narrow_output;
  p.epilogue = epilogue;
  return p;
}

CatalogGroup CatalogGroup::of_kind(const GemmProblem& p) {
  CatalogGroup g;
  g.type = p.type;
  g.ta = p.ta;
  g.tb = p.tb;
  g.narrow_output = p.narrow_output;
  g.epilogue = p.epilogue;
  return g;
}

const CatalogGroup* GemmCatalog::group_for(const GemmProblem& p) const {
  for (const CatalogGroup& g : groups)
    if (g.type == p.type && g.ta == p.ta && g.tb == p.tb && g.narrow_output == p.narrow_output &&
        g.epilogue == p.epilogue)
      return &g;
  return nullptr;
}

GemmCatalog load_gemm_catalog(const std::filesystem::path& file) {
  const std::string origin = file.string();
  const std::string text = read_input_file(file, "kernel catalog", std::size_t{256} << 20);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(fmt::format("{}: not JSON: {}", origin, e.what()));
  }
  const JsonReader r(j, "", origin);
  const std::string format = r.at("format").str();
  const bool streaming = format == kFormat;
  if (!streaming && format != kFormatWithoutStreaming)
    r.at("format").fail(fmt::format("expected '{}' (or '{}')", kFormat, kFormatWithoutStreaming));
  if (streaming)
    r.only({"format", "device", "library", "library_version", "multiprocessors", "l2_bytes",
            "measured", "reduction_fixed_s", "call_s", "groups"});
  else
    r.only({"format", "device", "library", "library_version", "multiprocessors", "measured",
            "reduction_fixed_s", "call_s", "groups"});
  GemmCatalog c;
  c.source_file = origin;
  c.device = r.at("device").str();
  c.library = r.at("library").str();
  c.library_version = r.at("library_version").integer(0, std::int64_t{1} << 40);
  c.multiprocessors = static_cast<int>(r.at("multiprocessors").integer(1, 1 << 16));
  if (streaming) c.l2_bytes = r.at("l2_bytes").integer(0, std::int64_t{1} << 40);
  c.measured = r.at("measured").str();
  c.reduction_fixed_s = r.at("reduction_fixed_s").number();
  c.call_s = r.at("call_s").number();
  if (!(c.call_s >= 0 && c.call_s < 1)) r.at("call_s").fail("expected seconds in [0, 1)");
  const JsonReader groups = r.at("groups");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const JsonReader g = groups.at(i);
    g.only({"type", "ta", "tb", "narrow_output", "epilogue", "peak_flops_per_s", "kernels"});
    CatalogGroup cg;
    cg.type = g.at("type").choice(kTypeNames);
    cg.ta = g.at("ta").boolean();
    cg.tb = g.at("tb").boolean();
    cg.narrow_output = g.at("narrow_output").boolean();
    cg.epilogue = g.at("epilogue").choice(kEpilogueNames);
    if (cg.narrow_output && (cg.type == GemmType::f32 || cg.type == GemmType::tf32))
      g.at("narrow_output").fail("a 16-bit output needs 16- or 8-bit operands");
    if (c.group_for(cg.kind()) != nullptr) g.fail("a second group of the same kind");
    cg.peak_flops_per_s = g.at("peak_flops_per_s").number();
    if (!(cg.peak_flops_per_s > 0)) g.at("peak_flops_per_s").fail("expected a rate above 0");
    const JsonReader ks = g.at("kernels");
    for (std::size_t k = 0; k < ks.size(); ++k)
      cg.kernels.push_back(read_kernel(ks.at(k), streaming));
    c.groups.push_back(std::move(cg));
  }
  return c;
}

void save_gemm_catalog(const GemmCatalog& c, const std::filesystem::path& file) {
  ordered_json j;
  j["format"] = kFormat;
  j["device"] = c.device;
  j["library"] = c.library;
  j["library_version"] = c.library_version;
  j["multiprocessors"] = c.multiprocessors;
  j["l2_bytes"] = c.l2_bytes;
  j["measured"] = c.measured;
  j["reduction_fixed_s"] = c.reduction_fixed_s;
  j["call_s"] = c.call_s;
  j["groups"] = ordered_json::array();
  for (const CatalogGroup& g : c.groups) {
    ordered_json gj;
    gj["type"] = name_of(kTypeNames, g.type);
    gj["ta"] = g.ta;
    gj["tb"] = g.tb;
    gj["narrow_output"] = g.narrow_output;
    gj["epilogue"] = name_of(kEpilogueNames, g.epilogue);
    gj["peak_flops_per_s"] = g.peak_flops_per_s;
    gj["kernels"] = ordered_json::array();
    for (const CatalogKernel& k : g.kernels) {
      const GemmKernel& x = k.kernel;
      ordered_json kj;
      kj["algo"] = x.algo;
      kj["tile"] = {x.tile_m, x.tile_n};
      kj["k_step"] = x.tile_k;
      kj["stages"] = x.stages;
      kj["cluster"] = {x.cluster_m, x.cluster_n};
      kj["swizzle"] = x.swizzle;
      kj["custom"] = x.custom;
      kj["inner"] = x.inner;
      kj["max_split_k"] = k.max_split_k;
      kj["split_reduction"] = name_of(kReductionNames, k.split_reduction);
      kj["min_align"] = {k.min_align_a, k.min_align_b, k.min_align_d};
      kj["slots"] = k.slots;
      kj["fixed_s"] = k.fixed_s;
      kj["tile_s"] = k.tile_s;
      kj["kstep_s"] = k.kstep_s;
      kj["stream_tile_s"] = k.stream_tile_s;
      kj["stream_kstep_s"] = k.stream_kstep_s;
      gj["kernels"].push_back(std::move(kj));
    }
    j["groups"].push_back(std::move(gj));
  }
  // One configuration a line: the file holds thousands, and stays readable and diffable.
  std::string text = "{\n";
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "groups") continue;
    text += fmt::format(" \"{}\": {},\n", it.key(), it.value().dump());
  }
  text += " \"groups\": [";
  for (std::size_t gi = 0; gi < j["groups"].size(); ++gi) {
    const ordered_json& gj = j["groups"][gi];
    text += gi ? ",\n  {" : "\n  {";
    for (auto it = gj.begin(); it != gj.end(); ++it)
      if (it.key() != "kernels") text += fmt::format("\"{}\": {}, ", it.key(), it.value().dump());
    text += "\"kernels\": [";
    for (std::size_t ki = 0; ki < gj["kernels"].size(); ++ki)
      text += (ki ? ",\n   " : "\n   ") + gj["kernels"][ki].dump();
    text += "]}";
  }
  text += "\n ]\n}\n";
  AtomicFile out(file, "kernel catalog");
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace parity
