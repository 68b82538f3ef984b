// Model specs: YAML in, validated ModelSpec out. The schema is documented in
// docs/configs.md; every rule there has its check (and its message) here.
//
// Parsing reads each field once, with its position, and checks what can be
// checked locally; the checks that tie fields together (dot interaction vs
// table dims, recipe dtypes vs table dtypes, totals that must fit the types in
// spec.h) run at the end, while the nodes are still at hand to point at.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "parity/error.h"
#include "parity/spec.h"
#include "spec/yaml_util.h"

namespace parity {

std::string_view pooling_name(Pooling p) {
  return name_in(kPoolingNames, p);
}
std::string_view distribution_name(IdDistribution d) {
  return name_in(kDistributionNames, d);
}
std::string_view interaction_name(InteractionKind k) {
  return name_in(kInteractionNames, k);
}
std::string_view optimizer_name(OptimizerKind k) {
  return name_in(kOptimizerNames, k);
}
std::string_view dense_math_name(DenseMath m) {
  return name_in(kDenseMathNames, m);
}

// ------------------------------------------------------ derived values ----

std::int64_t ModelSpec::embedding_rows() const {
  std::int64_t total = 0;
  for (const auto& t : tables) total += t.rows;
  return total;
}

std::int64_t ModelSpec::embedding_parameters() const {
  std::int64_t total = 0;
  for (const auto& t : tables) total += t.rows * t.dim;
  return total;
}

std::int64_t ModelSpec::lookups_per_example() const {
  std::int64_t total = 0;
  for (const auto& t : tables) total += t.pooling_size;
  return total;
}

int ModelSpec::embedding_output_dim() const {
  int total = 0;
  for (const auto& t : tables) total += t.dim;
  return total;
}

int ModelSpec::interaction_input_dim() const {
  return (bottom_mlp.empty() ? 0 : bottom_mlp.back()) + embedding_output_dim();
}

int ModelSpec::interaction_output_dim() const {
  if (interaction.kind == InteractionKind::dcnv2) return interaction_input_dim();
  // Dot: the bottom output passes through, plus one dot product per pair of the
  // F = tables + 1 vectors (tables and bottom output), i < j.
  const std::int64_t f = num_tables() + 1;
  const std::int64_t d = bottom_mlp.empty() ? 0 : bottom_mlp.back();
  return static_cast<int>(d + f * (f - 1) / 2);
}

std::int64_t ModelSpec::dense_parameters() const {
  // A linear layer in -> out holds in*out weights and out biases.
  const auto mlp = [](std::int64_t in, const std::vector<int>& sizes) {
    std::int64_t total = 0;
    for (int out : sizes) {
      total += in * out + out;
      in = out;
    }
    return total;
  };
  std::int64_t total = mlp(dense_features, bottom_mlp);
  if (interaction.kind == InteractionKind::dcnv2) {
    // Each low-rank cross layer: V [r, N], W [N, r] and a bias [N].
    const std::int64_t n = interaction_input_dim();
    const std::int64_t r = interaction.low_rank;
    total += interaction.cross_layers * (r * n + n * r + n);
  }
  total += mlp(interaction_output_dim(), top_mlp);
  return total;
}

// ------------------------------------------------------------- parsing ----

namespace {

using spec_yaml::Field;
using spec_yaml::MapView;

// Bounds that keep every derived quantity inside the types spec.h gives it.
constexpr std::int64_t kMaxRows = std::int64_t{1} << 62;
constexpr std::int64_t kMaxDim = 65536;
constexpr std::int64_t kMaxLayerSize = 1 << 20;
constexpr std::int64_t kMaxPoolingSize = 1 << 20;
constexpr std::int64_t kMaxCount = 100000;
constexpr std::size_t kMaxTables = 100000;
constexpr std::int64_t kMaxCrossLayers = 64;
constexpr std::int64_t kMaxDenseFeatures = 1 << 20;
constexpr std::int64_t kMaxBatch = std::int64_t{1} << 40;

const std::vector<std::string_view> kTopKeys = {
    "name",       "description", "dense_features", "batch_size", "table_defaults", "tables",
    "bottom_mlp", "top_mlp",     "interaction",    "optimizer",  "recipe"};
const std::vector<std::string_view> kTableKeys = {"name",         "count",        "rows",
                                                  "dim",          "pooling_size", "pooling",
                                                  "distribution", "zipf_alpha",   "dtype"};

bool is_identifier(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string read_identifier(const Field& f, std::string_view what) {
  const std::string expected = fmt::format("{} made of letters, digits, '_', '-' or '.'", what);
  if (!f.node().IsScalar()) f.fail_expected(expected);
  const std::string s = f.node().Scalar();
  if (!is_identifier(s)) f.fail_expected(expected);
  return s;
}

double read_positive(const Field& f) {
  const double v = f.as_number("a positive number");
  if (!(v > 0.0)) f.fail_expected("a positive number");
  return v;
}

double read_non_negative(const Field& f) {
  const double v = f.as_number("a number >= 0");
  if (v < 0.0) f.fail_expected("a number >= 0");
  return v;
}

std::vector<int> read_layers(const Field& f, std::string_view example) {
  const std::string expected = fmt::format("a list of layer sizes, e.g. {}", example);
  const auto items = f.as_list(expected);
  if (items.empty()) f.fail(fmt::format("expected at least one layer size, e.g. {}", example));
  std::vector<int> sizes;
  for (const auto& item : items)
    sizes.push_back(
        static_cast<int>(item.as_int(1, kMaxLayerSize, "a positive layer size up to 1048576")));
  return sizes;
}

DType read_table_dtype(const Field& f) {
  return f.as_choice(kTableDTypeNames);
}

// The per-table fields that may come from the entry itself or from table_defaults.
struct TableFields {
  std::optional<std::int64_t> rows;
  std::optional<int> dim;
  std::optional<int> pooling_size;
  std::optional<Pooling> pooling;
  std::optional<IdDistribution> distribution;
  std::optional<double> zipf_alpha;
  std::optional<Field> zipf_alpha_field;
  std::optional<DType> dtype;
};

// A field every table needs: its own value, else the one in table_defaults.
template <class T>
T required(const std::optional<T>& own, const std::optional<T>& fallback, const MapView& entry,
           std::string_view key) {
  if (own) return *own;
  if (fallback) return *fallback;
  entry.fail_missing(key, "expected a positive integer, here or in table_defaults");
}

TableFields read_table_fields(const MapView& m) {
  TableFields t;
  if (auto f = m.get("rows"))
    t.rows = f->as_int(1, kMaxRows, "a positive integer up to 2^62 (4611686018427387904)");
  if (auto f = m.get("dim"))
    t.dim = static_cast<int>(f->as_int(1, kMaxDim, "a positive integer up to 65536"));
  if (auto f = m.get("pooling_size"))
    t.pooling_size = static_cast<int>(
        f->as_int(0, kMaxPoolingSize, "an integer >= 0 (ids per bag) up to 1048576"));
  if (auto f = m.get("pooling")) t.pooling = f->as_choice(kPoolingNames);
  if (auto f = m.get("distribution")) t.distribution = f->as_choice(kDistributionNames);
  if (auto f = m.get("zipf_alpha")) {
    t.zipf_alpha = read_positive(*f);
    t.zipf_alpha_field = *f;
  }
  if (auto f = m.get("dtype")) t.dtype = read_table_dtype(*f);
  return t;
}

// Where each table came from, for messages about it.
struct TableOrigin {
  std::string entry_path;  // "tables[3]"
};

InteractionSpec read_interaction(const Field& f) {
  const MapView m = f.as_map({"kind", "cross_layers", "low_rank"},
                             "a map such as {kind: dcnv2, cross_layers: 3, low_rank: 512} or "
                             "{kind: dot}");
  InteractionSpec spec;
  spec.kind = m.require("kind", "expected dot or dcnv2").as_choice(kInteractionNames);
  if (spec.kind == InteractionKind::dot) {
    for (std::string_view key : {"cross_layers", "low_rank"})
      if (auto g = m.get(key))
        g->fail(fmt::format("only dcnv2 takes {} (this interaction is dot)", key));
    return spec;
  }
  spec.cross_layers = static_cast<int>(
      m.require("cross_layers", "dcnv2 needs the number of cross layers, e.g. cross_layers: 3")
          .as_int(1, kMaxCrossLayers, "an integer from 1 to 64"));
  spec.low_rank = static_cast<int>(
      m.require("low_rank", "dcnv2 needs the rank of each cross layer, e.g. low_rank: 512")
          .as_int(1, kMaxLayerSize, "a positive integer up to 1048576"));
  return spec;
}

OptimizerSpec read_optimizer(const Field& f, bool embedding) {
  const MapView m = f.as_map({"kind", "lr", "eps", "beta1", "beta2", "weight_decay"},
                             embedding ? "a map such as {kind: rowwise_adagrad, lr: 0.01}"
                                       : "a map such as {kind: adam, lr: 0.001}");
  OptimizerSpec spec;
  const Field kind = m.require("kind", embedding ? "expected sgd, adagrad or rowwise_adagrad"
                                                 : "expected sgd, adagrad or adam");
  spec.kind = kind.as_choice(kOptimizerNames);
  if (embedding && spec.kind == OptimizerKind::adam)
    kind.fail(
        "adam is not supported for embedding tables (expected sgd, adagrad or rowwise_adagrad)");
  if (!embedding && spec.kind == OptimizerKind::rowwise_adagrad)
    kind.fail("rowwise_adagrad applies to embedding tables only (expected sgd, adagrad or adam)");
  spec.lr = read_positive(m.require("lr", "expected the learning rate, a positive number"));
  if (auto g = m.get("eps")) {
    if (spec.kind == OptimizerKind::sgd)
      g->fail("sgd takes no eps (adagrad, rowwise_adagrad and adam do)");
    spec.eps = read_positive(*g);
  }
  for (std::string_view key : {"beta1", "beta2"}) {
    auto g = m.get(key);
    if (!g) continue;
    if (spec.kind != OptimizerKind::adam)
      g->fail(
          fmt::format("only adam takes {} (this optimizer is {})", key, optimizer_name(spec.kind)));
    const double b = g->as_number("a number in [0, 1)");
    if (!(b >= 0.0 && b < 1.0)) g->fail_expected("a number in [0, 1)");
    (key == "beta1" ? spec.beta1 : spec.beta2) = b;
  }
  if (auto g = m.get("weight_decay")) spec.weight_decay = read_non_negative(*g);
  return spec;
}

template <class T>
std::vector<T> read_unique_list(const Field& f, std::string_view expected,
                                const std::function<T(const Field&)>& read_one) {
  const auto items = f.as_list(expected);
  if (items.empty()) f.fail(fmt::format("expected a non-empty list, e.g. {}", expected));
  std::vector<T> out;
  for (const auto& item : items) {
    const T v = read_one(item);
    if (std::find(out.begin(), out.end(), v) != out.end())
      item.fail(fmt::format("'{}' is listed twice", item.node().Scalar()));
    out.push_back(v);
  }
  return out;
}

ModelSpec parse_model(const YAML::Node& root, const std::string& origin) {
  const Field top(root, "", &origin);
  const MapView m = top.as_map(kTopKeys, "a map of model fields");
  ModelSpec spec;
  spec.source_file = origin;
  spec.name = read_identifier(m.require("name", "expected the model's name, e.g. name: my-model"),
                              "a model name");
  if (auto f = m.get("description")) spec.description = f->as_string();
  spec.dense_features = static_cast<int>(
      m.require("dense_features", "expected the number of dense features, e.g. dense_features: 13")
          .as_int(1, kMaxDenseFeatures, "a positive integer up to 1048576"));
  spec.batch_size =
      m.require("batch_size",
                "expected the reference global batch size the learning rates are tuned for, e.g. "
                "batch_size: 65536")
          .as_int(1, kMaxBatch, "a positive integer up to 2^40");

  // ---- tables ----
  TableFields defaults;
  if (auto f = m.get("table_defaults")) {
    const MapView d = f->as_map(kTableKeys, "a map of table fields, e.g. {dim: 128, pooling: sum}");
    for (std::string_view key : {"name", "count"})
      if (auto g = d.get(key))
        g->fail(fmt::format("{} cannot have a default (give it on each table)", key));
    defaults = read_table_fields(d);
    if (defaults.zipf_alpha_field && defaults.distribution == IdDistribution::uniform)
      defaults.zipf_alpha_field->fail(
          "zipf_alpha is only for distribution: zipf (the default here is uniform)");
  }

  const Field tables_field = m.require(
      "tables", "expected a list of embedding tables, e.g. [{name: cat_0, rows: 1000, dim: 64}]");
  const auto entries = tables_field.as_list("a list of embedding tables");
  if (entries.empty()) tables_field.fail("expected at least one table");
  std::vector<TableOrigin> origins;
  std::map<std::string, std::size_t> first_index;  // name -> index in spec.tables
  for (const Field& entry : entries) {
    const MapView e =
        entry.as_map(kTableKeys, "a table map such as {name: cat_0, rows: 1000, dim: 64}");
    const Field name_field = e.require("name", "every table needs a name, e.g. name: cat_0");
    const std::string name = read_identifier(name_field, "a table name");
    std::int64_t count = 0;  // 0: no expansion
    if (auto f = e.get("count")) count = f->as_int(1, kMaxCount, "an integer from 1 to 100000");
    const TableFields own = read_table_fields(e);

    TableSpec t;
    t.name = name;
    t.rows = required(own.rows, defaults.rows, e, "rows");
    t.dim = required(own.dim, defaults.dim, e, "dim");
    t.pooling_size = own.pooling_size.value_or(defaults.pooling_size.value_or(1));
    t.pooling = own.pooling.value_or(defaults.pooling.value_or(Pooling::sum));
    t.distribution =
        own.distribution.value_or(defaults.distribution.value_or(IdDistribution::uniform));
    t.dtype = own.dtype.value_or(defaults.dtype.value_or(DType::f32));
    if (t.distribution == IdDistribution::zipf) {
      if (own.zipf_alpha)
        t.zipf_alpha = *own.zipf_alpha;
      else if (defaults.zipf_alpha)
        t.zipf_alpha = *defaults.zipf_alpha;
      else
        e.fail_missing(
            "zipf_alpha",
            "distribution zipf needs its exponent, a positive number, e.g. zipf_alpha: 1.1");
    } else if (own.zipf_alpha_field) {
      own.zipf_alpha_field->fail(
          "zipf_alpha is only for distribution: zipf (this table is uniform)");
    }

    const std::size_t copies = count == 0 ? 1 : static_cast<std::size_t>(count);
    if (spec.tables.size() + copies > kMaxTables)
      entry.fail("too many tables: at most 100000 after count: expansion");
    for (std::size_t k = 0; k < copies; ++k) {
      TableSpec copy = t;
      if (count > 0) copy.name = fmt::format("{}_{}", name, k);
      if (auto it = first_index.find(copy.name); it != first_index.end()) {
        const std::string via = count > 0 ? fmt::format(" (made by count: {})", count) : "";
        name_field.fail(fmt::format("duplicate table name '{}'{}, also {}", copy.name, via,
                                    origins[it->second].entry_path));
      }
      first_index.emplace(copy.name, spec.tables.size());
      spec.tables.push_back(std::move(copy));
      origins.push_back({entry.path()});
    }
  }

  spec.bottom_mlp =
      read_layers(m.require("bottom_mlp", "expected a list of layer sizes, e.g. [512, 256, 128]"),
                  "[512, 256, 128]");
  const Field top_field =
      m.require("top_mlp", "expected a list of layer sizes ending in 1, e.g. [1024, 512, 256, 1]");
  spec.top_mlp = read_layers(top_field, "[1024, 512, 256, 1]");
  if (spec.top_mlp.back() != 1)
    top_field.as_list("").back().fail(fmt::format(
        "the last top_mlp layer must have size 1 (the click logit), got {}", spec.top_mlp.back()));

  const Field interaction_field = m.require(
      "interaction", "expected {kind: dcnv2, cross_layers: 3, low_rank: 512} or {kind: dot}");
  spec.interaction = read_interaction(interaction_field);

  // ---- optimizer ----
  const MapView opt =
      m.require("optimizer",
                "expected {embedding: {kind: rowwise_adagrad, lr: 0.01}, dense: {kind: adam, lr: "
                "0.001}}")
          .as_map({"embedding", "dense"}, "a map with embedding: and dense: optimizers");
  spec.embedding_optimizer = read_optimizer(
      opt.require("embedding",
                  "expected the tables' optimizer, e.g. {kind: rowwise_adagrad, lr: 0.01}"),
      true);
  spec.dense_optimizer = read_optimizer(
      opt.require("dense", "expected the dense layers' optimizer, e.g. {kind: adam, lr: 0.001}"),
      false);

  // ---- totals that must fit spec.h's types ----
  std::int64_t rows = 0, params = 0, dims = 0;
  for (const auto& t : spec.tables) {
    if (__builtin_add_overflow(rows, t.rows, &rows) || rows > kMaxRows)
      tables_field.fail("the tables hold more than 2^62 rows in total");
    dims += t.dim;
  }
  for (const auto& t : spec.tables) {
    std::int64_t p = 0;
    if (__builtin_mul_overflow(t.rows, static_cast<std::int64_t>(t.dim), &p) ||
        __builtin_add_overflow(params, p, &params) || params > kMaxRows)
      tables_field.fail("the tables hold more than 2^62 parameters in total");
  }
  if (dims + spec.bottom_mlp.back() > INT_MAX)
    tables_field.fail(fmt::format(
        "the table dims plus the last bottom_mlp size add up to {}, more than 2147483647",
        dims + spec.bottom_mlp.back()));
  if (spec.interaction.kind == InteractionKind::dot) {
    const std::int64_t f = spec.num_tables() + 1;
    if (spec.bottom_mlp.back() + f * (f - 1) / 2 > INT_MAX)
      interaction_field.fail(
          fmt::format("dot interaction over {} tables has more than 2147483647 outputs; use dcnv2",
                      spec.num_tables()));
    for (std::size_t i = 0; i < spec.tables.size(); ++i) {
      const auto& t = spec.tables[i];
      if (t.dim != spec.bottom_mlp.back())
        interaction_field.fail(
            fmt::format("dot interaction needs every table dim ({} '{}' has {}) equal to the last "
                        "bottom_mlp size ({})",
                        origins[i].entry_path, t.name, t.dim, spec.bottom_mlp.back()));
    }
  }

  // ---- recipe ----
  std::vector<DType> used;
  for (DType d : {DType::f32, DType::f16, DType::bf16})
    for (const auto& t : spec.tables)
      if (t.dtype == d) {
        used.push_back(d);
        break;
      }
  spec.allowed_table_dtypes = used;
  spec.allowed_dense_math = {DenseMath::fp32};
  spec.allow_rowwise_adagrad = false;
  spec.max_global_batch = spec.batch_size;
  if (auto f = m.get("recipe")) {
    const MapView r =
        f->as_map({"allow_rowwise_adagrad", "table_dtypes", "dense_math", "max_global_batch"},
                  "a map such as {allow_rowwise_adagrad: true, table_dtypes: [fp32, "
                  "bf16], dense_math: [fp32, bf16]}");
    if (auto g = r.get("allow_rowwise_adagrad")) spec.allow_rowwise_adagrad = g->as_bool();
    if (auto g = r.get("max_global_batch"))
      spec.max_global_batch =
          g->as_int(spec.batch_size, std::int64_t{1} << 40,
                    fmt::format("an integer >= batch_size ({})", spec.batch_size));
    if (auto g = r.get("table_dtypes")) {
      spec.allowed_table_dtypes = read_unique_list<DType>(
          *g, "[fp32, fp16, bf16]", [](const Field& x) { return read_table_dtype(x); });
      for (std::size_t i = 0; i < spec.tables.size(); ++i) {
        const auto& t = spec.tables[i];
        const auto& allowed = spec.allowed_table_dtypes;
        if (std::find(allowed.begin(), allowed.end(), t.dtype) == allowed.end())
          g->fail(fmt::format("must include every table's own dtype: {} '{}' is {}",
                              origins[i].entry_path, t.name, dtype_name(t.dtype)));
      }
    }
    if (auto g = r.get("dense_math"))
      spec.allowed_dense_math = read_unique_list<DenseMath>(
          *g, "[fp32, tf32, bf16]", [](const Field& x) { return x.as_choice(kDenseMathNames); });
  }
  return spec;
}

}  // namespace

ModelSpec parse_model_spec(std::string_view yaml_text, const std::string& origin) {
  return spec_yaml::parse_spec(yaml_text, origin, "model spec", parse_model);
}

ModelSpec load_model_spec(const std::filesystem::path& file) {
  return parse_model_spec(spec_yaml::read_text_file(file, "model spec"), file.string());
}

}  // namespace parity
