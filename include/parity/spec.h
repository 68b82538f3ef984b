// Specs: what a model is, what a device is. Parsed from YAML, validated, and
// plain values afterwards. Every error names the file, the line, the field and
// what was expected (parity::InputError).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "parity/dtype.h"

namespace parity {

// ---------------------------------------------------------------- model ----

enum class Pooling : std::uint8_t { sum, mean };
enum class IdDistribution : std::uint8_t { uniform, zipf };
enum class InteractionKind : std::uint8_t { dot, dcnv2 };
enum class OptimizerKind : std::uint8_t { sgd, adagrad, rowwise_adagrad, adam };

// Each enum's names as configs, plans and messages spell them, in one table per enum: the
// *_name functions and the parsers (model YAML, plan JSON) read these tables.
template <class E>
struct NamedValue {
  std::string_view name;
  E value;
};
inline constexpr NamedValue<Pooling> kPoolingNames[] = {{"sum", Pooling::sum},
                                                        {"mean", Pooling::mean}};
inline constexpr NamedValue<IdDistribution> kDistributionNames[] = {
    {"uniform", IdDistribution::uniform}, {"zipf", IdDistribution::zipf}};
inline constexpr NamedValue<InteractionKind> kInteractionNames[] = {
    {"dot", InteractionKind::dot}, {"dcnv2", InteractionKind::dcnv2}};
inline constexpr NamedValue<OptimizerKind> kOptimizerNames[] = {
    {"sgd", OptimizerKind::sgd},
    {"adagrad", OptimizerKind::adagrad},
    {"rowwise_adagrad", OptimizerKind::rowwise_adagrad},
    {"adam", OptimizerKind::adam}};

// The name of `value` in an enum's name table ("?" when it has none).
template <class E, std::size_t N>
constexpr std::string_view name_in(const NamedValue<E> (&names)[N], E value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}
// The storage precisions of a table, as model specs and plans spell them.
inline constexpr NamedValue<DType> kTableDTypeNames[] = {
    {"fp32", DType::f32}, {"fp16", DType::f16}, {"bf16", DType::bf16}};

std::string_view pooling_name(Pooling p);              // "sum", "mean"
std::string_view distribution_name(IdDistribution d);  // "uniform", "zipf"
std::string_view interaction_name(InteractionKind k);  // "dot", "dcnv2"
std::string_view optimizer_name(OptimizerKind k);  // "sgd", "adagrad", "rowwise_adagrad", "adam"

struct TableSpec {
  std::string name;
  std::int64_t rows = 0;  // > 0
  int dim = 0;            // > 0
  int pooling_size = 1;   // ids per bag (multi-hot size), >= 0
  Pooling pooling = Pooling::sum;
  IdDistribution distribution = IdDistribution::uniform;
  double zipf_alpha = 0.0;   // > 0 when distribution is zipf
  DType dtype = DType::f32;  // storage precision: f32, f16 or bf16
  // Where the engine keeps the table; set by apply_plan from a plan's placement (a model file
  // does not say): in host memory with cache_rows of its rows cached in HBM, or all in HBM.
  bool host_placed = false;
  std::int64_t cache_rows = 0;  // in [0, rows] when host_placed
};

struct InteractionSpec {
  InteractionKind kind = InteractionKind::dcnv2;
  int cross_layers = 0;  // dcnv2: number of low-rank cross layers (>= 1)
  int low_rank = 0;      // dcnv2: rank r of each layer's W·V factorisation (>= 1)
};

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.01;           // > 0
  double eps = 1e-8;          // adagrad, rowwise_adagrad, adam
  double beta1 = 0.9;         // adam
  double beta2 = 0.999;       // adam
  double weight_decay = 0.0;  // >= 0; decoupled (w -= lr*wd*w) for adam, L2 (g += wd*w) otherwise
  // adagrad, rowwise_adagrad: >= 0, the sum of squares before the first step. With 0 the first
  // step moves every weight by lr whatever its gradient's size (g / |g|).
  double initial_accumulator = 0.0;
};

// Dense math precisions. tf32 is a math mode, not a storage type, hence its own enum.
enum class DenseMath : std::uint8_t { fp32, tf32, bf16, fp16 };
inline constexpr NamedValue<DenseMath> kDenseMathNames[] = {{"fp32", DenseMath::fp32},
                                                            {"tf32", DenseMath::tf32},
                                                            {"bf16", DenseMath::bf16},
                                                            {"fp16", DenseMath::fp16}};
std::string_view dense_math_name(DenseMath m);  // "fp32", "tf32", "bf16", "fp16"

// How the learning rates follow a global batch the planner changes from the reference one: in
// proportion to the batch (linear; Goyal et al. 2017, "Accurate, Large Minibatch SGD"), or to its
// square root (sqrt; the rule usually given for adaptive optimizers such as Adagrad and Adam).
enum class LrScaling : std::uint8_t { linear, sqrt };
inline constexpr NamedValue<LrScaling> kLrScalingNames[] = {{"linear", LrScaling::linear},
                                                            {"sqrt", LrScaling::sqrt}};
std::string_view lr_scaling_name(LrScaling r);  // "linear", "sqrt"

// The model families: DLRM (pooled tables, MLPs, an interaction) and HSTU, a sequential
// recommender over each user's history of events (Zhai et al. 2024, "Actions Speak Louder than
// Words").
enum class ModelKind : std::uint8_t { dlrm, hstu };
inline constexpr NamedValue<ModelKind> kModelKindNames[] = {{"dlrm", ModelKind::dlrm},
                                                            {"hstu", ModelKind::hstu}};
std::string_view model_kind_name(ModelKind k);  // "dlrm", "hstu"

// How history lengths are drawn (synthetic data and the planner's length model): uniform over
// [min_len, max_len], or a power law P(n) ∝ n^-alpha over it (most histories short, a long tail).
enum class LengthDistribution : std::uint8_t { uniform, power_law };
inline constexpr NamedValue<LengthDistribution> kLengthDistributionNames[] = {
    {"uniform", LengthDistribution::uniform}, {"power_law", LengthDistribution::power_law}};

// How an event's feature embeddings make its token: summed (each of model_dim) or concatenated
// (dims adding up to model_dim).
enum class EventCombine : std::uint8_t { sum, concat };
inline constexpr NamedValue<EventCombine> kEventCombineNames[] = {{"sum", EventCombine::sum},
                                                                  {"concat", EventCombine::concat}};

// An HSTU model's input: per example a history of 1..max_len events (each an item, an action,
// a timestamp, and any other per-event features) followed by `targets` target items to rank,
// one CSR layout (values, offsets of length batch + 1) as for every jagged input.
struct SequenceSpec {
  int max_len = 0;  // history events per example at most, >= 1
  int min_len = 1;  // at least, in [1, max_len]
  int targets = 1;  // target events after the history, >= 1
  LengthDistribution lengths = LengthDistribution::uniform;
  double length_alpha = 0.0;  // power_law's exponent, > 0
  // Tables looked up once per event and not pooled (pooling_size 1), features[0] the item.
  std::vector<TableSpec> features;
  EventCombine combine = EventCombine::sum;
};

// The HSTU stack: `layers` layers over tokens of model_dim, each
//   x -> LayerNorm -> one projection to U, V, Q, K (heads x value_dim, value_dim, attention_dim,
//   attention_dim) with SiLU -> A = SiLU(Q K^T / sqrt(attention_dim) + rab) / n, causal (targets
//   see the history and themselves, not each other), no softmax -> Y = LayerNorm(A V) * U ->
//   output projection to model_dim -> residual;
// rab a learned relative bias from position_buckets position and time_buckets log-scaled
// time-difference buckets per head. Ranking heads: one logit per task on each target token.
struct HstuSpec {
  SequenceSpec sequence;
  int model_dim = 0;               // d, >= 1
  int layers = 0;                  // >= 1
  int heads = 0;                   // >= 1
  int attention_dim = 0;           // a, per head, >= 1
  int value_dim = 0;               // v, per head, >= 1
  double dropout = 0.0;            // in [0, 1)
  int position_buckets = 0;        // >= 1
  int time_buckets = 0;            // >= 1
  std::vector<std::string> tasks;  // >= 1, unique: the actions each target is scored on
};

struct ModelSpec {
  std::string name;
  std::string description;
  std::string source_file;  // where it was loaded from ("<string>" if parsed from text)
  ModelKind kind = ModelKind::dlrm;
  // HSTU (present iff kind is hstu; the DLRM fields below are then empty, except `tables`, its
  // contextual features: pooled tables each giving one more token of model_dim before the
  // history).
  std::optional<HstuSpec> hstu;
  int dense_features = 0;         // > 0
  std::vector<TableSpec> tables;  // >= 1, unique names
  std::vector<int> bottom_mlp;    // output sizes of the bottom MLP layers, >= 1 layer
  std::vector<int> top_mlp;       // output sizes of the top MLP layers, last == 1
  InteractionSpec interaction;
  OptimizerSpec embedding_optimizer;  // sgd, adagrad or rowwise_adagrad
  OptimizerSpec dense_optimizer;      // sgd, adagrad or adam
  // Recipe changes that alter the numerics and that a planner may make ("recipe:" in YAML).
  bool allow_rowwise_adagrad = false;                   // a table's adagrad -> rowwise_adagrad
  std::vector<DType> allowed_table_dtypes{DType::f32};  // table storage precisions allowed
                                                        // (parsed: the tables' own dtypes
                                                        // unless recipe.table_dtypes says)
  std::vector<DenseMath> allowed_dense_math{DenseMath::fp32};  // dense math precisions allowed
  std::int64_t max_global_batch = 0;  // largest global batch a planner may use (the learning
                                      // rates then follow lr_scaling); parsed specs default to
                                      // batch_size
  // Smallest global batch a planner may choose because it is faster (fewer activations leave
  // HBM for tables); below it only when nothing larger fits. 0 (and parsed specs by default):
  // batch_size.
  std::int64_t min_global_batch = 0;
  LrScaling lr_scaling = LrScaling::linear;
  // Steps over which the learning rates rise from the reference batch's to the scaled ones after
  // a larger batch (gradual warm-up, Goyal et al. 2017); 0: the scaled rates from the first step.
  std::int64_t lr_warmup_steps = 0;
  std::int64_t batch_size = 0;  // the reference global batch size the lr is tuned for (> 0)
  // GPUs the model's reference recipe trains on ("gpus:" in YAML; 0: not said). `parity plan`
  // plans for it when --gpus is not given, and the fleet report compares devices at it.
  int gpus = 0;
  // The factor a plan's batch change scaled the optimizers' learning rates by (1: unchanged); the
  // warm-up starts from the rates divided by it.
  double lr_batch_scale = 1.0;

  // Derived quantities.
  int num_tables() const { return static_cast<int>(tables.size()); }
  // Over `tables` and, for HSTU, its sequence features (their lookups at most: every history
  // max_len events long).
  std::int64_t embedding_rows() const;        // sum of rows
  std::int64_t embedding_parameters() const;  // sum of rows * dim
  std::int64_t lookups_per_example() const;   // sum of pooling_size
  int embedding_output_dim() const;           // sum of dims
  int interaction_input_dim() const;          // bottom_mlp.back() + embedding_output_dim()
  int interaction_output_dim()
      const;  // dot: D + F(F-1)/2 with F = tables+1; dcnv2: interaction_input_dim()
  std::int64_t dense_parameters() const;  // bottom + interaction (cross layers) + top, weights and
                                          // biases (HSTU: its layers and heads)
  // The multiplier of the optimizers' learning rates at training step `step` (0-based): during
  // the warm-up after a larger batch, 1/s + (1 - 1/s) step / lr_warmup_steps for s =
  // lr_batch_scale; 1 after it and without a batch change.
  double lr_factor(std::int64_t step) const;
};

// The model trained at `batch` examples a step instead of its batch_size: its learning rates
// scaled by the recipe's rule (recipe.lr_scaling: batch / batch_size, or its square root) and,
// for a larger batch, warmed up from the reference rates over recipe.lr_warmup_steps steps
// (lr_batch_scale records the factor).
ModelSpec with_batch(const ModelSpec& model, std::int64_t batch);

// Throws InputError when the model is not a DLRM model: `who` (the planner, the engine, a data
// source) handles DLRM models only so far, and says so by name.
void require_dlrm(const ModelSpec& m, std::string_view who);

// Loads and validates a model spec. Throws InputError naming file, line and field.
ModelSpec load_model_spec(const std::filesystem::path& file);
// Same from text; origin is used in messages in place of a file name.
ModelSpec parse_model_spec(std::string_view yaml_text, const std::string& origin);

// --------------------------------------------------------------- device ----

enum class Vendor : std::uint8_t { nvidia, amd };
inline constexpr NamedValue<Vendor> kVendorNames[] = {{"nvidia", Vendor::nvidia},
                                                      {"amd", Vendor::amd}};
std::string_view vendor_name(Vendor v);  // "nvidia", "amd"

// A number with the public source it was taken from.
struct Sourced {
  double value = 0.0;
  std::string source;
};

enum class Fp8Format : std::uint8_t { ocp, fnuz };  // OCP e4m3/e5m2 (NVIDIA, CDNA4) or FNUZ (CDNA3)
inline constexpr NamedValue<Fp8Format> kFp8FormatNames[] = {{"ocp", Fp8Format::ocp},
                                                            {"fnuz", Fp8Format::fnuz}};

// How a device without TF32 units runs TF32 math, where its BLAS library offers a way: bf16x3
// splits each fp32 operand into a high and a low bf16 part and sums three bf16 products (hi·hi,
// hi·lo, lo·hi), about TF32's precision at a third of the bf16 rate.
enum class Tf32Emulation : std::uint8_t { none, bf16x3 };
inline constexpr NamedValue<Tf32Emulation> kTf32EmulationNames[] = {
    {"none", Tf32Emulation::none}, {"bf16x3", Tf32Emulation::bf16x3}};

struct DeviceSpec {
  std::string name;          // catalog key, e.g. "h200"
  std::string display_name;  // e.g. "NVIDIA H200 SXM"
  std::string source_file;
  Vendor vendor = Vendor::nvidia;
  std::string arch;                                    // "sm_90", "sm_100", "gfx942", "gfx950"
  Sourced hbm_bytes;                                   // bytes of device memory
  Sourced hbm_bandwidth;                               // bytes/s, peak
  Sourced fp32_flops;                                  // dense peak FLOP/s, no sparsity
  std::optional<Sourced> tf32_flops;                   // absent where the device has no TF32 units
  Tf32Emulation tf32_emulation = Tf32Emulation::none;  // without them: the library's emulation
  Sourced bf16_flops;
  Sourced fp16_flops;
  std::optional<Sourced> fp8_flops;
  std::optional<Fp8Format> fp8_format;  // present iff fp8_flops
  Sourced compute_units;                // SMs (NVIDIA) or CUs (AMD)
  Sourced warp_size;                    // 32 or 64
  Sourced l2_bytes;
  Sourced llc_bytes;             // last-level cache beyond L2 (AMD Infinity Cache); 0 if none
  Sourced shared_memory_per_cu;  // bytes of shared memory / LDS per SM / CU
  Sourced scale_up_bandwidth;    // bytes/s per GPU per direction in the scale-up domain
  Sourced scale_up_domain;       // GPUs in one scale-up domain
  Sourced scale_out_bandwidth;   // bytes/s per GPU per direction across domains (NIC)
  Sourced host_link_bandwidth;   // bytes/s per direction between device and host memory
  Sourced host_memory_bytes;     // host memory available per GPU for host-placed tables

  // Whether TF32 math runs: on TF32 units, or emulated by the device's library.
  bool has_tf32() const { return tf32_flops.has_value() || tf32_emulation != Tf32Emulation::none; }
  bool tf32_native() const { return tf32_flops.has_value(); }
  // Peak for a dense math precision (tf32 emulated as bf16x3: a third of the bf16 peak); throws
  // parity::Error for tf32 on a device that neither has nor emulates it.
  double dense_flops(DenseMath m) const;
};

DeviceSpec load_device_spec(const std::filesystem::path& file);
DeviceSpec parse_device_spec(std::string_view yaml_text, const std::string& origin);
// Every *.yaml in dir, sorted by name. Throws InputError on the first bad file.
std::vector<DeviceSpec> load_device_catalog(const std::filesystem::path& dir);
// Finds a device by catalog key (case-insensitive) or by a path to a YAML file.
DeviceSpec find_device(std::string_view key_or_path, const std::filesystem::path& catalog_dir);
// The catalog device a runtime's device name stands for: the one whose key is a word of the name
// ("NVIDIA H200" -> h200, "AMD Instinct MI300X" -> mi300x, case-insensitive; the longest key
// wins; a PCIe or NVL part matches only an entry of that form factor). nullopt when none matches.
std::optional<DeviceSpec> match_device(std::string_view runtime_name,
                                       const std::filesystem::path& catalog_dir);

}  // namespace parity
