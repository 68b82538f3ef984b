// Plan <-> JSON. Reading validates every field and names the one that is wrong, so an
// edited plan gets a clear message, never a crash.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "core/json_reader.h"
#include "parity/error.h"
#include "parity/plan.h"

namespace parity {
namespace {

using nlohmann::ordered_json;
using json = nlohmann::json;

constexpr const char* kFormat = "parity-plan-1";

// The table optimizers (Adam is for the dense layers only).
OptimizerKind read_emb_opt(const JsonReader& r) {
  return r.choice(
      kOptimizerNames, +[](OptimizerKind k) { return k != OptimizerKind::adam; });
}

GemmType read_gemm_type(const JsonReader& r) {
  const std::string v = r.str();
  for (GemmType t : {GemmType::f32, GemmType::tf32, GemmType::bf16, GemmType::f16, GemmType::e4m3})
    if (v == gemm_type_name(t)) return t;
  r.fail("expected one of fp32, tf32, bf16, fp16, fp8e4m3");
}

GemmEpilogue read_gemm_epilogue(const JsonReader& r) {
  const std::string v = r.str();
  for (GemmEpilogue e :
       {GemmEpilogue::none, GemmEpilogue::relu, GemmEpilogue::bias, GemmEpilogue::relu_bias})
    if (v == gemm_epilogue_name(e)) return e;
  r.fail("expected one of none, relu, bias, relu_bias");
}

}  // namespace

std::string plan_to_json(const Plan& p) {
  ordered_json j;
  j["format"] = kFormat;
  j["model"] = p.model;
  j["model_file"] = p.model_file;
  j["device"] = p.device;
  j["gpus"] = p.gpus;
  j["per_device_batch"] = p.per_device_batch;
  j["global_batch"] = p.global_batch;
  j["dense_math"] = std::string(dense_math_name(p.dense_math));
  if (p.token_capacity > 0) j["token_capacity"] = p.token_capacity;
  if (p.recompute) j["recompute"] = true;
  if (p.product_checks) j["product_checks"] = true;
  j["embedding_optimizer"] = std::string(optimizer_name(p.embedding_optimizer));
  j["tables"] = ordered_json::array();
  for (const auto& t : p.tables) {
    ordered_json tj;
    tj["name"] = t.name;
    tj["dtype"] = std::string(dtype_name(t.dtype));
    tj["optimizer"] = std::string(optimizer_name(t.optimizer));
    tj["sharding"] = std::string(sharding_name(t.sharding));
    tj["placement"] = std::string(placement_name(t.placement));
    if (t.placement == Placement::host) tj["cache_rows"] = t.cache_rows;
    tj["shards"] = ordered_json::array();
    for (const auto& s : t.shards)
      tj["shards"].push_back({{"device", s.device},
                              {"rows", {s.row_begin, s.row_end}},
                              {"cols", {s.col_begin, s.col_end}}});
    j["tables"].push_back(tj);
  }
  j["changes"] = ordered_json::array();
  for (const auto& c : p.changes)
    j["changes"].push_back(
        {{"what", c.what}, {"from", c.from}, {"to", c.to}, {"reason", c.reason}});
  j["kernels"] = ordered_json::array();
  for (const auto& k : p.kernels) {
    ordered_json kj = {{"op", k.op},
                       {"m", k.m},
                       {"n", k.n},
                       {"k", k.k},
                       {"tile", {k.tile_m, k.tile_n}},
                       {"predicted_s", k.predicted_s}};
    if (!k.ranked.empty()) {
      const GemmProblem& q = k.problem;
      kj["kind"] = {{"type", gemm_type_name(q.type)},
                    {"ta", q.ta},
                    {"tb", q.tb},
                    {"narrow_output", q.narrow_output},
                    {"epilogue", gemm_epilogue_name(q.epilogue)}};
      kj["ranked"] = k.ranked;
    }
    j["kernels"].push_back(kj);
  }
  if (!p.gemm_catalog.empty())
    j["gemm_catalog"] = {{"file", p.gemm_catalog.file},
                         {"library", p.gemm_catalog.library},
                         {"library_version", p.gemm_catalog.library_version}};
  const auto& pr = p.prediction;
  ordered_json pj;
  pj["step_s"] = pr.step_s;
  pj["examples_per_s"] = pr.examples_per_s;
  pj["examples_per_s_per_gpu"] = pr.examples_per_s_per_gpu;
  pj["time_s"] = pr.time_s;
  pj["floor_s"] = pr.floor_s;
  pj["memory_bytes"] = pr.memory_bytes;
  pj["peak_memory_bytes"] = pr.peak_memory_bytes;
  pj["peak_device"] = pr.peak_device;
  pj["memory_budget_bytes"] = pr.memory_budget_bytes;
  pj["host_memory_bytes"] = pr.host_memory_bytes;
  j["prediction"] = pj;
  j["calibration"] = p.calibration;
  return j.dump(2) + "\n";
}

Plan plan_from_json(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) throw InputError(fmt::format("{}: not valid JSON", origin));
  const JsonReader r(j, "", origin);
  r.only({"format", "model", "model_file", "device", "gpus", "per_device_batch", "global_batch",
          "dense_math", "token_capacity", "recompute", "product_checks", "embedding_optimizer",
          "tables", "changes", "kernels", "gemm_catalog", "prediction", "calibration"});
  if (r.at("format").str() != kFormat) r.at("format").fail(fmt::format("expected '{}'", kFormat));
  Plan p;
  p.model = r.at("model").str();
  if (r.has("model_file")) p.model_file = r.at("model_file").str();
  p.device = r.at("device").str();
  p.gpus = static_cast<int>(r.at("gpus").integer(1, 1 << 20));
  p.per_device_batch = r.at("per_device_batch").integer(1, std::int64_t{1} << 40);
  p.global_batch = r.at("global_batch").integer(1, std::int64_t{1} << 50);
  if (p.global_batch != p.per_device_batch * p.gpus)
    r.at("global_batch")
        .fail(fmt::format("must equal per_device_batch x gpus ({})", p.per_device_batch * p.gpus));
  p.dense_math = r.at("dense_math").choice(kDenseMathNames);
  if (r.has("token_capacity"))
    p.token_capacity = r.at("token_capacity").integer(0, std::int64_t{1} << 50);
  if (r.has("recompute")) p.recompute = r.at("recompute").boolean();
  if (r.has("product_checks")) p.product_checks = r.at("product_checks").boolean();
  p.embedding_optimizer = read_emb_opt(r.at("embedding_optimizer"));
  const JsonReader tables = r.at("tables");
  for (std::size_t i = 0; i < tables.size(); ++i) {
    const JsonReader t = tables.at(i);
    t.only({"name", "dtype", "optimizer", "sharding", "placement", "cache_rows", "shards"});
    TablePlan tp;
    tp.name = t.at("name").str();
    tp.dtype = t.at("dtype").choice(kTableDTypeNames);
    tp.optimizer = read_emb_opt(t.at("optimizer"));
    if (tp.optimizer != p.embedding_optimizer)
      t.at("optimizer")
          .fail(fmt::format("every table uses the plan's embedding_optimizer ({})",
                            optimizer_name(p.embedding_optimizer)));
    tp.sharding = t.at("sharding").choice(kShardingNames);
    tp.placement = t.at("placement").choice(kPlacementNames);
    if (t.has("cache_rows")) tp.cache_rows = t.at("cache_rows").integer(0, std::int64_t{1} << 62);
    const JsonReader shards = t.at("shards");
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const JsonReader sh = shards.at(s);
      sh.only({"device", "rows", "cols"});
      ShardPlan sp;
      sp.device = static_cast<int>(sh.at("device").integer(0, p.gpus - 1));
      const JsonReader rows = sh.at("rows");
      if (rows.size() != 2) rows.fail("expected [begin, end]");
      sp.row_begin = rows.at(std::size_t{0}).integer(0, std::int64_t{1} << 62);
      sp.row_end = rows.at(std::size_t{1}).integer(sp.row_begin + 1, std::int64_t{1} << 62);
      const JsonReader cols = sh.at("cols");
      if (cols.size() != 2) cols.fail("expected [begin, end]");
      sp.col_begin = static_cast<int>(cols.at(std::size_t{0}).integer(0, 1 << 20));
      sp.col_end = static_cast<int>(cols.at(std::size_t{1}).integer(sp.col_begin + 1, 1 << 20));
      tp.shards.push_back(sp);
    }
    p.tables.push_back(std::move(tp));
  }
  if (r.has("changes")) {
    const JsonReader changes = r.at("changes");
    for (std::size_t i = 0; i < changes.size(); ++i) {
      const JsonReader c = changes.at(i);
      c.only({"what", "from", "to", "reason"});
      p.changes.push_back(
          {c.at("what").str(), c.at("from").str(), c.at("to").str(), c.at("reason").str()});
    }
  }
  if (r.has("kernels")) {
    const JsonReader ks = r.at("kernels");
    for (std::size_t i = 0; i < ks.size(); ++i) {
      const JsonReader k = ks.at(i);
      k.only({"op", "m", "n", "k", "tile", "predicted_s", "kind", "ranked"});
      KernelChoice kc;
      kc.op = k.at("op").str();
      kc.m = k.at("m").integer(0, std::int64_t{1} << 50);
      kc.n = k.at("n").integer(0, std::int64_t{1} << 50);
      kc.k = k.at("k").integer(0, std::int64_t{1} << 50);
      const JsonReader tile = k.at("tile");
      if (tile.size() != 2) tile.fail("expected [m, n]");
      kc.tile_m = static_cast<int>(tile.at(std::size_t{0}).integer(1, 4096));
      kc.tile_n = static_cast<int>(tile.at(std::size_t{1}).integer(1, 4096));
      kc.predicted_s = k.at("predicted_s").number();
      if (k.has("kind") || k.has("ranked")) {
        const JsonReader kind = k.at("kind");
        kind.only({"type", "ta", "tb", "narrow_output", "epilogue"});
        GemmProblem& q = kc.problem;
        q.m = kc.m;
        q.n = kc.n;
        q.k = kc.k;
        q.type = read_gemm_type(kind.at("type"));
        q.ta = kind.at("ta").boolean();
        q.tb = kind.at("tb").boolean();
        q.narrow_output = kind.at("narrow_output").boolean();
        q.epilogue = read_gemm_epilogue(kind.at("epilogue"));
        const JsonReader ranked = k.at("ranked");
        if (ranked.size() == 0) ranked.fail("expected at least one configuration key");
        for (std::size_t c = 0; c < ranked.size(); ++c) kc.ranked.push_back(ranked.at(c).str());
      }
      p.kernels.push_back(kc);
    }
  }
  if (r.has("gemm_catalog")) {
    const JsonReader g = r.at("gemm_catalog");
    g.only({"file", "library", "library_version"});
    p.gemm_catalog.file = g.at("file").str();
    if (p.gemm_catalog.file.empty()) g.at("file").fail("expected a catalog file name");
    p.gemm_catalog.library = g.at("library").str();
    p.gemm_catalog.library_version = g.at("library_version").integer(0, std::int64_t{1} << 50);
  }
  if (r.has("prediction")) {
    const JsonReader pr = r.at("prediction");
    pr.only({"step_s", "examples_per_s", "examples_per_s_per_gpu", "time_s", "memory_bytes",
             "peak_memory_bytes", "peak_device", "memory_budget_bytes", "host_memory_bytes",
             "floor_s"});
    p.prediction.step_s = pr.at("step_s").number();
    p.prediction.examples_per_s = pr.at("examples_per_s").number();
    p.prediction.examples_per_s_per_gpu = pr.at("examples_per_s_per_gpu").number();
    p.prediction.peak_memory_bytes = pr.at("peak_memory_bytes").number();
    p.prediction.peak_device = static_cast<int>(pr.at("peak_device").integer(0, p.gpus - 1));
    p.prediction.memory_budget_bytes = pr.at("memory_budget_bytes").number();
    p.prediction.host_memory_bytes = pr.at("host_memory_bytes").number();
    if (pr.has("floor_s")) p.prediction.floor_s = pr.at("floor_s").number();  // plans before it
    for (const char* key : {"time_s", "memory_bytes"}) {
      const json& obj = j["prediction"][key];
      if (!obj.is_object()) pr.at(key).fail("expected an object of numbers");
      for (auto it = obj.begin(); it != obj.end(); ++it) {
        if (!it->is_number() || !std::isfinite(it->get<double>()))
          pr.at(key).at(it.key()).fail("expected a finite number");
        (std::string(key) == "time_s" ? p.prediction.time_s : p.prediction.memory_bytes)[it.key()] =
            it->get<double>();
      }
    }
  }
  if (r.has("calibration")) p.calibration = r.at("calibration").str();
  return p;
}

Plan load_plan(const std::filesystem::path& file) {
  Plan p = plan_from_json(read_input_file(file, "plan", std::size_t{256} << 20), file.string());
  // A model file named relative to the plan (plans written before it was recorded absolute).
  if (!p.model_file.empty() && std::filesystem::path(p.model_file).is_relative()) {
    const auto beside = file.parent_path() / p.model_file;
    std::error_code ec;
    if (std::filesystem::exists(beside, ec)) p.model_file = beside.string();
  }
  return p;
}

}  // namespace parity
