// The DLRM training step as a composition of whole-batch backend ops.
//
// Forward:  dense -> bottom MLP -> x0[:, :D];  ids -> embedding bags -> x0[:, D:]
//           x0 -> interaction (dot, or DCNv2 cross layers) -> top MLP -> logit -> BCE
// Backward: the same in reverse; the embedding backward is fused with the table
//           optimizer, the dense gradients land in one flat buffer and one optimizer
//           call updates every dense parameter.
#include "parity/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "parity/error.h"

namespace parity {
namespace {

OptimizerParams to_params(const OptimizerSpec& s) {
  OptimizerParams p;
  p.kind = s.kind;
  p.lr = static_cast<float>(s.lr);
  p.eps = static_cast<float>(s.eps);
  p.beta1 = static_cast<float>(s.beta1);
  p.beta2 = static_cast<float>(s.beta2);
  p.weight_decay = static_cast<float>(s.weight_decay);
  return p;
}

// Streams of the parameter initialiser, one per tensor kind, so that adding a layer
// does not change the initial values of the others.
enum InitStream : std::uint64_t { kBottom = 1, kCross = 2, kTop = 3, kEmbedding = 4 };

}  // namespace

std::int64_t TensorRef::elements() const {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

Model::Model(const ModelSpec& spec, Backend& backend, std::int64_t max_batch, std::uint64_t seed)
    : spec_(spec), backend_(backend), max_batch_(max_batch) {
  if (max_batch <= 0) throw Error("Model: max_batch must be positive, got " + std::to_string(max_batch));
  const std::int64_t B = max_batch;
  emb_opt_ = to_params(spec.embedding_optimizer);
  dense_opt_ = to_params(spec.dense_optimizer);
  // ---- dense parameter layout ----
  std::int64_t off = 0;
  auto add_linear = [&](std::vector<Linear>& v, const char* name, int in, int out, Activation act) {
    Linear l;
    l.forward_name = std::string(name) + "." + std::to_string(v.size()) + " forward";
    l.backward_name = std::string(name) + "." + std::to_string(v.size()) + " backward";
    l.in = in;
    l.out = out;
    l.act = act;
    l.w = off;
    off += static_cast<std::int64_t>(in) * out;
    l.b = off;
    off += out;
    v.push_back(l);
  };
  int width = spec.dense_features;
  for (int out : spec.bottom_mlp) {
    add_linear(bottom_, "bottom", width, out, Activation::relu);
    width = out;
  }
  bottom_out_ = width;
  x0_cols_ = spec.interaction_input_dim();
  inter_out_ = spec.interaction_output_dim();
  if (spec.interaction.kind == InteractionKind::dcnv2) {
    rank_ = spec.interaction.low_rank;
    const std::int64_t N = x0_cols_;
    for (int l = 0; l < spec.interaction.cross_layers; ++l) {
      Cross c;
      c.forward_name = "cross." + std::to_string(l) + " forward";
      c.backward_name = "cross." + std::to_string(l) + " backward";
      c.v = off;
      off += rank_ * N;
      c.w = off;
      off += N * rank_;
      c.b = off;
      off += N;
      cross_.push_back(c);
    }
  }
  width = inter_out_;
  for (std::size_t i = 0; i < spec.top_mlp.size(); ++i) {
    const bool last = i + 1 == spec.top_mlp.size();
    add_linear(top_, "top", width, spec.top_mlp[i], last ? Activation::none : Activation::relu);
    width = spec.top_mlp[i];
  }
  dense_count_ = off;

  // ---- embedding layout ----
  std::int64_t woff = 0, soff = 0, col = 0;  // out_col is relative to the embedding block of x0
  for (const auto& t : spec.tables) {
    TableLayout l;
    l.rows = t.rows;
    l.dim = t.dim;
    l.pooling = t.pooling;
    l.weight_offset = woff;
    l.state_offset = soff;
    l.out_col = col;
    l.dtype = t.dtype;
    woff += t.rows * t.dim;
    if (emb_opt_.kind == OptimizerKind::adagrad) soff += t.rows * t.dim;
    if (emb_opt_.kind == OptimizerKind::rowwise_adagrad) soff += t.rows;
    col += t.dim;
    tables_.push_back(l);
  }
  emb_count_ = woff;

  // ---- buffers ----
  params_ = floats(dense_count_);
  grads_ = floats(dense_count_);
  const int dense_state = optimizer_state_per_element(dense_opt_.kind);
  if (dense_state > 0) {
    dense_state_ = floats(dense_state * dense_count_);
    backend_.fill(dense_state_.as<float>(), dense_state * dense_count_, 0.0f);
  }
  emb_weights_ = floats(emb_count_);
  if (soff > 0) {
    emb_state_ = floats(soff);
    backend_.fill(emb_state_.as<float>(), soff, 0.0f);
  }

  for (InputSlot& slot : slots_) {
    slot.dense = floats(B * spec.dense_features);
    slot.labels = floats(B);
    slot.ids_capacity = std::max<std::int64_t>(1, B * spec.lookups_per_example());
    slot.ids = Buffer(backend_, static_cast<std::size_t>(slot.ids_capacity) * 8);
    slot.offsets = Buffer(backend_, static_cast<std::size_t>(B * spec.num_tables() + 1) * 8);
  }

  act_ = backend_.activation_dtype();
  x0_dtype_ = cross_.empty() ? DType::f32 : act_;
  grad_dtype_ = x0_dtype_;  // the gradient of the interaction output and between cross layers
  int widest = std::max(spec.dense_features, inter_out_);
  for (const auto& l : bottom_) {
    bottom_act_.push_back(activations(l.out, act_));
    widest = std::max(widest, l.out);
  }
  for (std::size_t i = 0; i < top_.size(); ++i) {
    top_act_.push_back(activations(top_[i].out, i + 1 == top_.size() ? DType::f32 : act_));
    widest = std::max(widest, top_[i].out);
  }
  x0_ = activations(x0_cols_, x0_dtype_);
  dx0_ = activations(x0_cols_, grad_dtype_);
  for (std::size_t l = 0; l < cross_.size(); ++l) {
    cross_x_.push_back(activations(x0_cols_, act_));
    cross_u_.push_back(activations(rank_, act_));
    cross_z_.push_back(activations(x0_cols_, act_));
  }
  if (!cross_.empty()) {
    dcross_ = activations(x0_cols_, act_);
  } else {
    inter_out_buf_ = floats(B * inter_out_);
  }
  d_inter_ = activations(inter_out_, cross_.empty() ? DType::f32 : act_);
  dscratch_a_ = floats(B * widest);
  dscratch_b_ = floats(B * widest);
  loss_ = floats(1);
  probs_ = floats(B);

  // ---- initialisation (deterministic in seed, done by the backend) ----
  for (std::size_t i = 0; i < bottom_.size() + top_.size(); ++i) {
    const bool is_bottom = i < bottom_.size();
    const Linear& l = is_bottom ? bottom_[i] : top_[i - bottom_.size()];
    const float a = std::sqrt(6.0f / static_cast<float>(l.in + l.out));  // Glorot uniform
    const std::uint64_t stream = (is_bottom ? kBottom : kTop) << 32 | (is_bottom ? i : i - bottom_.size());
    backend_.fill_uniform(param(l.w), static_cast<std::int64_t>(l.in) * l.out, -a, a, seed, stream);
    backend_.fill(param(l.b), l.out, 0.0f);
  }
  for (std::size_t l = 0; l < cross_.size(); ++l) {
    const std::int64_t N = x0_cols_;
    const float a = std::sqrt(6.0f / static_cast<float>(N + rank_));
    backend_.fill_uniform(param(cross_[l].v), rank_ * N, -a, a, seed, kCross << 32 | (2 * l));
    backend_.fill_uniform(param(cross_[l].w), N * rank_, -a, a, seed, kCross << 32 | (2 * l + 1));
    backend_.fill(param(cross_[l].b), N, 0.0f);
  }
  for (std::size_t t = 0; t < tables_.size(); ++t) {
    const float a = 1.0f / std::sqrt(static_cast<float>(tables_[t].rows));
    float* w = emb_weights_.as<float>() + tables_[t].weight_offset;
    backend_.fill_uniform(w, tables_[t].rows * tables_[t].dim, -a, a, seed, kEmbedding << 32 | t);
    if (tables_[t].dtype != DType::f32)
      backend_.round_to_dtype(w, tables_[t].rows * tables_[t].dim, tables_[t].dtype);
  }
}

Model::~Model() {
  backend_.release_constants();  // the activations are about to be freed
  for (InputSlot& slot : slots_) backend_.deallocate_pinned(slot.pinned);
}

std::size_t Model::allocated_bytes() const {
  std::size_t total = 0;
  for (const InputSlot& slot : slots_)
    for (const Buffer* b : {&slot.dense, &slot.labels, &slot.ids, &slot.offsets}) total += b->bytes();
  for (const Buffer* b : {&params_, &grads_, &dense_state_, &emb_weights_, &emb_state_, &x0_, &dx0_, &inter_out_buf_,
                          &d_inter_, &dcross_, &dscratch_a_, &dscratch_b_, &loss_,
                          &probs_})
    total += b->bytes();
  for (const auto* v : {&bottom_act_, &top_act_, &cross_x_, &cross_u_, &cross_z_})
    for (const auto& b : *v) total += b.bytes();
  return total;
}

void Model::check_batch(const Batch& batch) const {
  const std::int64_t n = batch.size;
  if (n <= 0 || n > max_batch_)
    throw Error("Model: batch of " + std::to_string(n) + " examples; this model was built for 1.." +
                std::to_string(max_batch_));
  if (batch.num_dense != spec_.dense_features || batch.num_tables != spec_.num_tables())
    throw Error("Model: batch has " + std::to_string(batch.num_dense) + " dense features and " +
                std::to_string(batch.num_tables) + " tables; model '" + spec_.name + "' expects " +
                std::to_string(spec_.dense_features) + " and " + std::to_string(spec_.num_tables()));
  const std::size_t T = static_cast<std::size_t>(batch.num_tables);
  if (batch.offsets.size() != T * static_cast<std::size_t>(n) + 1 ||
      batch.dense.size() != static_cast<std::size_t>(n * batch.num_dense) ||
      batch.ids.size() != static_cast<std::size_t>(batch.offsets.back()) ||
      (!batch.labels.empty() && batch.labels.size() != static_cast<std::size_t>(n)))
    throw Error("Model: malformed batch (dense, labels, offsets or ids have the wrong length)");
}

namespace {

// memcpy in parallel chunks: staging a large batch (the MLPerf model's ids are 112 MB) must take
// a small part of a step.
void parallel_copy(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  if (bytes <= kChunk) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return;
  }
  const auto chunks = static_cast<std::int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t first = static_cast<std::size_t>(c) * kChunk;
    std::memcpy(static_cast<char*>(dst) + first, static_cast<const char*>(src) + first,
                std::min(kChunk, bytes - first));
  }
}

std::size_t align8(std::size_t x) { return (x + 7) / 8 * 8; }

// Pinned staging layout of a batch: dense | labels | offsets | ids, 8-byte aligned.
struct PinnedLayout {
  std::size_t labels, offsets, ids, total;
};
PinnedLayout pinned_layout(std::size_t dense_floats, std::size_t labels, std::size_t offsets, std::size_t ids) {
  PinnedLayout l{};
  l.labels = align8(dense_floats * 4);
  l.offsets = l.labels + align8(labels * 4);
  l.ids = l.offsets + offsets * 8;
  l.total = l.ids + ids * 8;
  return l;
}

}  // namespace

void Model::stage(const Batch& batch) {
  check_batch(batch);
  if (staged_count_ >= kInputSlots)
    throw Error("Model::stage: " + std::to_string(kInputSlots) +
                " batches are staged already; train one (train_staged) first");
  const int index = static_cast<int>(staged_total_ % kInputSlots);
  InputSlot& slot = slots_[index];
  const std::int64_t n = batch.size;
  const auto nids = static_cast<std::int64_t>(batch.ids.size());
  const std::size_t dense_bytes = batch.dense.size() * 4, label_bytes = batch.labels.size() * 4;
  const std::size_t offset_bytes = batch.offsets.size() * 8, id_bytes = static_cast<std::size_t>(nids) * 8;
  const PinnedLayout at =
      pinned_layout(batch.dense.size(), batch.labels.size(), batch.offsets.size(), static_cast<std::size_t>(nids));

  // Backends that copy in the background read from pinned staging memory; the others (cpu) copy
  // at once, straight from the batch.
  const bool staging = backend_.copies_in_background();
  backend_.begin_input(index);  // the slot's last copies have read its pinned memory
  if (staging) ensure_pinned(slot, at.total, nids);  // first use (unless prepared), or ids beyond the capacity
  if (nids > slot.ids_capacity) {  // variable pooling above the spec's sizes: grow once
    const std::int64_t capacity = nids + nids / 4;
    Buffer grown(backend_, static_cast<std::size_t>(capacity) * 8);  // may throw: the slot stays as it was
    slot.ids = std::move(grown);
    slot.ids_capacity = capacity;
  }
  struct Part {
    void* dst;
    const void* src;
    std::size_t bytes, staged_at;
  };
  Part parts[] = {{slot.dense.get(), batch.dense.data(), dense_bytes, 0},
                  {slot.labels.get(), batch.labels.data(), label_bytes, at.labels},
                  {slot.offsets.get(), batch.offsets.data(), offset_bytes, at.offsets},
                  {slot.ids.get(), batch.ids.data(), id_bytes, at.ids}};
  try {
    for (Part& p : parts) {
      if (p.bytes == 0) continue;
      if (staging) {
        char* pinned = static_cast<char*>(slot.pinned) + p.staged_at;
        parallel_copy(pinned, p.src, p.bytes);
        p.src = pinned;
      }
      backend_.input_copy(p.dst, p.src, p.bytes);
    }
  } catch (...) {
    backend_.end_input(index);  // copies already enqueued are still waited for before the slot is reused
    throw;
  }
  backend_.end_input(index);
  slot.has_labels = label_bytes > 0;
  slot.sparse = SparseInput{n, batch.num_tables, slot.ids.as<std::int64_t>(),
                            slot.offsets.as<std::int64_t>(), nids};
  ++staged_total_;
  ++staged_count_;
}

void Model::ensure_pinned(InputSlot& slot, std::size_t bytes, std::int64_t nids) {
  if (slot.pinned != nullptr && bytes <= slot.pinned_bytes) return;
  backend_.deallocate_pinned(slot.pinned);
  slot.pinned = nullptr;
  slot.pinned_bytes = 0;
  const auto B = static_cast<std::size_t>(max_batch_);
  const std::size_t full = pinned_layout(B * static_cast<std::size_t>(spec_.dense_features), B,
                                         B * static_cast<std::size_t>(spec_.num_tables()) + 1,
                                         static_cast<std::size_t>(std::max(slot.ids_capacity, nids)))
                               .total;
  const std::size_t want = std::max(bytes, full);
  slot.pinned = backend_.allocate_pinned(want);
  slot.pinned_bytes = want;
}

void Model::prepare() {
  if (staged_count_ == 0) throw Error("Model::prepare: no batch is staged (its shapes are what is rehearsed)");
  // Pinned staging memory for the slots not used yet (a used one was sized when staged).
  if (backend_.copies_in_background()) {
    for (InputSlot& slot : slots_)
      if (slot.pinned == nullptr) ensure_pinned(slot, 0, 0);
  }
  const int index = static_cast<int>((staged_total_ - staged_count_) % kInputSlots);  // the next to train
  in_ = &slots_[index];
  rehearsing_ = true;
  struct Reset {
    Model& m;
    ~Reset() {
      m.in_ = nullptr;
      m.rehearsing_ = false;
    }
  } reset{*this};
  const std::int64_t n = in_->sparse.batch;
  backend_.rehearse([&] {
    forward(n);
    backward(n);
  });
}

int Model::take_staged() {
  const int index = static_cast<int>((staged_total_ - staged_count_) % kInputSlots);
  --staged_count_;
  return index;
}

class Model::SlotInUse {
 public:
  SlotInUse(Model& m, int index) : m_(m), index_(index) {
    m_.backend_.use_input(index_);
    m_.in_ = &m_.slots_[index_];
  }
  ~SlotInUse() {
    if (released_) return;
    m_.in_ = nullptr;
    try {
      m_.backend_.release_input(index_);  // unwinding: later copies into the slot still wait
    } catch (...) {
    }
  }
  SlotInUse(const SlotInUse&) = delete;
  SlotInUse& operator=(const SlotInUse&) = delete;
  void release() {
    released_ = true;
    m_.in_ = nullptr;
    m_.backend_.release_input(index_);
  }

 private:
  Model& m_;
  int index_;
  bool released_ = false;
};

void Model::forward(std::int64_t n) {
  // Activations are written once per step, here, then only read until the next step: each is
  // held constant once written (the GPU backend then converts it to bf16 once per step).
  backend_.release_constants();
  auto hold = [&](AMat m) {
    backend_.hold_constant(m.data, static_cast<std::size_t>(m.rows * m.ld) * m.element_bytes());
  };
  const AMat x0 = rows_of(x0_, x0_dtype_, n, x0_cols_);
  // Bottom MLP; its last layer writes straight into x0[:, :D].
  CAMat x = CMat(in_->dense.as<float>(), n, spec_.dense_features);
  for (std::size_t i = 0; i < bottom_.size(); ++i) {
    const Linear& l = bottom_[i];
    section("mlp", l.forward_name);
    const AMat y = i + 1 == bottom_.size() ? x0.cols_slice(0, bottom_out_) : rows_of(bottom_act_[i], act_, n, l.out);
    backend_.linear_forward(x, CMat(param(l.w), l.out, l.in), param(l.b), l.act, y);
    if (i + 1 < bottom_.size()) hold(y);
    x = y;
  }
  // Embedding bags into x0[:, D:].
  section("embedding_forward");
  backend_.embedding_forward(tables_, emb_weights_.as<float>(), in_->sparse,
                             x0.cols_slice(bottom_out_, x0_cols_ - bottom_out_));
  hold(x0);
  // Interaction.
  if (cross_.empty()) section("interaction", "dot forward");
  CAMat top_in;
  if (cross_.empty()) {
    const Mat out(inter_out_buf_.as<float>(), n, inter_out_);
    const Mat x0f = x0.f32();  // x0 is fp32 with the dot interaction
    backend_.dot_interaction_forward(x0f.cols_slice(0, bottom_out_),
                                     x0f.cols_slice(bottom_out_, x0_cols_ - bottom_out_),
                                     spec_.num_tables(), out);
    hold(out);
    top_in = out;
  } else {
    const std::int64_t N = x0_cols_;
    CAMat xl = x0;
    for (std::size_t l = 0; l < cross_.size(); ++l) {
      section("interaction", cross_[l].forward_name);
      const AMat next = rows_of(cross_x_[l], act_, n, N);
      const AMat u = rows_of(cross_u_[l], act_, n, rank_);
      backend_.cross_forward(x0, xl, CMat(param(cross_[l].v), rank_, N),
                             CMat(param(cross_[l].w), N, rank_), param(cross_[l].b), u,
                             rows_of(cross_z_[l], act_, n, N), next);
      hold(next);
      hold(u);  // z is read by elementwise kernels only: nothing to hold
      xl = next;
    }
    top_in = xl;
  }
  // Top MLP; the last layer gives the logits [n, 1].
  x = top_in;
  for (std::size_t i = 0; i < top_.size(); ++i) {
    const Linear& l = top_[i];
    section("mlp", l.forward_name);
    const AMat y = top_activation(i, n);
    backend_.linear_forward(x, CMat(param(l.w), l.out, l.in), param(l.b), l.act, y);
    hold(y);
    x = y;
  }
}

void Model::backward(std::int64_t n) {
  float* a = dscratch_a_.as<float>();
  float* b = dscratch_b_.as<float>();
  // Loss gradient into scratch a: dlogits [n, 1].
  section("loss");
  backend_.bce_with_logits(top_act_.back().as<float>(), in_->labels.as<float>(), n, a,
                           loss_.as<float>());
  // Top MLP backward; the first layer's dx is the gradient of the interaction output.
  const CAMat top_in = cross_.empty() ? CAMat(CMat(inter_out_buf_.as<float>(), n, inter_out_))
                                      : CAMat(rows_of(cross_x_.back(), act_, n, x0_cols_));
  for (std::size_t k = top_.size(); k-- > 0;) {
    const Linear& l = top_[k];
    section("mlp", l.backward_name);
    const CAMat x = k == 0 ? top_in : CAMat(top_activation(k - 1, n));
    const AMat dx = k == 0 ? rows_of(d_inter_, grad_dtype_, n, l.in) : AMat(Mat(b, n, l.in));
    backend_.linear_backward(x, CMat(param(l.w), l.out, l.in), top_activation(k, n), CMat(a, n, l.out), l.act, dx,
                             Mat(grad(l.w), l.out, l.in), grad(l.b));
    std::swap(a, b);
  }
  // Interaction backward into dx0 [n, D + Σ dims].
  if (cross_.empty()) section("interaction", "dot backward");
  const AMat x0 = rows_of(x0_, x0_dtype_, n, x0_cols_);
  const AMat dx0 = rows_of(dx0_, grad_dtype_, n, x0_cols_);
  const int D = bottom_out_;
  const int E = x0_cols_ - D;
  if (cross_.empty()) {
    const Mat x0f = x0.f32(), dx0f = dx0.f32();  // fp32 with the dot interaction
    backend_.dot_interaction_backward(x0f.cols_slice(0, D), x0f.cols_slice(D, E), spec_.num_tables(),
                                      CMat(d_inter_.as<float>(), n, inter_out_),
                                      dx0f.cols_slice(0, D), dx0f.cols_slice(D, E));
  } else {
    // The last layer starts dx0 and layer 0 (whose xl is x0) adds its dxl into it: no zeroing
    // and no final sum (Backend::CrossBackwardMode).
    const std::int64_t N = x0_cols_;
    // The gradients between cross layers (g in, h out, swapped per layer) in the activations' type.
    AMat g = rows_of(d_inter_, grad_dtype_, n, N);
    AMat h = rows_of(dcross_, grad_dtype_, n, N);
    for (std::size_t l = cross_.size(); l-- > 0;) {
      section("interaction", cross_[l].backward_name);
      Backend::CrossBackwardMode mode;
      mode.first_into_dx0 = l + 1 == cross_.size();
      mode.xl_is_x0 = l == 0;
      const CAMat xl = l == 0 ? CAMat(x0) : CAMat(rows_of(cross_x_[l - 1], act_, n, N));
      backend_.cross_backward(x0, xl, CMat(param(cross_[l].v), rank_, N),
                              CMat(param(cross_[l].w), N, rank_), rows_of(cross_u_[l], act_, n, rank_),
                              rows_of(cross_z_[l], act_, n, N), g, dx0, mode.xl_is_x0 ? AMat() : h,
                              Mat(grad(cross_[l].v), rank_, N),
                              Mat(grad(cross_[l].w), N, rank_), grad(cross_[l].b),
                              Mat(), mode);  // du stays the backend's working space
      std::swap(g, h);
    }
  }
  // Embedding backward fused with the table optimizer.
  section("embedding_backward");
  backend_.embedding_backward_update(tables_, emb_weights_.as<float>(), emb_state_.as<float>(),
                                     in_->sparse, dx0.cols_slice(D, E), emb_opt_);
  // Bottom MLP backward from dx0[:, :D] (then fp32 gradients in the scratch pair).
  CAMat dy = dx0.cols_slice(0, D);
  for (std::size_t k = bottom_.size(); k-- > 0;) {
    const Linear& l = bottom_[k];
    section("mlp", l.backward_name);
    const CAMat x = k == 0 ? CAMat(CMat(in_->dense.as<float>(), n, l.in)) : CAMat(rows_of(bottom_act_[k - 1], act_, n, l.in));
    const CAMat y = k + 1 == bottom_.size() ? CAMat(x0.cols_slice(0, D)) : CAMat(rows_of(bottom_act_[k], act_, n, l.out));
    float* out = dy.data == a ? b : a;
    const Mat dx = k == 0 ? Mat() : Mat(out, n, l.in);
    backend_.linear_backward(x, CMat(param(l.w), l.out, l.in), y, dy, l.act, dx,
                             Mat(grad(l.w), l.out, l.in), grad(l.b));
    dy = dx;
  }
  // One optimizer step over every dense parameter.
  section("dense_optimizer");
  backend_.dense_optimizer_step(params_.as<float>(), grads_.as<float>(), dense_state_.as<float>(),
                                dense_count_, dense_opt_, step_ + 1);
}

void Model::train_step(const Batch& batch) {
  if (batch.labels.size() != static_cast<std::size_t>(batch.size))
    throw Error("Model::train_step: batch has no labels");
  if (staged_count_ > 0)
    throw Error("Model::train_step: a batch is staged; train it (train_staged) first, or stage this one too");
  stage(batch);
  train_staged();
}

void Model::train_staged() {
  if (staged_count_ == 0) throw Error("Model::train_staged: no batch is staged");
  const int index = take_staged();
  if (!slots_[index].has_labels) throw Error("Model::train_staged: the staged batch has no labels");
  section("input_wait");
  SlotInUse use(*this, index);
  const std::int64_t n = in_->sparse.batch;
  forward(n);
  backward(n);
  use.release();
  ++step_;
  end_profiled_step();
}

// ---- profiling ----

void Model::set_profiling(bool on) {
  if (!on) finish_profile();
  profiling_ = on;
}

void Model::section(const char* category, std::string_view op) {
  if (!profiling_ || rehearsing_) return;
  auto& marks = marks_[mark_parity_];
  // A step has a mark set of 64; a deeper model's extra sections fold into the one before (the
  // last mark is kept for the end of the step).
  if (marks.size() >= 63 && category[0] != '\0') return;
  backend_.timing_mark(mark_parity_ * 64 + static_cast<int>(marks.size()));
  marks.emplace_back(category, std::string(op));
}

void Model::end_profiled_step() {
  if (!profiling_) return;
  section("");  // the end mark
  pending_[mark_parity_] = true;
  mark_parity_ ^= 1;
  // Read the previous step's marks now that this step is enqueued (the device stays busy).
  if (pending_[mark_parity_]) read_profile(mark_parity_);
  marks_[mark_parity_].clear();
}

void Model::read_profile(int parity) {
  auto& marks = marks_[parity];
  for (std::size_t i = 0; i + 1 < marks.size(); ++i) {
    const double ms = backend_.timing_elapsed_ms(parity * 64 + static_cast<int>(i),
                                                 parity * 64 + static_cast<int>(i) + 1);
    profile_ms_[marks[i].first] += ms;
    profile_ops_ms_[marks[i].first + ": " + (marks[i].second.empty() ? marks[i].first : marks[i].second)] += ms;
  }
  pending_[parity] = false;
  ++profiled_steps_;
}

void Model::finish_profile() {
  for (int k = 0; k < 2; ++k) {
    const int parity = mark_parity_ ^ 1 ^ k;  // the older pending step first
    if (pending_[parity]) read_profile(parity);
    marks_[parity].clear();
  }
}

float Model::last_loss() {
  float v = 0.0f;
  backend_.copy_to_host(&v, loss_.get(), sizeof v);
  return v;
}

void Model::predict(const Batch& batch, float* probs) {
  if (staged_count_ > 0)
    throw Error("Model::predict: a training batch is staged; train it (train_staged) first");
  stage(batch);
  struct NoProfile {  // evaluation is not part of the step profile
    bool& flag;
    bool was;
    ~NoProfile() { flag = was; }
  } guard{profiling_, std::exchange(profiling_, false)};
  SlotInUse use(*this, take_staged());
  forward(batch.size);
  backend_.sigmoid(top_act_.back().as<float>(), probs_.as<float>(), batch.size);
  use.release();
  backend_.copy_to_host(probs, probs_.get(), static_cast<std::size_t>(batch.size) * 4);
}

std::vector<TensorRef> Model::tensors() {
  std::vector<TensorRef> out;
  auto f32 = [](std::string name, std::vector<std::int64_t> shape, float* p) {
    return TensorRef{std::move(name), DType::f32, std::move(shape), p};
  };
  for (std::size_t i = 0; i < bottom_.size(); ++i) {
    const auto& l = bottom_[i];
    out.push_back(f32("bottom_mlp." + std::to_string(i) + ".weight", {l.out, l.in}, param(l.w)));
    out.push_back(f32("bottom_mlp." + std::to_string(i) + ".bias", {l.out}, param(l.b)));
  }
  const std::int64_t N = x0_cols_;
  for (std::size_t l = 0; l < cross_.size(); ++l) {
    out.push_back(f32("cross." + std::to_string(l) + ".v", {rank_, N}, param(cross_[l].v)));
    out.push_back(f32("cross." + std::to_string(l) + ".w", {N, rank_}, param(cross_[l].w)));
    out.push_back(f32("cross." + std::to_string(l) + ".bias", {N}, param(cross_[l].b)));
  }
  for (std::size_t i = 0; i < top_.size(); ++i) {
    const auto& l = top_[i];
    out.push_back(f32("top_mlp." + std::to_string(i) + ".weight", {l.out, l.in}, param(l.w)));
    out.push_back(f32("top_mlp." + std::to_string(i) + ".bias", {l.out}, param(l.b)));
  }
  for (std::size_t t = 0; t < tables_.size(); ++t) {
    const auto& l = tables_[t];
    const std::string& name = spec_.tables[t].name;
    out.push_back(f32("embedding." + name + ".weight", {l.rows, l.dim},
                      emb_weights_.as<float>() + l.weight_offset));
    if (emb_opt_.kind == OptimizerKind::adagrad)
      out.push_back(f32("optimizer.embedding." + name + ".state", {l.rows, l.dim},
                        emb_state_.as<float>() + l.state_offset));
    if (emb_opt_.kind == OptimizerKind::rowwise_adagrad)
      out.push_back(f32("optimizer.embedding." + name + ".state", {l.rows},
                        emb_state_.as<float>() + l.state_offset));
  }
  const int k = optimizer_state_per_element(dense_opt_.kind);
  if (k > 0) out.push_back(f32("optimizer.dense.state", {k, dense_count_}, dense_state_.as<float>()));
  return out;
}

}  // namespace parity
