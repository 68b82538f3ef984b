// Shape checks shared by every backend, so that each op says the same thing on the CPU and on a
// GPU ("linear_forward: x has 7 columns, w has 8"). Plain host C++ (no OpenMP, no vendor names):
// the CPU ops and the GPU backend's host code include it alike. Each check costs a few
// comparisons, never a pass over the data.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "parity/dtype.h"
#include "parity/error.h"

namespace parity::backend_checks {

// Throws parity::Error "op: message": the caller broke the op's contract.
template <class... Args>
[[noreturn]] void fail(const char* op, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format("{}: {}", op, fmt::format(format, std::forward<Args>(args)...)));
}
// Throws parity::InputError "op: message": the data are bad (an id outside its table, offsets
// that decrease), as a GPU backend reports them at raise_input_errors().
template <class... Args>
[[noreturn]] void fail_input(const char* op, fmt::format_string<Args...> format, Args&&... args) {
  throw InputError(fmt::format("{}: {}", op, fmt::format(format, std::forward<Args>(args)...)));
}

// A view (MatView or TypedView) is well formed: non-negative shape, ld >= cols, data present
// when it has elements.
template <class View>
void check_view(const char* op, const char* name, const View& m) {
  if (m.rows < 0 || m.cols < 0) fail(op, "{} has a negative shape [{}, {}]", name, m.rows, m.cols);
  if (m.ld < m.cols) fail(op, "{} has ld {} smaller than its {} columns", name, m.ld, m.cols);
  if (m.data == nullptr && m.rows > 0 && m.cols > 0) fail(op, "{} is null", name);
}

// The view is [rows, cols] and well formed.
template <class View>
void check_shape(const char* op, const char* name, const View& m, std::int64_t rows,
                 std::int64_t cols) {
  check_view(op, name, m);
  if (m.rows != rows || m.cols != cols)
    fail(op, "{} is [{}, {}], expected [{}, {}]", name, m.rows, m.cols, rows, cols);
}

// ---- per op: the shapes every backend requires (backend.h), checked once for all ----

// linear_forward: x [B, in], w [out, in], y [B, out].
template <class X, class W, class Y>
void check_linear_forward(const X& x, const W& w, const Y& y) {
  constexpr const char* op = "linear_forward";
  check_view(op, "x", x);
  check_view(op, "w", w);
  if (x.cols != w.cols) fail(op, "x has {} columns, w has {}", x.cols, w.cols);
  check_shape(op, "y", y, x.rows, w.rows);
}

// linear_backward: y and dy [B, out], dw [out, in], dx [B, in] unless dx is empty.
template <class X, class W, class Y, class DY, class DX, class DW>
void check_linear_backward(const X& x, const W& w, const Y& y, const DY& dy, const DX& dx,
                           const DW& dw) {
  constexpr const char* op = "linear_backward";
  check_view(op, "x", x);
  check_view(op, "w", w);
  if (x.cols != w.cols) fail(op, "x has {} columns, w has {}", x.cols, w.cols);
  check_shape(op, "y", y, x.rows, w.rows);
  check_shape(op, "dy", dy, x.rows, w.rows);
  check_shape(op, "dw", dw, w.rows, x.cols);
  if (dx.data != nullptr) check_shape(op, "dx", dx, x.rows, x.cols);
}

// The dot interaction's inputs: dense [B, D], emb [B, num_tables * D]. Returns the width of its
// output, D + F(F-1)/2 with F = num_tables + 1.
template <class V>
std::int64_t check_dot(const char* op, const V& dense, const V& emb, int num_tables) {
  check_view(op, "dense", dense);
  if (num_tables < 0) fail(op, "num_tables is {}, expected >= 0", num_tables);
  check_view(op, "emb", emb);
  if (emb.rows != dense.rows) fail(op, "emb has {} rows, dense has {}", emb.rows, dense.rows);
  if (emb.cols != num_tables * dense.cols)
    fail(op, "emb has {} columns, expected num_tables * D = {} * {}", emb.cols, num_tables,
         dense.cols);
  const std::int64_t f = num_tables + 1;
  return dense.cols + f * (f - 1) / 2;
}

// The operands a cross layer's forward and backward share: x0, xl, z [B, N]; v [r, N]; w [N, r];
// u [B, r]. Returns {B, N, r}.
struct CrossShape {
  std::int64_t batch, n, rank;
};
template <class A, class P, class O>
CrossShape check_cross_operands(const char* op, const A& x0, const A& xl, const P& v, const P& w,
                                const O& u, const O& z) {
  check_view(op, "x0", x0);
  check_view(op, "v", v);
  const CrossShape c{x0.rows, x0.cols, v.rows};
  check_shape(op, "xl", xl, c.batch, c.n);
  check_shape(op, "v", v, c.rank, c.n);
  check_shape(op, "w", w, c.n, c.rank);
  check_shape(op, "u", u, c.batch, c.rank);
  check_shape(op, "z", z, c.batch, c.n);
  return c;
}

// cross_forward: the shared operands, and x_next [B, N].
template <class A, class P, class O>
void check_cross_forward(const A& x0, const A& xl, const P& v, const P& w, const O& u, const O& z,
                         const O& x_next) {
  constexpr const char* op = "cross_forward";
  const CrossShape c = check_cross_operands(op, x0, xl, v, w, u, z);
  check_shape(op, "x_next", x_next, c.batch, c.n);
}

// cross_backward: the shared operands, and dx_next, dx0 and dxl (unless xl is x0) [B, N],
// dv [r, N], dw [N, r] and du_scratch [B, r] unless it is empty.
template <class A, class P, class G, class D, class M>
void check_cross_backward(const A& x0, const A& xl, const P& v, const P& w, const A& u, const A& z,
                          const G& dx_next, const D& dx0, const D& dxl, const M& dv, const M& dw,
                          const M& du_scratch, bool xl_is_x0) {
  constexpr const char* op = "cross_backward";
  const CrossShape c = check_cross_operands(op, x0, xl, v, w, u, z);
  check_shape(op, "dx_next", dx_next, c.batch, c.n);
  check_shape(op, "dx0", dx0, c.batch, c.n);
  if (!xl_is_x0) check_shape(op, "dxl", dxl, c.batch, c.n);
  check_shape(op, "dv", dv, c.rank, c.n);
  check_shape(op, "dw", dw, c.n, c.rank);
  if (du_scratch.data != nullptr) check_shape(op, "du_scratch", du_scratch, c.batch, c.rank);
}

// The storage types of a cross layer's typed views (backend.h): the activations share one, the
// gradients another.
inline void check_cross_storage(const char* op, std::initializer_list<DType> activations,
                                std::initializer_list<DType> gradients = {}) {
  for (DType t : activations)
    if (t != *activations.begin())
      fail(op, "the activations (x0, xl, u, z, x_next) must share one storage type");
  for (DType t : gradients)
    if (t != *gradients.begin())
      fail(op, "the gradients (dx_next, dx0, dxl) must share one storage type");
}

// ---- sequences (HSTU layers) ----

// The two views are well formed and share a shape.
template <class A, class B>
void check_same_shape(const char* op, const char* a_name, const A& a, const char* b_name,
                      const B& b) {
  check_view(op, a_name, a);
  check_shape(op, b_name, b, a.rows, a.cols);
}

// A layer norm's input has at least one column (a mean over none is undefined) and its
// statistics' buffers are present.
template <class X>
void check_norm_input(const char* op, const X& x, const void* mean, const void* rstd) {
  check_view(op, "x", x);
  if (x.cols < 1) fail(op, "x has {} columns, expected >= 1", x.cols);
  if (x.rows > 0 && (mean == nullptr || rstd == nullptr)) fail(op, "mean or rstd is null");
}

// gather_rows and scatter_add_rows: the gathered rows have the source's columns, and an index
// is present for each.
template <class S, class D>
void check_rows_copy(const char* op, const S& gathered, const D& full, const void* index) {
  check_view(op, "src", gathered);
  check_view(op, "dst", full);
  if (gathered.cols != full.cols)
    fail(op, "the gathered rows have {} columns, the full matrix {}", gathered.cols, full.cols);
  if (index == nullptr && gathered.rows > 0) fail(op, "index is null");
}

// The scalar fields of a sequence batch and of an attention.
template <class Seq, class Att>
void check_sequences(const char* op, const Seq& seq, const Att& att) {
  if (seq.batch < 0 || seq.tokens < 0 || seq.targets < 0 || seq.max_len < 0)
    fail(op, "the sequence batch has batch {}, tokens {}, targets {}, max_len {}; expected >= 0",
         seq.batch, seq.tokens, seq.targets, seq.max_len);
  if (seq.offsets == nullptr) fail(op, "the sequence offsets are null");
  if (seq.timestamps == nullptr && seq.tokens > 0) fail(op, "the timestamps are null");
  if (att.heads < 1 || att.attention_dim < 1 || att.value_dim < 1)
    fail(op, "heads {}, attention_dim {}, value_dim {}: expected >= 1 each", att.heads,
         att.attention_dim, att.value_dim);
  if (att.position_buckets < 1 || att.time_buckets < 1)
    fail(op, "position_buckets {} and time_buckets {}: expected >= 1 each", att.position_buckets,
         att.time_buckets);
}

}  // namespace parity::backend_checks
