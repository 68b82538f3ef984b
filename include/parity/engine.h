// The backend-neutral DLRM: parameters, activations and the training step,
// composed from the whole-batch ops of a Backend. All buffers are allocated once,
// at construction, for the largest batch; the step allocates nothing.
//
// Layout (the way table-batched kernels want it):
//   dense parameters   one flat buffer: bottom MLP, cross layers, top MLP, in that order
//   dense gradients    one flat buffer with the same layout (one fused optimizer call)
//   embedding weights  one buffer, table t at TableLayout::weight_offset, [rows, dim] row-major
//   interaction input  x0 [B, D + Σ dims]: the bottom MLP writes columns [0, D), the embedding
//                      forward writes the rest, so the concat costs nothing
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parity/backend.h"
#include "parity/data.h"
#include "parity/dtype.h"
#include "parity/spec.h"

namespace parity {

// A named parameter or optimizer-state tensor in backend memory (for checkpoints).
struct TensorRef {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  void* data = nullptr;  // backend memory

  std::int64_t elements() const;
  std::size_t bytes() const { return static_cast<std::size_t>(elements()) * dtype_size(dtype); }
};

class Model {
 public:
  // Builds the model for batches of up to max_batch examples and initialises the
  // parameters from seed (deterministically, on the backend).
  Model(const ModelSpec& spec, Backend& backend, std::int64_t max_batch, std::uint64_t seed);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Forward, backward and update on one batch. Does not synchronise the host.
  void train_step(const Batch& batch);
  // Mean loss of the last train_step (synchronises).
  float last_loss();
  // Forward only; probs gets sigmoid(logit) per example (host memory, batch.size floats).
  void predict(const Batch& batch, float* probs);

  std::int64_t step() const { return step_; }
  void set_step(std::int64_t s) { step_ = s; }
  const ModelSpec& spec() const { return spec_; }
  Backend& backend() { return backend_; }

  // Every parameter and optimizer-state tensor, with stable names:
  //   bottom_mlp.{i}.weight [out, in], bottom_mlp.{i}.bias [out], cross.{l}.v [r, N],
  //   cross.{l}.w [N, r], cross.{l}.bias [N], top_mlp.{i}.weight, top_mlp.{i}.bias,
  //   embedding.{table}.weight [rows, dim], optimizer.embedding.{table}.state [rows] or
  //   [rows, dim], optimizer.dense.state [k, n_dense] (k = 1 adagrad, 2 adam: m then v).
  std::vector<TensorRef> tensors();

  std::int64_t dense_parameter_count() const { return dense_count_; }
  std::int64_t embedding_parameter_count() const { return emb_count_; }
  // Bytes of backend memory held by the model (parameters, state, activations).
  std::size_t allocated_bytes() const;

 private:
  struct Linear {
    int in = 0, out = 0;
    std::int64_t w = 0, b = 0;  // offsets into the dense parameter buffer
    Activation act = Activation::relu;
  };
  struct Cross {
    std::int64_t v = 0, w = 0, b = 0;
  };

  void upload(const Batch& batch);
  void forward(std::int64_t n);
  void backward(std::int64_t n);
  Buffer floats(std::int64_t n) { return Buffer(backend_, static_cast<std::size_t>(n) * 4); }
  float* param(std::int64_t off) const { return params_.as<float>() + off; }
  float* grad(std::int64_t off) const { return grads_.as<float>() + off; }

  ModelSpec spec_;
  Backend& backend_;
  std::int64_t max_batch_;
  std::int64_t step_ = 0;
  std::int64_t dense_count_ = 0;
  std::int64_t emb_count_ = 0;
  int bottom_out_ = 0;   // D
  int x0_cols_ = 0;      // D + Σ dims
  int inter_out_ = 0;    // interaction output width
  int rank_ = 0;

  std::vector<Linear> bottom_, top_;
  std::vector<Cross> cross_;
  std::vector<TableLayout> tables_;
  OptimizerParams emb_opt_, dense_opt_;

  Buffer params_, grads_, dense_state_;
  Buffer emb_weights_, emb_state_;
  // Inputs of the current batch.
  Buffer in_dense_, in_labels_, in_ids_, in_offsets_;
  std::int64_t ids_capacity_ = 0;
  SparseInput sparse_;
  // Activations and their gradients.
  std::vector<Buffer> bottom_act_, top_act_;  // outputs of each layer (bottom last: in x0)
  Buffer x0_, dx0_;
  std::vector<Buffer> cross_x_, cross_u_, cross_z_;  // x_1..x_L, u_l, z_l
  Buffer inter_out_buf_;                             // dot: interaction output [B, inter_out]
  Buffer d_inter_;                                   // grad of the top MLP input [B, inter_out]
  Buffer dcross_;                                    // dcnv2: second gradient buffer [B, N]
  Buffer dscratch_a_, dscratch_b_, du_scratch_;      // MLP backward ping-pong, cross du
  Buffer loss_, probs_;
};

}  // namespace parity
