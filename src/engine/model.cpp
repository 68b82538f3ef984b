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
#include <numeric>

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
  auto add_linear = [&](std::vector<Linear>& v, int in, int out, Activation act) {
    Linear l;
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
    add_linear(bottom_, width, out, Activation::relu);
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
    add_linear(top_, width, spec.top_mlp[i], last ? Activation::none : Activation::relu);
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

  in_dense_ = floats(B * spec.dense_features);
  in_labels_ = floats(B);
  ids_capacity_ = std::max<std::int64_t>(1, B * spec.lookups_per_example());
  in_ids_ = Buffer(backend_, static_cast<std::size_t>(ids_capacity_) * 8);
  in_offsets_ = Buffer(backend_, static_cast<std::size_t>(B * spec.num_tables() + 1) * 8);

  int widest = std::max(spec.dense_features, inter_out_);
  for (const auto& l : bottom_) {
    bottom_act_.push_back(floats(B * l.out));
    widest = std::max(widest, l.out);
  }
  for (const auto& l : top_) {
    top_act_.push_back(floats(B * l.out));
    widest = std::max(widest, l.out);
  }
  x0_ = floats(B * x0_cols_);
  dx0_ = floats(B * x0_cols_);
  for (std::size_t l = 0; l < cross_.size(); ++l) {
    cross_x_.push_back(floats(B * x0_cols_));
    cross_u_.push_back(floats(B * rank_));
    cross_z_.push_back(floats(B * x0_cols_));
  }
  if (!cross_.empty()) {
    dcross_ = floats(B * x0_cols_);
    du_scratch_ = floats(B * rank_);
  } else {
    inter_out_buf_ = floats(B * inter_out_);
  }
  d_inter_ = floats(B * inter_out_);
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

Model::~Model() = default;

std::size_t Model::allocated_bytes() const {
  std::size_t total = 0;
  for (const Buffer* b : {&params_, &grads_, &dense_state_, &emb_weights_, &emb_state_, &in_dense_,
                          &in_labels_, &in_ids_, &in_offsets_, &x0_, &dx0_, &inter_out_buf_,
                          &d_inter_, &dcross_, &dscratch_a_, &dscratch_b_, &du_scratch_, &loss_,
                          &probs_})
    total += b->bytes();
  for (const auto* v : {&bottom_act_, &top_act_, &cross_x_, &cross_u_, &cross_z_})
    for (const auto& b : *v) total += b.bytes();
  return total;
}

void Model::upload(const Batch& batch) {
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
      batch.ids.size() != static_cast<std::size_t>(batch.offsets.back()))
    throw Error("Model: malformed batch (dense, offsets or ids have the wrong length)");
  const auto nids = static_cast<std::int64_t>(batch.ids.size());
  if (nids > ids_capacity_) {  // variable pooling above the spec's sizes: grow once
    ids_capacity_ = nids + nids / 4;
    in_ids_ = Buffer(backend_, static_cast<std::size_t>(ids_capacity_) * 8);
  }
  backend_.copy_to_device(in_dense_.get(), batch.dense.data(), batch.dense.size() * 4);
  if (!batch.labels.empty()) backend_.copy_to_device(in_labels_.get(), batch.labels.data(), n * 4);
  if (nids > 0) backend_.copy_to_device(in_ids_.get(), batch.ids.data(), nids * 8);
  backend_.copy_to_device(in_offsets_.get(), batch.offsets.data(), batch.offsets.size() * 8);
  sparse_ = SparseInput{n, batch.num_tables, in_ids_.as<std::int64_t>(),
                        in_offsets_.as<std::int64_t>(), nids};
}

void Model::forward(std::int64_t n) {
  const Mat x0(x0_.as<float>(), n, x0_cols_);
  // Bottom MLP; its last layer writes straight into x0[:, :D].
  CMat x(in_dense_.as<float>(), n, spec_.dense_features);
  for (std::size_t i = 0; i < bottom_.size(); ++i) {
    const Linear& l = bottom_[i];
    const Mat y = i + 1 == bottom_.size() ? x0.cols_slice(0, bottom_out_)
                                          : Mat(bottom_act_[i].as<float>(), n, l.out);
    backend_.linear_forward(x, CMat(param(l.w), l.out, l.in), param(l.b), l.act, y);
    x = y;
  }
  // Embedding bags into x0[:, D:].
  backend_.embedding_forward(tables_, emb_weights_.as<float>(), sparse_,
                             x0.cols_slice(bottom_out_, x0_cols_ - bottom_out_));
  // Interaction.
  CMat top_in;
  if (cross_.empty()) {
    const Mat out(inter_out_buf_.as<float>(), n, inter_out_);
    backend_.dot_interaction_forward(x0.cols_slice(0, bottom_out_),
                                     x0.cols_slice(bottom_out_, x0_cols_ - bottom_out_),
                                     spec_.num_tables(), out);
    top_in = out;
  } else {
    const std::int64_t N = x0_cols_;
    CMat xl = x0;
    for (std::size_t l = 0; l < cross_.size(); ++l) {
      const Mat next(cross_x_[l].as<float>(), n, N);
      backend_.cross_forward(x0, xl, CMat(param(cross_[l].v), rank_, N),
                             CMat(param(cross_[l].w), N, rank_), param(cross_[l].b),
                             Mat(cross_u_[l].as<float>(), n, rank_),
                             Mat(cross_z_[l].as<float>(), n, N), next);
      xl = next;
    }
    top_in = xl;
  }
  // Top MLP; the last layer gives the logits [n, 1].
  x = top_in;
  for (std::size_t i = 0; i < top_.size(); ++i) {
    const Linear& l = top_[i];
    const Mat y(top_act_[i].as<float>(), n, l.out);
    backend_.linear_forward(x, CMat(param(l.w), l.out, l.in), param(l.b), l.act, y);
    x = y;
  }
}

void Model::backward(std::int64_t n) {
  float* a = dscratch_a_.as<float>();
  float* b = dscratch_b_.as<float>();
  // Loss gradient into scratch a: dlogits [n, 1].
  backend_.bce_with_logits(top_act_.back().as<float>(), in_labels_.as<float>(), n, a,
                           loss_.as<float>());
  // Top MLP backward; the first layer's dx is the gradient of the interaction output.
  const CMat top_in = cross_.empty() ? CMat(inter_out_buf_.as<float>(), n, inter_out_)
                                     : CMat(cross_x_.back().as<float>(), n, x0_cols_);
  for (std::size_t k = top_.size(); k-- > 0;) {
    const Linear& l = top_[k];
    const CMat x = k == 0 ? top_in : CMat(top_act_[k - 1].as<float>(), n, l.in);
    const Mat dx = k == 0 ? Mat(d_inter_.as<float>(), n, l.in) : Mat(b, n, l.in);
    backend_.linear_backward(x, CMat(param(l.w), l.out, l.in), CMat(top_act_[k].as<float>(), n, l.out),
                             CMat(a, n, l.out), l.act, dx, Mat(grad(l.w), l.out, l.in), grad(l.b));
    std::swap(a, b);
  }
  // Interaction backward into dx0 [n, D + Σ dims].
  const Mat x0(x0_.as<float>(), n, x0_cols_);
  const Mat dx0(dx0_.as<float>(), n, x0_cols_);
  const int D = bottom_out_;
  const int E = x0_cols_ - D;
  if (cross_.empty()) {
    backend_.dot_interaction_backward(x0.cols_slice(0, D), x0.cols_slice(D, E), spec_.num_tables(),
                                      CMat(d_inter_.as<float>(), n, inter_out_),
                                      dx0.cols_slice(0, D), dx0.cols_slice(D, E));
  } else {
    const std::int64_t N = x0_cols_;
    backend_.fill(dx0.data, n * N, 0.0f);
    float* g = d_inter_.as<float>();
    float* h = dcross_.as<float>();
    for (std::size_t l = cross_.size(); l-- > 0;) {
      const CMat xl = l == 0 ? CMat(x0) : CMat(cross_x_[l - 1].as<float>(), n, N);
      backend_.cross_backward(x0, xl, CMat(param(cross_[l].v), rank_, N),
                              CMat(param(cross_[l].w), N, rank_),
                              CMat(cross_u_[l].as<float>(), n, rank_),
                              CMat(cross_z_[l].as<float>(), n, N), CMat(g, n, N), dx0,
                              Mat(h, n, N), Mat(grad(cross_[l].v), rank_, N),
                              Mat(grad(cross_[l].w), N, rank_), grad(cross_[l].b),
                              Mat(du_scratch_.as<float>(), n, rank_));
      std::swap(g, h);
    }
    backend_.add_inplace(dx0, CMat(g, n, N));  // layer 0's xl is x0 itself
  }
  // Embedding backward fused with the table optimizer.
  backend_.embedding_backward_update(tables_, emb_weights_.as<float>(), emb_state_.as<float>(),
                                     sparse_, dx0.cols_slice(D, E), emb_opt_);
  // Bottom MLP backward from dx0[:, :D].
  CMat dy = dx0.cols_slice(0, D);
  for (std::size_t k = bottom_.size(); k-- > 0;) {
    const Linear& l = bottom_[k];
    const CMat x = k == 0 ? CMat(in_dense_.as<float>(), n, l.in)
                          : CMat(bottom_act_[k - 1].as<float>(), n, l.in);
    const CMat y = k + 1 == bottom_.size() ? CMat(x0.cols_slice(0, D))
                                           : CMat(bottom_act_[k].as<float>(), n, l.out);
    float* out = dy.data == a ? b : a;
    const Mat dx = k == 0 ? Mat() : Mat(out, n, l.in);
    backend_.linear_backward(x, CMat(param(l.w), l.out, l.in), y, dy, l.act, dx,
                             Mat(grad(l.w), l.out, l.in), grad(l.b));
    dy = dx;
  }
  // One optimizer step over every dense parameter.
  backend_.dense_optimizer_step(params_.as<float>(), grads_.as<float>(), dense_state_.as<float>(),
                                dense_count_, dense_opt_, step_ + 1);
}

void Model::train_step(const Batch& batch) {
  if (batch.labels.size() != static_cast<std::size_t>(batch.size))
    throw Error("Model::train_step: batch has no labels");
  upload(batch);
  forward(batch.size);
  backward(batch.size);
  ++step_;
}

float Model::last_loss() {
  float v = 0.0f;
  backend_.copy_to_host(&v, loss_.get(), sizeof v);
  return v;
}

void Model::predict(const Batch& batch, float* probs) {
  upload(batch);
  forward(batch.size);
  backend_.sigmoid(top_act_.back().as<float>(), probs_.as<float>(), batch.size);
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
