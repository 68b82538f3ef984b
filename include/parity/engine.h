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
#include <map>
#include <string>
#include <string_view>
#include <utility>
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

  // Forward, backward and update on one batch (stage, then train_staged). Does not synchronise
  // the host beyond waiting for the copy of an earlier batch from the same staging slot.
  void train_step(const Batch& batch);

  // The input pipeline: stage(batch) copies a batch into pinned host memory and starts its copy
  // to the device on the backend's copy queue; train_staged() enqueues forward, backward and
  // update on the oldest staged batch. Staging batch k+1 right after enqueuing step k hides both
  // copies behind step k. At most kInputSlots batches may be staged at once.
  static constexpr int kInputSlots = 2;
  void stage(const Batch& batch);
  void train_staged();
  // Makes the first step allocate and plan nothing: rehearses forward, backward and update on the
  // oldest staged batch's shapes (Backend::rehearse: scratch, workspaces and library plans made,
  // nothing enqueued, no value changed) and allocates every input slot's pinned staging memory.
  // Call it once, after staging the first batch; it neither trains nor takes the batch.
  void prepare();
  int staged() const { return static_cast<int>(staged_count_); }
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

  // Profiling: with it on, every step records a device timing mark between op categories
  // (input_wait, mlp, embedding_forward, interaction, loss, embedding_backward,
  // dense_optimizer); profile_ms() gives the milliseconds per category summed over the
  // profiled steps. The marks of step k are read after step k+1 is enqueued, so the host does
  // not drain the device; the last step is read by finish_profile() (synchronises).
  void set_profiling(bool on);
  void finish_profile();
  const std::map<std::string, double>& profile_ms() const { return profile_ms_; }
  // The same per op ("category: op", e.g. "interaction: cross.0 backward").
  const std::map<std::string, double>& profile_ops_ms() const { return profile_ops_ms_; }
  std::int64_t profiled_steps() const { return profiled_steps_; }

  std::int64_t dense_parameter_count() const { return dense_count_; }
  std::int64_t embedding_parameter_count() const { return emb_count_; }
  // Bytes of backend memory held by the model (parameters, state, activations).
  std::size_t allocated_bytes() const;

 private:
  struct Linear {
    int in = 0, out = 0;
    std::int64_t w = 0, b = 0;  // offsets into the dense parameter buffer
    Activation act = Activation::relu;
    std::string forward_name, backward_name;  // in the step profile ("top.0 forward")
  };
  struct Cross {
    std::int64_t v = 0, w = 0, b = 0;
    std::string forward_name, backward_name;
  };

  // One input slot: device buffers of a batch and the pinned host memory it is staged in.
  struct InputSlot {
    Buffer dense, labels, ids, offsets;  // device: [B, F], [B], [ids_capacity], [T*B + 1]
    void* pinned = nullptr;              // host staging: dense | labels | offsets | ids
    std::size_t pinned_bytes = 0;
    std::int64_t ids_capacity = 0;
    bool has_labels = false;
    SparseInput sparse;                  // device pointers into this slot
  };
  void check_batch(const Batch& batch) const;
  // The slot's pinned staging memory exists and holds at least `bytes`; when (re)allocated, it
  // is sized for a full batch of max(ids_capacity, nids) ids.
  void ensure_pinned(InputSlot& slot, std::size_t bytes, std::int64_t nids);
  // The oldest staged slot, taken off the queue.
  int take_staged();
  // A staged slot in use by the step being enqueued: the compute queue waits for its copies, and
  // release_input is recorded once the step's work that reads it is enqueued (also when it throws).
  class SlotInUse;
  void forward(std::int64_t n);
  void backward(std::int64_t n);
  Buffer floats(std::int64_t n) { return Buffer(backend_, static_cast<std::size_t>(n) * 4); }
  // An activation buffer of [max_batch, cols] in storage type t.
  Buffer activations(std::int64_t cols, DType t) {
    return Buffer(backend_, static_cast<std::size_t>(max_batch_ * cols) * dtype_size(t));
  }
  // The first n rows of an activation buffer of `cols` columns stored as t.
  static AMat rows_of(const Buffer& b, DType t, std::int64_t n, std::int64_t cols) { return AMat(b.get(), t, n, cols); }
  // The output of top layer i for n examples (the last one, the logits, in fp32).
  AMat top_activation(std::size_t i, std::int64_t n) const {
    return rows_of(top_act_[i], i + 1 == top_.size() ? DType::f32 : act_, n, top_[i].out);
  }
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
  // Inputs: kInputSlots staging slots used round robin; the step reads the current one.
  InputSlot slots_[kInputSlots];
  std::int64_t staged_total_ = 0;   // batches ever staged (slot = staged_total_ % kInputSlots)
  std::int64_t staged_count_ = 0;   // staged, not yet trained
  const InputSlot* in_ = nullptr;   // the slot the step being enqueued reads
  // Profiling (see set_profiling).
  void section(const char* category, std::string_view op = {});  // free unless profiling
  void end_profiled_step();
  void read_profile(int parity);
  bool profiling_ = false;
  bool rehearsing_ = false;  // inside prepare(): no timing marks
  int mark_parity_ = 0;               // marks of alternate steps use separate event sets
  std::vector<std::pair<std::string, std::string>> marks_[2];  // (category, op) at each mark
  bool pending_[2] = {false, false};
  std::map<std::string, double> profile_ms_, profile_ops_ms_;
  std::int64_t profiled_steps_ = 0;
  // Activations and their gradients. Activations are stored in act_ (Backend::activation_dtype:
  // bf16 under bf16 math on a GPU), except the logits and, for the dot interaction, x0 and the
  // interaction output (its kernels read fp32). Gradients are fp32, except (with DCNv2) the
  // gradient of the interaction output, those between cross layers and dx0 (the gradient of the
  // interaction input, read by the embedding backward and the bottom MLP), stored like the
  // activations: each layer's sum is formed in fp32 or double and rounded once (on the GPU,
  // layer 0's dx0 once per part).
  DType act_ = DType::f32;     // MLP outputs; with DCNv2 also x0, u, z and the cross outputs
  DType x0_dtype_ = DType::f32;
  DType grad_dtype_ = DType::f32;  // d_inter_, dcross_, dx0_: act_ with DCNv2 (fp32 for the dot kernels)
  std::vector<Buffer> bottom_act_, top_act_;  // outputs of each layer (bottom last: in x0; top last: logits, fp32)
  Buffer x0_, dx0_;
  std::vector<Buffer> cross_x_, cross_u_, cross_z_;  // x_1..x_L, u_l, z_l
  Buffer inter_out_buf_;                             // dot: interaction output [B, inter_out]
  Buffer d_inter_;                                   // grad of the top MLP input [B, inter_out]
  Buffer dcross_;                                    // dcnv2: second gradient buffer [B, N]
  Buffer dscratch_a_, dscratch_b_;                   // MLP backward ping-pong
  Buffer loss_, probs_;
};

}  // namespace parity
