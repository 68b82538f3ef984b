// The planner: the headline plan, its invariants over random models and devices, and the
// plan file as a user meets it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "parity/error.h"
#include "parity/plan.h"
#include "plan_test_util.h"

using namespace parity::plan_test;  // NOLINT: the shipped configs, in every test below

namespace parity {
namespace {
namespace fs = std::filesystem;

// The headline: the full MLPerf DLRMv2 model on one H200 keeps every table in HBM in fp32
// by switching to rowwise Adagrad (full Adagrad's state would double the tables).
TEST(Planner, MlperfOnOneH200KeepsAllTablesInHbmInFp32) {
  const ModelSpec m = model("mlperf-dlrmv2");
  const Plan p = make_plan(m, device("h200"), 1, options());
  EXPECT_EQ(p.global_batch, 65536);
  EXPECT_EQ(p.embedding_optimizer, OptimizerKind::rowwise_adagrad);
  ASSERT_EQ(p.tables.size(), 26u);
  for (const auto& t : p.tables) {
    EXPECT_EQ(t.dtype, DType::f32) << t.name;
    EXPECT_EQ(t.placement, Placement::hbm) << t.name;
  }
  EXPECT_LE(p.prediction.peak_memory_bytes, 141e9);
  EXPECT_GT(p.prediction.memory_bytes.at("embedding_weights"), 104e9);
  const auto change = std::find_if(p.changes.begin(), p.changes.end(), [](const RecipeChange& c) {
    return c.what == "embedding optimizer";
  });
  ASSERT_NE(change, p.changes.end());
  EXPECT_EQ(change->from, "adagrad");
  EXPECT_EQ(change->to, "rowwise_adagrad");
  EXPECT_NE(change->reason.find("allowed by recipe.allow_rowwise_adagrad"), std::string::npos);
}

TEST(Planner, WithoutRowwiseTheMlperfModelNeedsHostMemoryOnOneH200) {
  ModelSpec m = model("mlperf-dlrmv2");
  m.allow_rowwise_adagrad = false;
  const Plan p = make_plan(m, device("h200"), 1, options());
  EXPECT_EQ(p.embedding_optimizer, OptimizerKind::adagrad);
  int host = 0;
  for (const auto& t : p.tables) host += t.placement == Placement::host;
  EXPECT_GT(host, 0);
  EXPECT_LE(p.prediction.peak_memory_bytes, 141e9);
}

TEST(Planner, InfeasibleModelsSayWhatDoesNotFitAndWhatWouldHelp) {
  ModelSpec m = model("mlperf-dlrmv2");
  m.allow_rowwise_adagrad = false;
  for (auto& t : m.tables) t.rows *= 40;  // ~8 TB of tables and state
  try {
    make_plan(m, device("h100"), 1, options());
    FAIL() << "planned an impossible model";
  } catch (const InfeasibleError& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find("does not fit on 1 x NVIDIA H100"), std::string::npos) << s;
    EXPECT_NE(s.find("GB over"), std::string::npos) << s;
    EXPECT_NE(s.find("more GPUs"), std::string::npos) << s;
    EXPECT_NE(s.find("recipe.allow_rowwise_adagrad"), std::string::npos) << s;
    EXPECT_NE(s.find("host placement"), std::string::npos) << s;
  }
}

TEST(Planner, NeverChoosesTf32WhereTheDeviceHasNone) {
  ModelSpec m = model("tiny");
  m.allowed_dense_math = {DenseMath::fp32, DenseMath::tf32};
  DeviceSpec bare = device("mi350x");  // no TF32 units and no library emulation
  bare.tf32_emulation = Tf32Emulation::none;
  EXPECT_FALSE(bare.has_tf32());
  EXPECT_EQ(make_plan(m, bare, 1, options()).dense_math, DenseMath::fp32);
  EXPECT_EQ(make_plan(m, device("h200"), 1, options()).dense_math, DenseMath::tf32);
  // A tf32 recipe ported to a device without TF32 falls back to fp32, and says so.
  const Plan src = make_plan(m, device("b200"), 1, options());
  const Plan port = port_plan(src, m, bare, options());
  EXPECT_EQ(port.dense_math, DenseMath::fp32);
  ASSERT_FALSE(port.changes.empty());
  EXPECT_NE(port.changes[0].reason.find("no TF32"), std::string::npos);
}

// MI350X and MI355X have no TF32 units; hipBLASLt runs TF32 math there as three bf16 products, a
// third of the bf16 rate, which is still several times the fp32 rate: a recipe that allows TF32 but
// not bf16 takes it, and a ported TF32 recipe keeps it, its products costed at that rate.
TEST(Planner, Tf32EmulatedAsThreeBf16Products) {
  ModelSpec m = model("tiny");
  m.allowed_dense_math = {DenseMath::fp32, DenseMath::tf32};
  for (const char* key : {"mi350x", "mi355x"}) {
    const DeviceSpec d = device(key);
    EXPECT_TRUE(d.has_tf32() && !d.tf32_native()) << key;
    EXPECT_DOUBLE_EQ(d.dense_flops(DenseMath::tf32), d.bf16_flops.value / 3) << key;
    const Plan p = make_plan(m, d, 1, options());
    EXPECT_EQ(p.dense_math, DenseMath::tf32) << key;
    const auto change = std::find_if(p.changes.begin(), p.changes.end(),
                                     [](const RecipeChange& c) { return c.what == "dense math"; });
    ASSERT_NE(change, p.changes.end()) << key;
    EXPECT_NE(change->reason.find("three bf16 products"), std::string::npos) << change->reason;
  }
  const DeviceSpec mi350x = device("mi350x");
  const Plan port = port_plan(make_plan(m, device("b200"), 1, options()), m, mi350x, options());
  EXPECT_EQ(port.dense_math, DenseMath::tf32);
  ASSERT_FALSE(port.changes.empty());
  EXPECT_EQ(port.changes[0].to, "tf32 (emulated)");
  // Each product is costed at the emulated rate: a big enough product takes bf16's time x 3.
  const Calibration cal = calibration_for(mi350x, kConfigs);
  const double tf32 = gemm_best({8192, 8192, 8192, DenseMath::tf32}, mi350x, cal).seconds;
  const double bf16 = gemm_best({8192, 8192, 8192, DenseMath::bf16}, mi350x, cal).seconds;
  EXPECT_NEAR(tf32 / bf16,
              3 * cal.gemm_efficiency(DenseMath::bf16) / cal.gemm_efficiency(DenseMath::tf32), 0.1);
}

// A plan that splits a rowwise-Adagrad table by columns says so: each shard keeps its rows' state
// from its own columns, not one process's numerics (docs/distributed.md).
TEST(Planner, ColumnSplitsOfRowwiseAdagradTablesAreARecipeChange) {
  auto named = [](const Plan& p) {
    return std::any_of(p.changes.begin(), p.changes.end(),
                       [](const RecipeChange& c) { return c.what == "rowwise Adagrad state"; });
  };
  auto columns = [](const Plan& p) {
    return std::count_if(p.tables.begin(), p.tables.end(),
                         [](const TablePlan& t) { return t.sharding == Sharding::column; });
  };
  const Plan split = make_plan(model("prod-ads-large"), device("h200"), 64, options());
  ASSERT_EQ(split.embedding_optimizer, OptimizerKind::rowwise_adagrad);
  ASSERT_GT(columns(split), 0);
  EXPECT_TRUE(named(split));
  const Plan one = make_plan(model("prod-ads-large"), device("h200"), 1, options());
  EXPECT_EQ(columns(one), 0);
  EXPECT_FALSE(named(one));
}

TEST(Planner, IsDeterministic) {
  const ModelSpec m = model("prod-many-features");
  const Plan a = make_plan(m, device("h200"), 32, options());
  const Plan b = make_plan(m, device("h200"), 32, options());
  EXPECT_EQ(plan_to_json(a), plan_to_json(b));
}

// Random models on random devices and GPU counts.
ModelSpec random_model(std::mt19937_64& rng) {
  auto pick = [&](auto lo, auto hi) {
    return std::uniform_int_distribution<long long>(lo, hi)(rng);
  };
  ModelSpec m;
  m.name = "random";
  m.source_file = "<test>";
  m.dense_features = static_cast<int>(pick(1, 64));
  m.batch_size = std::int64_t{1} << pick(10, 16);
  m.max_global_batch = m.batch_size << pick(0, 2);
  const int tables = static_cast<int>(pick(1, 60));
  const int dim = static_cast<int>(4 * pick(4, 64));
  for (int t = 0; t < tables; ++t) {
    TableSpec s;
    s.name = "t" + std::to_string(t);
    s.rows =
        static_cast<std::int64_t>(std::pow(10.0, std::uniform_real_distribution<>(1, 8.7)(rng)));
    s.dim = dim;
    s.pooling_size = static_cast<int>(pick(0, 60));
    if (pick(0, 1)) {
      s.distribution = IdDistribution::zipf;
      s.zipf_alpha = std::uniform_real_distribution<>(0.6, 1.4)(rng);
    }
    m.tables.push_back(s);
  }
  m.bottom_mlp = {static_cast<int>(pick(16, 512)), dim};
  m.top_mlp = {static_cast<int>(pick(16, 1024)), 1};
  if (pick(0, 1)) {
    m.interaction.kind = InteractionKind::dot;
  } else {
    m.interaction.kind = InteractionKind::dcnv2;
    m.interaction.cross_layers = static_cast<int>(pick(1, 3));
    m.interaction.low_rank = static_cast<int>(pick(8, 256));
  }
  const OptimizerKind opts[] = {OptimizerKind::sgd, OptimizerKind::adagrad,
                                OptimizerKind::rowwise_adagrad};
  m.embedding_optimizer.kind = opts[pick(0, 2)];
  m.dense_optimizer.kind = pick(0, 1) ? OptimizerKind::adam : OptimizerKind::adagrad;
  m.allow_rowwise_adagrad = pick(0, 1);
  m.allowed_table_dtypes = pick(0, 1) ? std::vector<DType>{DType::f32}
                                      : std::vector<DType>{DType::f32, DType::f16, DType::bf16};
  m.allowed_dense_math = {DenseMath::fp32, DenseMath::tf32, DenseMath::bf16};
  return m;
}

TEST(Planner, PropertiesOverRandomModelsAndDevices) {
  std::mt19937_64 rng(20261129);
  const auto catalog = load_device_catalog(kConfigs / "devices");
  int planned = 0;
  for (int i = 0; i < 60; ++i) {
    const ModelSpec m = random_model(rng);
    const DeviceSpec& d = catalog[static_cast<std::size_t>(i) % catalog.size()];
    const int gpus = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    Plan p;
    try {
      p = make_plan(m, d, gpus, options());
    } catch (const InfeasibleError&) {
      continue;  // some random models fit nowhere: what matters is the plans that are made
    }
    ++planned;
    // Peak memory within the budget, on every device, and host memory within the host's.
    ASSERT_EQ(p.prediction.device_memory_bytes.size(), static_cast<std::size_t>(gpus));
    for (double b : p.prediction.device_memory_bytes) EXPECT_LE(b, d.hbm_bytes.value) << i;
    EXPECT_LE(p.prediction.host_memory_bytes, d.host_memory_bytes.value) << i;
    EXPECT_TRUE(d.has_tf32() || p.dense_math != DenseMath::tf32);
    EXPECT_GT(p.prediction.examples_per_s, 0);
    // The floor (every op at its roofline, no fixed costs) is below the prediction but not
    // nothing: the predicted step is the floor plus launches, wave and tile quantization, the
    // embedding kernels' efficiencies and communication.
    EXPECT_GT(p.prediction.floor_s, 0) << i;
    EXPECT_LT(p.prediction.floor_s, p.prediction.step_s) << i;
    // Changes only where allowed.
    for (const auto& t : p.tables)
      EXPECT_NE(std::find(m.allowed_table_dtypes.begin(), m.allowed_table_dtypes.end(), t.dtype),
                m.allowed_table_dtypes.end());
    if (p.embedding_optimizer != m.embedding_optimizer.kind) {
      EXPECT_TRUE(m.allow_rowwise_adagrad);
      EXPECT_EQ(p.embedding_optimizer, OptimizerKind::rowwise_adagrad);
    }
    // More HBM never predicts lower throughput.
    DeviceSpec bigger = d;
    bigger.hbm_bytes.value *= 2;
    const Plan q = make_plan(m, bigger, gpus, options());
    EXPECT_GE(q.prediction.examples_per_s, p.prediction.examples_per_s * (1 - 1e-9))
        << "model " << i << " on " << gpus << " x " << d.name;
  }
  EXPECT_GT(planned, 30);
}

TEST(PlanFile, RoundTripsAndReEvaluatesTheSame) {
  const ModelSpec m = model("mlperf-dlrmv2");
  const DeviceSpec d = device("h200");
  const Plan p = make_plan(m, d, 8, options());
  const std::string json = plan_to_json(p);
  const Plan q = plan_from_json(json, "plan.json");
  EXPECT_EQ(plan_to_json(q), json);
  const Prediction e = evaluate_plan(q, m, d, calibration_for(d, kConfigs));
  EXPECT_DOUBLE_EQ(e.step_s, p.prediction.step_s);
  EXPECT_DOUBLE_EQ(e.peak_memory_bytes, p.prediction.peak_memory_bytes);
  EXPECT_GT(q.prediction.floor_s, 0);
  EXPECT_DOUBLE_EQ(q.prediction.floor_s, p.prediction.floor_s);
  EXPECT_DOUBLE_EQ(e.floor_s, p.prediction.floor_s);
  // The model as the plan trains it.
  const ModelSpec applied = apply_plan(m, q);
  EXPECT_EQ(applied.embedding_optimizer.kind, OptimizerKind::rowwise_adagrad);
  EXPECT_EQ(applied.batch_size, q.global_batch);
  const double to_plan = static_cast<double>(q.global_batch) / static_cast<double>(m.batch_size);
  EXPECT_DOUBLE_EQ(applied.embedding_optimizer.lr, m.embedding_optimizer.lr * to_plan);
  EXPECT_DOUBLE_EQ(applied.dense_optimizer.lr, m.dense_optimizer.lr * to_plan);
  // Another batch: the learning rates scale from the model's batch to it, once.
  const ModelSpec half = apply_plan(m, q, m.batch_size / 2);
  EXPECT_EQ(half.batch_size, m.batch_size / 2);
  EXPECT_DOUBLE_EQ(half.embedding_optimizer.lr, m.embedding_optimizer.lr * 0.5);
  EXPECT_DOUBLE_EQ(half.dense_optimizer.lr, m.dense_optimizer.lr * 0.5);
  ModelSpec other = model("tiny");
  EXPECT_THROW(apply_plan(other, q), InputError);
}

TEST(PlanFile, TheRecipesRuleScalesTheLearningRates) {
  ModelSpec m = model("mlperf-dlrmv2");
  const Plan q = make_plan(m, device("h200"), 8, options());
  const std::int64_t twice = 2 * m.batch_size;
  const ModelSpec linear = apply_plan(m, q, twice);
  EXPECT_DOUBLE_EQ(linear.embedding_optimizer.lr, m.embedding_optimizer.lr * 2);
  EXPECT_DOUBLE_EQ(linear.lr_batch_scale, 2.0);
  m.lr_scaling = LrScaling::sqrt;
  m.lr_warmup_steps = 100;
  const ModelSpec root = apply_plan(m, q, twice);
  EXPECT_DOUBLE_EQ(root.embedding_optimizer.lr, m.embedding_optimizer.lr * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(root.dense_optimizer.lr, m.dense_optimizer.lr * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(root.lr_factor(0), 1.0 / std::sqrt(2.0));  // warm-up from the reference rates
  EXPECT_DOUBLE_EQ(root.lr_factor(100), 1.0);
}

TEST(Planner, ABatchChangeSaysHowTheLearningRatesFollow) {
  ModelSpec m = model("tiny");
  m.max_global_batch = 8 * m.batch_size;
  m.lr_scaling = LrScaling::sqrt;
  m.lr_warmup_steps = 50;
  const Plan p = make_plan(m, device("h200"), 1, options());
  ASSERT_GT(p.global_batch, m.batch_size) << "the planner takes the larger batch the recipe allows";
  std::string reason;
  for (const auto& c : p.changes)
    if (c.what == "global batch") reason = c.reason;
  EXPECT_NE(reason.find("(recipe's sqrt rule)"), std::string::npos) << reason;
  EXPECT_NE(reason.find("warmed up from the reference batch's over 50 steps"), std::string::npos)
      << reason;
}

// A recipe that allows smaller batches gets the fastest of them: on one H200, prod-ads-large's
// reference batch leaves most of its tables in host memory, and half of it keeps more in HBM. The
// same recipe planned for less memory is then no faster than on the whole device (without the
// floor, the smaller device alone fell below the reference and overtook the larger).
TEST(Planner, ASmallerBatchTheRecipeAllowsIsTakenWhereFaster) {
  ModelSpec m = model("prod-ads-large");
  const DeviceSpec whole = device("h200");
  const Plan reference = make_plan(m, whole, 1, options());
  EXPECT_EQ(reference.global_batch, m.batch_size);
  m.min_global_batch = m.batch_size / 4;
  const Plan p = make_plan(m, whole, 1, options());
  ASSERT_LT(p.global_batch, m.batch_size);
  EXPECT_GE(p.global_batch, m.min_global_batch);
  EXPECT_GT(p.prediction.examples_per_s, reference.prediction.examples_per_s);
  std::string reason;
  for (const auto& c : p.changes)
    if (c.what == "global batch") reason = c.reason;
  EXPECT_NE(reason.find("recipe.min_global_batch allows down to"), std::string::npos) << reason;
  DeviceSpec limited = whole;
  limited.hbm_bytes.value = whole.hbm_bytes.value / 1.6;
  const Plan small = make_plan(m, limited, 1, options());
  EXPECT_LE(small.prediction.examples_per_s, p.prediction.examples_per_s * (1 + 1e-9));
}

// The plan check: a plan this run can execute gives what runs, decision by decision; a decision it
// cannot execute is refused by its field, with the reason and what to do.
TEST(PlanCheck, ExecutesOrRefusesEveryDecisionByName) {
  const ModelSpec m = model("criteo-kaggle-dot");
  const DeviceSpec d = device("h200");
  const Plan p = make_plan(m, d, 1, options());
  ExecutionTarget one;
  one.device = "h200";
  one.host_memory_bytes = 64e9;
  const std::vector<PlanDecision> run = check_plan(p, m, one);
  std::map<std::string, std::string> by;
  for (const PlanDecision& x : run) by[x.what] = x.executed;
  EXPECT_EQ(by.at("global batch"), std::to_string(p.global_batch));
  EXPECT_NE(by.at("tables").find("stored natively (fp16 x26)"), std::string::npos)
      << by.at("tables");
  EXPECT_EQ(by.at("dense math"), dense_math_name(p.dense_math));
  auto refused = [&](const Plan& q, const ExecutionTarget& t) -> std::string {
    try {
      check_plan(q, m, t);
    } catch (const PlanNotExecutable& e) {
      return e.what();
    }
    return "(not refused)";
  };
  // A kernel choice that is not a product of this model's step: refused by its index.
  Plan other = p;
  for (KernelChoice& k : other.kernels)
    if (!k.ranked.empty()) {
      k.problem.k += 8;
      break;
    }
  ASSERT_FALSE(p.gemm_catalog.empty());  // the H200's catalog is checked in
  EXPECT_NE(refused(other, one).find("plan kernels[0]: 'bottom.0 forward' is the product"),
            std::string::npos)
      << refused(other, one);
  const Plan eight = make_plan(m, d, 8, options());
  EXPECT_NE(refused(eight, one).find("plan gpus: the plan is for 8 GPUs and this run has 1"),
            std::string::npos);
  Plan host = p;
  host.tables[2].placement = Placement::host;
  host.tables[2].cache_rows = 1000;
  for (const PlanDecision& x : check_plan(host, m, one)) {
    if (x.what == "tables") {
      EXPECT_NE(x.executed.find("1 in host memory (1000 of their rows cached in HBM), the rest in "
                                "HBM"),
                std::string::npos)
          << x.executed;
    }
  }
  host.tables[2].cache_rows = m.tables[2].rows + 1;  // a cache larger than the table
  EXPECT_THROW(check_plan(host, m, one), InputError);
  Plan mixed = p;
  mixed.tables[0].optimizer = OptimizerKind::adagrad;
  EXPECT_NE(refused(mixed, one).find("tables[0] ('c1').optimizer"), std::string::npos);
  Plan needy = p;
  needy.prediction.host_memory_bytes = 100e9;
  EXPECT_NE(refused(needy, one).find("needs 100.0 GB of host memory and this machine has 64.0 GB"),
            std::string::npos);
  ExecutionTarget cpu = one;
  cpu.gpu_backend = false;
  for (const PlanDecision& x : check_plan(p, m, cpu)) {
    if (x.what == "dense math") {
      EXPECT_EQ(x.executed.rfind("fp32 (the plan says", 0), 0u);
    }
  }
  EXPECT_THROW(check_plan(p, model("tiny"), one), InputError);  // another model's plan
}

// The plan names its model file by an absolute path, so that it works from any directory.
TEST(PlanFile, RecordsTheModelFileAbsolutely) {
  const fs::path here = fs::current_path();
  fs::current_path(kConfigs);
  const Plan p = make_plan(load_model_spec("models/tiny.yaml"), device("h200"), 1, options());
  fs::current_path(here);
  EXPECT_TRUE(fs::path(p.model_file).is_absolute()) << p.model_file;
  EXPECT_TRUE(fs::equivalent(p.model_file, kConfigs / "models/tiny.yaml")) << p.model_file;
}

TEST(PlanFile, BadFilesNameTheField) {
  const Plan p = make_plan(model("tiny"), device("h200"), 1, options());
  std::string json = plan_to_json(p);
  auto message = [](const std::string& text) {
    try {
      plan_from_json(text, "edited.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string s = json;
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_NE(message("{").find("edited.json: not valid JSON"), std::string::npos);
  EXPECT_NE(message(edited("\"dtype\": \"fp16\"", "\"dtype\": \"int8\""))
                .find("field 'tables[0].dtype': expected one of fp32, fp16, bf16, got 'int8'"),
            std::string::npos);
  EXPECT_NE(
      message(edited("\"gpus\": 1", "\"gpus\": \"one\"")).find("field 'gpus': expected an integer"),
      std::string::npos);
  EXPECT_NE(message(edited("\"global_batch\": 512", "\"global_batch\": 513"))
                .find("per_device_batch x gpus"),
            std::string::npos);
  EXPECT_NE(message(edited("\"format\": \"parity-plan-1\",", "")).find("field 'format': missing"),
            std::string::npos);
  // A shard outside the plan's GPUs.
  EXPECT_NE(message(edited("\"device\": 0", "\"device\": 3")).find("tables[0].shards[0].device"),
            std::string::npos);
  // A misspelt field is refused, not ignored; a non-finite prediction is refused.
  EXPECT_NE(message(edited("\"gpus\": 1", "\"gpus\": 1, \"global_bach\": 7"))
                .find("field 'global_bach': unknown field (expected one of format, model"),
            std::string::npos)
      << message(edited("\"gpus\": 1", "\"gpus\": 1, \"global_bach\": 7"));
  EXPECT_NE(message(edited("\"placement\": \"hbm\"", "\"placement\": \"hbm\", \"cache\": 1"))
                .find("field 'tables[0].cache': unknown field"),
            std::string::npos);
  EXPECT_NE(message(edited("\"step_s\": ", "\"step_s\": -1, \"x_s\": "))
                .find("field 'prediction.x_s': unknown field"),
            std::string::npos);
  // A kernel choice of an unknown kind, or with no configuration.
  EXPECT_NE(message(edited("\"epilogue\": \"", "\"epilogue\": \"gelu"))
                .find("field 'kernels[0].kind.epilogue': expected one of none, relu, bias, "
                      "relu_bias"),
            std::string::npos);
  nlohmann::json unranked = nlohmann::json::parse(json);
  unranked["kernels"][0]["ranked"] = nlohmann::json::array();
  EXPECT_NE(message(unranked.dump())
                .find("field 'kernels[0].ranked': expected at least one configuration key"),
            std::string::npos);
  EXPECT_NE(message(edited("\"library_version\": ", "\"library_version\": -"))
                .find("field 'gemm_catalog.library_version': expected an integer in"),
            std::string::npos);
  // Rows outside the table: refused when the plan is applied to the model.
  const Plan rows = plan_from_json(edited("5000\n", "6000\n"), "edited.json");
  try {
    apply_plan(model("tiny"), rows);
    ADD_FAILURE() << "a shard past the table's rows was applied";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("outside the table"), std::string::npos) << e.what();
  }
  // A plan whose shards do not cover the table is rejected when evaluated.
  Plan q = plan_from_json(edited("5000\n", "4000\n"), "edited.json");
  EXPECT_THROW(evaluate_plan(q, model("tiny"), device("h200"), default_calibration(device("h200"))),
               InputError);
}

// The plan's kernel choices: every matrix product of the step as the GPU backend runs it, in the
// engine's order, ranked by the device's kernel catalog (the same ranking the backend would make),
// its FLOPs those the cost model counts.
TEST(PlanKernels, EveryProductOfTheStepRankedByTheDevicesCatalog) {
  const ModelSpec m = model("mlperf-dlrmv2");
  const DeviceSpec d = device("h200");
  const Plan p = make_plan(m, d, 1, options());
  const auto catalog = gemm_catalog_for(d, kConfigs);
  ASSERT_NE(catalog, nullptr);
  ASSERT_FALSE(p.gemm_catalog.empty());
  EXPECT_EQ(p.gemm_catalog.library_version, catalog->library_version);
  const auto products = dense_products(m, p.per_device_batch, p.dense_math);
  // Forwards: 3 bottom, 2 a cross layer x 3, 5 top; backwards: 5 top and 3 bottom weight
  // gradients, 5 top and 2 bottom data gradients (the first layer's input is the data), 4 a cross
  // layer.
  ASSERT_EQ(products.size(), 3u + 6u + 5u + 10u + 5u + 12u);
  ASSERT_EQ(p.kernels.size(), products.size());
  const double hbm = d.hbm_bandwidth.value * calibration_for(d, kConfigs).hbm_efficiency;
  int ranked = 0;
  for (std::size_t i = 0; i < products.size(); ++i) {
    const KernelChoice& k = p.kernels[i];
    EXPECT_EQ(k.op, products[i].op);
    if (catalog->group_for(products[i].problem) == nullptr) {
      EXPECT_TRUE(k.ranked.empty()) << k.op;
      continue;
    }
    ++ranked;
    ASSERT_FALSE(k.ranked.empty()) << k.op;
    EXPECT_EQ(decision_key(k.problem), decision_key(products[i].problem));
    const auto r = rank_gemm_kernels(k.problem, *catalog, hbm);
    ASSERT_FALSE(r.empty());
    EXPECT_EQ(k.ranked.front(), r.front().kernel.key()) << k.op;
    EXPECT_DOUBLE_EQ(k.predicted_s, r.front().seconds);
    for (const std::string& key : k.ranked) {
      GemmKernel g;
      EXPECT_TRUE(find_catalog_kernel(*catalog, k.problem, key, g)) << key;
      EXPECT_EQ(g.key(), key);
    }
  }
  EXPECT_EQ(ranked, static_cast<int>(products.size()));  // the catalog holds every kind
  // The same products the cost model times (up to the padding of 16-bit copies along k).
  double flops = 0, modelled = 0;
  for (const auto& s : products)
    flops += 2.0 * static_cast<double>(s.problem.m) * s.problem.n * s.problem.k;
  for (const auto& op :
       dense_op_costs(m, p.per_device_batch, p.dense_math, d, calibration_for(d, kConfigs)))
    modelled += op.flops;
  EXPECT_NEAR(flops / modelled, 1.0, 1e-3);
  // The dot interaction's step: its bottom output and top input in fp32 (x0), no cross layers.
  const ModelSpec dot = model("criteo-kaggle-dot");
  const Plan q = make_plan(dot, d, 1, options());
  const auto dot_products = dense_products(dot, q.per_device_batch, q.dense_math);
  ASSERT_EQ(q.kernels.size(), dot_products.size());
  ASSERT_EQ(q.dense_math, DenseMath::bf16);
  const auto find = [&](const std::string& op) {
    const auto it = std::find_if(dot_products.begin(), dot_products.end(),
                                 [&](const StepProduct& s) { return s.op == op; });
    if (it == dot_products.end()) {
      ADD_FAILURE() << op << " is not a product of the step";
      return GemmProblem{};
    }
    return it->problem;
  };
  const std::string last_bottom = fmt::format("bottom.{} forward", dot.bottom_mlp.size() - 1);
  EXPECT_FALSE(find(last_bottom).narrow_output);
  EXPECT_EQ(find(last_bottom).lead_d(), dot.interaction_input_dim());
  EXPECT_EQ(find("top.0 forward").k % 8, 0);  // the fp32 interaction output's 16-bit copy
  EXPECT_FALSE(find("top.0 data gradient").narrow_output);
  EXPECT_TRUE(find("bottom.0 forward").narrow_output);
  // Deterministic: the same choices again.
  const Plan again = make_plan(m, d, 1, options());
  for (std::size_t i = 0; i < p.kernels.size(); ++i)
    EXPECT_EQ(again.kernels[i].ranked, p.kernels[i].ranked);
  // Without a catalog for the device: the roofline model's tiles, no configurations.
  const Plan mi = make_plan(m, device("mi300x"), 1, options());
  EXPECT_TRUE(mi.gemm_catalog.empty());
  ASSERT_FALSE(mi.kernels.empty());
  for (const KernelChoice& k : mi.kernels) {
    EXPECT_TRUE(k.ranked.empty());
    EXPECT_GT(k.tile_m, 0);
  }
}

// Every table's shards tile it exactly: each (row, column) cell belongs to one shard, counted here
// from the shard bounds themselves (not by the evaluator that the planner also calls).
TEST(Planner, ShardsCoverEveryTableOnManyGpus) {
  const ModelSpec m = model("prod-many-features");
  const Plan p = make_plan(m, device("mi355x"), 128, options());
  ASSERT_EQ(p.tables.size(), m.tables.size());
  std::set<int> used;
  for (std::size_t t = 0; t < p.tables.size(); ++t) {
    const auto& tp = p.tables[t];
    const TableSpec& ts = m.tables[t];
    ASSERT_FALSE(tp.shards.empty()) << ts.name;
    double cells = 0;
    for (const auto& s : tp.shards) {
      EXPECT_GE(s.device, 0);
      EXPECT_LT(s.device, 128);
      used.insert(s.device);
      EXPECT_TRUE(0 <= s.row_begin && s.row_begin < s.row_end && s.row_end <= ts.rows) << ts.name;
      EXPECT_TRUE(0 <= s.col_begin && s.col_begin < s.col_end && s.col_end <= ts.dim) << ts.name;
      cells += static_cast<double>(s.row_end - s.row_begin) * (s.col_end - s.col_begin);
    }
    // Replicated tables hold a full copy per shard; the others split the table exactly once.
    const double table_cells = static_cast<double>(ts.rows) * ts.dim;
    if (tp.sharding == Sharding::replicated)
      EXPECT_DOUBLE_EQ(cells, table_cells * static_cast<double>(tp.shards.size())) << ts.name;
    else
      EXPECT_DOUBLE_EQ(cells, table_cells) << ts.name;
  }
  EXPECT_GT(used.size(), 64u);  // 1000 tables spread over most of the 128 GPUs
}

}  // namespace
}  // namespace parity

namespace parity {
namespace {

// The memory model's categories by hand on a small model on one GPU.
TEST(PlanEvaluation, MemoryAndTimeCategoriesByHand) {
  ModelSpec m = model("tiny");
  const DeviceSpec d = device("h200");
  const Calibration c = default_calibration(d);
  Plan p = whole_tables_plan(m, d, DenseMath::fp32, 512);
  double rows = 0, weights = 0;
  for (const auto& t : m.tables) {
    rows += static_cast<double>(t.rows);
    weights += static_cast<double>(t.rows) * t.dim * 4;
  }
  const Prediction pr = evaluate_plan(p, m, d, c);
  EXPECT_DOUBLE_EQ(pr.memory_bytes.at("embedding_weights"), weights);
  EXPECT_DOUBLE_EQ(pr.memory_bytes.at("embedding_optimizer_state"), rows * 4);  // one float per row
  // Dense: parameters, gradients and Adam's two states, in fp32.
  ASSERT_EQ(m.dense_optimizer.kind, OptimizerKind::adam);
  EXPECT_DOUBLE_EQ(pr.memory_bytes.at("dense_parameters_and_state"),
                   static_cast<double>(m.dense_parameters()) * 4 * 4);
  EXPECT_DOUBLE_EQ(pr.memory_bytes.at("reserved"), c.reserved_bytes);
  EXPECT_DOUBLE_EQ(pr.memory_bytes.at("workspace"), c.workspace_bytes);
  // The engine's buffers and the backend's: on one GPU the pooled outputs are x0's columns (no
  // exchange buffers); two input slots of dense features, labels, ids and offsets, with the
  // synthetic generator's two doubles per bag; the embedding workspace for a quarter more ids
  // (keys and bags double-buffered, segment starts: 20 bytes an id, and the heavy rows' chunk
  // sums); fp32 math: the backend's scratch is dz and the cross layers' du, a quarter over.
  EXPECT_EQ(pr.memory_bytes.count("embedding_io"), 0u);
  double ids = 0;
  int widest = 0;
  for (const auto& t : m.tables) {
    ids += 512.0 * t.pooling_size;
    widest = std::max(widest, t.dim);
  }
  const double bags = 512.0 * static_cast<double>(m.tables.size());
  EXPECT_DOUBLE_EQ(
      pr.memory_bytes.at("input_slots"),
      2 * (512.0 * m.dense_features * 4 + 512 * 4 + ids * 8 + (bags + 1) * 8) + 16 * bags);
  // Per id 20 bytes; the heavy rows' chunk sums and merged sums (a padded row of floats and two
  // ints each) and three ints per heavy row.
  const double n = 1.25 * ids, heavy = n / 65, chunks = n / 64 + heavy;
  const double merges = chunks / 64 + heavy;
  EXPECT_NEAR(pr.memory_bytes.at("embedding_workspace"),
              n * 20 + (chunks + merges) * (((widest + 7) / 8 * 8) * 4 + 8) + heavy * 12, 1e-6);
  double dz_cols = m.interaction_input_dim();
  for (int out : m.bottom_mlp) dz_cols = std::max<double>(dz_cols, out);
  for (int out : m.top_mlp) dz_cols = std::max<double>(dz_cols, out);
  EXPECT_NEAR(pr.memory_bytes.at("backend_scratch"),
              1.25 * 512 * (dz_cols * 4 + m.interaction.low_rank * 4), 1e-6);
  double total = 0;
  for (const auto& [k, v] : pr.memory_bytes) total += v;
  EXPECT_DOUBLE_EQ(pr.peak_memory_bytes, total);
  // One GPU: no exchange and no all-reduce; the step is the sum of its categories.
  EXPECT_EQ(pr.time_s.count("embedding_exchange"), 0u);
  double step = 0;
  for (const auto& [k, v] : pr.time_s) step += v;
  EXPECT_DOUBLE_EQ(pr.step_s, step);
  EXPECT_DOUBLE_EQ(pr.examples_per_s, 512 / pr.step_s);
  // Host placement without cache: the weights leave HBM, the host holds them with their state.
  p.tables[0].placement = Placement::host;
  const Prediction ph = evaluate_plan(p, m, d, c);
  const double t0 = static_cast<double>(m.tables[0].rows);
  // One row stays (the engine keeps a row of every host-placed table in its type's buffer);
  // each table row has a cache slot and a lookup count in HBM, and a copy of its slot on the host.
  EXPECT_DOUBLE_EQ(ph.memory_bytes.at("embedding_weights"),
                   weights - (t0 - 1) * m.tables[0].dim * 4);
  EXPECT_DOUBLE_EQ(ph.memory_bytes.at("embedding_cache_maps"), t0 * 8);
  EXPECT_DOUBLE_EQ(ph.host_memory_bytes, t0 * (m.tables[0].dim * 4 + 4 + 4));
  EXPECT_GT(ph.time_s.at("embedding_host_traffic"), 0);
}

}  // namespace
}  // namespace parity

namespace parity {
namespace {

// The dense ops carry the engine's step-profile names, in the order the step runs them.
TEST(DenseOps, NamedAsTheStepProfileInStepOrder) {
  const DeviceSpec d = device("h200");
  const Calibration c = default_calibration(d);
  auto names = [&](const std::string& model_name) {
    std::vector<std::string> out;
    for (const OpCost& op : dense_op_costs(model(model_name), 512, DenseMath::bf16, d, c))
      out.push_back(op.category + ": " + op.op);
    return out;
  };
  const std::vector<std::string> dcn = {"mlp: bottom.0 forward",
                                        "mlp: bottom.1 forward",
                                        "interaction: cross.0 forward",
                                        "interaction: cross.1 forward",
                                        "mlp: top.0 forward",
                                        "mlp: top.1 forward",
                                        "mlp: top.2 forward",
                                        "loss: loss",
                                        "mlp: top.2 backward",
                                        "mlp: top.1 backward",
                                        "mlp: top.0 backward",
                                        "interaction: cross.1 backward",
                                        "interaction: cross.0 backward",
                                        "mlp: bottom.1 backward",
                                        "mlp: bottom.0 backward"};
  EXPECT_EQ(names("tiny"), dcn);
  const std::vector<std::string> dot = {"mlp: bottom.0 forward",
                                        "mlp: bottom.1 forward",
                                        "interaction: dot forward",
                                        "mlp: top.0 forward",
                                        "mlp: top.1 forward",
                                        "mlp: top.2 forward",
                                        "loss: loss",
                                        "mlp: top.2 backward",
                                        "mlp: top.1 backward",
                                        "mlp: top.0 backward",
                                        "interaction: dot backward",
                                        "mlp: bottom.1 backward",
                                        "mlp: bottom.0 backward"};
  EXPECT_EQ(names("tiny-dot"), dot);
}

// One source: a plan's mlp, interaction and loss times are the sums of the op list (forward ops,
// then backward ops), to the bit, on every zoo model; every op has a time, and its products
// their FLOPs and bytes.
TEST(DenseOps, ThePlansDenseTimesAreTheirSums) {
  for (const auto& entry : fs::directory_iterator(kConfigs / "models")) {
    const ModelSpec m = load_model_spec(entry.path());
    if (m.kind != ModelKind::dlrm) continue;  // HSTU models are not planned yet
    for (const char* key : {"h200", "mi355x"}) {
      const DeviceSpec d = device(key);
      const Calibration c = calibration_for(d, kConfigs);
      for (const DenseMath math : {DenseMath::fp32, DenseMath::bf16}) {
        Plan p;
        p.model = m.name;
        p.gpus = 1;
        p.per_device_batch = p.global_batch = m.batch_size;
        p.dense_math = math;
        for (const auto& t : m.tables)
          p.tables.push_back({t.name,
                              t.dtype,
                              OptimizerKind::rowwise_adagrad,
                              Sharding::table,
                              Placement::hbm,
                              0,
                              {{0, 0, t.rows, 0, t.dim}}});
        const Prediction pr = evaluate_plan(p, m, d, c);
        std::map<std::string, double> forward, backward;
        for (const OpCost& op : dense_op_costs(m, p.per_device_batch, math, d, c)) {
          EXPECT_GT(op.seconds, 0) << m.name << " " << op.op;
          EXPECT_GT(op.bytes, 0) << m.name << " " << op.op;
          const bool bwd = op.op.ends_with(" backward");
          (bwd ? backward : forward)[op.category] += op.seconds;
        }
        for (const char* cat : {"mlp", "interaction", "loss"})
          EXPECT_EQ(pr.time_s.at(cat), forward[cat] + backward[cat])
              << m.name << " " << key << " " << cat;
      }
    }
  }
}

}  // namespace
}  // namespace parity

namespace parity {
namespace {

// The co-design search is at least as good as a port: on every zoo model (DLRM and HSTU), GPU
// count and device,
// the device's own plan predicts at least the examples/s of any other device's plan run there
// unchanged (port_plan) that fits, by the same cost model.
TEST(Planner, NoDevicesOwnPlanIsBeatenByAnotherDevicesPlanRunOnIt) {
  const char* devices[] = {"h100", "h200", "b200", "mi300x", "mi350x", "mi355x"};
  int compared = 0;
  for (const auto& entry : fs::directory_iterator(kConfigs / "models")) {
    const ModelSpec m = load_model_spec(entry.path());
    const bool hstu = m.kind == ModelKind::hstu;
    for (const int gpus : {1, 8, 128}) {
      if (hstu && gpus == 128) continue;  // HSTU at 1 and 8: its search is per-device batch
      std::map<std::string, Plan> own;
      for (const char* key : devices) try {
          own.emplace(key, make_plan(m, device(key), gpus, options()));
        } catch (const InfeasibleError&) {
        }
      for (const auto& [target, mine] : own)
        for (const auto& [source, theirs] : own) {
          if (source == target) continue;
          const Plan port = port_plan(theirs, m, device(target), options());
          if (!fits(port.prediction, device(target))) continue;
          ++compared;
          EXPECT_GE(mine.prediction.examples_per_s, port.prediction.examples_per_s * (1 - 1e-9))
              << m.name << " on " << gpus << " x " << target << ": its own plan "
              << mine.prediction.examples_per_s << " examples/s, " << source << "'s plan run there "
              << port.prediction.examples_per_s;
        }
    }
  }
  EXPECT_GT(compared, 500);  // the plans compared, not a loop over nothing
}

}  // namespace
}  // namespace parity
