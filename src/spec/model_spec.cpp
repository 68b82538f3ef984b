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
#include <cmath>
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
std::string_view lr_scaling_name(LrScaling r) {
  return name_in(kLrScalingNames, r);
}

ModelSpec with_batch(const ModelSpec& model, std::int64_t batch) {
  if (batch < 1 || model.batch_size < 1)
    throw InputError(
        fmt::format("model '{}': a batch of {} examples for a model whose batch_size "
                    "is {}; both must be positive",
                    model.name, batch, model.batch_size));
  ModelSpec m = model;
  const double ratio = static_cast<double>(batch) / static_cast<double>(model.batch_size);
  const double scale = model.lr_scaling == LrScaling::sqrt ? std::sqrt(ratio) : ratio;
  m.batch_size = batch;
  m.embedding_optimizer.lr *= scale;
  m.dense_optimizer.lr *= scale;
  m.lr_batch_scale = model.lr_batch_scale * scale;
  return m;
}

double ModelSpec::lr_factor(std::int64_t step) const {
  if (lr_batch_scale <= 1.0 || lr_warmup_steps <= 0 || step >= lr_warmup_steps) return 1.0;
  const double from = 1.0 / lr_batch_scale;
  return from + (1.0 - from) * static_cast<double>(std::max<std::int64_t>(step, 0)) /
                    static_cast<double>(lr_warmup_steps);
}

// ------------------------------------------------------ derived values ----

std::string_view model_kind_name(ModelKind k) {
  return name_in(kModelKindNames, k);
}

void require_dlrm(const ModelSpec& m, std::string_view who) {
  if (m.kind == ModelKind::dlrm) return;
  throw InputError(
      fmt::format("{}: model '{}' is an {} model (kind: {}); {} handles DLRM models only so far",
                  m.source_file, m.name, model_kind_name(m.kind), model_kind_name(m.kind), who));
}

std::int64_t ModelSpec::embedding_rows() const {
  std::int64_t total = 0;
  for (const auto& t : tables) total += t.rows;
  if (hstu)
    for (const auto& t : hstu->sequence.features) total += t.rows;
  return total;
}

std::int64_t ModelSpec::embedding_parameters() const {
  std::int64_t total = 0;
  for (const auto& t : tables) total += t.rows * t.dim;
  if (hstu)
    for (const auto& t : hstu->sequence.features) total += t.rows * t.dim;
  return total;
}

std::int64_t ModelSpec::lookups_per_example() const {
  std::int64_t total = 0;
  for (const auto& t : tables) total += t.pooling_size;
  if (hstu) {
    const auto& q = hstu->sequence;
    total += static_cast<std::int64_t>(q.features.size()) * (q.max_len + q.targets);
  }
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
  if (hstu) {
    // Per layer: the input LayerNorm (gain and bias), the projection d -> h (2v + 2a) with
    // bias, the LayerNorm of A V (h v, gain and bias), the output projection h v -> d with bias,
    // the relative bias (buckets x heads); then one logit per task from a target token.
    const std::int64_t d = hstu->model_dim, h = hstu->heads, a = hstu->attention_dim,
                       v = hstu->value_dim;
    const std::int64_t uvqk = h * (2 * v + 2 * a);
    const std::int64_t layer = 2 * d + (d * uvqk + uvqk) + 2 * h * v + (h * v * d + d) +
                               (hstu->position_buckets + hstu->time_buckets) * h;
    const std::int64_t t = static_cast<std::int64_t>(hstu->tasks.size());
    return hstu->layers * layer + d * t + t;
  }
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
constexpr std::int64_t kMaxGpus = std::int64_t{1} << 16;
constexpr std::int64_t kMaxSeqLen = 1 << 20;
constexpr std::int64_t kMaxTargets = 1 << 16;
constexpr std::int64_t kMaxHstuLayers = 256;

const std::vector<std::string_view> kTopKeys = {
    "name",     "kind",       "description", "dense_features", "batch_size", "table_defaults",
    "tables",   "bottom_mlp", "top_mlp",     "interaction",    "optimizer",  "recipe",
    "sequence", "context",    "hstu",        "tasks",          "gpus"};
// The fields of one family only.
const std::vector<std::string_view> kDlrmKeys = {"dense_features", "table_defaults", "tables",
                                                 "bottom_mlp",     "top_mlp",        "interaction"};
const std::vector<std::string_view> kHstuKeys = {"sequence", "context", "hstu", "tasks"};
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
  const MapView m =
      f.as_map({"kind", "lr", "eps", "beta1", "beta2", "weight_decay", "initial_accumulator"},
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
  if (auto g = m.get("initial_accumulator")) {
    if (spec.kind != OptimizerKind::adagrad && spec.kind != OptimizerKind::rowwise_adagrad)
      g->fail(
          fmt::format("only adagrad and rowwise_adagrad take initial_accumulator (this "
                      "optimizer is {})",
                      optimizer_name(spec.kind)));
    spec.initial_accumulator = read_non_negative(*g);
  }
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

TableFields read_table_defaults(const MapView& m) {
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

  return defaults;
}

// Rows and parameters of the tables together fit the types spec.h gives them.
void check_table_totals(const std::vector<TableSpec>& tables, const Field& at) {
  std::int64_t rows = 0, params = 0;
  for (const auto& t : tables)
    if (__builtin_add_overflow(rows, t.rows, &rows) || rows > kMaxRows)
      at.fail("the tables hold more than 2^62 rows in total");
  for (const auto& t : tables) {
    std::int64_t p = 0;
    if (__builtin_mul_overflow(t.rows, static_cast<std::int64_t>(t.dim), &p) ||
        __builtin_add_overflow(params, p, &params) || params > kMaxRows)
      at.fail("the tables hold more than 2^62 parameters in total");
  }
}

// The tables listed under a key: each entry's own fields, else table_defaults'; `count: N`
// expands an entry into N tables named name_0 ... name_{N-1}; names unique across every list of
// the model (names maps each to its entry in origins). pooled false: tables looked up once per
// event (an HSTU model's sequence features), which take no pooling fields.
void read_table_list(const Field& list_field, const TableFields& defaults, bool pooled,
                     std::vector<TableSpec>& out, std::vector<TableOrigin>& origins,
                     std::map<std::string, std::size_t>& first_index) {
  const auto entries = list_field.as_list("a list of embedding tables");
  if (entries.empty()) list_field.fail("expected at least one table");
  for (const Field& entry : entries) {
    const MapView e =
        entry.as_map(kTableKeys, "a table map such as {name: cat_0, rows: 1000, dim: 64}");
    if (!pooled)
      for (std::string_view key : {"pooling_size", "pooling"})
        if (auto g = e.get(key))
          g->fail(
              fmt::format("a sequence feature is looked up once per event and takes no {}", key));
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
    if (origins.size() + copies > kMaxTables)
      entry.fail("too many tables: at most 100000 after count: expansion");
    for (std::size_t k = 0; k < copies; ++k) {
      TableSpec copy = t;
      if (count > 0) copy.name = fmt::format("{}_{}", name, k);
      if (auto it = first_index.find(copy.name); it != first_index.end()) {
        const std::string via = count > 0 ? fmt::format(" (made by count: {})", count) : "";
        name_field.fail(fmt::format("duplicate table name '{}'{}, also {}", copy.name, via,
                                    origins[it->second].entry_path));
      }
      first_index.emplace(copy.name, origins.size());
      out.push_back(std::move(copy));
      origins.push_back({entry.path()});
    }
  }
}

// The DLRM fields: dense features, pooled tables, the MLPs and the interaction.
void read_dlrm(const MapView& m, ModelSpec& spec, std::vector<TableOrigin>& origins,
               std::map<std::string, std::size_t>& first_index) {
  spec.dense_features = static_cast<int>(
      m.require("dense_features", "expected the number of dense features, e.g. dense_features: 13")
          .as_int(1, kMaxDenseFeatures, "a positive integer up to 1048576"));
  const TableFields defaults = read_table_defaults(m);
  const Field tables_field = m.require(
      "tables", "expected a list of embedding tables, e.g. [{name: cat_0, rows: 1000, dim: 64}]");
  read_table_list(tables_field, defaults, true, spec.tables, origins, first_index);

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

  // ---- totals that must fit spec.h's types ----
  check_table_totals(spec.tables, tables_field);
  std::int64_t dims = 0;
  for (const auto& t : spec.tables) dims += t.dim;
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
}

// The HSTU fields: the sequence and its features, optional contextual features, the stack and
// the ranking tasks.
void read_hstu(const MapView& m, ModelSpec& spec, std::vector<TableOrigin>& origins,
               std::map<std::string, std::size_t>& first_index) {
  HstuSpec h;
  const MapView st =
      m.require("hstu",
                "expected the stack, e.g. {model_dim: 256, layers: 3, heads: 4, attention_dim: "
                "64, value_dim: 64, position_buckets: 128, time_buckets: 64}")
          .as_map({"model_dim", "layers", "heads", "attention_dim", "value_dim", "dropout",
                   "position_buckets", "time_buckets"},
                  "a map of the HSTU stack's fields");
  const auto positive = [&](std::string_view key, std::int64_t hi, std::string_view hint) {
    return static_cast<int>(
        st.require(key, hint).as_int(1, hi, fmt::format("a positive integer up to {}", hi)));
  };
  h.model_dim = positive("model_dim", kMaxDim, "expected the token width d, e.g. model_dim: 256");
  h.layers = positive("layers", kMaxHstuLayers, "expected the number of layers, e.g. layers: 3");
  h.heads = positive("heads", kMaxDim, "expected the attention heads, e.g. heads: 4");
  h.attention_dim = positive("attention_dim", kMaxDim,
                             "expected Q and K's width per head, e.g. attention_dim: 64");
  h.value_dim =
      positive("value_dim", kMaxDim, "expected U and V's width per head, e.g. value_dim: 64");
  h.position_buckets = positive("position_buckets", kMaxSeqLen,
                                "expected the relative bias's position buckets, e.g. 128");
  h.time_buckets = positive("time_buckets", kMaxSeqLen,
                            "expected the relative bias's log-scaled time buckets, e.g. 64");
  if (auto f = st.get("dropout")) {
    h.dropout = f->as_number("a number in [0, 1)");
    if (!(h.dropout >= 0.0 && h.dropout < 1.0)) f->fail_expected("a number in [0, 1)");
  }

  // ---- the sequence ----
  SequenceSpec& q = h.sequence;
  const MapView sq =
      m.require("sequence",
                "expected the history, e.g. {max_len: 1024, targets: 4, features: [{name: item, "
                "rows: 1000000, dim: 256}, {name: action, rows: 8, dim: 256}]}")
          .as_map(
              {"max_len", "min_len", "targets", "lengths", "length_alpha", "features", "combine"},
              "a map of the history's fields");
  const Field max_len = sq.require("max_len", "expected the longest history, e.g. max_len: 1024");
  q.max_len = static_cast<int>(
      max_len.as_int(1, kMaxSeqLen, fmt::format("a positive integer up to {}", kMaxSeqLen)));
  if (auto f = sq.get("min_len"))
    q.min_len = static_cast<int>(
        f->as_int(1, q.max_len, fmt::format("an integer from 1 to max_len ({})", q.max_len)));
  q.targets = static_cast<int>(
      sq.require("targets", "expected the target items after each history, e.g. targets: 4")
          .as_int(1, kMaxTargets, fmt::format("an integer from 1 to {}", kMaxTargets)));
  if (auto f = sq.get("lengths")) q.lengths = f->as_choice(kLengthDistributionNames);
  if (auto f = sq.get("length_alpha")) {
    if (q.lengths != LengthDistribution::power_law)
      f->fail("length_alpha is only for lengths: power_law");
    q.length_alpha = read_positive(*f);
  } else if (q.lengths == LengthDistribution::power_law) {
    sq.fail_missing("length_alpha",
                    "lengths: power_law needs its exponent, a positive number, e.g. 1.2");
  }
  if (auto f = sq.get("combine")) q.combine = f->as_choice(kEventCombineNames);
  const Field features =
      sq.require("features",
                 "expected the per-event tables, the item first, e.g. [{name: item, rows: "
                 "1000000, dim: 256}]");
  read_table_list(features, TableFields{}, false, q.features, origins, first_index);
  int dims = 0;
  for (std::size_t i = 0; i < q.features.size(); ++i) {
    const TableSpec& t = q.features[i];
    if (q.combine == EventCombine::sum && t.dim != h.model_dim)
      features.fail(fmt::format(
          "combine: sum needs every feature dim equal to hstu.model_dim ({}): '{}' has {}",
          h.model_dim, t.name, t.dim));
    dims += t.dim;
  }
  if (q.combine == EventCombine::concat && dims != h.model_dim)
    features.fail(fmt::format(
        "combine: concat needs the feature dims to add up to hstu.model_dim ({}), they add up to "
        "{}",
        h.model_dim, dims));

  // ---- contextual features: pooled, one token each ----
  if (auto f = m.get("context")) {
    read_table_list(*f, TableFields{}, true, spec.tables, origins, first_index);
    for (const TableSpec& t : spec.tables)
      if (t.dim != h.model_dim)
        f->fail(fmt::format(
            "a contextual feature is one token: its dim must be hstu.model_dim ({}), '{}' has {}",
            h.model_dim, t.name, t.dim));
  }
  std::vector<TableSpec> all = spec.tables;
  all.insert(all.end(), q.features.begin(), q.features.end());
  check_table_totals(all, features);

  // ---- ranking tasks ----
  h.tasks = read_unique_list<std::string>(
      m.require("tasks", "expected the actions each target is scored on, e.g. [click, like]"),
      "[click, like]", [](const Field& x) { return read_identifier(x, "a task name"); });
  spec.hstu = std::move(h);
}

ModelSpec parse_model(const YAML::Node& root, const std::string& origin) {
  const Field top(root, "", &origin);
  const MapView m = top.as_map(kTopKeys, "a map of model fields");
  ModelSpec spec;
  spec.source_file = origin;
  if (auto f = m.get("kind")) spec.kind = f->as_choice(kModelKindNames);
  // The other family's fields are refused by name.
  const auto& foreign = spec.kind == ModelKind::hstu ? kDlrmKeys : kHstuKeys;
  for (std::string_view key : foreign)
    if (auto f = m.get(key))
      f->fail(fmt::format("{} is a field of {} models; this model is kind: {}", key,
                          spec.kind == ModelKind::hstu ? "dlrm" : "hstu",
                          model_kind_name(spec.kind)));
  spec.name = read_identifier(m.require("name", "expected the model's name, e.g. name: my-model"),
                              "a model name");
  if (auto f = m.get("description")) spec.description = f->as_string();
  spec.batch_size =
      m.require("batch_size",
                "expected the reference global batch size the learning rates are tuned for, e.g. "
                "batch_size: 65536")
          .as_int(1, kMaxBatch, "a positive integer up to 2^40");
  if (auto f = m.get("gpus"))
    spec.gpus = static_cast<int>(f->as_int(1, kMaxGpus, "a GPU count from 1 to 65536"));

  std::vector<TableOrigin> origins;
  std::map<std::string, std::size_t> first_index;  // name -> index in origins
  if (spec.kind == ModelKind::hstu) {
    read_hstu(m, spec, origins, first_index);
  } else {
    read_dlrm(m, spec, origins, first_index);
  }
  std::vector<const TableSpec*> every;  // in the order of origins: an HSTU model's sequence
                                        // features come before its contextual ones
  if (spec.hstu)
    for (const auto& t : spec.hstu->sequence.features) every.push_back(&t);
  for (const auto& t : spec.tables) every.push_back(&t);

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

  // ---- recipe ----
  std::vector<DType> used;
  for (DType d : {DType::f32, DType::f16, DType::bf16})
    for (const TableSpec* t : every)
      if (t->dtype == d) {
        used.push_back(d);
        break;
      }
  spec.allowed_table_dtypes = used;
  spec.allowed_dense_math = {DenseMath::fp32};
  spec.allow_rowwise_adagrad = false;
  spec.max_global_batch = spec.batch_size;
  spec.min_global_batch = spec.batch_size;
  if (auto f = m.get("recipe")) {
    const MapView r =
        f->as_map({"allow_rowwise_adagrad", "table_dtypes", "dense_math", "max_global_batch",
                   "min_global_batch", "lr_scaling", "lr_warmup_steps"},
                  "a map such as {allow_rowwise_adagrad: true, table_dtypes: [fp32, "
                  "bf16], dense_math: [fp32, bf16]}");
    if (auto g = r.get("allow_rowwise_adagrad")) spec.allow_rowwise_adagrad = g->as_bool();
    if (auto g = r.get("max_global_batch"))
      spec.max_global_batch =
          g->as_int(spec.batch_size, std::int64_t{1} << 40,
                    fmt::format("an integer >= batch_size ({})", spec.batch_size));
    if (auto g = r.get("min_global_batch"))
      spec.min_global_batch = g->as_int(
          1, spec.batch_size, fmt::format("an integer from 1 to batch_size ({})", spec.batch_size));
    if (auto g = r.get("lr_scaling")) spec.lr_scaling = g->as_choice(kLrScalingNames);
    if (auto g = r.get("lr_warmup_steps"))
      spec.lr_warmup_steps =
          g->as_int(0, std::int64_t{1} << 40, "a number of steps, an integer >= 0");
    if (auto g = r.get("table_dtypes")) {
      spec.allowed_table_dtypes = read_unique_list<DType>(
          *g, "[fp32, fp16, bf16]", [](const Field& x) { return read_table_dtype(x); });
      for (std::size_t i = 0; i < every.size(); ++i) {
        const TableSpec& t = *every[i];
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
