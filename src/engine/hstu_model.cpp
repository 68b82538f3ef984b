// The HSTU training step as a composition of whole-batch backend ops (HstuModel, engine.h).
//
// Tokens: example b's tokens are its C contextual features, its L_b history events and its T
// targets, in that order, rows [start_b, start_b + C + L_b + T) of every [tokens, ·] activation.
//
// Forward:  event ids -> unpooled lookups (summed or concatenated per token) -> x_0, and each
//           contextual feature's pooled lookup added into its token (gather/scatter of rows);
//           per layer: LayerNorm -> projection -> SiLU -> U, V, Q, K -> attention -> norm-multiply
//           -> output projection -> residual; the targets' final tokens -> LayerNorm -> head ->
//           logits [B T, tasks] -> BCE.
// Backward: the same in reverse; the SiLU input and the layer norms' statistics are kept from the
//           forward, the embedding backward is fused with the table optimizer, and the dense
//           gradients land in one flat buffer updated by one optimizer call.
//
// Why it is built this way: every op is a Backend op with its math in backend.h, so the CPU
// reference and a GPU backend run this same file; the host builds each batch's token layout
// (CSR offsets, row indices) once and copies it in, so the ops see plain arrays. Where the backend
// copies in the background (GPU) the layout is packed into pinned staging memory by layout(), on
// the caller's thread ahead of the step (the trainer's worker): a copy from pageable memory waits
// for all the work enqueued before it, and a pack on the step's own thread left the device idle
// while the host copied.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/dense_buckets.h"
#include "dist/sharded_embedding.h"
#include "engine/layout.h"
#include "engine/step_profiler.h"
#include "parity/checkpoint.h"
#include "parity/engine.h"
#include "parity/error.h"
#include "parity/plan.h"
#include "parity/random.h"

namespace parity {
namespace {

// Streams of the parameter initialiser.
enum InitStream : std::uint64_t { kUvqk = 11, kOut = 12, kHead = 13, kTables = 14 };

constexpr float kNormEps = 1e-5f;

// The sections of a layer in the step profile, in the order of op_name()'s index.
constexpr const char* kLayerOps[] = {
    "norm forward",        "projection forward", "attention forward", "norm_mul forward",
    "output forward",      "output backward",    "norm_mul backward", "attention backward",
    "projection backward", "norm backward",      "recompute",         "silu forward",
    "residual forward",    "silu backward"};
enum LayerOp : int {
  kNormForward,
  kProjectionForward,
  kAttentionForward,
  kNormMulForward,
  kOutputForward,
  kOutputBackward,
  kNormMulBackward,
  kAttentionBackward,
  kProjectionBackward,
  kNormBackward,
  kRecompute,
  kSiluForward,
  kResidualForward,
  kSiluBackward,
  kLayerOpCount
};

// One HSTU layer's parameters: offsets into the flat dense buffer.
struct Layer {
  std::int64_t gamma, beta, uvqk_w, uvqk_b, out_w, out_b, position, time;
};

Buffer bytes_of(Backend& backend, std::int64_t n, std::size_t each) {
  return Buffer(backend, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * each);
}

}  // namespace

// A layout's arrays packed in pinned memory, with the fence after the copies that read them.
struct HstuModel::Staging {
  Backend* be = nullptr;
  void* p = nullptr;
  std::size_t bytes = 0;
  std::vector<std::size_t> sizes;  // the packed arrays' bytes, in upload()'s order
  std::function<void()> done;
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() { release(); }
  void wait() {
    if (done) done();
    done = {};
  }
  void release() {
    wait();
    if (p != nullptr) be->deallocate_pinned(p);
    p = nullptr;
    bytes = 0;
  }
};

struct HstuModel::Impl {
  bool whole_tables = true;  // false: built for a plan that shards them (no whole table, ever)
  ModelSpec spec;
  HstuSpec h;
  Backend& be;
  Options options;
  std::int64_t max_batch = 0, max_tokens = 0, step = 0;
  std::int64_t token_capacity = 0;  // tokens the per-token buffers hold now
  int capacity_growths = 0;
  std::uint64_t seed = 0;
  int d = 0, contexts = 0, features = 0, targets = 0, tasks = 0;
  int hv = 0, ha = 0, proj = 0;  // heads x value_dim, heads x attention_dim, 2 hv + 2 ha

  // ---- parameters ----
  std::vector<Layer> layers;
  std::int64_t final_gamma = 0, final_beta = 0, head_w = 0, head_b = 0, dense_count = 0;
  std::vector<TableLayout> feature_tables, context_tables;  // sharing the weight buffers
  OptimizerParams emb_opt, dense_opt;
  std::int64_t emb_elements[3] = {}, emb_state_count = 0, emb_count = 0;
  Buffer dense, grads, dense_state, emb_weights[3], emb_state;

  // ---- inputs (backend memory, sized for max_tokens) ----
  Buffer token_ids, token_offsets;  // the events' CSR over tokens, feature-major
  Buffer ctx_ids, ctx_offsets;      // the contexts' CSR over examples
  Buffer seq_offsets, times;        // [B + 1], [tokens]
  Buffer blocks;                    // the sequences' row blocks (sequence_blocks)
  Buffer ctx_rows, target_rows;     // [B C], [B T]: token rows of the contexts and targets
  Buffer labels;                    // [B T tasks]

  // ---- activations ----
  std::vector<Buffer> x;  // x_0 .. x_layers [tokens, d]
  std::vector<Buffer> n1, mean1, rstd1, pre, act, attn, y, mean2, rstd2;  // per layer
  Buffer ctx_out;                                      // [B, C d] pooled contexts
  Buffer final_in, final_out, final_mean, final_rstd;  // [B T, d], [B T]
  Buffer logits, dlogits, loss;
  // ---- gradients ----
  Buffer dx_a, dx_b, dn, dpre, dattn, dy, dfinal, dctx;

  engine::StepProfiler profiler;
  std::vector<std::string> op_names;  // "layer.{l} {what}", made once

  // ---- set by shard(): the ranks' communicator, and where the tables are sharded this rank's
  // pieces of the sequence features (a bag a token) and of the contextual tables (a bag an
  // example); with summed features, their lookups side by side [tokens, F d] and its gradient,
  // and the identity index that copies a column block ----
  Communicator* comm = nullptr;
  std::unique_ptr<ShardedEmbedding> feature_shards, context_shards;
  // The dense gradients' all-reduce in buckets while the backward goes on, as Model's (after
  // the gradients they read: stopped before those are freed).
  std::unique_ptr<DenseGradientBuckets> dense_buckets;
  Buffer feature_rows, dfeature_rows, identity;
  bool sum_shards() const {  // one feature's rows are x_0's as they are
    return feature_shards && h.sequence.combine == EventCombine::sum && features > 1;
  }

  // ---- the current batch (host) ----
  const Batch* host_batch = nullptr;  // the batch and layout of the step (upload())
  const Layout* host_layout = nullptr;
  std::int64_t batch = 0, tokens = 0;
  std::int64_t event_nnz = 0, ctx_nnz = 0, block_count = 0, packed_blocks = 0;
  std::int64_t ctx_lookups = 0;  // contextual ids per example (the tables' pooling sizes)
  Layout own;                    // the layout stage() builds

  Impl(const ModelSpec& s, Backend& backend, std::int64_t max_b, std::uint64_t init_seed, Options o,
       bool with_tables)
      : whole_tables(with_tables),
        spec(s),
        h(*s.hstu),
        be(backend),
        options(o),
        max_batch(max_b),
        seed(init_seed),
        profiler(backend) {
    if (max_batch < 1)
      throw InputError(fmt::format("HstuModel: max_batch is {}, expected >= 1", max_batch));
    if (h.dropout > 0.0)
      throw InputError(
          fmt::format("model '{}': hstu.dropout {} is not run yet by the engine (set it to 0)",
                      spec.name, h.dropout));
    d = h.model_dim;
    contexts = spec.num_tables();
    features = static_cast<int>(h.sequence.features.size());
    targets = h.sequence.targets;
    tasks = static_cast<int>(h.tasks.size());
    hv = h.heads * h.value_dim;
    ha = h.heads * h.attention_dim;
    proj = 2 * hv + 2 * ha;
    max_tokens = max_batch * (contexts + h.sequence.max_len + targets);
    if (options.token_capacity < 0)
      throw InputError(fmt::format("HstuModel: token_capacity is {}, expected >= 0 (0: {})",
                                   options.token_capacity, max_tokens));
    emb_opt = engine::optimizer_params(spec.embedding_optimizer);
    dense_opt = engine::optimizer_params(spec.dense_optimizer);
    lay_out_parameters();
    for (int l = 0; l < h.layers; ++l)
      for (const char* what : kLayerOps) op_names.push_back(fmt::format("layer.{} {}", l, what));
    allocate();
    allocate_tokens(options.token_capacity > 0 ? std::min(options.token_capacity, max_tokens)
                                               : max_tokens);
    initialise();
  }

  void lay_out_parameters() {
    std::int64_t off = 0;
    auto take = [&](std::int64_t n) {
      const std::int64_t at = off;
      off += n;
      return at;
    };
    for (int l = 0; l < h.layers; ++l) {
      Layer L;
      L.gamma = take(d);
      L.beta = take(d);
      L.uvqk_w = take(static_cast<std::int64_t>(proj) * d);
      L.uvqk_b = take(proj);
      L.out_w = take(static_cast<std::int64_t>(d) * hv);
      L.out_b = take(d);
      L.position = take(static_cast<std::int64_t>(h.heads) * h.position_buckets);
      L.time = take(static_cast<std::int64_t>(h.heads) * h.time_buckets);
      layers.push_back(L);
    }
    final_gamma = take(d);
    final_beta = take(d);
    head_w = take(static_cast<std::int64_t>(tasks) * d);
    head_b = take(tasks);
    dense_count = off;

    const auto aligned = engine::aligned_elements;
    std::int64_t col = 0;
    auto add = [&](const TableSpec& t, std::vector<TableLayout>& into, bool concat,
                   double ids_per_bag) {
      if (t.host_placed)
        throw InputError(
            fmt::format("model '{}': table '{}' is host-placed, which the HSTU "
                        "engine does not run yet",
                        spec.name, t.name));
      TableLayout l;
      l.rows = t.rows;
      l.dim = t.dim;
      l.pooling = t.pooling;
      l.dtype = t.dtype;
      l.ids_per_bag = ids_per_bag;
      std::int64_t& woff = emb_elements[engine::ModelLayout::buffer_index(t.dtype)];
      l.weight_offset = woff;
      woff = aligned(woff + t.rows * t.dim, dtype_size(t.dtype));
      l.state_offset = emb_state_count;
      if (emb_opt.kind == OptimizerKind::adagrad)
        emb_state_count = aligned(emb_state_count + t.rows * t.dim, 4);
      if (emb_opt.kind == OptimizerKind::rowwise_adagrad) emb_state_count += t.rows;
      l.out_col = concat ? col : 0;
      if (concat) col += t.dim;
      emb_count += t.rows * t.dim;
      into.push_back(l);
    };
    const bool concat = h.sequence.combine == EventCombine::concat;
    for (const TableSpec& t : h.sequence.features) add(t, feature_tables, concat, 1.0);
    col = 0;
    for (const TableSpec& t : spec.tables)  // pooled, one token each: [B, C d]
      add(t, context_tables, true, t.pooling_size);
  }

  // The buffers whose size does not depend on the batch's token count: parameters, their
  // gradients and optimizer state, the tables, and the per-example inputs and head activations.
  void allocate() {
    const std::int64_t BT = max_batch * targets;
    dense = bytes_of(be, dense_count, 4);
    grads = bytes_of(be, dense_count, 4);
    const int k = optimizer_state_per_element(dense_opt.kind);
    if (k > 0) {
      dense_state = bytes_of(be, k * dense_count, 4);
      be.fill(dense_state.as<float>(), k * dense_count, initial_optimizer_state(dense_opt));
    }
    for (const DType t : {DType::f32, DType::f16, DType::bf16}) {
      const int i = engine::ModelLayout::buffer_index(t);
      if (whole_tables && emb_elements[i] > 0)
        emb_weights[i] = bytes_of(be, emb_elements[i], dtype_size(t));
    }
    if (whole_tables && emb_state_count > 0) {
      emb_state = bytes_of(be, emb_state_count, 4);
      be.fill(emb_state.as<float>(), emb_state_count, initial_optimizer_state(emb_opt));
    }
    for (const TableSpec& t : spec.tables) ctx_lookups += t.pooling_size;
    ctx_ids = bytes_of(be, max_batch * ctx_lookups, 8);
    ctx_offsets = bytes_of(be, contexts * max_batch + 1, 8);
    seq_offsets = bytes_of(be, max_batch + 1, 8);
    blocks = bytes_of(be, max_batch * max_blocks(), 8);
    ctx_rows = bytes_of(be, max_batch * contexts, 8);
    target_rows = bytes_of(be, BT, 8);
    labels = bytes_of(be, BT * tasks, 4);
    ctx_out = bytes_of(be, max_batch * contexts * d, 4);
    dctx = bytes_of(be, max_batch * contexts * d, 4);
    final_in = bytes_of(be, BT * d, 4);
    final_out = bytes_of(be, BT * d, 4);
    dfinal = bytes_of(be, BT * d, 4);
    final_mean = bytes_of(be, BT, 4);
    final_rstd = bytes_of(be, BT, 4);
    logits = bytes_of(be, BT * tasks, 4);
    dlogits = bytes_of(be, BT * tasks, 4);
    loss = bytes_of(be, 1, 4);
  }

  // The buffers of one row per token, for up to T tokens: the token inputs, the activations the
  // backward keeps (with recompute, the normed input, U/V/Q/K after SiLU and the norm-multiply
  // output once for all layers: each layer's backward forms them again), and the gradients.
  void allocate_tokens(std::int64_t T) {
    // The old buffers go first, so that growing never holds both.
    for (auto* v : {&x, &n1, &mean1, &rstd1, &pre, &act, &attn, &y, &mean2, &rstd2}) v->clear();
    for (Buffer* b : {&token_ids, &token_offsets, &times, &dx_a, &dx_b, &dn, &dpre, &dattn, &dy})
      b->reset();
    token_capacity = T;
    token_ids = bytes_of(be, features * T, 8);
    token_offsets = bytes_of(be, features * T + 1, 8);
    times = bytes_of(be, T, 8);
    for (int l = 0; l <= h.layers; ++l) x.push_back(bytes_of(be, T * d, 4));
    const int kept = options.recompute ? 1 : h.layers;  // buffers of the recomputed activations
    for (int l = 0; l < h.layers; ++l) {
      if (l < kept) {
        n1.push_back(bytes_of(be, T * d, 4));
        act.push_back(bytes_of(be, T * proj, 4));
        y.push_back(bytes_of(be, T * hv, 4));
      }
      mean1.push_back(bytes_of(be, T, 4));
      rstd1.push_back(bytes_of(be, T, 4));
      pre.push_back(bytes_of(be, T * proj, 4));
      attn.push_back(bytes_of(be, T * hv, 4));
      mean2.push_back(bytes_of(be, T, 4));
      rstd2.push_back(bytes_of(be, T, 4));
    }
    if (sum_shards()) {
      feature_rows.reset();
      dfeature_rows.reset();
      feature_rows = bytes_of(be, T * features * d, 4);
      dfeature_rows = bytes_of(be, T * features * d, 4);
      std::vector<std::int64_t> v(static_cast<std::size_t>(T));
      for (std::int64_t i = 0; i < T; ++i) v[static_cast<std::size_t>(i)] = i;
      identity.reset();
      identity = bytes_of(be, T, 8);
      be.copy_to_device(identity.get(), v.data(), v.size() * 8);
    }
    dx_a = bytes_of(be, T * d, 4);
    dx_b = bytes_of(be, T * d, 4);
    dn = bytes_of(be, T * d, 4);
    dpre = bytes_of(be, T * proj, 4);
    dattn = bytes_of(be, T * hv, 4);
    dy = bytes_of(be, T * hv, 4);
  }
  // Layer l's normed input, SiLU output and norm-multiply output (shared under recompute).
  const Buffer& n1_of(int l) const { return n1[options.recompute ? 0 : l]; }
  const Buffer& act_of(int l) const { return act[options.recompute ? 0 : l]; }
  const Buffer& y_of(int l) const { return y[options.recompute ? 0 : l]; }

  // Row blocks of the longest sequence (contexts + max_len + targets tokens).
  std::int64_t max_blocks() const {
    return (contexts + h.sequence.max_len + targets + kSequenceBlockRows - 1) / kSequenceBlockRows;
  }

  float* params() const { return dense.as<float>(); }
  TableWeights tables() const {
    return TableWeights{emb_weights[0].get(), emb_weights[1].get(), emb_weights[2].get()};
  }

  void initialise() {
    float* p = params();
    auto glorot = [&](std::int64_t at, int out, int in, std::uint64_t stream) {
      const float a = std::sqrt(6.0f / static_cast<float>(in + out));
      be.fill_uniform(p + at, static_cast<std::int64_t>(out) * in, -a, a, seed, stream);
    };
    be.fill(p, dense_count, 0.0f);
    for (int l = 0; l < h.layers; ++l) {
      const Layer& L = layers[static_cast<std::size_t>(l)];
      be.fill(p + L.gamma, d, 1.0f);
      glorot(L.uvqk_w, proj, d, kUvqk << 32 | static_cast<std::uint64_t>(l));
      glorot(L.out_w, d, hv, kOut << 32 | static_cast<std::uint64_t>(l));
    }
    be.fill(p + final_gamma, d, 1.0f);
    glorot(head_w, tasks, d, kHead << 32);
    if (!whole_tables) return;  // the pieces fill themselves (shard())
    std::uint64_t t = 0;
    for (const auto* set : {&feature_tables, &context_tables})
      for (const TableLayout& tl : *set) {
        const float a = 1.0f / std::sqrt(static_cast<float>(tl.dim));
        be.fill_uniform(engine::table_rows(tables(), tl), tl.dtype, tl.rows * tl.dim, -a, a, seed,
                        kTables << 32 | t++);
      }
  }

  // ---- the batch's token layout ----

  // The batch checked and laid out on the host (no backend work: safe on another thread).
  void build(const Batch& b, Layout& L) const {
    if (b.targets != targets || b.tasks != tasks || b.features != features ||
        b.num_tables != contexts)
      throw InputError(fmt::format(
          "model '{}': the batch has {} targets, {} tasks, {} sequence features and {} contextual "
          "ones; the model has {}, {}, {} and {}",
          spec.name, b.targets, b.tasks, b.features, b.num_tables, targets, tasks, features,
          contexts));
    if (b.size < 1 || b.size > max_batch)
      throw InputError(fmt::format("model '{}': a batch of {} examples, expected 1 to {}",
                                   spec.name, b.size, max_batch));
    const std::int64_t batch = b.size;
    L.batch = batch;
    const std::int64_t events = b.events();
    const int max_len = h.sequence.max_len;
    // Each example's shown history: its last max_len events when truncating.
    std::vector<std::int64_t> first(static_cast<std::size_t>(batch)), len(first);
    for (std::int64_t e = 0; e < batch; ++e) {
      const std::int64_t lo = b.history_offsets[e], hi = b.history_offsets[e + 1];
      if (hi < lo) throw InputError(fmt::format("batch example {}: history offsets decrease", e));
      std::int64_t n = hi - lo;
      if (n > max_len && !options.truncate_long_histories)
        throw InputError(fmt::format(
            "batch example {}: a history of {} events, longer than the model's max_len {} "
            "(truncate long histories to keep the most recent ones)",
            e, n, max_len));
      n = std::min<std::int64_t>(n, max_len);
      first[e] = hi - n;
      len[e] = n;
      for (std::int64_t j = hi - n + 1; j < hi; ++j)
        if (b.event_times[j] < b.event_times[j - 1])
          throw InputError(fmt::format("batch example {}: event {} has timestamp {}, before {}", e,
                                       j - lo, b.event_times[j], b.event_times[j - 1]));
      const std::int64_t last = hi > lo ? b.event_times[hi - 1] : 0;
      for (int t = 0; t < targets; ++t)
        if (b.target_times[e * targets + t] < last)
          throw InputError(
              fmt::format("batch example {}: target {} has timestamp {}, before "
                          "the history's last, {}",
                          e, t, b.target_times[e * targets + t], last));
    }
    L.seq.assign(1, 0);
    for (std::int64_t e = 0; e < batch; ++e)
      L.seq.push_back(L.seq.back() + contexts + len[e] + targets);
    const std::int64_t tokens = L.seq.back();
    L.tokens = tokens;
    L.packed_blocks = sequence_blocks(L.seq, L.blocks);

    // Per token its time, its feature bags (one id each for history events, the item only for
    // targets, none for contexts), and the rows of contexts and targets.
    L.times.resize(static_cast<std::size_t>(tokens));
    L.ctx_rows.resize(static_cast<std::size_t>(batch * contexts));
    L.target_rows.resize(static_cast<std::size_t>(batch * targets));
    L.token_ids.clear();
    L.token_ids.reserve(static_cast<std::size_t>(features * tokens));
    L.token_offsets.assign(1, 0);
    L.token_offsets.reserve(static_cast<std::size_t>(features * tokens + 1));
    for (int f = 0; f < features; ++f) {
      const std::int64_t rows = h.sequence.features[static_cast<std::size_t>(f)].rows;
      for (std::int64_t e = 0; e < batch; ++e) {
        for (int c = 0; c < contexts; ++c) L.token_offsets.push_back(L.token_offsets.back());
        for (std::int64_t j = first[e]; j < first[e] + len[e]; ++j) {
          const std::int64_t id = b.event_ids[f * events + j];
          if (id < 0 || id >= rows)
            throw InputError(
                fmt::format("batch example {}: feature '{}' of event {} is id {}, outside [0, {})",
                            e, h.sequence.features[static_cast<std::size_t>(f)].name,
                            j - b.history_offsets[e], id, rows));
          L.token_ids.push_back(id);
          L.token_offsets.push_back(L.token_offsets.back() + 1);
        }
        for (int t = 0; t < targets; ++t) {
          if (f == 0) {
            const std::int64_t id = b.target_ids[e * targets + t];
            if (id < 0 || id >= rows)
              throw InputError(fmt::format(
                  "batch example {}: target {} is item {}, outside [0, {})", e, t, id, rows));
            L.token_ids.push_back(id);
          }
          L.token_offsets.push_back(static_cast<std::int64_t>(L.token_ids.size()));
        }
      }
    }
    for (std::int64_t e = 0; e < batch; ++e) {
      const std::int64_t s = L.seq[e];
      const std::int64_t t0 = len[e] > 0 ? b.event_times[first[e]] : b.target_times[e * targets];
      for (int c = 0; c < contexts; ++c) {
        L.times[s + c] = t0;
        L.ctx_rows[e * contexts + c] = s + c;
      }
      for (std::int64_t j = 0; j < len[e]; ++j)
        L.times[s + contexts + j] = b.event_times[first[e] + j];
      for (int t = 0; t < targets; ++t) {
        L.times[s + contexts + len[e] + t] = b.target_times[e * targets + t];
        L.target_rows[e * targets + t] = s + contexts + len[e] + t;
      }
    }
    if (static_cast<std::int64_t>(b.offsets.size()) != contexts * batch + 1 ||
        static_cast<std::int64_t>(b.ids.size()) < b.offsets.back() ||
        b.offsets.back() > batch * ctx_lookups)
      throw InputError(
          fmt::format("model '{}': the batch's contextual CSR has {} offsets and {} ids, "
                      "expected {} offsets and at most {} ids (the tables' pooling sizes)",
                      spec.name, b.offsets.size(), b.offsets.empty() ? 0 : b.offsets.back(),
                      contexts * batch + 1, batch * ctx_lookups));
    if (b.labels.size() != static_cast<std::size_t>(batch * targets * tasks))
      throw InputError(fmt::format("model '{}': the batch has {} labels, expected {}", spec.name,
                                   b.labels.size(), batch * targets * tasks));
  }

  // The layout's arrays and the batch's own into the step's buffers (grown when the batch has
  // more tokens than they hold: rare where a plan sized them, then an eighth more than asked).
  void upload(const Batch& b, const Layout& L) {
    host_batch = &b;
    host_layout = &L;
    batch = L.batch;
    tokens = L.tokens;
    event_nnz = static_cast<std::int64_t>(L.token_ids.size());
    ctx_nnz = b.offsets.empty() ? 0 : b.offsets.back();  // given, so no op reads it back
    if (tokens > token_capacity) {
      allocate_tokens(std::min(max_tokens, tokens + tokens / 8));
      ++capacity_growths;
    }
    // The arrays go in from the layout's pinned staging where layout() packed them (on the
    // caller's thread, ahead of the step), else from where they are.
    const std::array<Part, kParts> parts = parts_of(b, L);
    const Staging* st = L.staged.get();
    bool packed = st != nullptr && st->p != nullptr && st->sizes.size() == kParts;
    for (std::size_t i = 0; packed && i < kParts; ++i) packed = st->sizes[i] == parts[i].bytes;
    Buffer* dst[kParts] = {&token_ids, &token_offsets, &ctx_ids,     &ctx_offsets, &seq_offsets,
                           &times,     &ctx_rows,      &target_rows, &blocks,      &labels};
    const char* at = packed ? static_cast<const char*>(st->p) : nullptr;
    for (std::size_t i = 0; i < kParts; ++i) {
      if (parts[i].bytes == 0) continue;
      be.copy_to_device(dst[i]->get(), packed ? at : parts[i].src, parts[i].bytes);
      if (packed) at += staged_size(parts[i].bytes);
    }
    block_count = static_cast<std::int64_t>(L.blocks.size());
    packed_blocks = L.packed_blocks;
    if (packed) L.staged->done = be.fence();  // the copies that read it: pack() waits for them
  }

  // The arrays upload() copies in, in its order: the layout's and the batch's contextual ids,
  // offsets and labels.
  struct Part {
    const void* src;
    std::size_t bytes;
  };
  static constexpr std::size_t kParts = 10;
  static std::array<Part, kParts> parts_of(const Batch& b, const Layout& L) {
    const auto bytes = [](const auto& v) { return v.size() * sizeof(v[0]); };
    return {{{L.token_ids.data(), bytes(L.token_ids)},
             {L.token_offsets.data(), bytes(L.token_offsets)},
             {b.ids.data(), static_cast<std::size_t>(b.offsets.empty() ? 0 : b.offsets.back()) * 8},
             {b.offsets.data(), bytes(b.offsets)},
             {L.seq.data(), bytes(L.seq)},
             {L.times.data(), bytes(L.times)},
             {L.ctx_rows.data(), bytes(L.ctx_rows)},
             {L.target_rows.data(), bytes(L.target_rows)},
             {L.blocks.data(), bytes(L.blocks)},
             {b.labels.data(), bytes(b.labels)}}};
  }
  static std::size_t staged_size(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

  // Packs the arrays upload() copies in into L's pinned staging (backends that copy in the
  // background: a copy from pageable memory waits for the work enqueued before it). Waits for
  // the copies of the staging's last use first; grows it (an eighth more than asked) when the
  // step needs more. Thread-safe (layout()'s caller may run it beside a step).
  void pack(const Batch& b, Layout& L) const {
    if (!be.copies_in_background()) return;
    const std::array<Part, kParts> parts = parts_of(b, L);
    std::size_t need = 0;
    for (const Part& part : parts) need += staged_size(part.bytes);
    if (!L.staged) L.staged = std::make_shared<Staging>();
    Staging& st = *L.staged;
    st.wait();
    if (st.bytes < need) {
      st.release();
      st.be = &be;
      st.p = be.allocate_pinned(need + need / 8);
      st.bytes = need + need / 8;
    }
    char* at = static_cast<char*>(st.p);
    st.sizes.clear();
    for (const Part& part : parts) {
      if (part.bytes > 0) std::memcpy(at, part.src, part.bytes);
      at += staged_size(part.bytes);
      st.sizes.push_back(part.bytes);
    }
  }

  // tensors()'s list; without the tables: dense_tensors()'s.
  std::vector<TensorRef> tensor_refs(bool with_tables);

  void stage(const Batch& b) {
    build(b, own);
    pack(b, own);
    upload(b, own);
  }

  SparseInput event_input() const {
    return {tokens, features, token_ids.as<const std::int64_t>(),
            token_offsets.as<const std::int64_t>(), event_nnz};
  }
  SparseInput context_input() const {
    return {batch, contexts, ctx_ids.as<const std::int64_t>(), ctx_offsets.as<const std::int64_t>(),
            ctx_nnz};
  }
  SequenceBatch sequences() const {
    SequenceBatch s;
    s.batch = batch;
    s.tokens = tokens;
    s.max_len = contexts + h.sequence.max_len + targets;
    s.targets = targets;
    s.offsets = seq_offsets.as<const std::int64_t>();
    s.timestamps = times.as<const std::int64_t>();
    s.blocks = blocks.as<const std::int64_t>();
    s.block_count = block_count;
    s.packed_blocks = packed_blocks;
    return s;
  }
  HstuAttention attention(const Layer& L, const float* base) const {
    HstuAttention a;
    a.heads = h.heads;
    a.attention_dim = h.attention_dim;
    a.value_dim = h.value_dim;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(h.attention_dim)));
    a.inv_n =
        static_cast<float>(1.0 / static_cast<double>(contexts + h.sequence.max_len + targets));
    a.position_buckets = h.position_buckets;
    a.time_buckets = h.time_buckets;
    a.position = base + L.position;
    a.time = base + L.time;
    return a;
  }
  const std::string& op_name(int layer, LayerOp op) const {
    return op_names[static_cast<std::size_t>(layer * kLayerOpCount + op)];
  }
  Mat mat(const Buffer& b, std::int64_t rows, std::int64_t cols) const {
    return Mat(b.as<float>(), rows, cols);
  }
  CMat weight(std::int64_t at, std::int64_t rows, std::int64_t cols) const {
    return CMat(params() + at, rows, cols);
  }

  // ---- forward ----

  void forward() {
    const std::int64_t T = tokens, BT = batch * targets;
    profiler.section("embedding_forward");
    Mat x0 = mat(x[0], T, d);
    if (feature_shards) {
      const Layout& L = *host_layout;
      const SparseInput in{T, features, L.token_ids.data(), L.token_offsets.data(), event_nnz};
      if (sum_shards()) {  // the features' rows side by side, then summed per token
        const Mat rows = mat(feature_rows, T, static_cast<std::int64_t>(features) * d);
        feature_shards->forward(in, rows);
        be.gather_rows(rows.cols_slice(0, d), identity.as<const std::int64_t>(), x0);
        for (int f = 1; f < features; ++f) be.add_into(rows.cols_slice(f * d, d), x0);
      } else {
        feature_shards->forward(in, x0);
      }
    } else if (h.sequence.combine == EventCombine::sum) {
      be.embedding_sum_forward(feature_tables, tables(), event_input(), x0);
    } else {
      be.embedding_forward(feature_tables, tables(), event_input(), x0);
    }
    if (contexts > 0) {
      const Mat pooled = mat(ctx_out, batch, static_cast<std::int64_t>(contexts) * d);
      if (context_shards)
        context_shards->forward(
            SparseInput{batch, contexts, host_batch->ids.data(), host_batch->offsets.data(), -1},
            pooled);
      else
        be.embedding_forward(context_tables, tables(), context_input(), pooled);
      be.scatter_add_rows(mat(ctx_out, batch * contexts, d), ctx_rows.as<const std::int64_t>(), x0);
    }
    const SequenceBatch seq = sequences();
    const float* p = params();
    for (int l = 0; l < h.layers; ++l) {
      const Layer& L = layers[static_cast<std::size_t>(l)];
      const auto i = static_cast<std::size_t>(l);
      profiler.section("norms", op_name(l, kNormForward));
      be.layer_norm_forward(mat(x[i], T, d), p + L.gamma, p + L.beta, kNormEps, mat(n1_of(l), T, d),
                            mean1[i].as<float>(), rstd1[i].as<float>());
      profiler.section("projections", op_name(l, kProjectionForward));
      be.linear_forward(mat(n1_of(l), T, d), weight(L.uvqk_w, proj, d), p + L.uvqk_b,
                        Activation::none, mat(pre[i], T, proj));
      profiler.section("projections", op_name(l, kSiluForward));
      be.silu_forward(mat(pre[i], T, proj), mat(act_of(l), T, proj));
      const Mat s = mat(act_of(l), T, proj);
      profiler.section("attention", op_name(l, kAttentionForward));
      be.hstu_attention_forward(seq, attention(L, p), s.cols_slice(2 * hv, ha),
                                s.cols_slice(2 * hv + ha, ha), s.cols_slice(hv, hv),
                                mat(attn[i], T, hv));
      profiler.section("norms", op_name(l, kNormMulForward));
      be.norm_mul_forward(mat(attn[i], T, hv), s.cols_slice(0, hv), kNormEps, mat(y_of(l), T, hv),
                          mean2[i].as<float>(), rstd2[i].as<float>());
      profiler.section("projections", op_name(l, kOutputForward));
      be.linear_forward(mat(y_of(l), T, hv), weight(L.out_w, d, hv), p + L.out_b, Activation::none,
                        mat(x[i + 1], T, d));
      profiler.section("projections", op_name(l, kResidualForward));
      be.add_into(mat(x[i], T, d), mat(x[i + 1], T, d));
    }
    profiler.section("head");
    be.gather_rows(mat(x[static_cast<std::size_t>(h.layers)], T, d),
                   target_rows.as<const std::int64_t>(), mat(final_in, BT, d));
    be.layer_norm_forward(mat(final_in, BT, d), p + final_gamma, p + final_beta, kNormEps,
                          mat(final_out, BT, d), final_mean.as<float>(), final_rstd.as<float>());
    be.linear_forward(mat(final_out, BT, d), weight(head_w, tasks, d), p + head_b, Activation::none,
                      mat(logits, BT, tasks));
  }

  // ---- backward and update ----

  // Layer l's activations that recompute does not keep, formed again from what it keeps (x, the
  // projection before SiLU, the attention output) by the forward's own ops: the same bits, so
  // the backward is the one without recompute. The statistics are written again with their
  // values.
  void recompute_layer(int l) {
    const std::int64_t T = tokens;
    const Layer& L = layers[static_cast<std::size_t>(l)];
    const auto i = static_cast<std::size_t>(l);
    const float* p = params();
    profiler.section("recompute", op_name(l, kRecompute));
    be.layer_norm_forward(mat(x[i], T, d), p + L.gamma, p + L.beta, kNormEps, mat(n1_of(l), T, d),
                          mean1[i].as<float>(), rstd1[i].as<float>());
    be.silu_forward(mat(pre[i], T, proj), mat(act_of(l), T, proj));
    be.norm_mul_forward(mat(attn[i], T, hv), mat(act_of(l), T, proj).cols_slice(0, hv), kNormEps,
                        mat(y_of(l), T, hv), mean2[i].as<float>(), rstd2[i].as<float>());
  }

  void backward_and_update() {
    const std::int64_t T = tokens, BT = batch * targets;
    float* p = params();
    float* g = grads.as<float>();
    profiler.section("head");
    be.bce_with_logits(logits.as<float>(), labels.as<float>(), BT * tasks, dlogits.as<float>(),
                       loss.as<float>());
    if (comm != nullptr && comm->size() > 1) {
      // This rank's mean-loss gradient scaled by its share of the step's examples: the ranks'
      // summed gradients are then the mean loss's over all of them.
      double global = static_cast<double>(host_layout->global_batch);
      if (global <= 0) {
        global = static_cast<double>(batch);
        comm->all_reduce_sum(std::span<double>(&global, 1));
      }
      be.scale_rows(nullptr, static_cast<float>(static_cast<double>(batch) / global),
                    mat(dlogits, BT * tasks, 1));
    }
    be.linear_backward(mat(final_out, BT, d), weight(head_w, tasks, d), mat(logits, BT, tasks),
                       mat(dlogits, BT, tasks), Activation::none, mat(dfinal, BT, d),
                       Mat(g + head_w, tasks, d), g + head_b);
    be.layer_norm_backward(mat(final_in, BT, d), p + final_gamma, final_mean.as<float>(),
                           final_rstd.as<float>(), mat(dfinal, BT, d), mat(final_out, BT, d),
                           g + final_gamma, g + final_beta);
    // The dense gradients are final as a tail of the buffer (the head and final norm, then
    // layer by layer from the last): each bucket goes to the all-reduce once the backward has
    // made it.
    if (dense_buckets) dense_buckets->begin();
    auto final_from = [&](std::int64_t from) {
      if (dense_buckets) dense_buckets->final_from(from);
    };
    final_from(final_gamma);
    Buffer* dx = &dx_a;  // the gradient of the current layer's output
    Buffer* other = &dx_b;
    be.fill(dx->as<float>(), T * d, 0.0f);
    be.scatter_add_rows(mat(final_out, BT, d), target_rows.as<const std::int64_t>(),
                        mat(*dx, T, d));
    const SequenceBatch seq = sequences();
    for (int l = h.layers - 1; l >= 0; --l) {
      const Layer& L = layers[static_cast<std::size_t>(l)];
      const auto i = static_cast<std::size_t>(l);
      const Mat s = mat(act_of(l), T, proj);
      const Mat ds = mat(dpre, T, proj);
      if (options.recompute) recompute_layer(l);
      profiler.section("projections", op_name(l, kOutputBackward));
      be.linear_backward(mat(y_of(l), T, hv), weight(L.out_w, d, hv), mat(x[i + 1], T, d),
                         mat(*dx, T, d), Activation::none, mat(dy, T, hv), Mat(g + L.out_w, d, hv),
                         g + L.out_b);
      profiler.section("norms", op_name(l, kNormMulBackward));
      be.norm_mul_backward(mat(attn[i], T, hv), s.cols_slice(0, hv), mean2[i].as<float>(),
                           rstd2[i].as<float>(), mat(dy, T, hv), mat(dattn, T, hv),
                           ds.cols_slice(0, hv));
      profiler.section("attention", op_name(l, kAttentionBackward));
      be.hstu_attention_backward(
          seq, attention(L, p), s.cols_slice(2 * hv, ha), s.cols_slice(2 * hv + ha, ha),
          s.cols_slice(hv, hv), mat(dattn, T, hv), ds.cols_slice(2 * hv, ha),
          ds.cols_slice(2 * hv + ha, ha), ds.cols_slice(hv, hv), g + L.position, g + L.time);
      profiler.section("projections", op_name(l, kSiluBackward));
      be.silu_backward(mat(pre[i], T, proj), ds, ds);
      profiler.section("projections", op_name(l, kProjectionBackward));
      be.linear_backward(mat(n1_of(l), T, d), weight(L.uvqk_w, proj, d), mat(pre[i], T, proj), ds,
                         Activation::none, mat(dn, T, d), Mat(g + L.uvqk_w, proj, d), g + L.uvqk_b);
      profiler.section("norms", op_name(l, kNormBackward));
      be.layer_norm_backward(mat(x[i], T, d), p + L.gamma, mean1[i].as<float>(),
                             rstd1[i].as<float>(), mat(dn, T, d), mat(*other, T, d), g + L.gamma,
                             g + L.beta);
      be.add_into(mat(*dx, T, d), mat(*other, T, d));  // the residual's gradient
      std::swap(dx, other);
      final_from(L.gamma);
    }
    // *dx is the gradient of x_0: the tables' updates, fused with their optimizer.
    // This step's learning rates: the recipe's warm-up after a larger batch.
    const double lr_factor = spec.lr_factor(step);
    const OptimizerParams emb = engine::optimizer_params(spec.embedding_optimizer, lr_factor);
    ++step;
    const StochasticRounding rounding{seed, static_cast<std::uint64_t>(step)};
    if (dense_buckets) {  // data-parallel dense layers: every rank's gradients summed
      if (!dense_buckets->overlapped()) profiler.section("dense_allreduce_exposed");
      dense_buckets->finish();
      if (dense_buckets->overlapped() && !dense_buckets->beside_other_collectives()) {
        // NCCL: the buckets finish before the exchange's collectives start.
        profiler.section("dense_allreduce_exposed");
        dense_buckets->wait();
      }
    }
    profiler.section("embedding_backward");
    if (sum_shards()) {  // each feature's rows had the token's gradient
      const Mat rows = mat(dfeature_rows, T, static_cast<std::int64_t>(features) * d);
      for (int f = 0; f < features; ++f)
        be.gather_rows(mat(*dx, T, d), identity.as<const std::int64_t>(),
                       rows.cols_slice(f * d, d));
      feature_shards->backward_update(rows, emb, rounding);
    } else if (feature_shards) {
      feature_shards->backward_update(mat(*dx, T, d), emb, rounding);
    } else {
      be.embedding_backward_update(feature_tables, tables(), emb_state.as<float>(), event_input(),
                                   mat(*dx, T, d), emb, rounding);
    }
    if (contexts > 0) {
      be.gather_rows(mat(*dx, T, d), ctx_rows.as<const std::int64_t>(),
                     mat(dctx, batch * contexts, d));
      const Mat dpooled = mat(dctx, batch, static_cast<std::int64_t>(contexts) * d);
      const StochasticRounding ctx_rounding{rounding.seed ^ 0xc0, rounding.step};
      if (context_shards)
        context_shards->backward_update(dpooled, emb, ctx_rounding);
      else
        be.embedding_backward_update(context_tables, tables(), emb_state.as<float>(),
                                     context_input(), dpooled, emb, ctx_rounding);
    }
    if (dense_buckets && dense_buckets->overlapped()) {  // what the exchange did not hide
      profiler.section("dense_allreduce_exposed");
      dense_buckets->wait();
    }
    profiler.section("dense_optimizer");
    be.dense_optimizer_step(p, g, dense_state.as<float>(), dense_count,
                            engine::optimizer_params(spec.dense_optimizer, lr_factor), step);
  }
};

HstuModel::HstuModel(const ModelSpec& spec, Backend& backend, std::int64_t max_batch,
                     std::uint64_t seed, Options options, const Plan* shard_plan,
                     Communicator* comm, std::size_t dense_bucket_bytes) {
  if (spec.kind != ModelKind::hstu || !spec.hstu)
    throw InputError(fmt::format("model '{}' is a {} model; HstuModel runs HSTU models", spec.name,
                                 model_kind_name(spec.kind)));
  if ((shard_plan == nullptr) != (comm == nullptr))
    throw Error("HstuModel: a sharded model needs both its plan and its communicator");
  impl_ = std::make_unique<Impl>(
      spec, backend, max_batch, seed, options,
      shard_plan == nullptr || ShardedEmbedding::every_table_whole(*shard_plan, *comm));
  if (shard_plan != nullptr) shard(*shard_plan, *comm, dense_bucket_bytes);
}

HstuModel::~HstuModel() = default;

void HstuModel::train_step(const Batch& batch) {
  impl_->build(batch, impl_->own);
  impl_->pack(batch, impl_->own);
  train_step(batch, impl_->own);
}

void HstuModel::layout(const Batch& batch, Layout& out) const {
  impl_->build(batch, out);
  impl_->pack(batch, out);
}

void HstuModel::train_step(const Batch& batch, const Layout& layout) {
  impl_->profiler.section("input");
  impl_->upload(batch, layout);
  impl_->forward();
  impl_->backward_and_update();
  impl_->profiler.end_step();
}

void HstuModel::set_profiling(bool on) {
  impl_->profiler.set_enabled(on);
}
void HstuModel::finish_profile() {
  impl_->profiler.finish();
}
const std::map<std::string, double>& HstuModel::profile_ms() const {
  return impl_->profiler.category_ms();
}
const std::map<std::string, double>& HstuModel::profile_ops_ms() const {
  return impl_->profiler.op_ms();
}
const std::map<std::string, double>& HstuModel::profile_host_ops_ms() const {
  return impl_->profiler.host_op_ms();
}
std::int64_t HstuModel::profiled_steps() const {
  return impl_->profiler.steps();
}

float HstuModel::last_loss() {
  float v = 0.0f;
  impl_->be.copy_to_host(&v, impl_->loss.get(), 4);
  return v;
}

void HstuModel::predict(const Batch& batch, float* probs) {
  Impl& m = *impl_;
  const engine::StepProfiler::Pause pause(m.profiler);
  m.stage(batch);
  m.forward();
  const std::int64_t n = m.batch * m.targets * m.tasks;
  m.be.sigmoid(m.logits.as<float>(), m.dlogits.as<float>(), n);
  m.be.copy_to_host(probs, m.dlogits.get(), static_cast<std::size_t>(n) * 4);
}

std::int64_t HstuModel::step() const {
  return impl_->step;
}
void HstuModel::set_step(std::int64_t s) {
  impl_->step = s;
}
const ModelSpec& HstuModel::spec() const {
  return impl_->spec;
}
std::int64_t HstuModel::max_tokens() const {
  return impl_->max_tokens;
}
std::int64_t HstuModel::dense_parameter_count() const {
  return impl_->dense_count;
}
std::int64_t HstuModel::embedding_parameter_count() const {
  return impl_->emb_count;
}

std::map<std::string, std::size_t> HstuModel::allocated_bytes_by_category() const {
  const Impl& m = *impl_;
  std::map<std::string, std::size_t> out;
  auto add = [&](const char* category, std::initializer_list<const Buffer*> buffers) {
    for (const Buffer* b : buffers) out[category] += b->bytes();
  };
  add("embedding_weights", {&m.emb_weights[0], &m.emb_weights[1], &m.emb_weights[2]});
  add("embedding_optimizer_state", {&m.emb_state});
  for (const ShardedEmbedding* sh : {m.feature_shards.get(), m.context_shards.get()})
    if (sh != nullptr) {  // this rank's pieces, in the backend's memory
      out["embedding_weights"] += sh->weight_bytes();
      out["embedding_optimizer_state"] += sh->state_bytes();
      out["embedding_exchange"] += sh->exchange_bytes();
    }
  if (m.feature_shards) add("embedding_exchange", {&m.feature_rows, &m.dfeature_rows, &m.identity});
  add("dense_parameters_and_state", {&m.dense, &m.grads, &m.dense_state});
  add("input_slots", {&m.token_ids, &m.token_offsets, &m.times, &m.ctx_ids, &m.ctx_offsets,
                      &m.seq_offsets, &m.blocks, &m.ctx_rows, &m.target_rows, &m.labels});
  add("activations",
      {&m.ctx_out, &m.final_in, &m.final_out, &m.final_mean, &m.final_rstd, &m.logits, &m.loss});
  for (const auto* v :
       {&m.x, &m.n1, &m.mean1, &m.rstd1, &m.pre, &m.act, &m.attn, &m.y, &m.mean2, &m.rstd2})
    for (const Buffer& b : *v) out["activations"] += b.bytes();
  add("gradients",
      {&m.dlogits, &m.dx_a, &m.dx_b, &m.dn, &m.dpre, &m.dattn, &m.dy, &m.dfinal, &m.dctx});
  return out;
}

std::size_t HstuModel::allocated_bytes() const {
  std::size_t total = 0;
  for (const auto& [category, bytes] : allocated_bytes_by_category()) total += bytes;
  return total;
}

std::int64_t HstuModel::token_capacity() const {
  return impl_->token_capacity;
}
int HstuModel::token_capacity_growths() const {
  return impl_->capacity_growths;
}

std::vector<TensorRef> HstuModel::Impl::tensor_refs(bool with_tables) {
  Impl& m = *this;
  std::vector<TensorRef> out;
  float* p = m.params();
  auto f32 = [&](std::string name, std::vector<std::int64_t> shape, float* at) {
    out.push_back(TensorRef{std::move(name), DType::f32, std::move(shape), at});
  };
  const std::int64_t d = m.d;
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const Layer& L = m.layers[l];
    f32(fmt::format("layer.{}.norm.gamma", l), {d}, p + L.gamma);
    f32(fmt::format("layer.{}.norm.beta", l), {d}, p + L.beta);
    f32(fmt::format("layer.{}.uvqk.weight", l), {m.proj, d}, p + L.uvqk_w);
    f32(fmt::format("layer.{}.uvqk.bias", l), {m.proj}, p + L.uvqk_b);
    f32(fmt::format("layer.{}.out.weight", l), {d, m.hv}, p + L.out_w);
    f32(fmt::format("layer.{}.out.bias", l), {d}, p + L.out_b);
    f32(fmt::format("layer.{}.rab.position", l), {m.h.heads, m.h.position_buckets}, p + L.position);
    f32(fmt::format("layer.{}.rab.time", l), {m.h.heads, m.h.time_buckets}, p + L.time);
  }
  f32("final_norm.gamma", {d}, p + m.final_gamma);
  f32("final_norm.beta", {d}, p + m.final_beta);
  f32("head.weight", {m.tasks, d}, p + m.head_w);
  f32("head.bias", {m.tasks}, p + m.head_b);
  // Where the tables are sharded the whole tables are gone: their names and shapes only.
  const bool sharded_tables = feature_shards != nullptr;
  auto tables = [&](const std::vector<TableLayout>& set, const std::vector<TableSpec>& specs) {
    for (std::size_t t = 0; t < set.size(); ++t) {
      const TableLayout& l = set[t];
      out.push_back(TensorRef{fmt::format("embedding.{}.weight", specs[t].name),
                              l.dtype,
                              {l.rows, l.dim},
                              sharded_tables ? nullptr : engine::table_rows(m.tables(), l)});
      float* state = sharded_tables ? nullptr : engine::table_state(m.emb_state.as<float>(), l);
      if (m.emb_opt.kind == OptimizerKind::adagrad)
        f32(fmt::format("optimizer.embedding.{}.state", specs[t].name), {l.rows, l.dim}, state);
      if (m.emb_opt.kind == OptimizerKind::rowwise_adagrad)
        f32(fmt::format("optimizer.embedding.{}.state", specs[t].name), {l.rows}, state);
    }
  };
  if (with_tables) {
    tables(m.feature_tables, m.h.sequence.features);
    tables(m.context_tables, m.spec.tables);
  }
  const int k = optimizer_state_per_element(m.dense_opt.kind);
  if (k > 0) f32("optimizer.dense.state", {k, m.dense_count}, m.dense_state.as<float>());
  return out;
}

std::vector<TensorRef> HstuModel::tensors() {
  if (impl_->feature_shards)
    throw Error(
        "HstuModel::tensors: the tables of a sharded model live in its shards; checkpoints of a "
        "sharded model go through HstuModel::checkpoint_layout");
  return impl_->tensor_refs(true);
}

std::vector<TensorRef> HstuModel::dense_tensors() {
  return impl_->tensor_refs(false);
}

void HstuModel::shard(const Plan& plan, Communicator& comm, std::size_t dense_bucket_bytes) {
  Impl& m = *impl_;
  if (m.step > 0 || m.comm != nullptr)
    throw Error("HstuModel::shard: call it once, before the first step");
  if (plan.gpus != comm.size())
    throw InputError(
        fmt::format("the plan is for {} GPUs and this run has {} ranks", plan.gpus, comm.size()));
  (void)apply_plan(m.spec, plan);  // the plan's tables are the model's, their shards well formed
  const auto F = static_cast<std::size_t>(m.features);
  if (!ShardedEmbedding::every_table_whole(plan, comm)) {
    std::vector<const TableLayout*> layouts;
    for (const auto* set : {&m.feature_tables, &m.context_tables})
      for (const TableLayout& l : *set) layouts.push_back(&l);
    for (std::size_t t = 0; t < plan.tables.size(); ++t)
      if (plan.tables[t].dtype != layouts[t]->dtype)
        throw InputError(fmt::format(
            "plan table '{}' is {} and the model's is {} (build the model from apply_plan(model, "
            "plan))",
            plan.tables[t].name, dtype_name(plan.tables[t].dtype), dtype_name(layouts[t]->dtype)));
    const std::vector<TablePlan> features(plan.tables.begin(),
                                          plan.tables.begin() + static_cast<std::ptrdiff_t>(F));
    const std::vector<TablePlan> contexts(plan.tables.begin() + static_cast<std::ptrdiff_t>(F),
                                          plan.tables.end());
    // The pieces start from the values the whole tables start from (initialise(): stream t over
    // the sequence features, then the contextual tables), computed for their own rows and columns.
    auto init = [&m](std::uint64_t first) {
      return [&m, first](int t, std::int64_t r, int c) {
        const TableLayout& l = first == 0 ? m.feature_tables[static_cast<std::size_t>(t)]
                                          : m.context_tables[static_cast<std::size_t>(t)];
        const float a = 1.0f / std::sqrt(static_cast<float>(l.dim));
        const std::uint64_t key =
            rng::key(m.seed, kTables << 32 | (first + static_cast<std::uint64_t>(t)));
        const auto i = static_cast<std::uint64_t>(r * l.dim + c);
        return static_cast<float>(-a + (a - -a) * rng::uniform01(key, i));  // as fill_uniform
      };
    };
    auto mark = [&m](const char* category) { m.profiler.section(category); };
    m.feature_shards = std::make_unique<ShardedEmbedding>(m.h.sequence.features, features,
                                                          m.emb_opt.kind, comm, m.be);
    m.feature_shards->fill(init(0), initial_optimizer_state(m.emb_opt));
    m.feature_shards->set_marker(mark);
    if (m.contexts > 0) {
      m.context_shards =
          std::make_unique<ShardedEmbedding>(m.spec.tables, contexts, m.emb_opt.kind, comm, m.be);
      m.context_shards->fill(init(F), initial_optimizer_state(m.emb_opt));
      m.context_shards->set_marker(mark);
    }
    for (Buffer& b : m.emb_weights) b = Buffer();
    m.emb_state = Buffer();
    m.allocate_tokens(m.token_capacity);  // with the summed features' side-by-side rows
  }
  m.comm = &comm;
  // Every rank builds them here, at the same point (a duplicate communicator is asked for).
  m.dense_buckets = std::make_unique<DenseGradientBuckets>(comm, m.be, m.grads.as<float>(),
                                                           m.dense_count, dense_bucket_bytes);
}

bool HstuModel::dense_allreduce_overlapped() const {
  return impl_->dense_buckets && impl_->dense_buckets->overlapped();
}

bool HstuModel::sharded() const {
  return impl_->feature_shards != nullptr;
}

CheckpointLayout HstuModel::checkpoint_layout() {
  Impl& m = *impl_;
  if (!m.feature_shards) return whole_tensor_layout(tensors());
  CheckpointLayout out;
  for (const TensorRef& t : m.tensor_refs(true)) out.tensors.push_back({t.name, t.dtype, t.shape});
  // Dense tensors are the same on every rank: rank 0 writes them, every rank loads them.
  CheckpointLayout dense = whole_tensor_layout(dense_tensors());
  for (CheckpointPiece& p : dense.pieces) {
    p.write = m.comm->rank() == 0;
    out.pieces.push_back(std::move(p));
  }
  for (ShardedEmbedding* sh : {m.feature_shards.get(), m.context_shards.get()})
    if (sh != nullptr)
      for (CheckpointPiece& p : sh->checkpoint_pieces()) out.pieces.push_back(std::move(p));
  return out;
}

std::optional<float> HstuModel::table_value(int t, std::int64_t row, int col) {
  Impl& m = *impl_;
  if (m.feature_shards)
    return t < m.features ? m.feature_shards->weight(t, row, col)
                          : m.context_shards->weight(t - m.features, row, col);
  const TableLayout& l = t < m.features
                             ? m.feature_tables[static_cast<std::size_t>(t)]
                             : m.context_tables[static_cast<std::size_t>(t - m.features)];
  if (l.dtype != DType::f32) throw Error("HstuModel::table_value: an fp32 table's values only");
  float v = 0;
  m.be.copy_to_host(
      &v, static_cast<const float*>(engine::table_rows(m.tables(), l)) + row * l.dim + col,
      sizeof v);
  return v;
}

}  // namespace parity
