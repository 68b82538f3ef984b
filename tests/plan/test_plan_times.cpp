// The step's matrix products timed as the plan's kernel choices run them (planned_product_times):
// the catalog's predicted time of each chosen configuration in place of the roofline model's.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "parity/plan.h"
#include "plan_test_util.h"

using namespace parity::plan_test;  // NOLINT: the shipped configs, in every test below

namespace parity {
namespace {

// A plan for a device with a kernel catalog times every product of its batch by its choice; at
// another batch none matches, and a device without a catalog has none to give.
TEST(ProductTimes, TheChoicesOfThePlansBatchTimeItsProducts) {
  const ModelSpec m = model("criteo-kaggle-dot");
  const Plan p = make_plan(m, device("h200"), 1, options());
  ASSERT_FALSE(p.gemm_catalog.empty()) << "configs/calibration/h200-gemm.json";
  const ProductTimes t = planned_product_times(p, m);
  EXPECT_EQ(t.size(), dense_products(m, p.per_device_batch, p.dense_math).size());
  for (const KernelChoice& k : p.kernels) {
    ASSERT_EQ(t.count(k.op), 1u) << k.op;
    EXPECT_DOUBLE_EQ(t.at(k.op), k.predicted_s) << k.op;
  }
  Plan other = p;
  other.per_device_batch = other.global_batch = p.per_device_batch / 2;
  EXPECT_TRUE(planned_product_times(other, m).empty());
  const Plan bare = make_plan(m, device("mi350x"), 1, options());
  EXPECT_TRUE(bare.gemm_catalog.empty());
  EXPECT_TRUE(planned_product_times(bare, m).empty());
}

// A timed product replaces the roofline model's time in its op and nowhere else; the op's work
// and traffic (the floor's) stay the roofline model's; a checked forward product keeps the
// roofline's time (it runs another shape).
TEST(ProductTimes, ATimedProductReplacesItsRooflineTimeInItsOpAlone) {
  const ModelSpec m = model("tiny");
  const DeviceSpec d = device("h200");
  const Calibration c = calibration_for(d, kConfigs);
  const std::int64_t b = 4096;
  const auto plain = dense_op_costs(m, b, DenseMath::bf16, d, c);
  const ProductTimes t = {{"top.0 forward", 1.25e-3}, {"cross.1 weight gradient v", 2.5e-3}};
  const auto timed = dense_op_costs(m, b, DenseMath::bf16, d, c, false, &t);
  ASSERT_EQ(plain.size(), timed.size());
  const GemmEstimate top0 =
      gemm_best({b, m.top_mlp[0], m.interaction_output_dim(), DenseMath::bf16}, d, c);
  const std::int64_t n = m.interaction_input_dim(), r = m.interaction.low_rank;
  const GemmEstimate dv = gemm_best({r, n, b, DenseMath::bf16}, d, c);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const OpCost &x = plain[i], &y = timed[i];
    EXPECT_DOUBLE_EQ(y.flops, x.flops) << x.op;
    EXPECT_DOUBLE_EQ(y.bytes, x.bytes) << x.op;
    if (x.op == "top.0 forward") {
      EXPECT_NEAR(y.seconds - x.seconds, 1.25e-3 - top0.seconds, 1e-15) << x.op;
    } else if (x.op == "cross.1 backward") {
      EXPECT_NEAR(y.seconds - x.seconds, 2.5e-3 - dv.seconds, 1e-15) << x.op;
    } else {
      EXPECT_DOUBLE_EQ(y.seconds, x.seconds) << x.op;
    }
  }
  const auto checked = dense_op_costs(m, b, DenseMath::bf16, d, c, true, &t);
  const auto checked_plain = dense_op_costs(m, b, DenseMath::bf16, d, c, true);
  for (std::size_t i = 0; i < checked.size(); ++i)
    if (checked[i].op == "top.0 forward") {
      EXPECT_DOUBLE_EQ(checked[i].seconds, checked_plain[i].seconds);
    }
}

// The plan's mlp and interaction times are its ops' with the choices' times, as evaluating the
// plan again gives them.
TEST(ProductTimes, ThePlansPredictionTimesItsChoices) {
  const DeviceSpec d = device("h200");
  const Calibration c = calibration_for(d, kConfigs);
  for (const char* name : {"tiny", "criteo-kaggle-dot", "mlperf-dlrmv2-2m"}) {
    const ModelSpec m = model(name);
    const Plan p = make_plan(m, d, 1, options());
    const ProductTimes t = planned_product_times(p, m);
    ASSERT_FALSE(t.empty()) << name;
    std::map<std::string, double> by;
    for (const OpCost& op : dense_op_costs(m, p.per_device_batch, p.dense_math, d, c, false, &t))
      by[op.category] += op.seconds;
    for (const char* cat : {"mlp", "interaction"})
      EXPECT_NEAR(p.prediction.time_s.at(cat), by[cat], 1e-12 * by[cat]) << name << " " << cat;
    EXPECT_DOUBLE_EQ(evaluate_plan(p, m, d, c).step_s, p.prediction.step_s) << name;
    Plan roofline = p;
    roofline.kernels.clear();
    EXPECT_NE(evaluate_plan(roofline, m, d, c).step_s, p.prediction.step_s) << name;
  }
}

}  // namespace
}  // namespace parity
