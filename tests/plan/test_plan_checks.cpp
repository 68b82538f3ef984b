// Checksummed products in the plan (Plan::product_checks): their passes and scratch predicted,
// tf32 never chosen with them, the plan file and the plan check carrying them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "parity/error.h"
#include "parity/plan.h"
#include "plan_test_util.h"

using namespace parity::plan_test;  // NOLINT: the shipped configs, in every test below

namespace parity {
namespace {

double pad8(double c) {
  return std::ceil(c / 8) * 8;
}

// The forward products of the step's forward ops, as the engine runs them: [rows, cols] of depth
// k, by op name, whether the output is bf16 under bf16 math (all but the logits), and whether the
// input is fp32 (the dense features; the dot interaction's output), read under bf16 math through
// a bf16 copy padded with zeros to a multiple of 8 columns.
// fed: the first top layer after DCNv2 cross layers whose products run in one kernel (both
// depths multiples of 8), whose input's terms the last layer's combine sums (3 doubles a row read
// instead of the input, where the product runs in one kernel too).
struct Forward {
  std::int64_t cols, k;
  bool narrow_out = true;
  bool fp32_in = false;
  bool fed = false;
};
std::vector<std::pair<std::string, Forward>> mlp_forwards(const ModelSpec& m) {
  std::vector<std::pair<std::string, Forward>> out;
  int in = m.dense_features;
  for (std::size_t i = 0; i < m.bottom_mlp.size(); ++i) {
    out.push_back(
        {"bottom." + std::to_string(i) + " forward", {m.bottom_mlp[i], in, true, i == 0}});
    in = m.bottom_mlp[i];
  }
  in = m.interaction_output_dim();
  const bool dot = m.interaction.kind != InteractionKind::dcnv2;
  const bool held = !dot && in % 8 == 0 && m.interaction.low_rank % 8 == 0;
  for (std::size_t i = 0; i < m.top_mlp.size(); ++i) {
    const bool narrow = i + 1 < m.top_mlp.size();
    out.push_back({"top." + std::to_string(i) + " forward",
                   {m.top_mlp[i], in, narrow, i == 0 && dot, i == 0 && held && narrow}});
    in = m.top_mlp[i];
  }
  return out;
}

// Whether a checked bf16 product runs in one kernel on d (the GPU backend's rule): a bf16 output
// and a depth that is a multiple of 8 (an fp32 input's padded copy's), on a device that has the
// kernel.
bool one_kernel(const DeviceSpec& d, const Forward& f) {
  return fused_checked_products(d) && f.narrow_out && (f.fp32_in || f.k % 8 == 0);
}
// The bytes a checked bf16 product's row sums take an example, in one kernel: a double pair a
// column tile of 128 and the two checksum columns in fp32.
double row_sums_bytes(double cols) {
  return 16 * std::ceil(cols / 128) + 8;
}

// Each forward op costs what its checked products add, by hand: under fp32 the product is the
// same, and the weights' column sums (w read) and the rows pass (input read, output read and
// written) come on top; under bf16, in one kernel (an H200), the product moves the same bytes
// and the weights' copy with its checksum rows, the row sums written and read back and the rows
// pass's read of the input come on top; through the library (an MI300X, or a depth the kernel
// does not take) the product runs over two more columns into fp32 and the rows pass reads the
// input, those fp32 columns and stores the output, so at least that much more. Every other op is
// untouched.
TEST(ProductChecksPlan, EachForwardOpCostsItsChecksByHand) {
  for (const char* dev : {"h200", "mi300x"}) {
    const DeviceSpec d = device(dev);
    const Calibration c = calibration_for(d, kConfigs);
    for (const char* name : {"tiny", "tiny-dot", "mlperf-dlrmv2-2m", "criteo-kaggle-dot"}) {
      const ModelSpec m = model(name);
      const std::int64_t b = 4096;
      for (const DenseMath math : {DenseMath::fp32, DenseMath::bf16}) {
        const auto plain = dense_op_costs(m, b, math, d, c);
        const auto checked = dense_op_costs(m, b, math, d, c, true);
        ASSERT_EQ(plain.size(), checked.size());
        std::map<std::string, Forward> forwards;
        for (const auto& [op, f] : mlp_forwards(m)) forwards[op] = f;
        const double in = math == DenseMath::bf16 ? 2.0 : 4.0;
        for (std::size_t i = 0; i < plain.size(); ++i) {
          const OpCost &p = plain[i], &q = checked[i];
          const std::string what =
              std::string(dev) + " " + name + " " + std::string(dense_math_name(math)) + " " + p.op;
          ASSERT_EQ(p.op, q.op) << what;
          const auto f = forwards.find(p.op);
          const bool cross = p.op.starts_with("cross.") && p.op.ends_with(" forward");
          if (f == forwards.end() && !cross) {
            EXPECT_DOUBLE_EQ(q.seconds, p.seconds) << what;
            EXPECT_DOUBLE_EQ(q.bytes, p.bytes) << what;
            continue;
          }
          EXPECT_GT(q.seconds, p.seconds) << what;
          if (cross) continue;  // two products: covered by the seconds above
          const double mm = static_cast<double>(f->second.cols),
                       k = static_cast<double>(f->second.k);
          if (math == DenseMath::fp32) {
            EXPECT_NEAR(q.bytes - p.bytes, 4 * mm * k + b * (4 * k + 8 * mm), 1e-6 * q.bytes)
                << what;
          } else if (one_kernel(d, f->second) && f->second.fp32_in) {
            // Over the padded copy's depth: more bytes and products than the unchecked one, and
            // at least the checks' parts.
            const double added =
                4 * mm * k + 2 * pad8(mm + 2) * pad8(k) + b * (in * k + 2 * row_sums_bytes(mm));
            EXPECT_GE(q.bytes - p.bytes, added * (1 - 1e-9)) << what;
            EXPECT_GE(q.flops, p.flops) << what;
          } else if (one_kernel(d, f->second)) {
            const double input = f->second.fed ? 24 : in * k;
            const double added =
                4 * mm * k + 2 * pad8(mm + 2) * pad8(k) + b * (input + 2 * row_sums_bytes(mm));
            EXPECT_NEAR(q.bytes - p.bytes, added, 1e-6 * q.bytes) << what;
            EXPECT_DOUBLE_EQ(q.flops, p.flops) << what;  // no more columns
          } else {
            // The weights' copy with its checksum rows and the rows pass; the product itself moves
            // no fewer bytes over more columns in fp32.
            const double at_least =
                4 * mm * k + 2 * pad8(mm + 2) * pad8(k) + b * (in * k + 4 * (mm + 2) + 2 * mm);
            EXPECT_GE(q.bytes - p.bytes, at_least * (1 - 1e-9)) << what;
            EXPECT_GT(q.flops, p.flops) << what;  // two more columns
          }
        }
      }
    }
  }
}

// The row pass runs at product_check_efficiency of the copy rate: halving it adds, to each
// checked MLP layer, the time of its row pass's bytes once more at that rate, and nothing else.
TEST(ProductChecksPlan, TheRowPassRunsAtItsCalibratedRate) {
  const DeviceSpec d = device("h200");
  const Calibration c = calibration_for(d, kConfigs);
  ASSERT_GT(c.product_check_efficiency, 0.0);
  Calibration half = c;
  half.product_check_efficiency = c.product_check_efficiency / 2;
  const ModelSpec m = model("mlperf-dlrmv2-2m");
  const std::int64_t b = 4096;
  std::map<std::string, Forward> forwards;
  for (const auto& [op, f] : mlp_forwards(m)) forwards[op] = f;
  const auto at = dense_op_costs(m, b, DenseMath::bf16, d, c, true);
  const auto slower = dense_op_costs(m, b, DenseMath::bf16, d, half, true);
  ASSERT_EQ(at.size(), slower.size());
  const double rate = d.hbm_bandwidth.value * c.hbm_efficiency * c.product_check_efficiency;
  for (std::size_t i = 0; i < at.size(); ++i) {
    EXPECT_DOUBLE_EQ(slower[i].bytes, at[i].bytes) << at[i].op;
    const auto f = forwards.find(at[i].op);
    const bool cross = at[i].op.starts_with("cross.") && at[i].op.ends_with(" forward");
    if (f == forwards.end()) {
      if (cross)
        EXPECT_GT(slower[i].seconds, at[i].seconds) << at[i].op;
      else
        EXPECT_DOUBLE_EQ(slower[i].seconds, at[i].seconds) << at[i].op;
      continue;
    }
    const double mm = static_cast<double>(f->second.cols), k = static_cast<double>(f->second.k);
    const double stored = f->second.narrow_out ? 2 : 4;  // the logits in fp32
    const double input = f->second.fed ? 24 : 2 * k;
    const double pass =
        static_cast<double>(b) * (one_kernel(d, f->second) ? input + row_sums_bytes(mm)
                                                           : 2 * k + 4 * (mm + 2) + stored * mm);
    EXPECT_NEAR(slower[i].seconds - at[i].seconds, pass / rate, 1e-9 * at[i].seconds) << at[i].op;
  }
}

// The checks' scratch by hand: under fp32 the column sums of the deepest forward product (4k + 1025
// doubles); under bf16 also a bf16 output's bias (the widest) and, for the whole batch, the largest
// of the products' fp32 outputs over two more columns (padded to 8) or, in one kernel, their row
// sums; each slot a quarter over its request. On an H200 (one kernel where it applies) and on an
// MI300X (the library everywhere).
TEST(ProductChecksPlan, TheirScratchIsCountedByHand) {
  for (const char* dev : {"h200", "mi300x"}) {
    const DeviceSpec d = device(dev);
    const Calibration c = calibration_for(d, kConfigs);
    const ModelSpec m = model("tiny");
    ASSERT_EQ(m.interaction.kind, InteractionKind::dcnv2);
    const std::int64_t b = 512;
    const auto n = static_cast<std::int64_t>(m.interaction_input_dim());
    std::vector<Forward> products = {{m.interaction.low_rank, n}, {n, m.interaction.low_rank}};
    for (const auto& [op, f] : mlp_forwards(m)) products.push_back(f);
    double deepest = 0, widest = 0, largest = 0;
    for (const Forward& f : products) {
      const auto cols = static_cast<double>(f.cols);
      deepest = std::max<double>(deepest, static_cast<double>(f.k));
      widest = std::max(widest, cols);
      largest = std::max(largest, one_kernel(d, f) ? row_sums_bytes(cols) : 4 * pad8(cols + 2));
    }
    for (const DenseMath math : {DenseMath::fp32, DenseMath::bf16}) {
      Plan p = whole_tables_plan(m, d, math, b);
      const Prediction without = evaluate_plan(p, m, d, c);
      p.product_checks = true;
      const Prediction with = evaluate_plan(p, m, d, c);
      const double added =
          with.memory_bytes.at("backend_scratch") - without.memory_bytes.at("backend_scratch");
      double expected = (4 * deepest + 1025) * 8;
      if (math == DenseMath::bf16) expected += 4 * widest + b * largest;
      // In one kernel a cross layer's u is held for its combine, in slots of its own: its row
      // sums, its input's terms (3 doubles a row) and its weights' sums.
      const std::int64_t r = m.interaction.low_rank;
      if (math == DenseMath::bf16 && fused_checked_products(d) && n % 8 == 0 && r % 8 == 0) {
        expected += b * (row_sums_bytes(static_cast<double>(r)) + 24) + (4.0 * n + 1025) * 8;
        // The first top layer's input terms and weights' sums, for the last combine.
        if (m.top_mlp.size() > 1) expected += b * 24 + (4.0 * n + 1025) * 8;
      }
      // The weights' copy with its checksum rows shares the bf16 weight slot: at most that more.
      EXPECT_GE(added, 1.25 * expected * (1 - 1e-12)) << dense_math_name(math);
      if (math == DenseMath::fp32) {
        EXPECT_DOUBLE_EQ(added, 1.25 * expected);
      }
      EXPECT_GT(with.step_s, without.step_s) << dense_math_name(math);
      EXPECT_LT(with.examples_per_s, without.examples_per_s) << dense_math_name(math);
      for (const auto& [name, bytes] : without.memory_bytes) {
        if (name != "backend_scratch") {
          EXPECT_DOUBLE_EQ(with.memory_bytes.at(name), bytes) << name;
        }
      }
    }
  }
}

// The planner plans for the checks where asked: the plan says so, its prediction counts them (the
// same as evaluating the plan again), and it never takes tf32, whose rounding of the operands
// inside the library the checks cannot follow; HSTU models too.
TEST(ProductChecksPlan, ThePlannerCountsThemAndNeverTakesTf32) {
  const DeviceSpec d = device("h200");
  const Calibration c = calibration_for(d, kConfigs);
  ModelSpec m = model("tiny");
  m.allowed_dense_math = {DenseMath::fp32, DenseMath::tf32};
  EXPECT_EQ(make_plan(m, d, 1, options(false)).dense_math, DenseMath::tf32);
  const Plan checked = make_plan(m, d, 1, options(true));
  EXPECT_TRUE(checked.product_checks);
  EXPECT_EQ(checked.dense_math, DenseMath::fp32);
  EXPECT_DOUBLE_EQ(evaluate_plan(checked, m, d, c).step_s, checked.prediction.step_s);

  for (const char* name : {"mlperf-dlrmv2-2m", "hstu-feed-1k"}) {
    const ModelSpec z = model(name);
    const Plan without = make_plan(z, d, 1, options(false));
    const Plan with = make_plan(z, d, 1, options(true));
    EXPECT_FALSE(without.product_checks) << name;
    EXPECT_TRUE(with.product_checks) << name;
    EXPECT_NE(with.dense_math, DenseMath::tf32) << name;
    EXPECT_GT(with.prediction.step_s / with.global_batch,
              without.prediction.step_s / without.global_batch)
        << name;
    EXPECT_GT(with.prediction.memory_bytes.at("backend_scratch"),
              without.prediction.memory_bytes.at("backend_scratch"))
        << name;
    EXPECT_DOUBLE_EQ(evaluate_plan(with, z, d, c).step_s, with.prediction.step_s) << name;
  }
  ModelSpec h = model("hstu-feed-1k");
  h.allowed_dense_math = {DenseMath::fp32, DenseMath::tf32};
  EXPECT_EQ(make_plan(h, d, 1, options(true)).dense_math, DenseMath::fp32);
}

// HSTU: the projections, the output products and the head's forward product are checked; the
// other ops are untouched.
TEST(ProductChecksPlan, HstuForwardProductsAreCosted) {
  const DeviceSpec d = device("h200");
  const Calibration c = calibration_for(d, kConfigs);
  const ModelSpec m = model("hstu-feed-1k");
  for (const DenseMath math : {DenseMath::fp32, DenseMath::bf16}) {
    const auto plain = hstu_op_costs(m, 512, math, false, d, c);
    const auto checked = hstu_op_costs(m, 512, math, false, d, c, true);
    ASSERT_EQ(plain.size(), checked.size());
    int heavier = 0;
    for (std::size_t i = 0; i < plain.size(); ++i) {
      ASSERT_EQ(plain[i].op, checked[i].op);
      const bool forward_product = plain[i].op.ends_with("projection forward") ||
                                   plain[i].op.ends_with("output forward") ||
                                   (plain[i].op == "head" && i > 0 && plain[i - 1].op != "head");
      if (forward_product) {
        EXPECT_GT(checked[i].seconds, plain[i].seconds) << plain[i].op;
        ++heavier;
      } else {
        EXPECT_DOUBLE_EQ(checked[i].seconds, plain[i].seconds) << plain[i].op;
      }
    }
    EXPECT_EQ(heavier, 2 * m.hstu->layers + 1);
  }
}

// The plan file carries the checks (absent in an older plan: off), and a wrong value is named.
TEST(ProductChecksPlan, ThePlanFileCarriesThem) {
  const DeviceSpec d = device("h200");
  const ModelSpec m = model("tiny");
  const Plan p = make_plan(m, d, 1, options(true));
  const std::string json = plan_to_json(p);
  ASSERT_NE(json.find("\"product_checks\": true"), std::string::npos);
  const Plan q = plan_from_json(json, "plan.json");
  EXPECT_TRUE(q.product_checks);
  EXPECT_EQ(plan_to_json(q), json);
  const std::string plain = plan_to_json(make_plan(m, d, 1, options(false)));
  EXPECT_EQ(plain.find("product_checks"), std::string::npos);
  EXPECT_FALSE(plan_from_json(plain, "plan.json").product_checks);
  std::string bad = json;
  bad.replace(bad.find("\"product_checks\": true"), 22, "\"product_checks\": 1");
  try {
    plan_from_json(bad, "plan.json");
    ADD_FAILURE() << "a number for product_checks was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("product_checks"), std::string::npos) << e.what();
  }
}

// The plan check lists the checks among the decisions executed, and refuses them by name under
// tf32 on a GPU (an edited plan); the cpu backend computes in fp32 and runs them.
TEST(ProductChecksPlan, ThePlanCheckExecutesOrRefusesThem) {
  const DeviceSpec d = device("h200");
  const ModelSpec m = model("tiny");
  Plan p = make_plan(m, d, 1, options(true));
  ExecutionTarget gpu;
  gpu.device = "h200";
  const auto has_checks = [](const std::vector<PlanDecision>& ds) {
    return std::any_of(ds.begin(), ds.end(),
                       [](const PlanDecision& x) { return x.what == "product checks"; });
  };
  EXPECT_TRUE(has_checks(check_plan(p, m, gpu)));
  p.product_checks = false;
  EXPECT_FALSE(has_checks(check_plan(p, m, gpu)));
  p.product_checks = true;
  p.dense_math = DenseMath::tf32;
  p.kernels.clear();  // chosen for bf16
  try {
    check_plan(p, m, gpu);
    ADD_FAILURE() << "tf32 with product checks was executed";
  } catch (const PlanNotExecutable& e) {
    EXPECT_NE(std::string(e.what()).find("plan product_checks: "), std::string::npos) << e.what();
  }
  ExecutionTarget cpu;
  cpu.gpu_backend = false;
  EXPECT_TRUE(has_checks(check_plan(p, m, cpu)));
}

}  // namespace
}  // namespace parity
