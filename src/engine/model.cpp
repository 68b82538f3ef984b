// The DLRM training step as a composition of whole-batch backend ops.
//
// Forward:  dense -> bottom MLP -> x0[:, :D];  ids -> embedding bags -> x0[:, D:]
//           x0 -> interaction (dot, or DCNv2 cross layers) -> top MLP -> logit -> BCE
// Backward: the same in reverse; the embedding backward is fused with the table
//           optimizer, the dense gradients land in one flat buffer and one optimizer
//           call updates every dense parameter.
//
// Model composes four pieces: the parameter layout (layout.h), the buffers of this file (the
// parameters and the activations) with the forward and backward over them, the input pipeline
// (input_stager.h) and the step profile (step_profiler.h).
#include "parity/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "dist/dense_buckets.h"
#include "dist/sharded_embedding.h"
#include "engine/host_tables.h"
#include "engine/input_stager.h"
#include "engine/layout.h"
#include "engine/step_profiler.h"
#include "parity/checkpoint.h"
#include "parity/error.h"

namespace parity {
namespace {

using engine::InputSlot;
using engine::Linear;
using engine::ModelLayout;

Buffer floats(Backend& backend, std::int64_t n) {
  return Buffer(backend, static_cast<std::size_t>(n) * 4);
}

// The parameters, their gradients and the optimizer state (layout.h says where each lives).
struct Parameters {
  // Without tables where a sharded model's shards hold them.
  Parameters(Backend& backend, const ModelLayout& layout, bool with_tables) {
    dense = floats(backend, layout.dense_count);
    grads = floats(backend, layout.dense_count);
    const int per_element = optimizer_state_per_element(layout.dense_opt.kind);
    if (per_element > 0) {
      dense_state = floats(backend, per_element * layout.dense_count);
      backend.fill(dense_state.as<float>(), per_element * layout.dense_count,
                   initial_optimizer_state(layout.dense_opt));
    }
    for (const DType t : {DType::f32, DType::f16, DType::bf16}) {
      const int i = ModelLayout::buffer_index(t);
      if (layout.emb_elements[i] > 0 && with_tables)
        emb_weights[i] =
            Buffer(backend, static_cast<std::size_t>(layout.emb_elements[i]) * dtype_size(t));
    }
    if (layout.emb_state_count > 0 && with_tables) {
      emb_state = floats(backend, layout.emb_state_count);
      backend.fill(emb_state.as<float>(), layout.emb_state_count,
                   initial_optimizer_state(layout.emb_opt));
    }
  }
  TableWeights tables() const {
    return TableWeights{emb_weights[0].get(), emb_weights[1].get(), emb_weights[2].get()};
  }
  Buffer dense, grads, dense_state;  // [dense_count] each; the state [k, dense_count]
  Buffer emb_weights[3];             // by storage type (ModelLayout::buffer_index)
  Buffer emb_state;
};

// Activations and their gradients, for max_batch rows. Activations are stored in act_dtype
// (Backend::activation_dtype: bf16 under bf16 math on a GPU), except the logits and, for the dot
// interaction, x0 and the interaction output (its kernels read fp32). Gradients are fp32, except
// (with DCNv2) the gradient of the interaction output, those between cross layers and dx0 (the
// gradient of the interaction input, read by the embedding backward and the bottom MLP), stored
// like the activations: each layer's sum is formed in fp32 or double and rounded once (on the
// GPU, layer 0's dx0 once per part).
struct Activations {
  Activations(Backend& backend, const ModelLayout& layout, std::int64_t max_batch) {
    const std::int64_t B = max_batch;
    auto rows = [&](std::int64_t cols, DType t) {  // [max_batch, cols] stored as t
      return Buffer(backend, static_cast<std::size_t>(B * cols) * dtype_size(t));
    };
    const bool dcn = !layout.cross.empty();
    act_dtype = backend.activation_dtype();
    x0_dtype = dcn ? act_dtype : DType::f32;
    grad_dtype = x0_dtype;  // the gradient of the interaction output and between cross layers
    int widest = std::max(layout.dense_features, layout.inter_out);
    for (const Linear& l : layout.bottom) {
      bottom.push_back(rows(l.out, act_dtype));
      widest = std::max(widest, l.out);
    }
    for (std::size_t i = 0; i < layout.top.size(); ++i) {
      top.push_back(rows(layout.top[i].out, i + 1 == layout.top.size() ? DType::f32 : act_dtype));
      widest = std::max(widest, layout.top[i].out);
    }
    x0 = rows(layout.x0_cols, x0_dtype);
    dx0 = rows(layout.x0_cols, grad_dtype);
    for (std::size_t l = 0; l < layout.cross.size(); ++l) {
      cross_x.push_back(rows(layout.x0_cols, act_dtype));
      cross_u.push_back(rows(layout.rank, act_dtype));
      cross_z.push_back(rows(layout.x0_cols, act_dtype));
    }
    if (dcn) {
      dcross = rows(layout.x0_cols, act_dtype);
    } else {
      inter_out = floats(backend, B * layout.inter_out);
    }
    d_inter = rows(layout.inter_out, dcn ? act_dtype : DType::f32);
    scratch_a = floats(backend, B * widest);
    scratch_b = floats(backend, B * widest);
    loss = floats(backend, 1);
    probs = floats(backend, B);
  }

  std::size_t bytes() const {
    std::size_t total = 0;
    for (const Buffer* b :
         {&x0, &dx0, &inter_out, &d_inter, &dcross, &scratch_a, &scratch_b, &loss, &probs})
      total += b->bytes();
    for (const auto* v : {&bottom, &top, &cross_x, &cross_u, &cross_z})
      for (const auto& b : *v) total += b.bytes();
    return total;
  }

  DType act_dtype = DType::f32;  // MLP outputs; with DCNv2 also x0, u, z and the cross outputs
  DType x0_dtype = DType::f32;
  DType grad_dtype = DType::f32;    // d_inter, dcross, dx0: act_dtype with DCNv2, else fp32
  std::vector<Buffer> bottom, top;  // each layer's output (bottom last: in x0; top last: logits)
  Buffer x0, dx0;
  std::vector<Buffer> cross_x, cross_u, cross_z;  // x_1..x_L, u_l, z_l
  Buffer inter_out;                               // dot: interaction output [B, inter_out]
  Buffer d_inter;                                 // grad of the top MLP input [B, inter_out]
  Buffer dcross;                                  // dcnv2: second gradient buffer [B, N]
  Buffer scratch_a, scratch_b;                    // MLP backward ping-pong, fp32
  Buffer loss, probs;
};

// The first n rows of an activation buffer of `cols` columns stored as t.
AMat rows_of(const Buffer& b, DType t, std::int64_t n, std::int64_t cols) {
  return AMat(b.get(), t, n, cols);
}

}  // namespace

std::int64_t TensorRef::elements() const {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

struct Model::Impl {
  // The members are made in this order: the backend allocates the parameters, then the input
  // slots, then the activations, and initialises the parameters last.
  Impl(const ModelSpec& s, Backend& b, std::int64_t max_batch, std::uint64_t rng_seed,
       bool with_tables)
      : spec(s),
        backend(b),
        layout(spec),
        host(backend, spec, layout),
        params(backend, layout, with_tables),
        input(backend, spec, max_batch),
        acts(backend, layout, max_batch),
        guard(backend, sizeof(std::int64_t)),
        profiler(backend),
        seed(rng_seed) {
    layout.initialise(backend, param(0), params.tables(), rng_seed, with_tables);
    if (with_tables) host.load(layout.tables, params.tables(), params.emb_state.as<float>());
    clear_guard();
  }
  ~Impl() {
    dense_buckets.reset();        // its tasks read the gradients: drained before anything is freed
    backend.release_constants();  // the activations are about to be freed
  }

  // counting: host-placed tables' lookups are counted (training steps; not evaluation).
  void forward(const InputSlot& in, std::int64_t n, bool counting = true);
  void backward(const InputSlot& in, std::int64_t n);

  // Set by Model::shard: this rank's table shards and the ranks' communicator.
  std::unique_ptr<ShardedEmbedding> sharded;
  Communicator* comm = nullptr;
  // The dense gradients' all-reduce in buckets while the backward goes on (set by shard()).
  std::unique_ptr<DenseGradientBuckets> dense_buckets;
  float* param(std::int64_t off) const { return params.dense.as<float>() + off; }
  float* grad(std::int64_t off) const { return params.grads.as<float>() + off; }
  void clear_guard() {
    const std::int64_t none = -1;
    backend.copy_to_device(guard.get(), &none, sizeof none);
  }
  // The output of top layer i for n examples (the last one, the logits, in fp32).
  AMat top_activation(std::size_t i, std::int64_t n) const {
    const bool logits = i + 1 == layout.top.size();
    return rows_of(acts.top[i], logits ? DType::f32 : acts.act_dtype, n, layout.top[i].out);
  }

  ModelSpec spec;
  Backend& backend;
  std::int64_t step = 0;
  ModelLayout layout;
  engine::HostTables host;           // host-placed tables (binds layout.tables[t].host)
  std::int64_t host_start_step = 0;  // the caches' refreshes are counted from this step
  Parameters params;
  engine::InputStager input;
  Activations acts;
  // The first step whose loss or dense gradients were not finite, or -1 (one int64; written by
  // Backend::flag_nonfinite on the device).
  Buffer guard;
  engine::StepProfiler profiler;
  int made_pending = -1;  // the input slot of the last profiled step, its batch's span unread
  void read_made() {
    if (made_pending < 0) return;
    const double ms = backend.input_made_ms(std::exchange(made_pending, -1));
    if (ms >= 0) profiler.beside("synthetic_input", ms);
  }
  // Evaluation's batches go into the same slots: the pending span is read before its slot is
  // staged again.
  void before_staging() {
    if (made_pending >= 0 && made_pending == input.next()) read_made();
  }
  std::uint64_t seed;  // of the initialisation, and of the tables' stochastic rounding
};

static_assert(Model::kInputSlots == engine::InputStager::kSlots);

void Model::Impl::forward(const InputSlot& in, std::int64_t n, bool counting) {
  const ModelLayout& L = layout;
  // Activations are written once per step, here, then only read until the next step: each is
  // held constant once written (the GPU backend then converts it to bf16 once per step).
  backend.release_constants();
  auto hold = [&](AMat m) {
    backend.hold_constant(m.data, static_cast<std::size_t>(m.rows * m.ld) * m.element_bytes());
  };
  const AMat x0 = rows_of(acts.x0, acts.x0_dtype, n, L.x0_cols);
  // Bottom MLP; its last layer writes straight into x0[:, :D].
  CAMat x = CMat(in.dense.as<float>(), n, L.dense_features);
  for (std::size_t i = 0; i < L.bottom.size(); ++i) {
    const Linear& l = L.bottom[i];
    profiler.section("mlp", l.forward_name);
    const bool last = i + 1 == L.bottom.size();
    const AMat y =
        last ? x0.cols_slice(0, L.bottom_out) : rows_of(acts.bottom[i], acts.act_dtype, n, l.out);
    backend.linear_forward(x, CMat(param(l.w), l.out, l.in), param(l.b), l.act, y);
    if (!last) hold(y);
    x = y;
  }
  // Embedding bags into x0[:, D:].
  profiler.section("embedding_forward");
  if (!host.empty() && counting) host.observe(L.tables, in.sparse);
  if (sharded) {
    if (in.host_sparse.offsets == nullptr)
      throw Error(
          "Model: a sharded model routes its batch's ids on the host, and this batch was made on "
          "the device (stage batches from host memory)");
    sharded->forward(in.host_sparse, x0.cols_slice(L.bottom_out, L.x0_cols - L.bottom_out));
  } else
    backend.embedding_forward(L.tables, params.tables(), in.sparse,
                              x0.cols_slice(L.bottom_out, L.x0_cols - L.bottom_out));
  hold(x0);
  // Interaction.
  CAMat top_in;
  if (L.cross.empty()) {
    profiler.section("interaction", "dot forward");
    const Mat out(acts.inter_out.as<float>(), n, L.inter_out);
    const Mat x0f = x0.f32();  // x0 is fp32 with the dot interaction
    backend.dot_interaction_forward(x0f.cols_slice(0, L.bottom_out),
                                    x0f.cols_slice(L.bottom_out, L.x0_cols - L.bottom_out),
                                    spec.num_tables(), out);
    hold(out);
    top_in = out;
  } else {
    const std::int64_t N = L.x0_cols;
    CAMat xl = x0;
    for (std::size_t l = 0; l < L.cross.size(); ++l) {
      const engine::Cross& c = L.cross[l];
      profiler.section("interaction", c.forward_name);
      const AMat next = rows_of(acts.cross_x[l], acts.act_dtype, n, N);
      const AMat u = rows_of(acts.cross_u[l], acts.act_dtype, n, L.rank);
      // The last layer's output feeds the first top layer (not the logits' own product).
      if (l + 1 == L.cross.size() && L.top.size() > 1)
        backend.cross_feeds_product(CMat(param(L.top[0].w), L.top[0].out, L.top[0].in));
      backend.cross_forward(x0, xl, CMat(param(c.v), L.rank, N), CMat(param(c.w), N, L.rank),
                            param(c.b), u, rows_of(acts.cross_z[l], acts.act_dtype, n, N), next);
      hold(next);
      hold(u);  // z is read by elementwise kernels only: nothing to hold
      xl = next;
    }
    top_in = xl;
  }
  // Top MLP; the last layer gives the logits [n, 1].
  x = top_in;
  for (std::size_t i = 0; i < L.top.size(); ++i) {
    const Linear& l = L.top[i];
    profiler.section("mlp", l.forward_name);
    const AMat y = top_activation(i, n);
    backend.linear_forward(x, CMat(param(l.w), l.out, l.in), param(l.b), l.act, y);
    hold(y);
    x = y;
  }
}

void Model::Impl::backward(const InputSlot& in, std::int64_t n) {
  const ModelLayout& L = layout;
  float* a = acts.scratch_a.as<float>();
  float* b = acts.scratch_b.as<float>();
  // Loss gradient into scratch a: dlogits [n, 1].
  profiler.section("loss");
  backend.bce_with_logits(acts.top.back().as<float>(), in.labels.as<float>(), n, a,
                          acts.loss.as<float>());
  if (comm != nullptr && comm->size() > 1) {
    // This rank's mean-loss gradient scaled by its share of the global batch: the ranks' summed
    // gradients are then the whole batch's mean-loss gradient.
    double global = static_cast<double>(in.global_examples);
    if (global <= 0) {
      global = static_cast<double>(n);
      comm->all_reduce_sum(std::span<double>(&global, 1));
    }
    backend.scale_rows(nullptr, static_cast<float>(static_cast<double>(n) / global), Mat(a, n, 1));
  }
  // Top MLP backward; the first layer's dx is the gradient of the interaction output.
  const CAMat top_in = L.cross.empty()
                           ? CAMat(CMat(acts.inter_out.as<float>(), n, L.inter_out))
                           : CAMat(rows_of(acts.cross_x.back(), acts.act_dtype, n, L.x0_cols));
  // The dense gradients are final layer by layer, from the last parameters to the first (top,
  // cross, bottom): each bucket goes to the all-reduce once the backward has made it.
  if (dense_buckets) dense_buckets->begin();
  auto final_from = [&](std::int64_t from) {
    if (dense_buckets) dense_buckets->final_from(from);
  };
  for (std::size_t k = L.top.size(); k-- > 0;) {
    const Linear& l = L.top[k];
    profiler.section("mlp", l.backward_name);
    const CAMat x = k == 0 ? top_in : CAMat(top_activation(k - 1, n));
    const AMat dx =
        k == 0 ? rows_of(acts.d_inter, acts.grad_dtype, n, l.in) : AMat(Mat(b, n, l.in));
    backend.linear_backward(x, CMat(param(l.w), l.out, l.in), top_activation(k, n),
                            CMat(a, n, l.out), l.act, dx, Mat(grad(l.w), l.out, l.in), grad(l.b));
    final_from(l.w);
    std::swap(a, b);
  }
  // Interaction backward into dx0 [n, D + Σ dims].
  const AMat x0 = rows_of(acts.x0, acts.x0_dtype, n, L.x0_cols);
  const AMat dx0 = rows_of(acts.dx0, acts.grad_dtype, n, L.x0_cols);
  const int D = L.bottom_out;
  const int E = L.x0_cols - D;
  if (L.cross.empty()) {
    profiler.section("interaction", "dot backward");
    const Mat x0f = x0.f32(), dx0f = dx0.f32();  // fp32 with the dot interaction
    backend.dot_interaction_backward(x0f.cols_slice(0, D), x0f.cols_slice(D, E), spec.num_tables(),
                                     CMat(acts.d_inter.as<float>(), n, L.inter_out),
                                     dx0f.cols_slice(0, D), dx0f.cols_slice(D, E));
  } else {
    // The last layer starts dx0 and layer 0 (whose xl is x0) adds its dxl into it: no zeroing
    // and no final sum (Backend::CrossBackwardMode).
    const std::int64_t N = L.x0_cols;
    const int r = L.rank;
    // The gradients between cross layers (g in, h out, swapped per layer) in the activations' type.
    AMat g = rows_of(acts.d_inter, acts.grad_dtype, n, N);
    AMat h = rows_of(acts.dcross, acts.grad_dtype, n, N);
    for (std::size_t l = L.cross.size(); l-- > 0;) {
      const engine::Cross& c = L.cross[l];
      profiler.section("interaction", c.backward_name);
      Backend::CrossBackwardMode mode;
      mode.first_into_dx0 = l + 1 == L.cross.size();
      mode.xl_is_x0 = l == 0;
      const CAMat xl =
          l == 0 ? CAMat(x0) : CAMat(rows_of(acts.cross_x[l - 1], acts.act_dtype, n, N));
      backend.cross_backward(x0, xl, CMat(param(c.v), r, N), CMat(param(c.w), N, r),
                             rows_of(acts.cross_u[l], acts.act_dtype, n, r),
                             rows_of(acts.cross_z[l], acts.act_dtype, n, N), g, dx0,
                             mode.xl_is_x0 ? AMat() : h, Mat(grad(c.v), r, N), Mat(grad(c.w), N, r),
                             grad(c.b), Mat(),
                             mode);  // du stays the backend's working space
      final_from(c.v);
      std::swap(g, h);
    }
  }
  // Embedding backward fused with the table optimizer.
  profiler.section("embedding_backward");
  const StochasticRounding rounding{seed, static_cast<std::uint64_t>(step + 1)};
  // This step's learning rates: the recipe's warm-up after a larger batch (ModelSpec::lr_factor).
  const double lr_factor = spec.lr_factor(step);
  if (sharded && dense_buckets->overlapped() && !dense_buckets->beside_other_collectives()) {
    // NCCL: the buckets in flight finish before the exchange's collectives start.
    profiler.section("dense_allreduce_exposed");
    dense_buckets->wait();
    profiler.section("embedding_backward");
  }
  if (sharded)
    sharded->backward_update(dx0.cols_slice(D, E),
                             engine::optimizer_params(spec.embedding_optimizer, lr_factor),
                             rounding);
  else
    backend.embedding_backward_update(
        L.tables, params.tables(), params.emb_state.as<float>(), in.sparse, dx0.cols_slice(D, E),
        engine::optimizer_params(spec.embedding_optimizer, lr_factor), rounding);
  // Bottom MLP backward from dx0[:, :D] (then fp32 gradients in the scratch pair).
  CAMat dy = dx0.cols_slice(0, D);
  for (std::size_t k = L.bottom.size(); k-- > 0;) {
    const Linear& l = L.bottom[k];
    profiler.section("mlp", l.backward_name);
    const CAMat x = k == 0 ? CAMat(CMat(in.dense.as<float>(), n, l.in))
                           : CAMat(rows_of(acts.bottom[k - 1], acts.act_dtype, n, l.in));
    const CAMat y = k + 1 == L.bottom.size()
                        ? CAMat(x0.cols_slice(0, D))
                        : CAMat(rows_of(acts.bottom[k], acts.act_dtype, n, l.out));
    float* out = dy.data == a ? b : a;
    const Mat dx = k == 0 ? Mat() : Mat(out, n, l.in);
    backend.linear_backward(x, CMat(param(l.w), l.out, l.in), y, dy, l.act, dx,
                            Mat(grad(l.w), l.out, l.in), grad(l.b));
    final_from(l.w);
    dy = dx;
  }
  // One optimizer step over every dense parameter; then the guard looks at the step's loss and
  // the updated dense parameters. A NaN or an infinity upstream reaches the loss, or a gradient and
  // so a parameter; a parameter that overflows or holds a NaN stays so even where a ReLU masks it
  // from the loss (the GPU's max(x, 0) turns NaN into 0).
  if (comm != nullptr) {  // data-parallel dense layers: every rank's gradients summed
    // What the backward did not hide: the buckets still in flight (or, without a worker, the
    // whole all-reduce).
    profiler.section("dense_allreduce_exposed");
    dense_buckets->finish();
    dense_buckets->wait();
  }
  profiler.section("dense_optimizer");
  backend.dense_optimizer_step(params.dense.as<float>(), params.grads.as<float>(),
                               params.dense_state.as<float>(), L.dense_count,
                               engine::optimizer_params(spec.dense_optimizer, lr_factor), step + 1);
  backend.flag_nonfinite(acts.loss.as<float>(), 1, step + 1, guard.as<std::int64_t>());
  backend.flag_nonfinite(params.dense.as<float>(), L.dense_count, step + 1,
                         guard.as<std::int64_t>());
}

// ---- the public interface ----

Model::Model(const ModelSpec& spec, Backend& backend, std::int64_t max_batch, std::uint64_t seed,
             const Plan* shard_plan, Communicator* comm, std::size_t dense_bucket_bytes) {
  require_dlrm(spec, "the engine");
  if (max_batch <= 0)
    throw Error(fmt::format("Model: max_batch must be positive, got {}", max_batch));
  if ((shard_plan == nullptr) != (comm == nullptr))
    throw Error("Model: a sharded model needs both its plan and its communicator");
  impl_ = std::make_unique<Impl>(
      spec, backend, max_batch, seed,
      shard_plan == nullptr || ShardedEmbedding::every_table_whole(*shard_plan, *comm));
  if (shard_plan != nullptr) shard(*shard_plan, *comm, dense_bucket_bytes);
}

Model::~Model() = default;

void Model::train_step(const Batch& batch) {
  if (batch.labels.size() != static_cast<std::size_t>(batch.size))
    throw Error("Model::train_step: batch has no labels");
  if (impl_->input.staged() > 0)
    throw Error(
        "Model::train_step: a batch is staged; train it (train_staged) first, or stage this one "
        "too");
  stage(batch);
  train_staged();
}

void Model::stage(const Batch& batch, std::int64_t global_examples) {
  impl_->before_staging();
  impl_->input.stage(batch, global_examples);
}

void Model::stage_synthetic(const SyntheticData& data, Split split, std::int64_t first,
                            std::int64_t count) {
  impl_->before_staging();
  impl_->input.stage_synthetic(data, split, first, count);
}

void Model::train_staged() {
  Impl& m = *impl_;
  if (m.input.staged() == 0) throw Error("Model::train_staged: no batch is staged");
  const int index = m.input.take();
  if (!m.input.slot(index).has_labels)
    throw Error("Model::train_staged: the staged batch has no labels");
  m.profiler.section("input_wait");
  engine::InputStager::InUse use(m.input, index);
  const std::int64_t n = use.slot().sparse.batch;
  m.forward(use.slot(), n);
  m.backward(use.slot(), n);
  use.release();
  ++m.step;
  m.profiler.end_step();
  // The span of making a step's batch on the device (it ran while the step before did): not a
  // section of the step, but the device's time all the same. Read one step late, as the marks
  // are, so that the host does not wait for the device (or before its slot is staged again).
  m.read_made();
  if (m.profiler.recording()) m.made_pending = index;
  m.host.trained_step();
  if (!m.host.empty() && engine::HostTables::refresh_due(m.step - m.host_start_step)) {
    const engine::StepProfiler::Pause no_marks(m.profiler);
    m.host.refresh(m.layout.tables, m.params.tables(), m.params.emb_state.as<float>());
  }
}

void Model::prepare() {
  Impl& m = *impl_;
  if (m.input.staged() == 0)
    throw Error("Model::prepare: no batch is staged (its shapes are what is rehearsed)");
  m.input.allocate_pinned();
  const InputSlot& in = m.input.slot(m.input.oldest());  // the next to train
  const engine::StepProfiler::Pause no_marks(m.profiler);
  const std::int64_t n = in.sparse.batch;
  m.backend.rehearse([&] {
    m.forward(in, n);
    m.backward(in, n);
  });
}

int Model::staged() const {
  return impl_->input.staged();
}

float Model::last_loss() {
  float v = 0.0f;
  impl_->backend.copy_to_host(&v, impl_->acts.loss.get(), sizeof v);
  return v;
}

std::int64_t Model::first_nonfinite_step() {
  std::int64_t v = -1;
  impl_->backend.copy_to_host(&v, impl_->guard.get(), sizeof v);
  return v;
}

void Model::predict(const Batch& batch, float* probs) {
  Impl& m = *impl_;
  if (m.input.staged() > 0)
    throw Error("Model::predict: a training batch is staged; train it (train_staged) first");
  m.before_staging();
  m.input.stage(batch);
  const engine::StepProfiler::Pause no_marks(m.profiler);  // evaluation is not part of the profile
  engine::InputStager::InUse use(m.input, m.input.take());
  m.forward(use.slot(), batch.size, /*counting=*/false);
  m.backend.sigmoid(m.acts.top.back().as<float>(), m.acts.probs.as<float>(), batch.size);
  use.release();
  m.backend.copy_to_host(probs, m.acts.probs.get(), static_cast<std::size_t>(batch.size) * 4);
}

std::int64_t Model::step() const {
  return impl_->step;
}
void Model::set_step(std::int64_t s) {
  impl_->step = s;
  impl_->host_start_step = s;  // the caches' refresh schedule starts again (their counts did)
}
const ModelSpec& Model::spec() const {
  return impl_->spec;
}
Backend& Model::backend() {
  return impl_->backend;
}

std::vector<TensorRef> Model::tensors() {
  Impl& m = *impl_;
  if (m.sharded)
    throw Error(
        "Model::tensors: the tables of a sharded model live in its shards; checkpoints of a "
        "sharded model go through Model::checkpoint_layout");
  m.host.write_back(m.layout.tables, m.params.tables(), m.params.emb_state.as<float>());
  return m.layout.tensors(m.spec, m.param(0), m.params.tables(), m.params.emb_state.as<float>(),
                          m.params.dense_state.as<float>());
}

void Model::shard(const Plan& plan, Communicator& comm, std::size_t dense_bucket_bytes) {
  Impl& m = *impl_;
  auto refuse = [](const std::string& why) {
    throw Error("Model::shard: " + why + "; train on one process (no --plan for several GPUs)");
  };
  if (m.step > 0 || m.comm != nullptr) refuse("call it once, before the first step");
  if (plan.gpus != comm.size())
    throw InputError(
        fmt::format("the plan is for {} GPUs and this run has {} ranks", plan.gpus, comm.size()));
  if (!ShardedEmbedding::every_table_whole(plan, comm)) {
    if (!m.host.empty()) refuse("host-placed tables are not sharded yet");
    for (std::size_t t = 0; t < plan.tables.size() && t < m.spec.tables.size(); ++t)
      if (plan.tables[t].dtype != m.spec.tables[t].dtype)
        refuse(
            fmt::format("plan table '{}' is {} and the model's is {} (build the model from "
                        "apply_plan(model, plan))",
                        plan.tables[t].name, dtype_name(plan.tables[t].dtype),
                        dtype_name(m.spec.tables[t].dtype)));
    auto sh = std::make_unique<ShardedEmbedding>(m.spec, plan, comm, m.backend);
    // The shards start from the values this model's tables start from, computed for their own
    // rows and columns: no rank needs memory for the whole tables.
    sh->fill(
        [&m](int t, std::int64_t r, int c) {
          return m.layout.initial_table_value(static_cast<std::size_t>(t), m.seed, r, c);
        },
        initial_optimizer_state(m.layout.emb_opt));
    for (Buffer& b : m.params.emb_weights) b = Buffer();
    m.params.emb_state = Buffer();
    sh->set_marker([&m](const char* category) { m.profiler.section(category); });
    m.sharded = std::move(sh);
  }
  m.comm = &comm;
  // Every rank builds them here, at the same point (a duplicate communicator is asked for).
  m.dense_buckets = std::make_unique<DenseGradientBuckets>(
      comm, m.backend, m.params.grads.as<float>(), m.layout.dense_count, dense_bucket_bytes);
}

CheckpointLayout Model::checkpoint_layout() {
  Impl& m = *impl_;
  if (!m.sharded) return whole_tensor_layout(tensors());
  CheckpointLayout out;
  for (const TensorRef& t :
       m.layout.tensors(m.spec, m.param(0), m.params.tables(), m.params.emb_state.as<float>(),
                        m.params.dense_state.as<float>()))
    out.tensors.push_back({t.name, t.dtype, t.shape});
  // Dense tensors are the same on every rank: rank 0 writes them, every rank loads them.
  CheckpointLayout dense = whole_tensor_layout(dense_tensors());
  for (CheckpointPiece& p : dense.pieces) {
    p.write = m.comm->rank() == 0;
    out.pieces.push_back(std::move(p));
  }
  for (CheckpointPiece& p : m.sharded->checkpoint_pieces()) out.pieces.push_back(std::move(p));
  return out;
}

const ShardedEmbedding* Model::sharded_embedding() const {
  return impl_->sharded.get();
}

bool Model::dense_allreduce_overlapped() const {
  return impl_->dense_buckets && impl_->dense_buckets->overlapped();
}

std::vector<TensorRef> Model::dense_tensors() {
  Impl& m = *impl_;
  std::vector<TensorRef> all =
      m.layout.tensors(m.spec, m.param(0), m.params.tables(), m.params.emb_state.as<float>(),
                       m.params.dense_state.as<float>());
  std::erase_if(all, [](const TensorRef& t) {
    return t.name.rfind("embedding.", 0) == 0 || t.name.rfind("optimizer.embedding.", 0) == 0;
  });
  return all;
}

void Model::tensors_written() {
  Impl& m = *impl_;
  m.host.load(m.layout.tables, m.params.tables(), m.params.emb_state.as<float>());
}

std::vector<Model::CacheStats> Model::cache_stats() {
  Impl& m = *impl_;
  std::vector<CacheStats> out;
  for (const auto& s : m.host.stats())
    out.push_back({m.spec.tables[static_cast<std::size_t>(s.table)].name, s.rows, s.cache_rows,
                   s.hits, s.lookups});
  return out;
}

int Model::cache_refreshes() const {
  return impl_->host.refreshes();
}
double Model::cache_refresh_seconds() const {
  return impl_->host.refresh_seconds();
}

std::size_t Model::host_resident_bytes() const {
  return impl_->host.host_bytes();
}

void Model::set_profiling(bool on) {
  if (!on) impl_->read_made();
  impl_->profiler.set_enabled(on);
}
void Model::finish_profile() {
  impl_->read_made();
  impl_->profiler.finish();
}
const std::map<std::string, double>& Model::profile_ms() const {
  return impl_->profiler.category_ms();
}
const std::map<std::string, double>& Model::profile_ops_ms() const {
  return impl_->profiler.op_ms();
}
const std::map<std::string, double>& Model::profile_host_ops_ms() const {
  return impl_->profiler.host_op_ms();
}
std::int64_t Model::profiled_steps() const {
  return impl_->profiler.steps();
}
const std::map<std::string, double>& Model::profile_beside_ms() const {
  return impl_->profiler.beside_ms();
}

std::int64_t Model::dense_parameter_count() const {
  return impl_->layout.dense_count;
}
std::int64_t Model::embedding_parameter_count() const {
  return impl_->layout.emb_count;
}

std::size_t Model::allocated_bytes() const {
  std::size_t total = 0;
  for (const auto& [name, bytes] : allocated_bytes_by_category()) total += bytes;
  return total;
}

std::map<std::string, std::size_t> Model::allocated_bytes_by_category() const {
  const Impl& m = *impl_;
  const auto sum = [](std::initializer_list<const Buffer*> buffers) {
    std::size_t total = 0;
    for (const Buffer* b : buffers) total += b->bytes();
    return total;
  };
  std::map<std::string, std::size_t> by{
      {"embedding_weights",
       sum({&m.params.emb_weights[0], &m.params.emb_weights[1], &m.params.emb_weights[2]})},
      {"embedding_optimizer_state", sum({&m.params.emb_state})},
      {"dense_parameters_and_state",
       sum({&m.params.dense, &m.params.grads, &m.params.dense_state})},
      {"activations", m.acts.bytes()},
      {"input_slots", m.input.allocated_bytes()}};
  if (!m.host.empty()) by["embedding_cache_maps"] = m.host.device_bytes();
  if (m.sharded) {  // this rank's shards, in the backend's memory
    by["embedding_weights"] += m.sharded->weight_bytes();
    by["embedding_optimizer_state"] += m.sharded->state_bytes();
    by["embedding_exchange"] = m.sharded->exchange_bytes();
  }
  return by;
}

}  // namespace parity
