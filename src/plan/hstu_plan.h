// The planner's HSTU half (hstu_plan.cpp): the step of an HSTU model as ops, its memory, the plan
// evaluation and the search. make_plan, evaluate_plan, port_plan, apply_plan and check_plan hand
// HSTU models here.
#pragma once

#include <vector>

#include "parity/plan.h"

namespace parity::detail {

// Every table of an HSTU model in plan order: the sequence features, then the contextual tables.
std::vector<const TableSpec*> hstu_tables(const ModelSpec& m);
// Dense parameters of an HSTU model, as the engine lays them out (src/engine/hstu_model.cpp).
double hstu_dense_parameters(const ModelSpec& m);

Prediction evaluate_hstu_plan(const Plan& plan, const ModelSpec& m, const DeviceSpec& dev,
                              const Calibration& cal);
Plan make_hstu_plan(const ModelSpec& m, const DeviceSpec& dev, int gpus,
                    const PlannerOptions& options);
ModelSpec apply_hstu_plan(const ModelSpec& model, const Plan& plan, std::int64_t batch);
// The HSTU decisions of a plan the plan check has matched to its model (tokens, recompute,
// tables), appended to `out`.
void add_hstu_decisions(const Plan& plan, std::vector<PlanDecision>& out);

}  // namespace parity::detail
