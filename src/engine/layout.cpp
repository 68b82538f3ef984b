#include "engine/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "parity/error.h"
#include "parity/random.h"

namespace parity::engine {
namespace {

// Streams of the parameter initialiser, one per tensor kind, so that adding a layer
// does not change the initial values of the others.
enum InitStream : std::uint64_t { kBottom = 1, kCross = 2, kTop = 3, kEmbedding = 4 };

}  // namespace

OptimizerParams optimizer_params(const OptimizerSpec& s, double lr_factor) {
  OptimizerParams p;
  p.kind = s.kind;
  p.lr = static_cast<float>(s.lr * lr_factor);
  p.eps = static_cast<float>(s.eps);
  p.beta1 = static_cast<float>(s.beta1);
  p.beta2 = static_cast<float>(s.beta2);
  p.weight_decay = static_cast<float>(s.weight_decay);
  p.initial_accumulator = static_cast<float>(s.initial_accumulator);
  return p;
}

ModelLayout::ModelLayout(const ModelSpec& spec)
    : emb_opt(optimizer_params(spec.embedding_optimizer)),
      dense_opt(optimizer_params(spec.dense_optimizer)) {
  // ---- dense parameters ----
  std::int64_t off = 0;
  auto add_linear = [&](std::vector<Linear>& v, const char* name, int in, int out, Activation act) {
    Linear l;
    l.forward_name = fmt::format("{}.{} forward", name, v.size());
    l.backward_name = fmt::format("{}.{} backward", name, v.size());
    l.in = in;
    l.out = out;
    l.act = act;
    l.w = off;
    off += static_cast<std::int64_t>(in) * out;
    l.b = off;
    off += out;
    v.push_back(l);
  };
  dense_features = spec.dense_features;
  int width = dense_features;
  for (int out : spec.bottom_mlp) {
    add_linear(bottom, "bottom", width, out, Activation::relu);
    width = out;
  }
  bottom_out = width;
  x0_cols = spec.interaction_input_dim();
  inter_out = spec.interaction_output_dim();
  if (spec.interaction.kind == InteractionKind::dcnv2) {
    rank = spec.interaction.low_rank;
    const std::int64_t N = x0_cols;
    for (int l = 0; l < spec.interaction.cross_layers; ++l) {
      Cross c;
      c.forward_name = fmt::format("cross.{} forward", l);
      c.backward_name = fmt::format("cross.{} backward", l);
      c.v = off;
      off += rank * N;
      c.w = off;
      off += N * rank;
      c.b = off;
      off += N;
      cross.push_back(c);
    }
  }
  width = inter_out;
  for (std::size_t i = 0; i < spec.top_mlp.size(); ++i) {
    const bool last = i + 1 == spec.top_mlp.size();
    add_linear(top, "top", width, spec.top_mlp[i], last ? Activation::none : Activation::relu);
    width = spec.top_mlp[i];
  }
  dense_count = off;

  // ---- embeddings ----
  // Each table starts 16-byte aligned in its buffer (the kernels' vector loads want it).
  const auto aligned = aligned_elements;
  std::int64_t soff = 0, col = 0;  // out_col is relative to the embedding block of x0
  for (const auto& t : spec.tables) {
    TableLayout l;
    l.rows = t.rows;
    l.dim = t.dim;
    l.pooling = t.pooling;
    l.dtype = t.dtype;
    l.ids_per_bag = t.pooling_size;
    // A host-placed table keeps only its cache in these buffers (HostTables holds the rest), and
    // at least one row, so that its type's buffer exists (the GPU kernels address host rows from
    // it).
    const std::int64_t here = t.host_placed ? std::max<std::int64_t>(t.cache_rows, 1) : t.rows;
    if (t.host_placed) l.host.cache_rows = t.cache_rows;
    std::int64_t& woff = emb_elements[buffer_index(t.dtype)];
    l.weight_offset = woff;
    woff = aligned(woff + here * t.dim, dtype_size(t.dtype));
    l.state_offset = soff;
    l.out_col = col;
    emb_count += t.rows * t.dim;
    if (emb_opt.kind == OptimizerKind::adagrad) soff = aligned(soff + here * t.dim, 4);
    if (emb_opt.kind == OptimizerKind::rowwise_adagrad) soff += here;
    col += t.dim;
    tables.push_back(l);
  }
  emb_state_count = soff;
}

int ModelLayout::buffer_index(DType t) {
  switch (t) {
    case DType::f32:
      return 0;
    case DType::f16:
      return 1;
    case DType::bf16:
      return 2;
    default:
      throw InputError(
          fmt::format("tables are stored as fp32, fp16 or bf16, not {}", dtype_name(t)));
  }
}

void* table_rows(const TableWeights& weights, const TableLayout& table) {
  if (table.host_placed()) return table.host.weights;
  if (weights.of(table.dtype) == nullptr) return nullptr;  // a sharded model's: in its shards
  return static_cast<std::byte*>(weights.of(table.dtype)) +
         table.weight_offset * static_cast<std::int64_t>(dtype_size(table.dtype));
}

float* table_state(float* state, const TableLayout& table) {
  if (table.host_placed()) return table.host.state;
  return state == nullptr ? nullptr : state + table.state_offset;
}

void ModelLayout::initialise(Backend& backend, float* params, const TableWeights& emb_weights,
                             std::uint64_t seed, bool with_tables) const {
  for (std::size_t i = 0; i < bottom.size() + top.size(); ++i) {
    const bool is_bottom = i < bottom.size();
    const Linear& l = is_bottom ? bottom[i] : top[i - bottom.size()];
    const float a = std::sqrt(6.0f / static_cast<float>(l.in + l.out));  // Glorot uniform
    const std::uint64_t stream =
        (is_bottom ? kBottom : kTop) << 32 | (is_bottom ? i : i - bottom.size());
    backend.fill_uniform(params + l.w, static_cast<std::int64_t>(l.in) * l.out, -a, a, seed,
                         stream);
    backend.fill(params + l.b, l.out, 0.0f);
  }
  for (std::size_t l = 0; l < cross.size(); ++l) {
    const std::int64_t N = x0_cols;
    const float a = std::sqrt(6.0f / static_cast<float>(N + rank));
    backend.fill_uniform(params + cross[l].v, rank * N, -a, a, seed, kCross << 32 | (2 * l));
    backend.fill_uniform(params + cross[l].w, N * rank, -a, a, seed, kCross << 32 | (2 * l + 1));
    backend.fill(params + cross[l].b, N, 0.0f);
  }
  for (std::size_t t = 0; t < tables.size() && with_tables; ++t) {
    const float a = 1.0f / std::sqrt(static_cast<float>(tables[t].rows));
    backend.fill_uniform(table_rows(emb_weights, tables[t]), tables[t].dtype,
                         tables[t].rows * tables[t].dim, -a, a, seed, kEmbedding << 32 | t);
  }
}

float ModelLayout::initial_table_value(std::size_t t, std::uint64_t seed, std::int64_t row,
                                       int col) const {
  const float a = 1.0f / std::sqrt(static_cast<float>(tables[t].rows));
  const std::uint64_t key = rng::key(seed, kEmbedding << 32 | t);
  const auto i = static_cast<std::uint64_t>(row * tables[t].dim + col);
  return static_cast<float>(-a + (a - -a) * rng::uniform01(key, i));  // as fill_uniform rounds it
}

std::vector<TensorRef> ModelLayout::tensors(const ModelSpec& spec, float* params,
                                            const TableWeights& emb_weights, float* emb_state,
                                            float* dense_state) const {
  std::vector<TensorRef> out;
  auto f32 = [&](std::string name, std::vector<std::int64_t> shape, float* p) {
    out.push_back(TensorRef{std::move(name), DType::f32, std::move(shape), p});
  };
  for (std::size_t i = 0; i < bottom.size(); ++i) {
    const auto& l = bottom[i];
    f32(fmt::format("bottom_mlp.{}.weight", i), {l.out, l.in}, params + l.w);
    f32(fmt::format("bottom_mlp.{}.bias", i), {l.out}, params + l.b);
  }
  const std::int64_t N = x0_cols;
  for (std::size_t l = 0; l < cross.size(); ++l) {
    f32(fmt::format("cross.{}.v", l), {rank, N}, params + cross[l].v);
    f32(fmt::format("cross.{}.w", l), {N, rank}, params + cross[l].w);
    f32(fmt::format("cross.{}.bias", l), {N}, params + cross[l].b);
  }
  for (std::size_t i = 0; i < top.size(); ++i) {
    const auto& l = top[i];
    f32(fmt::format("top_mlp.{}.weight", i), {l.out, l.in}, params + l.w);
    f32(fmt::format("top_mlp.{}.bias", i), {l.out}, params + l.b);
  }
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const auto& l = tables[t];
    const std::string& name = spec.tables[t].name;
    out.push_back(TensorRef{fmt::format("embedding.{}.weight", name),
                            l.dtype,
                            {l.rows, l.dim},
                            table_rows(emb_weights, l)});
    if (emb_opt.kind == OptimizerKind::adagrad)
      f32(fmt::format("optimizer.embedding.{}.state", name), {l.rows, l.dim},
          table_state(emb_state, l));
    if (emb_opt.kind == OptimizerKind::rowwise_adagrad)
      f32(fmt::format("optimizer.embedding.{}.state", name), {l.rows}, table_state(emb_state, l));
  }
  const int k = optimizer_state_per_element(dense_opt.kind);
  if (k > 0) f32("optimizer.dense.state", {k, dense_count}, dense_state);
  return out;
}

}  // namespace parity::engine
