// The Plan: the contract between the thinking half (spec, perf, plan) and the doing
// half (engine, backends). A plain, serializable value: device and GPU count, batch,
// per table its precision, optimizer, placement and sharding (with shard boundaries),
// dense math precision, the recipe changes with their reasons, the kernel choices,
// and the predictions (step time and memory by category, examples/s). The planner
// makes it, `parity train --plan` consumes it, a user can read and edit it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parity/error.h"
#include "parity/perf.h"
#include "parity/select.h"
#include "parity/spec.h"

namespace parity {

enum class Sharding : std::uint8_t { table, row, column, replicated };
inline constexpr NamedValue<Sharding> kShardingNames[] = {{"table", Sharding::table},
                                                          {"row", Sharding::row},
                                                          {"column", Sharding::column},
                                                          {"replicated", Sharding::replicated}};
std::string_view sharding_name(Sharding s);

struct ShardPlan {
  int device = 0;  // rank holding the shard (replicated: every rank, -1)
  std::int64_t row_begin = 0, row_end = 0;
  int col_begin = 0, col_end = 0;
  bool operator==(const ShardPlan&) const = default;
};

struct TablePlan {
  std::string name;
  DType dtype = DType::f32;
  OptimizerKind optimizer = OptimizerKind::rowwise_adagrad;
  Sharding sharding = Sharding::table;
  Placement placement = Placement::hbm;
  std::int64_t cache_rows = 0;  // host placement: rows cached in HBM (per shard)
  std::vector<ShardPlan> shards;
};

struct RecipeChange {
  std::string what;  // "embedding optimizer", "table dtype", "global batch", "dense math", ...
  std::string from, to;
  std::string reason;
};

// One matrix product of the step and the kernel chosen for it. With the device's kernel catalog
// (Plan::gemm_catalog) the product is described as the GPU backend runs it and `ranked` holds the
// catalog configurations the ranking put first (GemmKernel::key(), fastest first): the backend
// runs the first the library accepts, saying why it passed over any before it. Without a catalog
// only the roofline model's tile is recorded (ranked empty).
struct KernelChoice {
  std::string op;  // e.g. "top.0 forward", "top.0 weight gradient"
  std::int64_t m = 0, n = 0, k = 0;
  int tile_m = 0, tile_n = 0;
  double predicted_s = 0;
  GemmProblem problem;              // with a catalog: the product's kind and shape
  std::vector<std::string> ranked;  // with a catalog: the configurations, fastest first
};

// The kernel catalog a plan's choices were ranked from, and the library it was measured with:
// a plan run against another version of the library falls back to the library's own choices.
struct GemmCatalogRef {
  std::string file;  // as found by the planner (configs/calibration/DEVICE-gemm.json)
  std::string library;
  std::int64_t library_version = 0;
  bool empty() const { return file.empty(); }
};

struct Prediction {
  double step_s = 0;
  double examples_per_s = 0;  // whole job
  double examples_per_s_per_gpu = 0;
  std::map<std::string, double> time_s;  // by op category (critical path)
  // The step with every op at its roofline and no fixed costs (launches, latencies): a measured
  // step time over this is how far from the hardware's limits the engine runs.
  double floor_s = 0;
  std::map<std::string, double> memory_bytes;  // by category, on the fullest device
  double peak_memory_bytes = 0;                // fullest device
  std::vector<double> device_memory_bytes;     // every device
  int peak_device = 0;
  double memory_budget_bytes = 0;  // HBM per device
  double host_memory_bytes = 0;    // host memory used per GPU (host-placed tables)
};

struct Plan {
  std::string model;       // model name
  std::string model_file;  // where the model was loaded from
  std::string device;      // catalog key
  int gpus = 1;
  std::int64_t per_device_batch = 0;
  std::int64_t global_batch = 0;
  DenseMath dense_math = DenseMath::fp32;
  // HSTU models: tokens per device the per-token buffers are sized for (a batch's token count
  // varies with its lengths; the plan sizes for nearly every batch: token_capacity in perf.h), and
  // activation recompute. DLRM plans: 0 and false.
  std::int64_t token_capacity = 0;
  bool recompute = false;
  // Every forward product of the dense layers checked row by row against its checksum
  // (Backend::set_product_checks, `--product-checks`): the prediction counts the checks' passes
  // and scratch, and the dense math is never tf32 (the checks cannot follow its rounding).
  bool product_checks = false;
  OptimizerKind embedding_optimizer = OptimizerKind::rowwise_adagrad;
  // Every table: a DLRM model's; an HSTU model's sequence features, then its contextual tables.
  std::vector<TablePlan> tables;
  std::vector<RecipeChange> changes;
  std::vector<KernelChoice> kernels;
  GemmCatalogRef gemm_catalog;  // empty: no catalog for the device (roofline tiles only)
  Prediction prediction;
  std::string calibration;  // calibration source
};

struct PlannerOptions {
  // configs/calibration/ (the device's calibration and kernel catalog) and configs/devices/
  // (the other devices whose costs the sharding search also decides by)
  std::filesystem::path configs_dir = "configs";
  // Smallest global batch the planner may fall back to, as a fraction of the model's
  // batch_size, when the reference batch does not fit.
  int max_batch_halvings = 6;
  // The kernel catalog the plan's matrix products are ranked with: empty for the device's own
  // (configs/calibration/DEVICE-gemm.json, where it exists).
  std::filesystem::path gemm_catalog;
  // Plan for a run with checksummed products (Plan::product_checks).
  bool product_checks = false;
};

// The device's kernel catalog: `file` when given (its device must be `dev`), else
// configs/calibration/DEVICE-gemm.json under configs_dir when it exists, else none (nullptr).
std::shared_ptr<const GemmCatalog> gemm_catalog_for(const DeviceSpec& dev,
                                                    const std::filesystem::path& configs_dir,
                                                    const std::filesystem::path& file = {});

// One matrix product of a DLRM training step as the GPU backend runs it (the engine's layers,
// src/backend/gpu/gpu_backend.cpp): forward, data-gradient and weight-gradient products of every
// layer, its operands' type, transposes, output type and epilogue, with the sizes the backend
// pads a 16-bit copy of an fp32 operand to.
struct StepProduct {
  std::string op;  // "bottom.0 forward", "top.1 data gradient", "cross.0 weight gradient v"
  GemmProblem problem;
};
std::vector<StepProduct> dense_products(const ModelSpec& m, std::int64_t per_device_batch,
                                        DenseMath math);

// The plan's kernel choices: every product of the step (dense_products), ranked with the catalog
// where one is given (the first few configurations kept, the first's time predicted), else the
// roofline model's tile (gemm_best).
std::vector<KernelChoice> plan_kernel_choices(const Plan& p, const ModelSpec& m,
                                              const DeviceSpec& dev, const Calibration& cal,
                                              const GemmCatalog* catalog);

// The predicted seconds of the step's matrix products by their names (StepProduct::op), as the
// plan's kernel choices give them: each product of the plan's batch and math that a kernel catalog
// ranked, at the predicted time of the configuration it runs first (KernelChoice::predicted_s).
// The catalog's model predicts a product's time from its shape, tile and streaming costs, which
// the roofline model (gemm_best) does not see for skinny products. Products without such a choice
// (no catalog for the device, or a batch other than the plan's) are absent: the roofline times
// them.
using ProductTimes = std::map<std::string, double>;
ProductTimes planned_product_times(const Plan& plan, const ModelSpec& model);

// One dense op of a training step as the engine's step profile names it, with what the
// performance model predicts for it on one device.
struct OpCost {
  std::string category;  // the step profile's: "mlp", "interaction", "loss"
  std::string op;        // the step profile's op names: "bottom.0 forward", "top.2 backward",
                         // "cross.1 forward", "dot backward", "loss"
  double flops = 0;      // of the matrix products in the op
  double bytes = 0;      // device-memory bytes the op moves (products' operands and outputs,
                         // elementwise passes)
  double seconds = 0;    // predicted
};

// The dense ops of one step in the order the engine runs them (forward, loss, backward), each
// with its products and elementwise passes on `dev`. The plan's mlp, interaction and loss times
// are their sums by category (evaluate_plan), so a benchmark can print each op's prediction
// beside its measurement. product_checks: the forward products checked (Plan::product_checks);
// times: the products' times where the plan's kernel choices give them (planned_product_times;
// the roofline model's for the others, and for checked forward products, which run another shape).
std::vector<OpCost> dense_op_costs(const ModelSpec& m, std::int64_t per_device_batch,
                                   DenseMath math, const DeviceSpec& dev, const Calibration& cal,
                                   bool product_checks = false,
                                   const ProductTimes* times = nullptr);

// The ops of one HSTU training step on `examples` examples of the model's average length, named
// and grouped as the HSTU engine's step profile names them ("layer.0 attention forward" in
// "attention"), in the order it runs them, each with its products, passes and predicted time; the
// plan's HSTU times by category are their sums (with the embeddings, input and optimizer).
std::vector<OpCost> hstu_op_costs(const ModelSpec& m, double examples, DenseMath math,
                                  bool recompute, const DeviceSpec& dev, const Calibration& cal,
                                  bool product_checks = false);

// The predicted step of a plan: time by category and memory by category. Throws
// InputError if the plan does not match the model (tables, shards) or the device.
Prediction evaluate_plan(const Plan& plan, const ModelSpec& model, const DeviceSpec& device,
                         const Calibration& cal);

// Thrown when no recipe fits; what() says what does not fit, by how many bytes, and what
// would make it fit.
class InfeasibleError : public InputError {
 public:
  using InputError::InputError;
};

// The co-designed plan: maximises predicted examples/s under the memory budget.
// Deterministic. Throws InfeasibleError when nothing fits.
Plan make_plan(const ModelSpec& model, const DeviceSpec& device, int gpus,
               const PlannerOptions& options = {});

// The recipe of `source` run unchanged on `device` (the direct port): same batch per
// device, table precision, optimizer, placement, sharding and dense math (tf32 falls back
// to fp32 on a device without tf32), re-evaluated on `device`. Its prediction says whether
// it fits (peak_memory_bytes > memory_budget_bytes when it does not).
Plan port_plan(const Plan& source, const ModelSpec& model, const DeviceSpec& device,
               const PlannerOptions& options = {});

// JSON round trip. from_json throws InputError naming the field that is wrong.
std::string plan_to_json(const Plan& plan);
Plan plan_from_json(const std::string& text, const std::string& origin);
Plan load_plan(const std::filesystem::path& file);

// The model as the plan trains it: table dtypes, embedding optimizer, and the batch (the plan's
// global batch, or `batch` when positive) with the learning rates following it by the recipe's
// rule (with_batch: recipe.lr_scaling, recipe.lr_warmup_steps). Throws InputError if the plan is
// not for this model.
ModelSpec apply_plan(const ModelSpec& model, const Plan& plan, std::int64_t batch = 0);

// ---- the plan check (can_implement): before anything runs ----

// What the run about to start can execute: how many GPUs it has, which device, how much host
// memory it may use.
struct ExecutionTarget {
  int gpus = 1;                  // devices (ranks) of the run: one, or a sharded run's world
  std::string device;            // catalog key of the detected device ("" when none or unknown)
  double host_memory_bytes = 0;  // available to the run (0: unknown, not checked)
  bool gpu_backend = true;       // false: the cpu backend (dense math is fp32 there)
  // The GPU backend runs the plan's kernel choices (parity train --gemm-selection plan), not the
  // BLAS library's own.
  bool plan_kernels = false;
};

// One decision of a plan and how the run executes it.
struct PlanDecision {
  std::string what;      // "global batch", "table c3", "dense math", ...
  std::string executed;  // what runs
};

// Thrown when a plan holds a decision this run cannot execute; what() names the plan field, why,
// and what to do.
class PlanNotExecutable : public InputError {
 public:
  using InputError::InputError;
};

// Every decision of `plan` for `model` (batch, each table's precision, optimizer, placement and
// sharding, dense math, kernel choices, host memory) either executed by a run on `target`, as the
// returned list says, or refused: throws PlanNotExecutable naming the first decision refused.
// batch: the batch the run trains (the plan's when 0). Also refuses a plan that does not match the
// model (InputError, as apply_plan).
std::vector<PlanDecision> check_plan(const Plan& plan, const ModelSpec& model,
                                     const ExecutionTarget& target, std::int64_t batch = 0);

// Whether a predicted step fits: every device within its HBM budget and the host-placed tables
// within the host's memory per GPU.
bool fits(const Prediction& prediction, const DeviceSpec& device);

}  // namespace parity
