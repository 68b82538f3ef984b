// GpuBackend (see gpu_backend.h): shape checks, the mapping of each op onto library products
// (blas.h) and the kernels of the op files (one .cu/.h pair per op), and the adapter to the
// embedding module. Scratch, held-operand copies and the input queue are their own classes
// (scratch.h, operand_cache.h, input_queue.h).
//
// Products, in parity's row-major terms (blas.h maps them onto the column-major library):
//   linear forward   y [B, out]  = x [B, in] · wᵀ            (+ bias, relu in the epilogue)
//   linear backward  dw [out, in] = dzᵀ · x;  dx [B, in] = dz · w;  dbias = Σ_rows dz
//   cross forward    u [B, r] = xl · vᵀ;  z [B, N] = u · wᵀ + bias;  x_next = x0 ⊙ z + xl
//   cross backward   dw [N, r] = dzᵀ · u;  du [B, r] = dz · w;  dv [r, N] = duᵀ · xl;
//                    dxl = g + du · v  (the product reads g as its addend C, beta 1)
// Under DenseMath::bf16 an operand stored in bf16 (an activation) is read as it is; an fp32
// operand is converted to a bf16 copy (rows 16-byte aligned), the original untouched. An fp32
// operand in memory the engine holds constant (hold_constant) is converted once per step and
// the copy reused (operand_cache.h).
#include "backend/gpu/gpu_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/checks.h"
#include "backend/gpu/blas.h"
#include "backend/gpu/column_sum.h"
#include "backend/gpu/convert.h"
#include "backend/gpu/cross.h"
#include "backend/gpu/dense_optimizer.h"
#include "backend/gpu/dot_interaction.h"
#include "backend/gpu/embedding.h"
#include "backend/gpu/fill.h"
#include "backend/gpu/finite_guard.h"
#include "backend/gpu/hstu_attention.h"
#include "backend/gpu/input_queue.h"
#include "backend/gpu/linear.h"
#include "backend/gpu/loss.h"
#include "backend/gpu/memory_test.h"
#include "backend/gpu/operand_cache.h"
#include "backend/gpu/port.h"
#include "backend/gpu/product_checks.h"
#include "backend/gpu/runtime.h"
#include "backend/gpu/scratch.h"
#include "backend/gpu/sequence.h"
#include "backend/gpu/synthetic.h"
#include "parity/error.h"

namespace parity {

namespace {

using backend_checks::check_shape;  // the CPU backend's checks and messages (backend/checks.h)
using backend_checks::check_view;
using backend_checks::fail;
using gpu::Bf16;
using Slot = gpu::ScratchSlot;

gpu::GemmMath gemm_math(DenseMath m) {
  switch (m) {
    case DenseMath::fp32:
      return gpu::GemmMath::fp32;
    case DenseMath::tf32:
      return gpu::GemmMath::tf32;
    case DenseMath::bf16:
      return gpu::GemmMath::bf16;
    case DenseMath::fp16:
      break;
  }
  throw Error(fmt::format("GpuBackend: dense math {} is not implemented (use fp32, tf32 or bf16)",
                          dense_math_name(m)));
}

gpu::Epilogue epilogue_of(bool bias, Activation act) {
  const bool relu = act == Activation::relu;
  if (bias) return relu ? gpu::Epilogue::relu_bias : gpu::Epilogue::bias;
  return relu ? gpu::Epilogue::relu : gpu::Epilogue::none;
}

bool same_layouts(std::span<const TableLayout> a, const std::vector<TableLayout>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const TableLayout& x = a[i];
    const TableLayout& y = b[i];
    if (x.rows != y.rows || x.dim != y.dim || x.pooling != y.pooling ||
        x.weight_offset != y.weight_offset || x.state_offset != y.state_offset ||
        x.out_col != y.out_col || x.dtype != y.dtype || x.host.weights != y.host.weights ||
        x.host.state != y.host.state || x.host.slot != y.host.slot ||
        x.round_table != y.round_table || x.round_row != y.round_row ||
        x.round_col != y.round_col || x.ids_per_bag != y.ids_per_bag)
      return false;
  }
  return true;
}

// The checks both embedding ops make before the module's own (`m`: the output or its gradient).
void check_embedding_call(const char* op, const char* name, CAMat m, const SparseInput& in,
                          std::span<const TableLayout> tables) {
  check_view(op, name, m);
  if (m.rows != in.batch) fail(op, "{} has {} rows, the batch is {}", name, m.rows, in.batch);
  if (in.num_tables != static_cast<int>(tables.size()))
    fail(op, "the input has {} tables, the layout {}", in.num_tables, tables.size());
}

// Rows of a bf16 copy start 16-byte aligned (8 elements): the library's fast kernels want aligned
// rows, and a [B, 13] input packed at 26 bytes a row ran on a slow fallback kernel.
std::int64_t copy_ld(std::int64_t cols) {
  return (cols + 7) / 8 * 8;
}

}  // namespace

struct GpuBackend::Impl {
  DenseMath math;
  int device = 0;  // the GPU it was made on
  gpu::Stream stream;
  gpu::Blas blas;
  gpu::Scratch scratch;
  gpu::OperandCache held;
  gpu::InputQueue input;
  gpu::TimingMarks marks;
  gpu::DeviceBuffer<std::byte> loss_scratch;
  Counters counters;
  std::unordered_map<const void*, std::size_t> sizes;  // bytes of each allocate()d block
  gpu::DeviceBuffer<std::byte> limit;                  // limit_memory()'s reservation
  // Embedding module state, built on the first call with a given set of layouts. A model may
  // pass more than one set (an HSTU model: its sequence features and its contextual tables), so
  // a few are kept, each with its workspace: switching between them rebuilds nothing.
  struct TableSet {
    std::vector<TableLayout> layouts;  // as the engine passed them
    std::unique_ptr<gpu::EmbeddingTables> tables;
    std::unique_ptr<gpu::EmbeddingWorkspace> workspace;
  };
  static constexpr std::size_t kTableSets = 4;
  std::vector<TableSet> emb_sets;  // the most recently used last
  std::int64_t emb_growths = 0;    // tables and workspaces (re)built

  explicit Impl(DenseMath m)
      : math(m),
        loss_scratch(static_cast<std::size_t>(gpu::bce_scratch_bytes()),
                     "GpuBackend loss partials") {
    gpu::check(gpu::get_device(&device), "get_device");
  }

  gpu::Stream_t s() const { return stream.get(); }

  // The bf16 copy of m (leading dimension copy_ld, the columns past m's zero): the held copy when
  // m lies in held memory, else converted into the slot's scratch now.
  const Bf16* bf16_of(CMat m, Slot slot) {
    if (const Bf16* h = held.find(m, copy_ld(m.cols), s())) return h;
    auto* p = scratch.get_as<Bf16>(slot, m.rows * copy_ld(m.cols), s());
    gpu::convert_padded(s(), m, AMat(p, DType::bf16, m.rows, m.cols, copy_ld(m.cols)));
    return p;
  }

  // An operand as the library reads it: under bf16 math a view stored in bf16 as it is, given16
  // (a bf16 copy the caller made) or the bf16 copy of an fp32 view (bf16_of); else the fp32 view.
  gpu::GemmOperand operand(CAMat m, bool transposed, Slot slot, const Bf16* given16 = nullptr) {
    if (math == DenseMath::bf16) {
      if (given16 != nullptr) return {given16, m.cols, transposed};
      if (m.dtype == DType::bf16) return {m.data, m.ld, transposed};
      if (m.is_f32()) return {bf16_of(m.f32(), slot), copy_ld(m.cols), transposed};
    } else if (m.is_f32()) {
      return {m.data, m.ld, transposed};
    }
    fail("matrix product",
         "an operand stored in {} under {} dense math (bf16 activations need bf16 math)",
         dtype_name(m.dtype), dense_math_name(math));
  }

  // D = op(a) · op(b) (+ beta C) (+ bias) (relu): a and b are the stored operands ([m, k] / [k, m]
  // and [k, n] / [n, k] by their transpose flags), fp32 or (under bf16 math) bf16; d is fp32, or
  // bf16 under bf16 math (an activation, or a gradient stored so; C, where given, of d's type).
  // Returns the library's arguments (its operands as it read them).
  gpu::GemmArgs product(CAMat a, bool ta, CAMat b, bool tb, AMat d, float beta = 0.0f,
                        gpu::Epilogue ep = gpu::Epilogue::none, const float* bias = nullptr,
                        const Bf16* a16 = nullptr, CAMat c = CAMat()) {
    gpu::GemmArgs g;
    if (c.data != nullptr && c.dtype != d.dtype)
      fail("matrix product", "the addend C is stored in {}, the output in {}: they must match",
           dtype_name(c.dtype), dtype_name(d.dtype));
    g.c = c.data;
    g.ldc = c.ld;
    g.m = d.rows;
    g.n = d.cols;
    g.k = ta ? a.rows : a.cols;
    g.beta = beta;
    g.d = d.data;
    g.d_bf16 = d.dtype == DType::bf16;
    if (!d.is_f32() && !g.d_bf16)
      fail("matrix product", "an output stored in {}; fp32 or bf16 expected", dtype_name(d.dtype));
    g.ldd = d.ld;
    g.epilogue = ep;
    g.bias = bias;
    if (g.d_bf16 && bias != nullptr) {  // a bf16 output takes a bf16 bias (blas.h)
      auto* b16 = scratch.get_as<Bf16>(Slot::bias16, d.cols, s());
      gpu::convert(s(), CMat(bias, 1, d.cols), AMat(b16, DType::bf16, 1, d.cols));
      g.bias = b16;
    }
    g.a = operand(a, ta, Slot::a16, a16);
    g.b = operand(b, tb, Slot::b16);
    // x · wᵀ with both operands bf16 copies of fp32 views: their rows run along k and end in
    // zeros up to a multiple of 8, so the product may run over the padded k (same result), where
    // an odd k takes the library's slow unaligned kernels.
    if (math == DenseMath::bf16 && !ta && tb && a16 == nullptr && a.is_f32() && b.is_f32())
      g.k = copy_ld(g.k);
    // A weight gradient dzᵀ · x, or a data gradient dz · w, whose second operand is a bf16 copy of
    // an fp32 [k, n] view with n not a multiple of 8 (its rows end in zeros up to one): over the
    // padded n into scratch, then the n columns copied out, where the unaligned n would take the
    // slow align1 kernels (docs/perf/dense.md has the figures).
    const std::int64_t n8 = copy_ld(g.n);
    if (math == DenseMath::bf16 && !tb && b.is_f32() && n8 != g.n && d.is_f32() &&
        c.data == nullptr && beta == 0.0f && ep == gpu::Epilogue::none && bias == nullptr) {
      float* wide = scratch.get_as<float>(Slot::dw, g.m * n8, s());
      g.n = n8;
      g.d = wide;
      g.ldd = n8;
      blas.gemm(s(), gemm_math(math), g);
      gpu::convert(s(), CMat(wide, d.rows, d.cols, n8), d);
      return g;
    }
    blas.gemm(s(), gemm_math(math), g);
    return g;
  }

  // ---- checksummed products (Backend::set_product_checks; product_checks.cu) ----
  enum Checked : int { kLinear, kCrossU, kCrossZ };
  static const char* checked_name(int what) {
    switch (what) {
      case kCrossU:
        return "cross_forward u = xl · vᵀ";
      case kCrossZ:
        return "cross_forward z = u · wᵀ + bias";
      default:
        return "linear_forward";
    }
  }
  struct Checks {
    bool on = false;
    std::int64_t seen = 0;     // forward products counted since the checks were set
    std::int64_t checked = 0;  // of them, checked
    std::optional<Backend::ProductFault> fault;  // its product counted like `seen`
    gpu::DeviceBuffer<gpu::ProductCheckRecord> record;
    bool fused = true;        // bf16 products in one kernel where it runs (use_fused_checks)
    std::int64_t in_one = 0;  // of the checked products, those that did
    // cross_feeds_product's weights, for the next cross_forward; then, once that layer's combine
    // has summed the input terms of the product its x_next feeds, what that product must be
    // (input and weights) to take them, and where they are. The next forward product takes or
    // drops them.
    std::optional<CMat> feeds;
    struct Fed {
      const void* input = nullptr;
      std::int64_t rows = 0, cols = 0, ld = 0;
      const float* w = nullptr;
      std::int64_t w_rows = 0;
      double* terms = nullptr;
    };
    std::optional<Fed> fed;
  } checks;

  // A fused product whose rows are judged later (judge_held): what the judge needs. With
  // terms_elsewhere (set by the caller) the input's part of the check is summed by an op that
  // reads the input anyway, into `terms` (3 doubles a row), and the product keeps its scratch in
  // slots of its own (held_checked, held_sums); else the judge reads the input itself.
  struct Held {
    bool terms_elsewhere = false;
    bool pending = false;
    struct {
      const void* data = nullptr;
      std::int64_t ld = 0;
    } input;  // as the product read it (bf16)
    std::int64_t n = 0, m = 0, k = 0;
    const double* partials = nullptr;
    const float* checksum = nullptr;
    const double* sums = nullptr;  // the weights' pairs (product_check_augment)
    double* terms = nullptr;
    long long index = 0;
    int what = 0;
  };

  // A forward product d [n, m] = a [n, k] · wᵀ (+ bias) (relu). With the checks on, the product
  // is written in fp32 without its activation (into d where d is fp32, else into scratch; under
  // bf16 math with its checksum columns and without its bias), a due fault flipped in it, its
  // rows checked, then the bias and the activation applied and d stored. With them off, only the
  // product a fault is due in takes that path, recording nothing. held: where the product runs in
  // one kernel, its rows are judged later, by judge_held (held->pending says so), from scratch
  // slots of its own where the caller sums its input's terms (held->terms_elsewhere); elsewhere
  // they are judged here. A product whose input's terms the op that wrote the input summed for
  // it (checks.fed) reads them instead of its input.
  void forward_product(int what, CAMat a, CMat w, const float* bias, Activation act, AMat d,
                       Held* held = nullptr) {
    if (!checks.on && !checks.fault) {
      product(a, false, w, true, d, 0.0f, epilogue_of(bias != nullptr, act), bias);
      return;
    }
    const bool rehearsal = gpu::rehearsing();  // sizes the scratch, counts nothing
    const std::int64_t index = rehearsal ? -1 : checks.seen++;
    // The input's terms, where the op that wrote this input summed them for this product.
    double* fed_terms = nullptr;
    if (const auto& f = checks.fed; f && f->input == a.data && f->rows == a.rows &&
                                    f->cols == a.cols && f->ld == a.ld && f->w == w.data &&
                                    f->w_rows == w.rows)
      fed_terms = f->terms;
    checks.fed.reset();
    const bool due = checks.fault && checks.fault->product == index;
    const std::int64_t n = d.rows, m = d.cols, k = a.cols;
    // Bit `bit` of the stored element, flipped in its fp32 value before the rounding: of the
    // fp32 value, or where the output is stored as bf16 of its upper 16 bits (bf16 bit 15, the
    // sign, is fp32 bit 31), as the cpu backend counts them.
    const auto fault_bit = [&] {
      const int bit = checks.fault->bit;
      return d.dtype == DType::bf16 ? 16 + bit % 16 : bit;
    };
    if (!checks.on && !due) {  // a fault planted in a later product
      product(a, false, w, true, d, 0.0f, epilogue_of(bias != nullptr, act), bias);
      return;
    }
    // From here the checked path; with the checks off it runs for the product a fault is planted
    // in (before the activation, as on the cpu backend), and records nothing.
    gpu::ProductCheckRecord* record = checks.on ? checks.record.data() : nullptr;
    // Plants the due fault in element e of out32 (the stored value being out32 + bias where bias
    // is given); a fault in an empty product stays pending, as on the cpu backend.
    const auto plant = [&](Mat out32, const float* bias_added_later) {
      if (!due || n * m == 0) return;
      gpu::flip_bit(s(), out32, checks.fault->element % (n * m), fault_bit(), bias_added_later);
      checks.fault.reset();
    };
    const bool narrow = d.dtype == DType::bf16;
    // A bf16 output's bias is added as bf16 (blas.h): the same values, widened, here.
    const float* b = bias;
    if (narrow && bias != nullptr) {
      auto* rounded = scratch.get_as<float>(Slot::bias16, m, s());
      gpu::round_to_bf16(s(), bias, m, rounded);
      b = rounded;
    }
    const bool own_slots = held != nullptr && held->terms_elsewhere;
    auto* sums = scratch.get_as<double>(own_slots ? Slot::held_sums : Slot::sums,
                                        gpu::product_check_sums(k), s());
    const bool relu = act == Activation::relu;
    if (math == DenseMath::bf16) {
      // The product over w's bf16 copy with its two checksum rows, into fp32 scratch [n, m + 2]
      // (the width padded to 8), without the bias: the check adds it (product_checks.cu).
      const std::int64_t rows = copy_ld(m + 2), ld = copy_ld(k);
      auto* wa = scratch.get_as<Bf16>(Slot::b16, rows * ld, s());
      gpu::product_check_augment(s(), w, rows, ld, wa, sums);
      gpu::GemmArgs g;
      g.a = operand(a, false, Slot::a16);
      g.b = {wa, ld, true};
      g.m = n;
      g.n = rows;
      g.k = a.is_f32() ? ld : k;  // a bf16 copy of an fp32 input ends in zeros up to ld, as wa
      // An fp32 input's bf16 copy ends in zeros up to a multiple of 8: its depth is the kernel's.
      if (fused_check(g, d, g.k)) {
        // One kernel: the bf16 output stored, each row's sums a column tile, the checksum
        // columns; then the rows judged against the input (checked_product.cu).
        const std::int64_t tiles = gpu::product_check_tiles(m);
        // Held: its slot takes the input's terms and those of the product x_next feeds too.
        auto* partials = scratch.get_as<double>(own_slots ? Slot::held_checked : Slot::checked,
                                                n * (2 * tiles + (own_slots ? 7 : 1)), s());
        gpu::FusedProduct p;
        p.a = g.a.data;
        p.lda = g.a.ld;
        p.w = wa;
        p.ldw = ld;
        p.n = n;
        p.m = m;
        p.k = g.k;
        p.check_depth = k;
        p.bias = b;
        p.relu = relu;
        p.out = d.data;
        p.ldo = d.ld;
        p.partials = partials;
        p.checksum = reinterpret_cast<float*>(partials + 2 * n * tiles);
        if (due && n * m > 0) {
          p.fault_element = checks.fault->element % (n * m);
          p.fault_bit = fault_bit();
          checks.fault.reset();
        }
        gpu::product_check_fused(s(), p);
        if (held != nullptr && record != nullptr) {
          held->pending = true;
          held->input = {g.a.data, g.a.ld};
          held->n = n;
          held->m = m;
          held->k = k;
          held->partials = partials;
          held->checksum = p.checksum;
          held->sums = sums;
          held->terms = own_slots ? partials + n * (2 * tiles + 1) : nullptr;
          held->index = index;
          held->what = what;
        } else if (record != nullptr && fed_terms != nullptr) {
          gpu::product_check_tiles_terms(s(), fed_terms, n, k, partials, p.checksum, m, index, what,
                                         record);
        } else if (record != nullptr) {
          gpu::product_check_tiles_rows(s(), {g.a.data, g.a.ld, true}, n, k, partials, p.checksum,
                                        m, sums, index, what, record);
        }
        if (!rehearsal && checks.on) {
          ++checks.checked;
          ++checks.in_one;
        }
        return;
      }
      float* out32 = scratch.get_as<float>(Slot::checked, n * rows, s());
      g.d = out32;
      g.ldd = rows;
      blas.gemm(s(), gemm_math(math), g);
      plant(Mat(out32, n, m, rows), b);
      gpu::product_check_rows(s(), {g.a.data, g.a.ld, true}, n, k, out32, rows, m, sums, true, b,
                              relu, d, index, what, record);
    } else {
      // fp32 math: the product with its bias into d (fp32), checked in place.
      if (!d.is_f32())
        fail("matrix product", "an output stored in {} under {} dense math", dtype_name(d.dtype),
             dense_math_name(math));
      const Mat out32 = d.f32();
      const gpu::GemmArgs g = product(a, false, w, true, out32, 0.0f,
                                      b != nullptr ? gpu::Epilogue::bias : gpu::Epilogue::none, b);
      plant(out32, nullptr);
      gpu::product_check_weights(s(), {g.b.data, g.b.ld, false}, m, k, b, sums);
      gpu::product_check_rows(s(), {g.a.data, g.a.ld, false}, n, k, out32.data, out32.ld, m, sums,
                              false, nullptr, relu, d, index, what, record);
    }
    if (!rehearsal && checks.on) ++checks.checked;
  }

  // Judges a held product's rows (forward_product), its input's terms summed by now where they
  // are summed elsewhere.
  void judge_held(const Held& h) {
    if (!h.pending || gpu::rehearsing()) return;
    if (h.terms_elsewhere)
      gpu::product_check_tiles_terms(s(), h.terms, h.n, h.k, h.partials, h.checksum, h.m, h.index,
                                     h.what, checks.record.data());
    else
      gpu::product_check_tiles_rows(s(), {h.input.data, h.input.ld, true}, h.n, h.k, h.partials,
                                    h.checksum, h.m, h.sums, h.index, h.what, checks.record.data());
  }

  // Whether a checked product of a [n, k] into d runs in one kernel (forward_product, fused_check),
  // known before it runs: bf16 math, input and output, k a multiple of 8, the input's rows
  // 16-byte aligned (the weights' copy always is).
  bool runs_fused(CAMat a, AMat d) const {
    return checks.fused && math == DenseMath::bf16 && a.dtype == DType::bf16 &&
           d.dtype == DType::bf16 && a.cols % 8 == 0 &&
           reinterpret_cast<std::uintptr_t>(a.data) % 16 == 0 && a.ld % 8 == 0 &&
           gpu::product_check_fused_available();
  }

  // Whether a checked bf16 product of depth k runs in one kernel (product_check_fused): on this
  // device and binary, with a bf16 output, k a multiple of 8 (as the plan costs it:
  // OpBuilder::checked_product) and operands whose rows start 16-byte aligned.
  bool fused_check(const gpu::GemmArgs& g, AMat d, std::int64_t k) const {
    const auto aligned = [](const void* p, std::int64_t ld) {
      return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && ld % 8 == 0;
    };
    return checks.fused && d.dtype == DType::bf16 && k % 8 == 0 && aligned(g.a.data, g.a.ld) &&
           aligned(g.b.data, g.b.ld) && gpu::product_check_fused_available();
  }

  // The id count of a batch: the caller's (the engine always gives it), else read back from the
  // device (a host synchronisation, counted).
  std::int64_t nnz_of(const SparseInput& in) {
    if (in.nnz >= 0) return in.nnz;
    if (gpu::rehearsing())
      throw Error("GpuBackend::rehearse: an embedding op needs the id count (SparseInput::nnz)");
    std::int64_t v = 0;
    const std::int64_t* last = in.offsets + static_cast<std::int64_t>(in.num_tables) * in.batch;
    gpu::check(gpu::memcpy_async(&v, last, sizeof v, s()), "embedding: reading the id count");
    gpu::check(gpu::stream_synchronize(s()), "embedding: reading the id count");
    ++counters.host_syncs;
    return v;
  }

  // The set built for `tables`, built now when none is (the least recently used set dropped
  // when kTableSets are kept).
  TableSet& ensure_tables(std::span<const TableLayout> tables) {
    for (std::size_t i = 0; i < emb_sets.size(); ++i)
      if (same_layouts(tables, emb_sets[i].layouts)) {
        if (i + 1 != emb_sets.size())
          std::rotate(emb_sets.begin() + i, emb_sets.begin() + i + 1, emb_sets.end());
        return emb_sets.back();
      }
    if (emb_sets.size() == kTableSets) {
      // Enqueued work may use the dropped one; a bad input it recorded is raised, not dropped.
      gpu::check(gpu::stream_synchronize(s()), "embedding layout change");
      emb_sets.front().tables->raise_input_errors(s());
      emb_sets.erase(emb_sets.begin());
    }
    TableSet set;
    set.layouts.assign(tables.begin(), tables.end());
    set.tables = std::make_unique<gpu::EmbeddingTables>(tables);
    ++emb_growths;
    emb_sets.push_back(std::move(set));
    return emb_sets.back();
  }

  // The set's workspace for batches of at least `batch` examples and `nnz` ids.
  gpu::EmbeddingWorkspace& workspace_for(TableSet& set, std::int64_t batch, std::int64_t nnz) {
    gpu::EmbeddingWorkspace* w = set.workspace.get();
    if (w != nullptr && batch <= w->max_batch() && nnz <= w->max_nnz()) return *w;
    const std::int64_t max_batch = std::max(batch, w != nullptr ? w->max_batch() : 0);
    const std::int64_t max_nnz = std::max(nnz + nnz / 4, w != nullptr ? w->max_nnz() : 0);
    // The old one may be in use.
    gpu::check(gpu::stream_synchronize(s()), "embedding workspace growth");
    set.workspace.reset();
    set.workspace = std::make_unique<gpu::EmbeddingWorkspace>(*set.tables, max_batch, max_nnz);
    ++emb_growths;
    return *set.workspace;
  }
};

GpuBackend::GpuBackend(DenseMath math) {
  (void)gemm_math(math);  // throws for a math this backend does not implement
  if (gpu::device_count() == 0) throw Error(fmt::format("GpuBackend: {}", gpu::no_device_reason()));
  impl_ = std::make_unique<Impl>(math);
}

GpuBackend::~GpuBackend() {
  if (impl_ != nullptr) {
    (void)gpu::stream_synchronize(impl_->input.stream());
    (void)gpu::stream_synchronize(impl_->s());
  }
}

std::string GpuBackend::name() const {
#if defined(PARITY_GPU_HIP)
  return "hip";
#else
  return "cuda";
#endif
}

DenseMath GpuBackend::dense_math() const {
  return impl_->math;
}

GpuBackend::Counters GpuBackend::counters() const {
  Counters c = impl_->counters;
  c.allocations += impl_->held.allocations();
  c.scratch_growths = impl_->scratch.growths() + impl_->emb_growths;
  c.blas_plans = impl_->blas.plans();
  c.blas_heuristics = impl_->blas.heuristic_queries();
  c.epilogue_fallbacks = impl_->blas.epilogue_fallbacks();
  return c;
}

// ------------------------------------------------------------------ memory --

void GpuBackend::limit_memory(std::size_t bytes) {
  const auto [free_bytes, total_bytes] = gpu::memory_info();
  const double gb = 1e9;
  if (bytes >= total_bytes)
    throw Error(fmt::format("limit_memory({:.2f} GB): the GPU has {:.2f} GB, nothing to limit",
                            static_cast<double>(bytes) / gb,
                            static_cast<double>(total_bytes) / gb));
  const std::size_t in_use = total_bytes - free_bytes - impl_->limit.size();
  if (in_use > bytes)
    throw Error(fmt::format("limit_memory({:.2f} GB): {:.2f} GB of the GPU are in use already",
                            static_cast<double>(bytes) / gb, static_cast<double>(in_use) / gb));
  impl_->limit = {};  // a second call replaces the first
  impl_->limit = gpu::DeviceBuffer<std::byte>(total_bytes - bytes, "GpuBackend::limit_memory");
}

std::size_t GpuBackend::free_memory_bytes() const {
  return gpu::memory_info().first;
}

void GpuBackend::memory_pattern_write(void* p, std::size_t bytes, MemoryPattern pattern,
                                      std::uint64_t seed) {
  if (bytes % 4 != 0 || (bytes > 0 && p == nullptr))
    fail("memory_pattern_write", "{} bytes is not a buffer of whole 32-bit words", bytes);
  gpu::memory_pattern_write(impl_->s(), p, bytes, pattern, seed);
}

Backend::MemoryCheck GpuBackend::memory_pattern_check(const void* p, std::size_t bytes,
                                                      MemoryPattern pattern, std::uint64_t seed) {
  if (bytes % 4 != 0 || (bytes > 0 && p == nullptr))
    fail("memory_pattern_check", "{} bytes is not a buffer of whole 32-bit words", bytes);
  const unsigned long long start[2] = {0, ~0ull};
  gpu::DeviceBuffer<unsigned long long> result(2, "memory_pattern_check");
  result.upload(start, 2, impl_->s());
  gpu::memory_pattern_check(impl_->s(), p, bytes, pattern, seed, result.data());
  unsigned long long found[2] = {0, 0};
  result.download(found, 2, impl_->s());
  gpu::check(gpu::stream_synchronize(impl_->s()), "memory_pattern_check");
  return {found[0], found[0] > 0 ? found[1] : 0};
}

void GpuBackend::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) gpu::copy_async(dst, src, bytes, impl_->s());
}

void* GpuBackend::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  ++impl_->counters.allocations;
  void* p = gpu::detail::device_alloc(bytes, "GpuBackend::allocate");
  impl_->sizes[p] = bytes;
  return p;
}

void GpuBackend::deallocate(void* p) noexcept {
  if (p == nullptr) return;
  std::size_t bytes = 1;
  if (const auto it = impl_->sizes.find(p); it != impl_->sizes.end()) {
    bytes = it->second;
    impl_->sizes.erase(it);
  }
  impl_->held.forget(p, bytes);
  // Work already enqueued may still use p (cudaFree waits for the device as well; this makes the
  // order explicit for runtimes that do not).
  (void)gpu::stream_synchronize(impl_->input.stream());
  (void)gpu::stream_synchronize(impl_->s());
  gpu::detail::device_free(p);
}

void GpuBackend::copy_to_device(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  gpu::check(gpu::memcpy_async(dst, host_src, bytes, impl_->s()), "copy_to_device");
}

void GpuBackend::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  gpu::check(gpu::memcpy_async(host_dst, src, bytes, impl_->s()), "copy_to_host");
  gpu::check(gpu::stream_synchronize(impl_->s()), "copy_to_host");
}

void GpuBackend::fill(float* p, std::int64_t n, float value) {
  if (n < 0 || (n > 0 && p == nullptr))
    fail("fill", "bad buffer (n {}, p {})", n, static_cast<void*>(p));
  gpu::fill(impl_->s(), p, n, value);
}

void GpuBackend::fill_uniform(void* p, DType dtype, std::int64_t n, float lo, float hi,
                              std::uint64_t seed, std::uint64_t stream) {
  if (n < 0 || (n > 0 && p == nullptr)) fail("fill_uniform", "bad buffer (n {})", n);
  gpu::fill_uniform(impl_->s(), p, dtype, n, lo, hi, seed, stream);
}

void GpuBackend::flag_nonfinite(const float* x, std::int64_t n, std::int64_t step,
                                std::int64_t* first_bad) {
  if (n < 0 || (n > 0 && x == nullptr) || first_bad == nullptr)
    fail("flag_nonfinite", "bad buffer (n {})", n);
  gpu::flag_nonfinite(impl_->s(), x, n, step, first_bad);
}

void GpuBackend::synchronize() {
  gpu::check(gpu::stream_synchronize(impl_->input.stream()), "synchronize (input copies)");
  impl_->stream.synchronize();
}

std::function<void()> GpuBackend::fence() {
  gpu::Event_t e = nullptr;
  gpu::check(gpu::event_create(&e), "fence");
  // Destroyed with the last copy of the function (a pending event may be destroyed: its
  // resources go once it completes).
  auto event = std::shared_ptr<std::remove_pointer_t<gpu::Event_t>>(
      e, [](gpu::Event_t x) { (void)gpu::event_destroy(x); });
  gpu::check(gpu::event_record(e, impl_->s()), "fence");
  return [event] { gpu::check(gpu::event_synchronize(event.get()), "waiting for a fence"); };
}

void GpuBackend::use_from_this_thread() {
  gpu::check(gpu::set_device(impl_->device), "use_from_this_thread");
}

// ---------------------------------------------------------- input pipeline --

void* GpuBackend::allocate_pinned(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // Any thread may allocate (an HSTU layout is packed on the trainer's worker thread).
  std::atomic_ref<std::int64_t>(impl_->counters.pinned_allocations).fetch_add(1);
  return gpu::detail::host_alloc(bytes, "GpuBackend::allocate_pinned");
}

void GpuBackend::deallocate_pinned(void* p) noexcept {
  if (p == nullptr) return;
  (void)gpu::stream_synchronize(impl_->input.stream());  // a copy may still read it
  gpu::detail::host_free(p);
}

void GpuBackend::begin_input(int slot) {
  impl_->input.begin(slot);
}
void GpuBackend::input_copy(void* dst, const void* host_src, std::size_t bytes) {
  impl_->input.copy(dst, host_src, bytes);
}
void GpuBackend::make_synthetic(const SyntheticBatch& batch) {
  impl_->input.make_begin();
  gpu::make_synthetic(impl_->input.stream(), batch);
  impl_->input.make_end();
}
double GpuBackend::input_made_ms(int slot) {
  return impl_->input.made_ms(slot);
}
void GpuBackend::end_input(int slot) {
  impl_->input.end(slot);
}
void GpuBackend::use_input(int slot) {
  impl_->input.use(slot, impl_->s());
}
void GpuBackend::release_input(int slot) {
  impl_->input.release(slot, impl_->s());
}

void GpuBackend::hold_constant(const void* p, std::size_t bytes) {
  impl_->held.hold(p, bytes);
}
void GpuBackend::release_constants() {
  impl_->held.release();
}

void GpuBackend::rehearse(const std::function<void()>& ops) {
  struct Release {  // the rehearsal's held copies were never written (also when an op throws)
    GpuBackend& b;
    ~Release() { b.release_constants(); }
  } release{*this};
  const gpu::RehearsalScope scope;
  ops();
}

void GpuBackend::timing_mark(int i) {
  impl_->marks.record(i, impl_->s());
}
double GpuBackend::timing_elapsed_ms(int i, int j) {
  return impl_->marks.elapsed_ms(i, j);
}

// ------------------------------------------------------------ dense layers --

DType GpuBackend::activation_dtype() const {
  return impl_->math == DenseMath::bf16 ? DType::bf16 : DType::f32;
}

void GpuBackend::linear_forward(CAMat x, CMat w, const float* bias, Activation act, AMat y) {
  backend_checks::check_linear_forward(x, w, y);
  // y [B, out] = x [B, in] · wᵀ (+ bias) (relu)
  impl_->forward_product(Impl::kLinear, x, w, bias, act, y);
}

void GpuBackend::linear_backward(CAMat x, CMat w, CAMat y, CAMat dy, Activation act, AMat dx,
                                 Mat dw, float* dbias) {
  backend_checks::check_linear_backward(x, w, y, dy, dx, dw);
  const std::int64_t batch = x.rows, out = w.rows;
  const bool want_dx = dx.data != nullptr;
  Impl& im = *impl_;
  const gpu::Stream_t s = im.s();
  const bool bf = im.math == DenseMath::bf16;

  // dz = dy ⊙ act'(y) [B, out]; under bf16 also its bf16 copy, shared by both products.
  // dbias = Σ_rows dz, summed in the ReLU pass where it can be (under bf16 that pass then writes
  // only the bf16 dz the products read).
  Bf16* dz16 = bf ? im.scratch.get_as<Bf16>(Slot::dz16, batch * out, s) : nullptr;
  void* partial = dbias != nullptr ? im.scratch.get(Slot::reduce,
                                                    gpu::gradient_sums_scratch_bytes(batch, out), s)
                                   : nullptr;
  float* buf = im.scratch.get_as<float>(Slot::dz, batch * out, s);
  CMat dz(buf, batch, out);
  if (act == Activation::relu) {
    gpu::relu_backward(s, y, dy, buf, dz16, dbias, partial, bf);
  } else {
    if (dy.is_f32()) {
      dz = dy.f32();
    } else {  // a bf16 gradient without activation: widened once (only the sums need fp32)
      gpu::convert(s, dy, Mat(buf, batch, out));
    }
    if (bf) gpu::convert(s, dz, AMat(dz16, DType::bf16, batch, out));
    if (dbias != nullptr) gpu::column_sum(s, dz, dbias, partial);
  }
  im.product(dz, true, x, false, dw, 0.0f, gpu::Epilogue::none, nullptr,
             dz16);  // dw [out, in] = dzᵀ · x
  if (want_dx)
    im.product(dz, false, w, false, dx, 0.0f, gpu::Epilogue::none, nullptr, dz16);  // dx = dz · w
}

void GpuBackend::set_product_checks(bool on) {
  Impl& im = *impl_;
  if (on && im.math == DenseMath::tf32)
    throw InputError(
        "checksummed products are not built for tf32 dense math: its products round their fp32 "
        "operands to 10-bit mantissas inside the library, which a check from the stored operands "
        "cannot follow (docs/reliability.md). Train with fp32 or bf16 dense math, or without "
        "--product-checks");
  im.checks.on = on;
  im.checks.seen = 0;
  im.checks.checked = 0;
  im.checks.in_one = 0;
  im.checks.fault.reset();
  im.checks.feeds.reset();
  im.checks.fed.reset();
  if (on) {
    if (im.checks.record.size() == 0)
      im.checks.record = gpu::DeviceBuffer<gpu::ProductCheckRecord>(1, "product check record");
    im.checks.record.zero(im.s());
  }
}

void GpuBackend::use_fused_checks(bool on) {
  impl_->checks.fused = on;
}

void GpuBackend::cross_feeds_product(CMat w) {
  if (impl_->checks.on) impl_->checks.feeds = w;
}

std::int64_t GpuBackend::fused_checks() const {
  return impl_->checks.in_one;
}

Backend::ProductChecks GpuBackend::product_checks() {
  Impl& im = *impl_;
  ProductChecks out;
  out.products = im.checks.checked;
  out.fault_pending = im.checks.fault.has_value();
  if (!im.checks.on) return out;
  gpu::ProductCheckRecord r;
  im.checks.record.download(&r, 1, im.s());
  gpu::check(gpu::stream_synchronize(im.s()), "product_checks");
  out.failures = static_cast<std::int64_t>(r.failures);
  if (r.first_set != 0)
    out.first_failure = fmt::format(
        "product {} ({}): row {} of [{} x {}]: its sum is {:.9g}, the inputs predict {:.9g} "
        "(difference {:.3g}, bound {:.3g})",
        r.product, Impl::checked_name(r.what), r.row, r.rows, r.cols, r.sum, r.predicted,
        std::abs(r.sum - r.predicted), r.bound);
  return out;
}

void GpuBackend::inject_product_fault(const ProductFault& f) {
  if (f.product < 0 || f.element < 0 || f.bit < 0 || f.bit > 31)
    fail("inject_product_fault",
         "product {}, element {}, bit {}: expected non-negative numbers and a bit of 0 to 31",
         f.product, f.element, f.bit);
  impl_->checks.fault = f;
  impl_->checks.fault->product += impl_->checks.seen;
}

// ------------------------------------------------------------- embeddings --

void GpuBackend::embedding_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                                   const SparseInput& in, AMat out) {
  check_embedding_call("embedding_forward", "out", out, in, tables);
  if (tables.empty() || in.batch == 0) return;
  Impl& im = *impl_;
  Impl::TableSet& set = im.ensure_tables(tables);
  set.tables->bind(weights, nullptr);
  gpu::DeviceSparseInput din{in.batch, in.num_tables, in.ids, in.offsets, im.nnz_of(in)};
  gpu::embedding_forward(im.s(), *set.tables, weights, din, out);
}

void GpuBackend::embedding_backward_update(std::span<const TableLayout> tables,
                                           const TableWeights& weights, float* state,
                                           const SparseInput& in, CAMat dout,
                                           const OptimizerParams& opt,
                                           const StochasticRounding& rounding) {
  check_embedding_call("embedding_backward_update", "dout", dout, in, tables);
  if (tables.empty() || in.batch == 0) return;
  Impl& im = *impl_;
  Impl::TableSet& set = im.ensure_tables(tables);
  const std::int64_t nnz = im.nnz_of(in);
  if (nnz == 0) return;  // no row occurs: nothing is updated
  set.tables->bind(weights, state);
  gpu::EmbeddingWorkspace& workspace = im.workspace_for(set, in.batch, nnz);
  gpu::UpdateOptions upd;
  upd.seed = rounding.seed;
  upd.step = rounding.step;
  gpu::DeviceSparseInput din{in.batch, in.num_tables, in.ids, in.offsets, nnz};
  gpu::embedding_backward_update(im.s(), *set.tables, weights, state, din, dout, opt, upd,
                                 workspace);
}

void GpuBackend::embedding_cache_observe(std::span<const TableLayout> tables, const SparseInput& in,
                                         std::span<std::uint32_t* const> counts,
                                         std::uint64_t* stats) {
  if (in.num_tables != static_cast<int>(tables.size()))
    fail("embedding_cache_observe", "the input has {} tables, the layout {}", in.num_tables,
         tables.size());
  if (!counts.empty() && counts.size() != tables.size())
    fail("embedding_cache_observe", "{} count arrays for {} tables", counts.size(), tables.size());
  if (in.batch == 0) return;
  Impl& im = *impl_;
  const gpu::DeviceSparseInput din{in.batch, in.num_tables, in.ids, in.offsets, im.nnz_of(in)};
  for (std::size_t t = 0; t < tables.size(); ++t) {
    if (!tables[t].host_placed()) continue;
    gpu::embedding_cache_observe(im.s(), tables[t], static_cast<int>(t), din,
                                 counts.empty() ? nullptr : counts[t], stats + 2 * t);
  }
}

void GpuBackend::embedding_cache_copy(const TableLayout& table, const TableWeights& weights,
                                      float* state, OptimizerKind opt, bool to_cache) {
  gpu::embedding_cache_copy(impl_->s(), table, weights.of(table.dtype), state,
                            cache_state_per_row(opt, table.dim), to_cache);
}

void GpuBackend::use_gemm_catalog(std::shared_ptr<const GemmCatalog> catalog,
                                  double hbm_bytes_per_s, std::vector<GemmDecision> decisions) {
  impl_->blas.use_catalog(std::move(catalog), hbm_bytes_per_s, std::move(decisions));
}

GemmSelectionCounts GpuBackend::gemm_selection_counts() const {
  return impl_->blas.selection_counts();
}

std::int64_t GpuBackend::blas_library_version() const {
  return static_cast<std::int64_t>(gpu::Blas::library_version());
}

std::map<std::string, std::size_t> GpuBackend::internal_memory_bytes() const {
  const Impl& im = *impl_;
  std::map<std::string, std::size_t> out;
  static constexpr const char* kSlotNames[] = {
      "scratch.a16",       "scratch.b16",      "scratch.dz",     "scratch.dz16",
      "scratch.du",        "scratch.du16",     "scratch.bias16", "scratch.reduce",
      "scratch.dw",        "scratch.checked",  "scratch.sums",   "scratch.held_checked",
      "scratch.held_sums", "scratch.next_sums"};
  static_assert(std::size(kSlotNames) == static_cast<std::size_t>(Slot::count));
  for (int i = 0; i < static_cast<int>(Slot::count); ++i)
    if (const std::size_t b = im.scratch.bytes(static_cast<Slot>(i)); b > 0) out[kSlotNames[i]] = b;
  out["held_bf16_copies"] = im.held.bytes();
  std::size_t workspaces = 0;
  for (const Impl::TableSet& set : im.emb_sets)
    workspaces += set.workspace != nullptr ? set.workspace->bytes() : 0;
  out["embedding_workspace"] = workspaces;
  out["loss_partials"] = im.loss_scratch.bytes();
  return out;
}

void* GpuBackend::allocate_host_resident(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // Pinned host memory is mapped at the same address on the device under unified addressing
  // (every 64-bit CUDA and HIP platform parity runs on).
  return gpu::detail::host_alloc(bytes, "host-resident memory (a host-placed table)");
}

void GpuBackend::deallocate_host_resident(void* p) noexcept {
  if (p == nullptr) return;
  (void)gpu::device_synchronize();  // a kernel may still read it
  gpu::detail::host_free(p);
}

void GpuBackend::raise_input_errors() {
  for (const Impl::TableSet& set : impl_->emb_sets) set.tables->raise_input_errors(impl_->s());
}

// ----------------------------------------------------------- interactions --

void GpuBackend::dot_interaction_forward(CMat dense, CMat emb, int num_tables, Mat out) {
  constexpr const char* op = "dot_interaction_forward";
  check_shape(op, "out", out, dense.rows, backend_checks::check_dot(op, dense, emb, num_tables));
  // Under bf16 math the next product (the first top layer's) reads the output's bf16 copy: the
  // kernel writes it beside the output, for the engine's hold of the output to find, instead of a
  // conversion pass over the fp32 output (whose odd widths it read at half the copy rate).
  gpu::BF16Copy copy;
  if (impl_->math == DenseMath::bf16 && out.rows > 0 && out.cols > 0) {
    copy.ld = copy_ld(out.cols);
    copy.data = impl_->held.written_with(out, copy.ld);
  }
  gpu::dot_forward(impl_->s(), dense, emb, num_tables, out, copy);
}

void GpuBackend::dot_interaction_backward(CMat dense, CMat emb, int num_tables, CMat dout,
                                          Mat ddense, Mat demb) {
  constexpr const char* op = "dot_interaction_backward";
  check_shape(op, "dout", dout, dense.rows, backend_checks::check_dot(op, dense, emb, num_tables));
  check_shape(op, "ddense", ddense, dense.rows, dense.cols);
  check_shape(op, "demb", demb, dense.rows, emb.cols);
  gpu::dot_backward(impl_->s(), dense, emb, num_tables, dout, ddense, demb);
}

void GpuBackend::cross_forward(CAMat x0, CAMat xl, CMat v, CMat w, const float* bias, AMat u,
                               AMat z, AMat x_next) {
  backend_checks::check_cross_forward(x0, xl, v, w, u, z, x_next);
  backend_checks::check_cross_storage("cross_forward",
                                      {x0.dtype, xl.dtype, u.dtype, z.dtype, x_next.dtype});
  Impl& im = *impl_;
  // With the checks on and both products in one kernel, u's rows are judged after the combine,
  // which sums the input's part of their check as it reads xl, so that the check reads no xl of
  // its own; z's after u's, so that failures are counted in the products' order.
  Impl::Held hu, hz;
  hu.terms_elsewhere = true;
  const bool hold = im.checks.on && gpu::product_check_combine_runs(x0, z, xl, x_next) &&
                    im.runs_fused(xl, u) && im.runs_fused(u, z);
  im.forward_product(Impl::kCrossU, xl, v, nullptr, Activation::none, u,  // u [B, r] = xl · vᵀ
                     hold ? &hu : nullptr);
  // z [B, N] = u · wᵀ + bias
  im.forward_product(Impl::kCrossZ, u, w, bias, Activation::none, z, hold ? &hz : nullptr);
  const std::optional<CMat> feeds = std::exchange(im.checks.feeds, std::nullopt);
  // (The product x_next feeds stores its output as the activations, as x_next is stored.)
  if (hu.pending && feeds && feeds->cols == x_next.cols && im.runs_fused(x_next, x_next)) {
    // The product x_next feeds: its weights' sums now, its input's terms in the combine.
    const std::int64_t rows = copy_ld(feeds->rows + 2), ld = copy_ld(feeds->cols);
    auto* wa = im.scratch.get_as<Bf16>(Slot::b16, rows * ld, im.s());
    auto* next_sums =
        im.scratch.get_as<double>(Slot::next_sums, gpu::product_check_sums(feeds->cols), im.s());
    gpu::product_check_augment(im.s(), *feeds, rows, ld, wa, next_sums);
    double* next_terms = hu.terms + 3 * x_next.rows;
    gpu::product_check_cross_combine(im.s(), x0, z, xl, x_next, hu.sums, hu.terms, next_sums,
                                     next_terms);
    im.checks.fed = Impl::Checks::Fed{x_next.data, x_next.rows, x_next.cols, x_next.ld,
                                      feeds->data, feeds->rows, next_terms};
  } else if (hu.pending) {
    gpu::product_check_cross_combine(im.s(), x0, z, xl, x_next, hu.sums, hu.terms);
  } else {
    gpu::cross_combine(im.s(), x0, z, xl, x_next);
  }
  im.judge_held(hu);
  im.judge_held(hz);
}

void GpuBackend::cross_backward(CAMat x0, CAMat xl, CMat v, CMat w, CAMat u, CAMat z, CAMat dx_next,
                                AMat dx0, AMat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch,
                                CrossBackwardMode mode) {
  backend_checks::check_cross_backward(x0, xl, v, w, u, z, dx_next, dx0, dxl, dv, dw, du_scratch,
                                       mode.xl_is_x0);
  backend_checks::check_cross_storage(
      "cross_backward", {x0.dtype, xl.dtype, u.dtype, z.dtype},
      {dx_next.dtype, dx0.dtype, mode.xl_is_x0 ? dx0.dtype : dxl.dtype});
  const std::int64_t batch = x0.rows, n = x0.cols, rank = v.rows;
  const bool want_du = du_scratch.data != nullptr;
  Impl& im = *impl_;
  const gpu::Stream_t s = im.s();
  const bool bf = im.math == DenseMath::bf16;

  // dz = g ⊙ x0 [B, N] (and its bf16 copy); dx0 += g ⊙ z.
  float* dz_buf = im.scratch.get_as<float>(Slot::dz, batch * n, s);
  Bf16* dz16 = bf ? im.scratch.get_as<Bf16>(Slot::dz16, batch * n, s) : nullptr;
  // dbias = Σ_rows dz, summed in the same pass.
  void* partial = dbias != nullptr
                      ? im.scratch.get(Slot::reduce, gpu::gradient_sums_scratch_bytes(batch, n), s)
                      : nullptr;
  // Under bf16 the products read dz16 only: the fp32 dz is then not written (where the bias
  // sum is folded into the pass).
  gpu::cross_gradients(s, dx_next, x0, z, dz_buf, dz16, dx0, dbias, partial,
                       {mode.first_into_dx0, mode.xl_is_x0, bf});
  const CMat dz(dz_buf, batch, n);

  im.product(dz, true, u, false, dw, 0.0f, gpu::Epilogue::none, nullptr,
             dz16);  // dw [N, r] = dzᵀ · u
  // du [B, r] = dz · w. Under bf16 both products that read du take its bf16 copy, made once: the
  // product writes it directly, or (where the caller wants du itself) it is converted once.
  CAMat du;
  if (!bf) {
    const Mat du32 = want_du
                         ? du_scratch
                         : Mat(im.scratch.get_as<float>(Slot::du, batch * rank, s), batch, rank);
    im.product(dz, false, w, false, du32);
    du = du32;
  } else {
    auto* du16 = im.scratch.get_as<Bf16>(Slot::du16, batch * rank, s);
    if (want_du) {
      im.product(dz, false, w, false, du_scratch, 0.0f, gpu::Epilogue::none, nullptr, dz16);
      gpu::convert(s, du_scratch, AMat(du16, DType::bf16, batch, rank));
    } else {
      im.product(dz, false, w, false, AMat(du16, DType::bf16, batch, rank), 0.0f,
                 gpu::Epilogue::none, nullptr, dz16);
    }
    du = CAMat(du16, DType::bf16, batch, rank);
  }
  im.product(du, true, xl, false, dv);  // dv [r, N] = duᵀ · xl
  if (mode.xl_is_x0) {                  // dx0 (holding g ⊙ z + g already) += du · v, in place
    im.product(du, false, v, false, dx0, 1.0f);
    return;
  }
  // dxl = g + du · v: the product reads g as its addend (C) and writes dxl (D).
  im.product(du, false, v, false, dxl, 1.0f, gpu::Epilogue::none, nullptr, nullptr, dx_next);
}

// ------------------------------------------------------------------- heads --

// ---- HSTU layers ----

namespace {

// The fp32 view of an activation; the HSTU ops run fp32 activations on the GPU so far.
CMat f32_in(const char* op, const char* name, CAMat m) {
  if (!m.is_f32() && m.data != nullptr)
    fail(op, "{} is stored as {}; the GPU's HSTU ops take fp32 activations", name,
         dtype_name(m.dtype));
  return CMat(static_cast<const float*>(m.data), m.rows, m.cols, m.ld);
}
Mat f32_out(const char* op, const char* name, AMat m) {
  if (!m.is_f32() && m.data != nullptr)
    fail(op, "{} is stored as {}; the GPU's HSTU ops take fp32 activations", name,
         dtype_name(m.dtype));
  return Mat(static_cast<float*>(m.data), m.rows, m.cols, m.ld);
}

void check_attention(const char* op, const SequenceBatch& seq, const HstuAttention& att, CAMat q,
                     CAMat k, CAMat v, const char* out_name, CAMat out) {
  backend_checks::check_sequences(op, seq, att);
  const std::int64_t qk = static_cast<std::int64_t>(att.heads) * att.attention_dim;
  const std::int64_t vc = static_cast<std::int64_t>(att.heads) * att.value_dim;
  check_shape(op, "q", q, seq.tokens, qk);
  check_shape(op, "k", k, seq.tokens, qk);
  check_shape(op, "v", v, seq.tokens, vc);
  check_shape(op, out_name, out, seq.tokens, vc);
  if (att.position == nullptr || att.time == nullptr) fail(op, "the bias tables are null");
}

}  // namespace

void GpuBackend::embedding_sum_forward(std::span<const TableLayout> tables,
                                       const TableWeights& weights, const SparseInput& in,
                                       AMat out) {
  constexpr const char* op = "embedding_sum_forward";
  const Mat o = f32_out(op, "out", out);
  check_view(op, "out", o);
  if (in.num_tables != static_cast<int>(tables.size()) || in.batch != o.rows)
    fail(op,
         "the sparse input has {} tables and {} bags per table, the layout {} and the output "
         "{} rows",
         in.num_tables, in.batch, tables.size(), o.rows);
  for (std::size_t t = 0; t < tables.size(); ++t)
    if (tables[t].dim != o.cols)
      fail(op, "table {} has dim {}, and the summed output has {} columns", t, tables[t].dim,
           o.cols);
  gpu::embedding_sum_forward(impl_->s(), tables, weights, in, o, nullptr);
}

void GpuBackend::layer_norm_forward(CAMat x, const float* gamma, const float* beta, float eps,
                                    AMat y, float* mean, float* rstd) {
  constexpr const char* op = "layer_norm_forward";
  const CMat xf = f32_in(op, "x", x);
  const Mat yf = f32_out(op, "y", y);
  backend_checks::check_norm_input(op, xf, mean, rstd);
  check_shape(op, "y", yf, xf.rows, xf.cols);
  if (!(eps > 0.0f)) fail(op, "eps is {}, expected > 0", eps);
  gpu::layer_norm_forward(impl_->s(), xf, gamma, beta, eps, yf, mean, rstd);
}

void GpuBackend::layer_norm_backward(CAMat x, const float* gamma, const float* mean,
                                     const float* rstd, CAMat dy, AMat dx, float* dgamma,
                                     float* dbeta) {
  constexpr const char* op = "layer_norm_backward";
  const CMat xf = f32_in(op, "x", x), dyf = f32_in(op, "dy", dy);
  const Mat dxf = f32_out(op, "dx", dx);
  backend_checks::check_norm_input(op, xf, mean, rstd);
  check_shape(op, "dy", dyf, xf.rows, xf.cols);
  check_shape(op, "dx", dxf, xf.rows, xf.cols);
  void* scratch = impl_->scratch.get(
      Slot::reduce, static_cast<std::size_t>(gpu::layer_norm_scratch_bytes(xf.rows, xf.cols)),
      impl_->s());
  gpu::layer_norm_backward(impl_->s(), xf, gamma, mean, rstd, dyf, dxf, dgamma, dbeta, scratch);
}

void GpuBackend::norm_mul_forward(CAMat x, CAMat u, float eps, AMat y, float* mean, float* rstd) {
  constexpr const char* op = "norm_mul_forward";
  const CMat xf = f32_in(op, "x", x), uf = f32_in(op, "u", u);
  const Mat yf = f32_out(op, "y", y);
  backend_checks::check_norm_input(op, xf, mean, rstd);
  check_shape(op, "u", uf, xf.rows, xf.cols);
  check_shape(op, "y", yf, xf.rows, xf.cols);
  if (!(eps > 0.0f)) fail(op, "eps is {}, expected > 0", eps);
  gpu::norm_mul_forward(impl_->s(), xf, uf, eps, yf, mean, rstd);
}

void GpuBackend::norm_mul_backward(CAMat x, CAMat u, const float* mean, const float* rstd, CAMat dy,
                                   AMat dx, AMat du) {
  constexpr const char* op = "norm_mul_backward";
  const CMat xf = f32_in(op, "x", x), uf = f32_in(op, "u", u), dyf = f32_in(op, "dy", dy);
  const Mat dxf = f32_out(op, "dx", dx), duf = f32_out(op, "du", du);
  backend_checks::check_norm_input(op, xf, mean, rstd);
  for (const auto& [name, m] :
       {std::pair<const char*, CMat>{"u", uf}, {"dy", dyf}, {"dx", CMat(dxf)}, {"du", CMat(duf)}})
    check_shape(op, name, m, xf.rows, xf.cols);
  gpu::norm_mul_backward(impl_->s(), xf, uf, mean, rstd, dyf, dxf, duf);
}

void GpuBackend::silu_forward(CAMat x, AMat y) {
  const CMat xf = f32_in("silu_forward", "x", x);
  const Mat yf = f32_out("silu_forward", "y", y);
  backend_checks::check_same_shape("silu_forward", "x", xf, "y", yf);
  gpu::silu_forward(impl_->s(), xf, yf);
}

void GpuBackend::silu_backward(CAMat x, CAMat dy, AMat dx) {
  constexpr const char* op = "silu_backward";
  const CMat xf = f32_in(op, "x", x), dyf = f32_in(op, "dy", dy);
  const Mat dxf = f32_out(op, "dx", dx);
  backend_checks::check_same_shape(op, "x", xf, "dy", dyf);
  check_shape(op, "dx", dxf, xf.rows, xf.cols);
  gpu::silu_backward(impl_->s(), xf, dyf, dxf);
}

void GpuBackend::add_into(CAMat x, AMat y) {
  const CMat xf = f32_in("add_into", "x", x);
  const Mat yf = f32_out("add_into", "y", y);
  backend_checks::check_same_shape("add_into", "x", xf, "y", yf);
  gpu::add_into(impl_->s(), xf, yf);
}

void GpuBackend::gather_rows(CAMat src, const std::int64_t* index, AMat dst) {
  // Between element types too: the sharded step's fp32 rows into bf16 activations and back.
  backend_checks::check_rows_copy("gather_rows", dst, src, index);
  gpu::gather_rows(impl_->s(), src, index, dst);
}

void GpuBackend::scale_rows(const float* scale, float alpha, Mat x) {
  check_view("scale_rows", "x", x);
  gpu::scale_rows(impl_->s(), scale, alpha, x);
}

void GpuBackend::scatter_add_rows(CAMat src, const std::int64_t* index, AMat dst) {
  const CMat sf = f32_in("scatter_add_rows", "src", src);
  const Mat df = f32_out("scatter_add_rows", "dst", dst);
  backend_checks::check_rows_copy("scatter_add_rows", sf, df, index);
  gpu::scatter_add_rows(impl_->s(), sf, index, df);
}

// The attention runs on tensor cores (bf16 operands, fp32 sums) when its operands are bf16, or
// under bf16 dense math when the kernels take its shape: fp32 operands are then rounded once into
// scratch, as the products round theirs. Otherwise the scalar fp32 kernels, the exact path.
std::string GpuBackend::tensor_core_attention_refusal(const HstuAttention& att) const {
  return gpu::tensor_core_attention_refusal(att);
}

bool GpuBackend::tensor_core_attention(const char* op, const HstuAttention& att, CAMat q) const {
  const std::string why = gpu::tensor_core_attention_refusal(att);
  if (q.dtype == DType::bf16) {
    if (!why.empty()) fail(op, "bf16 operands need the tensor-core attention, but {}", why);
    return true;
  }
  return impl_->math == DenseMath::bf16 && why.empty();
}

namespace {
// Columns of the scratch matrix that holds the bf16 copies of the fp32 views among `views`
// (each copy starts on 16 bytes).
std::int64_t copy_cols(std::initializer_list<CAMat> views) {
  std::int64_t cols = 0;
  for (const CAMat& m : views)
    if (m.dtype != DType::bf16) cols += (m.cols + 7) / 8 * 8;
  return cols;
}
std::size_t bf16_operand_bytes(std::initializer_list<CAMat> views) {
  std::int64_t rows = 0;
  for (const CAMat& m : views) rows = std::max(rows, m.rows);
  return static_cast<std::size_t>(rows * copy_cols(views) * 2);
}
// The attention's operands as bf16 views: bf16 ones as they are, fp32 ones rounded into buf.
std::vector<CAMat> bf16_operands(gpu::Stream_t s, void* buf, std::initializer_list<CAMat> views) {
  const std::int64_t cols = copy_cols(views);
  std::vector<CAMat> out;
  std::int64_t c0 = 0;
  for (const CAMat& m : views) {
    if (m.dtype == DType::bf16) {
      out.push_back(m);
      continue;
    }
    const AMat dst = AMat(buf, DType::bf16, m.rows, cols).cols_slice(c0, m.cols);
    gpu::convert(s, m, dst);
    out.push_back(dst);
    c0 += (m.cols + 7) / 8 * 8;
  }
  return out;
}
}  // namespace

void GpuBackend::hstu_attention_forward(const SequenceBatch& seq, const HstuAttention& att, CAMat q,
                                        CAMat k, CAMat v, AMat out) {
  constexpr const char* op = "hstu_attention_forward";
  if (tensor_core_attention(op, att, q)) {
    check_attention(op, seq, att, q, k, v, "out", out);
    const auto in = {q, k, v};
    void* buf = impl_->scratch.get(Slot::a16, bf16_operand_bytes(in), impl_->s());
    const std::vector<CAMat> b = bf16_operands(impl_->s(), buf, in);
    gpu::hstu_attention_forward_tc(impl_->s(), seq, att, b[0], b[1], b[2], out);
    return;
  }
  const CMat qf = f32_in(op, "q", q), kf = f32_in(op, "k", k), vf = f32_in(op, "v", v);
  const Mat of = f32_out(op, "out", out);
  check_attention(op, seq, att, qf, kf, vf, "out", of);
  gpu::hstu_attention_forward(impl_->s(), seq, att, qf, kf, vf, of);
}

void GpuBackend::hstu_attention_backward(const SequenceBatch& seq, const HstuAttention& att,
                                         CAMat q, CAMat k, CAMat v, CAMat dout, AMat dq, AMat dk,
                                         AMat dv, float* dposition, float* dtime) {
  constexpr const char* op = "hstu_attention_backward";
  if (dposition == nullptr || dtime == nullptr) fail(op, "the bias gradients are null");
  if (tensor_core_attention(op, att, q)) {
    check_attention(op, seq, att, q, k, v, "dout", dout);
    check_shape(op, "dq", dq, q.rows, q.cols);
    check_shape(op, "dk", dk, k.rows, k.cols);
    check_shape(op, "dv", dv, v.rows, v.cols);
    const auto in = {q, k, v, dout};
    void* buf = impl_->scratch.get(Slot::a16, bf16_operand_bytes(in), impl_->s());
    const std::vector<CAMat> b = bf16_operands(impl_->s(), buf, in);
    void* scratch = impl_->scratch.get(
        Slot::du, static_cast<std::size_t>(gpu::attention_scratch_bytes(att)), impl_->s());
    gpu::hstu_attention_backward_tc(impl_->s(), seq, att, b[0], b[1], b[2], b[3], dq, dk, dv,
                                    dposition, dtime, scratch);
    return;
  }
  const CMat qf = f32_in(op, "q", q), kf = f32_in(op, "k", k), vf = f32_in(op, "v", v),
             gf = f32_in(op, "dout", dout);
  const Mat dqf = f32_out(op, "dq", dq), dkf = f32_out(op, "dk", dk), dvf = f32_out(op, "dv", dv);
  check_attention(op, seq, att, qf, kf, vf, "dout", gf);
  check_shape(op, "dq", dqf, qf.rows, qf.cols);
  check_shape(op, "dk", dkf, kf.rows, kf.cols);
  check_shape(op, "dv", dvf, vf.rows, vf.cols);
  void* scratch = impl_->scratch.get(
      Slot::du, static_cast<std::size_t>(gpu::attention_scratch_bytes(att)), impl_->s());
  gpu::hstu_attention_backward(impl_->s(), seq, att, qf, kf, vf, gf, dqf, dkf, dvf, dposition,
                               dtime, scratch);
}

void GpuBackend::bce_with_logits(const float* logits, const float* labels, std::int64_t n,
                                 float* dlogits, float* loss_out) {
  constexpr const char* op = "bce_with_logits";
  if (n <= 0) fail(op, "n is {}, expected > 0", n);
  if (logits == nullptr || labels == nullptr || dlogits == nullptr) fail(op, "a buffer is null");
  if (loss_out == nullptr) fail(op, "loss_out is null");
  gpu::bce_with_logits(impl_->s(), logits, labels, n, dlogits, loss_out,
                       impl_->loss_scratch.data());
}

void GpuBackend::sigmoid(const float* logits, float* probs, std::int64_t n) {
  if (n < 0 || (n > 0 && (logits == nullptr || probs == nullptr)))
    fail("sigmoid", "bad buffers (n {})", n);
  gpu::sigmoid(impl_->s(), logits, probs, n);
}

void GpuBackend::dense_optimizer_step(float* params, const float* grads, float* state,
                                      std::int64_t n, const OptimizerParams& opt,
                                      std::int64_t step) {
  constexpr const char* op = "dense_optimizer_step";
  if (n < 0) fail(op, "n is {}, expected >= 0", n);
  if (n > 0 && (params == nullptr || grads == nullptr)) fail(op, "params or grads is null");
  if ((opt.kind == OptimizerKind::adagrad || opt.kind == OptimizerKind::adam) && n > 0 &&
      state == nullptr)
    fail(op, "state is null");
  if (opt.kind == OptimizerKind::adam && step < 1)
    fail(op, "adam step is {}, expected >= 1 (1-based)", step);
  gpu::dense_optimizer_step(impl_->s(), params, grads, state, n, opt, step);
}

std::unique_ptr<Backend> make_gpu_backend(DenseMath math) {
  return std::make_unique<GpuBackend>(math);
}

std::string gpu_device_name() {
  return gpu::device_count() == 0 ? std::string() : gpu::device_info().name;
}

std::string gpu_device_uuid() {
  return gpu::device_count() == 0 ? std::string() : gpu::device_info().uuid;
}

int gpu_device_count() {
  return gpu::device_count();
}

void use_gpu(int index) {
  const int n = gpu::device_count();
  if (n > 0) gpu::check(gpu::set_device(index % n), "selecting the process's GPU");
}

}  // namespace parity
