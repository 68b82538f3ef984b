// Where every parameter of the DLRM lives, computed from the spec alone; what the parameters
// start as; and the names Model::tensors gives them (engine.h lists them).
//
// Layout (the way table-batched kernels want it):
//   dense parameters   one flat buffer: bottom MLP, cross layers, top MLP, in that order
//   dense gradients    one flat buffer with the same layout (one fused optimizer call)
//   embedding weights  one buffer per storage type (fp32, fp16, bf16: TableWeights), table t in
//                      its type's buffer at TableLayout::weight_offset, [rows, dim] row-major,
//                      each table starting 16-byte aligned
//   embedding state    one fp32 buffer, table t at TableLayout::state_offset (per element or per
//                      row)
//   host-placed tables (TableLayout::host) keep only their cache rows in those two buffers; all
//                      their rows live in host memory (host_tables.h)
//   interaction input  x0 [B, D + Σ dims]: the bottom MLP writes columns [0, D), the embedding
//                      forward writes the rest, so the concat costs nothing
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parity/backend.h"
#include "parity/engine.h"
#include "parity/spec.h"

namespace parity::engine {

// A linear layer: its weight [out, in] and bias [out] at offsets into the dense parameters.
struct Linear {
  int in = 0, out = 0;
  std::int64_t w = 0, b = 0;
  Activation act = Activation::relu;
  std::string forward_name, backward_name;  // in the step profile ("top.0 forward")
};

// A DCNv2 low-rank cross layer: v [r, N], w [N, r] and bias [N] at offsets into the dense
// parameters.
struct Cross {
  std::int64_t v = 0, w = 0, b = 0;
  std::string forward_name, backward_name;
};

struct ModelLayout {
  explicit ModelLayout(const ModelSpec& spec);

  std::vector<Linear> bottom, top;
  std::vector<Cross> cross;  // empty with the dot interaction
  std::vector<TableLayout> tables;
  OptimizerParams emb_opt, dense_opt;
  std::int64_t dense_count = 0;       // floats of dense parameters (and of their gradients)
  std::int64_t emb_count = 0;         // embedding weights (parameters, of every storage type)
  std::int64_t emb_elements[3] = {};  // elements of the fp32, fp16 and bf16 weight buffers
  std::int64_t emb_state_count = 0;   // floats of embedding optimizer state (with alignment gaps)

  // The index of a table storage type's buffer in emb_elements (0 fp32, 1 fp16, 2 bf16).
  static int buffer_index(DType t);
  int dense_features = 0;  // F
  int bottom_out = 0;      // D
  int x0_cols = 0;         // D + Σ dims (N of the cross layers)
  int inter_out = 0;       // interaction output width
  int rank = 0;            // low rank of the cross layers

  // Initialises the parameters, deterministically in seed and on the backend: Glorot-uniform
  // weights and zero biases for the MLPs and cross layers; tables uniform in ±1/sqrt(rows),
  // rounded to the table's storage type.
  // Without tables (they live in a sharded model's shards), only the dense parameters.
  void initialise(Backend& backend, float* params, const TableWeights& emb_weights,
                  std::uint64_t seed, bool tables = true) const;
  // Element (row, col) of fp32 table t as initialise() makes it (the backends' fill_uniform at
  // element row * dim + col), for shards that hold no whole table to copy from.
  float initial_table_value(std::size_t t, std::uint64_t seed, std::int64_t row, int col) const;

  // The parameter and optimizer-state tensors in these buffers, named as Model::tensors says.
  std::vector<TensorRef> tensors(const ModelSpec& spec, float* params,
                                 const TableWeights& emb_weights, float* emb_state,
                                 float* dense_state) const;
};

// The optimizer's hyper-parameters as the ops take them, its learning rate times lr_factor (a
// warm-up step's; 1: the spec's own).
OptimizerParams optimizer_params(const OptimizerSpec& s, double lr_factor = 1.0);
// `elements` rounded up so that the next table starts 16-byte aligned (the kernels' vector loads).
inline std::int64_t aligned_elements(std::int64_t elements, std::size_t element_bytes) {
  const auto per = static_cast<std::int64_t>(16 / element_bytes);
  return (elements + per - 1) / per * per;
}

// Where table t's first row is (backend memory; a host-placed table's host-resident rows).
void* table_rows(const TableWeights& weights, const TableLayout& table);
// Where table t's optimizer state starts (the same: a host-placed table's is host-resident).
float* table_state(float* state, const TableLayout& table);

}  // namespace parity::engine
