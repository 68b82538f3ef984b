// The plan check: each decision of a plan is executed by the run or refused by name, before any
// memory is touched (the CUTLASS can_implement idea applied to a whole recipe).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "hstu_plan.h"
#include "parity/plan.h"

namespace parity {
namespace {

[[noreturn]] void refuse(const std::string& field, const std::string& why, const std::string& fix) {
  throw PlanNotExecutable(fmt::format("plan {}: {}; {}", field, why, fix));
}

std::string gb(double bytes) {
  return fmt::format("{:.1f} GB", bytes / 1e9);
}

}  // namespace

std::vector<PlanDecision> check_plan(const Plan& plan, const ModelSpec& model,
                                     const ExecutionTarget& target, std::int64_t batch) {
  if (model.kind != ModelKind::hstu) require_dlrm(model, "the plan check");
  (void)apply_plan(model, plan, batch);  // the tables match the model; shards are well formed
  std::vector<PlanDecision> out;
  if (target.gpus > 1 && plan.gpus != target.gpus)
    refuse("gpus",
           fmt::format("the plan is for {} GPUs and this run has {} ranks", plan.gpus, target.gpus),
           fmt::format("make a plan for {} (parity plan --gpus {})", target.gpus, target.gpus));
  if (plan.gpus > target.gpus)
    refuse("gpus",
           fmt::format("the plan is for {} GPUs and this run has {}", plan.gpus, target.gpus),
           fmt::format("make a plan for {} (parity plan --gpus {})", target.gpus, target.gpus));
  const std::string here = !target.gpu_backend     ? std::string("the cpu backend")
                           : target.device.empty() ? std::string("1 x a GPU not in the catalog")
                                                   : "1 x " + target.device;
  out.push_back({"devices", target.gpu_backend && target.device == plan.device
                                ? here
                                : fmt::format("{} (the plan is for {} x {}: its predictions are "
                                              "that device's)",
                                              here, plan.gpus, plan.device)});
  const std::int64_t b = batch > 0 ? batch : plan.global_batch;
  out.push_back(
      {"global batch", b == plan.global_batch
                           ? fmt::format("{}", b)
                           : fmt::format("{} (--batch; the plan's is {}, learning rates "
                                         "scaled by the recipe's {} rule)",
                                         b, plan.global_batch, lr_scaling_name(model.lr_scaling))});
  const PlanDecision dense_math{
      "dense math", target.gpu_backend
                        ? std::string(dense_math_name(plan.dense_math))
                        : fmt::format("fp32 (the plan says {}; the cpu backend computes every "
                                      "product in fp32 with double accumulation)",
                                      dense_math_name(plan.dense_math))};
  if (plan.product_checks && plan.dense_math == DenseMath::tf32 && target.gpu_backend)
    refuse("product_checks",
           "checksummed products under tf32 dense math: tf32 rounds the operands inside the "
           "library, which a check from the stored operands cannot follow",
           "make the plan with fp32 or bf16 dense math (parity plan --product-checks never picks "
           "tf32)");
  const auto add_dense_math = [&] {
    out.push_back(dense_math);
    if (plan.product_checks)
      out.push_back({"product checks",
                     "every forward product of the dense layers checked row by row against its "
                     "checksum; a failing product is replayed from the newest checkpoint, or stops "
                     "the run without one"});
  };
  const bool sharded = target.gpus > 1;
  if (model.kind == ModelKind::hstu) {
    detail::add_hstu_decisions(plan, out);
    add_dense_math();
    if (!plan.gemm_catalog.empty() && target.gpu_backend && target.plan_kernels)
      out.push_back({"kernels", fmt::format("every matrix product ranked by the kernel catalog {} "
                                            "when it first runs (its token count changes every "
                                            "step)",
                                            plan.gemm_catalog.file)});
    return out;
  }
  std::map<std::string, int> by_dtype;
  int host_tables = 0;
  std::int64_t host_rows = 0;
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    const TablePlan& tp = plan.tables[t];
    const std::string field = fmt::format("tables[{}] ('{}')", t, tp.name);
    if (tp.optimizer != plan.embedding_optimizer)
      refuse(field + ".optimizer",
             fmt::format("{}, and the plan's embedding optimizer is {}: the engine updates every "
                         "table with one optimizer",
                         optimizer_name(tp.optimizer), optimizer_name(plan.embedding_optimizer)),
             "give every table the plan's embedding_optimizer");
    if (tp.placement == Placement::host) {
      ++host_tables;
      host_rows += tp.cache_rows;
      if (model.tables[t].rows > std::int64_t{0xfffffffe})
        refuse(field + ".placement",
               fmt::format("host placement keeps a 32-bit cache slot per row, and the table has "
                           "{} rows",
                           model.tables[t].rows),
               "place it in HBM, or shard it over more GPUs");
    }
    if (sharded && tp.placement != Placement::hbm)
      refuse(field + ".placement",
             fmt::format("{}; a run over several ranks shards tables in device memory only so far",
                         placement_name(tp.placement)),
             "edit the plan's table placement to hbm (the planner places a table in host memory "
             "where the GPUs' memory does not hold it: plan for more GPUs)");
    if (tp.dtype != DType::f32 && tp.dtype != DType::f16 && tp.dtype != DType::bf16)
      refuse(field + ".dtype",
             fmt::format("{} tables are not implemented (fp32, fp16 and bf16 are)",
                         dtype_name(tp.dtype)),
             "choose fp32, fp16 or bf16");
    ++by_dtype[std::string(dtype_name(tp.dtype))];
  }
  std::string dtypes;
  for (const auto& [name, n] : by_dtype)
    dtypes += fmt::format("{}{} x{}", dtypes.empty() ? "" : ", ", name, n);
  const std::string where =
      host_tables == 0
          ? std::string("all in HBM")
          : fmt::format("{} in host memory ({} of their rows cached in {}), the rest in HBM",
                        host_tables, host_rows, target.gpu_backend ? "HBM" : "the cache buffers");
  std::map<std::string, int> by_sharding;
  for (const TablePlan& tp : plan.tables) ++by_sharding[std::string(sharding_name(tp.sharding))];
  std::string shardings;
  for (const auto& [name, n] : by_sharding)
    shardings += fmt::format("{}{} x{}", shardings.empty() ? "" : ", ", name, n);
  out.push_back({"tables", fmt::format("{} stored natively ({}), {}, {}, updated by {}",
                                       plan.tables.size(), dtypes, where,
                                       sharded ? fmt::format("sharded over {} ranks ({})",
                                                             target.gpus, shardings)
                                               : std::string("on one device"),
                                       optimizer_name(plan.embedding_optimizer))});
  if (sharded)
    out.push_back({"dense layers", fmt::format("data-parallel over {} ranks, gradients summed "
                                               "in buckets while the backward goes on",
                                               target.gpus)});
  add_dense_math();
  // Each ranked choice names a product the step makes at the plan's batch: choices edited or made
  // for another model would match none of the products, which would then be ranked when they
  // first run, not as the plan says.
  if (batch <= 0 || batch == plan.global_batch) {
    std::map<std::string, std::string> step;  // op -> the product's kind and shape
    for (const StepProduct& s : dense_products(model, plan.per_device_batch, plan.dense_math))
      step[s.op] = decision_key(s.problem);
    for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
      const KernelChoice& k = plan.kernels[i];
      if (k.ranked.empty()) continue;
      const auto it = step.find(k.op);
      if (it == step.end() || it->second != decision_key(k.problem))
        refuse(fmt::format("kernels[{}]", i),
               it == step.end()
                   ? fmt::format("'{}' is not a matrix product of {}'s step", k.op, model.name)
                   : fmt::format("'{}' is the product {} at the plan's batch and math, the plan "
                                 "says {}",
                                 k.op, it->second, decision_key(k.problem)),
               "make the plan again for this model (parity plan), or remove its kernel choices");
    }
  }
  if (!plan.kernels.empty()) {
    const bool ranked = !plan.gemm_catalog.empty() &&
                        std::any_of(plan.kernels.begin(), plan.kernels.end(),
                                    [](const KernelChoice& k) { return !k.ranked.empty(); });
    const bool other_batch = batch > 0 && batch != plan.global_batch;
    if (ranked && target.gpu_backend && target.plan_kernels && other_batch)
      out.push_back(
          {"kernels", fmt::format("the plan's {} matrix-product choices are for its batch "
                                  "of {}: each product is ranked by the kernel catalog "
                                  "{} when it first runs",
                                  plan.kernels.size(), plan.global_batch, plan.gemm_catalog.file)});
    else if (ranked && target.gpu_backend && target.plan_kernels)
      out.push_back(
          {"kernels", fmt::format("{} matrix-product choices from the kernel catalog {}: each "
                                  "product runs its first configuration the BLAS library accepts "
                                  "(any passed over said why); a product the plan does not list is "
                                  "ranked by the same catalog when it first runs",
                                  plan.kernels.size(), plan.gemm_catalog.file)});
    else
      out.push_back(
          {"kernels",
           fmt::format("{} matrix-product choices are the plan's predictions; "
                       "the products run the {} own choice{}",
                       plan.kernels.size(), target.gpu_backend ? "BLAS library's" : "CPU backend's",
                       ranked && target.gpu_backend && target.device == plan.device
                           ? " (--gemm-selection plan runs the plan's)"
                           : "")});
  }
  if (target.host_memory_bytes > 0 && plan.prediction.host_memory_bytes > target.host_memory_bytes)
    refuse("prediction.host_memory_bytes",
           fmt::format("the plan needs {} of host memory and this machine has {} available",
                       gb(plan.prediction.host_memory_bytes), gb(target.host_memory_bytes)),
           "free host memory, or plan for a machine with more");
  return out;
}

}  // namespace parity
