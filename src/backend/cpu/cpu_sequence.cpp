// The HSTU layer's ops for the CPU reference: layer norm, the norm-multiply, SiLU, row gathers and
// the jagged pointwise attention with its relative bias.
//
// Why it is built this way:
// - Row ops (norms, SiLU, sums) split rows across threads; each row's sums run in double in column
//   order, and the column sums of the parameter gradients (dgamma, dbeta) run over rows in order,
//   so no result depends on the thread count.
// - Attention gives each (sequence, head) pair to one thread. The forward walks query rows and
//   their visible keys in ascending order; the backward walks the same pairs once, adding dq into
//   the query's row at once and dk, dv into the pair's own double accumulators (one row per
//   token), and the bias gradients into per-pair partials that are summed over sequences in order
//   afterwards. Nothing is shared between threads, and the order of every sum is fixed.
// - The score of a pair is computed from the stored inputs in double, once per pass; there is no
//   n x n buffer, so the reference runs the longest sequences the GPU kernels are tested on.
#include <bit>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_ops.h"

namespace parity::cpu {

using backend_checks::fail_input;
using detail::fail;
using detail::kParallelElements;

namespace {

// μ and ρ of a row [cols] in double.
template <class T>
void row_stats(const T* x, std::int64_t cols, double eps, double& mu, double& rho) {
  double sum = 0.0;
  for (std::int64_t c = 0; c < cols; ++c) sum += static_cast<double>(x[c]);
  mu = sum / static_cast<double>(cols);
  double sq = 0.0;
  for (std::int64_t c = 0; c < cols; ++c) {
    const double d = static_cast<double>(x[c]) - mu;
    sq += d * d;
  }
  rho = 1.0 / std::sqrt(sq / static_cast<double>(cols) + eps);
}

// dx = ρ (g - mean(g) - x̂ mean(g x̂)) for one row, g and x̂ [cols] in double.
template <class T>
void norm_row_backward(const double* g, const double* xhat, std::int64_t cols, double rho, T* dx) {
  double g_mean = 0.0, gx_mean = 0.0;
  for (std::int64_t c = 0; c < cols; ++c) {
    g_mean += g[c];
    gx_mean += g[c] * xhat[c];
  }
  g_mean /= static_cast<double>(cols);
  gx_mean /= static_cast<double>(cols);
  for (std::int64_t c = 0; c < cols; ++c)
    dx[c] = static_cast<T>(rho * (g[c] - g_mean - xhat[c] * gx_mean));
}

// The token range of sequence b.
struct Span {
  std::int64_t begin, n;
};
Span sequence(const SequenceBatch& seq, std::int64_t b) {
  return {seq.offsets[b], seq.offsets[b + 1] - seq.offsets[b]};
}

// rab_h(i, j) and the indices of its two terms (HstuAttention).
struct Bias {
  int position, time;
};
Bias bias_buckets(const HstuAttention& att, std::int64_t i, std::int64_t j, std::int64_t ts_i,
                  std::int64_t ts_j) {
  const std::int64_t p = std::min<std::int64_t>(i - j, att.position_buckets - 1);
  const auto delta = static_cast<std::uint64_t>(std::max<std::int64_t>(ts_i - ts_j, 0));
  const std::int64_t t = std::min<std::int64_t>(std::bit_width(delta), att.time_buckets - 1);
  return {static_cast<int>(p), static_cast<int>(t)};
}

bool visible(std::int64_t i, std::int64_t j, std::int64_t history) {
  return j <= i && (j < history || j == i);
}

// The shapes of q, k [tokens, heads a] and v, out [tokens, heads v].
template <class Q, class O>
void check_attention_shapes(const char* op, const SequenceBatch& seq, const HstuAttention& att,
                            const Q& q, const Q& k, const Q& v, const char* out_name,
                            const O& out) {
  backend_checks::check_sequences(op, seq, att);
  const std::int64_t qk_cols = static_cast<std::int64_t>(att.heads) * att.attention_dim;
  const std::int64_t v_cols = static_cast<std::int64_t>(att.heads) * att.value_dim;
  detail::check_shape(op, "q", q, seq.tokens, qk_cols);
  detail::check_shape(op, "k", k, seq.tokens, qk_cols);
  detail::check_shape(op, "v", v, seq.tokens, v_cols);
  detail::check_shape(op, out_name, out, seq.tokens, v_cols);
}

}  // namespace

void validate_sequences(const char* op, const SequenceBatch& seq) {
  if (seq.offsets[0] != 0) fail_input(op, "sequence offsets[0] is {}, expected 0", seq.offsets[0]);
  for (std::int64_t b = 0; b < seq.batch; ++b) {
    const std::int64_t lo = seq.offsets[b], hi = seq.offsets[b + 1];
    if (hi < lo) fail_input(op, "sequence {}: offsets decrease from {} to {}", b, lo, hi);
    const std::int64_t n = hi - lo;
    if (n > 0 && n < seq.targets)
      fail_input(op, "sequence {} holds {} tokens, fewer than its {} targets", b, n, seq.targets);
    if (n > seq.max_len)
      fail_input(op, "sequence {} holds {} tokens, more than max_len {}", b, n, seq.max_len);
    for (std::int64_t t = lo + 1; t < hi; ++t)
      if (seq.timestamps[t] < seq.timestamps[t - 1])
        fail_input(op, "sequence {}: timestamp {} of token {} is before {} of token {}", b,
                   seq.timestamps[t], t - lo, seq.timestamps[t - 1], t - 1 - lo);
  }
  if (seq.offsets[seq.batch] != seq.tokens)
    fail_input(op, "the sequence offsets end at {}, the batch has {} tokens",
               seq.offsets[seq.batch], seq.tokens);
}

// ------------------------------------------------------------- layer norm --

template <class T>
void layer_norm_forward(MatView<const T> x, const T* gamma, const T* beta, double eps, MatView<T> y,
                        T* mean, T* rstd) {
  constexpr const char* op = "layer_norm_forward";
  backend_checks::check_norm_input(op, x, mean, rstd);
  detail::check_shape(op, "y", y, x.rows, x.cols);
  if (!(eps > 0.0)) fail(op, "eps is {}, expected > 0", eps);
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= kParallelElements)
  for (std::int64_t r = 0; r < x.rows; ++r) {
    double mu = 0.0, rho = 0.0;
    row_stats(x.row(r), x.cols, eps, mu, rho);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rho);
    const T* xr = x.row(r);
    T* yr = y.row(r);
    for (std::int64_t c = 0; c < x.cols; ++c) {
      double v = (static_cast<double>(xr[c]) - mu) * rho;
      if (gamma != nullptr) v *= static_cast<double>(gamma[c]);
      if (beta != nullptr) v += static_cast<double>(beta[c]);
      yr[c] = static_cast<T>(v);
    }
  }
}

template <class T>
void layer_norm_backward(MatView<const T> x, const T* gamma, const T* mean, const T* rstd,
                         MatView<const T> dy, MatView<T> dx, T* dgamma, T* dbeta) {
  constexpr const char* op = "layer_norm_backward";
  backend_checks::check_norm_input(op, x, mean, rstd);
  detail::check_shape(op, "dy", dy, x.rows, x.cols);
  detail::check_shape(op, "dx", dx, x.rows, x.cols);
  const std::int64_t cols = x.cols;
#pragma omp parallel if (x.rows * cols >= kParallelElements)
  {
    std::vector<double> g(static_cast<std::size_t>(cols)), xhat(static_cast<std::size_t>(cols));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < x.rows; ++r) {
      const double mu = static_cast<double>(mean[r]), rho = static_cast<double>(rstd[r]);
      for (std::int64_t c = 0; c < cols; ++c) {
        xhat[c] = (static_cast<double>(x(r, c)) - mu) * rho;
        g[c] = static_cast<double>(dy(r, c)) *
               (gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0);
      }
      norm_row_backward(g.data(), xhat.data(), cols, rho, dx.row(r));
    }
  }
  if (dgamma == nullptr && dbeta == nullptr) return;
#pragma omp parallel for schedule(static) if (x.rows * cols >= kParallelElements)
  for (std::int64_t c = 0; c < cols; ++c) {
    double sg = 0.0, sb = 0.0;
    for (std::int64_t r = 0; r < x.rows; ++r) {
      const double d = static_cast<double>(dy(r, c));
      sg += d * (static_cast<double>(x(r, c)) - static_cast<double>(mean[r])) *
            static_cast<double>(rstd[r]);
      sb += d;
    }
    if (dgamma != nullptr) dgamma[c] = static_cast<T>(sg);
    if (dbeta != nullptr) dbeta[c] = static_cast<T>(sb);
  }
}

template <class T>
void norm_mul_forward(MatView<const T> x, MatView<const T> u, double eps, MatView<T> y, T* mean,
                      T* rstd) {
  constexpr const char* op = "norm_mul_forward";
  backend_checks::check_norm_input(op, x, mean, rstd);
  detail::check_shape(op, "u", u, x.rows, x.cols);
  detail::check_shape(op, "y", y, x.rows, x.cols);
  if (!(eps > 0.0)) fail(op, "eps is {}, expected > 0", eps);
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= kParallelElements)
  for (std::int64_t r = 0; r < x.rows; ++r) {
    double mu = 0.0, rho = 0.0;
    row_stats(x.row(r), x.cols, eps, mu, rho);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rho);
    for (std::int64_t c = 0; c < x.cols; ++c)
      y(r, c) =
          static_cast<T>((static_cast<double>(x(r, c)) - mu) * rho * static_cast<double>(u(r, c)));
  }
}

template <class T>
void norm_mul_backward(MatView<const T> x, MatView<const T> u, const T* mean, const T* rstd,
                       MatView<const T> dy, MatView<T> dx, MatView<T> du) {
  constexpr const char* op = "norm_mul_backward";
  backend_checks::check_norm_input(op, x, mean, rstd);
  detail::check_shape(op, "u", u, x.rows, x.cols);
  detail::check_shape(op, "dy", dy, x.rows, x.cols);
  detail::check_shape(op, "dx", dx, x.rows, x.cols);
  detail::check_shape(op, "du", du, x.rows, x.cols);
  const std::int64_t cols = x.cols;
#pragma omp parallel if (x.rows * cols >= kParallelElements)
  {
    std::vector<double> g(static_cast<std::size_t>(cols)), xhat(static_cast<std::size_t>(cols));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < x.rows; ++r) {
      const double mu = static_cast<double>(mean[r]), rho = static_cast<double>(rstd[r]);
      for (std::int64_t c = 0; c < cols; ++c) {
        xhat[c] = (static_cast<double>(x(r, c)) - mu) * rho;
        const double d = static_cast<double>(dy(r, c));
        g[c] = d * static_cast<double>(u(r, c));
        du(r, c) = static_cast<T>(d * xhat[c]);
      }
      norm_row_backward(g.data(), xhat.data(), cols, rho, dx.row(r));
    }
  }
}

// ------------------------------------------------------ elementwise, rows --

template <class T>
void silu_forward(MatView<const T> x, MatView<T> y) {
  backend_checks::check_same_shape("silu_forward", "x", x, "y", y);
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= kParallelElements)
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < x.cols; ++c) {
      const double v = static_cast<double>(x(r, c));
      y(r, c) = static_cast<T>(v * detail::stable_sigmoid(v));
    }
}

template <class T>
void silu_backward(MatView<const T> x, MatView<const T> dy, MatView<T> dx) {
  constexpr const char* op = "silu_backward";
  backend_checks::check_same_shape(op, "x", x, "dy", dy);
  detail::check_shape(op, "dx", dx, x.rows, x.cols);
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= kParallelElements)
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < x.cols; ++c) {
      const double v = static_cast<double>(x(r, c));
      const double s = detail::stable_sigmoid(v);
      dx(r, c) = static_cast<T>(static_cast<double>(dy(r, c)) * s * (1.0 + v * (1.0 - s)));
    }
}

template <class T>
void add_into(MatView<const T> x, MatView<T> y) {
  backend_checks::check_same_shape("add_into", "x", x, "y", y);
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= kParallelElements)
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < x.cols; ++c)
      y(r, c) = static_cast<T>(static_cast<double>(y(r, c)) + static_cast<double>(x(r, c)));
}

template <class T>
void gather_rows(MatView<const T> src, const std::int64_t* index, MatView<T> dst) {
  constexpr const char* op = "gather_rows";
  backend_checks::check_rows_copy(op, dst, src, index);
  for (std::int64_t i = 0; i < dst.rows; ++i)
    if (index[i] < 0 || index[i] >= src.rows)
      fail_input(op, "index[{}] is {}, outside the source's [0, {}) rows", i, index[i], src.rows);
#pragma omp parallel for schedule(static) if (dst.rows * dst.cols >= kParallelElements)
  for (std::int64_t i = 0; i < dst.rows; ++i)
    for (std::int64_t c = 0; c < dst.cols; ++c) dst(i, c) = src(index[i], c);
}

template <class T>
void scatter_add_rows(MatView<const T> src, const std::int64_t* index, MatView<T> dst) {
  constexpr const char* op = "scatter_add_rows";
  backend_checks::check_rows_copy(op, src, dst, index);
  std::vector<bool> seen(static_cast<std::size_t>(dst.rows), false);
  for (std::int64_t i = 0; i < src.rows; ++i) {
    if (index[i] < 0 || index[i] >= dst.rows)
      fail_input(op, "index[{}] is {}, outside the destination's [0, {}) rows", i, index[i],
                 dst.rows);
    if (seen[static_cast<std::size_t>(index[i])])
      fail_input(op, "index[{}] is {}, which an earlier index names too", i, index[i]);
    seen[static_cast<std::size_t>(index[i])] = true;
  }
#pragma omp parallel for schedule(static) if (src.rows * src.cols >= kParallelElements)
  for (std::int64_t i = 0; i < src.rows; ++i)
    for (std::int64_t c = 0; c < src.cols; ++c)
      dst(index[i], c) =
          static_cast<T>(static_cast<double>(dst(index[i], c)) + static_cast<double>(src(i, c)));
}

// -------------------------------------------------------------- attention --

template <class T>
void hstu_attention_forward(const SequenceBatch& seq, const HstuAttention& att, const T* position,
                            const T* time, MatView<const T> q, MatView<const T> k,
                            MatView<const T> v, MatView<T> out) {
  constexpr const char* op = "hstu_attention_forward";
  check_attention_shapes(op, seq, att, q, k, v, "out", out);
  if (position == nullptr || time == nullptr) fail(op, "the bias tables are null");
  validate_sequences(op, seq);
  const int heads = att.heads, a = att.attention_dim, vd = att.value_dim;
  const double scale = att.scale, inv_n = att.inv_n;
  const std::int64_t pairs = seq.batch * heads;
#pragma omp parallel if (seq.tokens >= 64)
  {
    std::vector<double> acc(static_cast<std::size_t>(vd));
#pragma omp for schedule(dynamic)
    for (std::int64_t bh = 0; bh < pairs; ++bh) {
      const std::int64_t b = bh / heads;
      const int h = static_cast<int>(bh % heads);
      const Span s = sequence(seq, b);
      const std::int64_t history = s.n - seq.targets;
      const T* pos = position + static_cast<std::int64_t>(h) * att.position_buckets;
      const T* tim = time + static_cast<std::int64_t>(h) * att.time_buckets;
      for (std::int64_t i = 0; i < s.n; ++i) {
        const T* qi = q.row(s.begin + i) + h * a;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::int64_t j = 0; j <= i; ++j) {
          if (!visible(i, j, history)) continue;
          const T* kj = k.row(s.begin + j) + h * a;
          double dot = 0.0;
          for (int c = 0; c < a; ++c)
            dot += static_cast<double>(qi[c]) * static_cast<double>(kj[c]);
          const Bias bk =
              bias_buckets(att, i, j, seq.timestamps[s.begin + i], seq.timestamps[s.begin + j]);
          const double score = scale * dot + static_cast<double>(pos[bk.position]) +
                               static_cast<double>(tim[bk.time]);
          const double w = inv_n * score * detail::stable_sigmoid(score);
          const T* vj = v.row(s.begin + j) + h * vd;
          for (int c = 0; c < vd; ++c) acc[c] += w * static_cast<double>(vj[c]);
        }
        T* oi = out.row(s.begin + i) + h * vd;
        for (int c = 0; c < vd; ++c) oi[c] = static_cast<T>(acc[c]);
      }
    }
  }
}

template <class T>
void hstu_attention_backward(const SequenceBatch& seq, const HstuAttention& att, const T* position,
                             const T* time, MatView<const T> q, MatView<const T> k,
                             MatView<const T> v, MatView<const T> dout, MatView<T> dq,
                             MatView<T> dk, MatView<T> dv, T* dposition, T* dtime) {
  constexpr const char* op = "hstu_attention_backward";
  check_attention_shapes(op, seq, att, q, k, v, "dout", dout);
  const std::int64_t qk_cols = static_cast<std::int64_t>(att.heads) * att.attention_dim;
  const std::int64_t v_cols = static_cast<std::int64_t>(att.heads) * att.value_dim;
  detail::check_shape(op, "dq", dq, seq.tokens, qk_cols);
  detail::check_shape(op, "dk", dk, seq.tokens, qk_cols);
  detail::check_shape(op, "dv", dv, seq.tokens, v_cols);
  if (position == nullptr || time == nullptr) fail(op, "the bias tables are null");
  if (dposition == nullptr || dtime == nullptr) fail(op, "the bias gradients are null");
  validate_sequences(op, seq);
  const int heads = att.heads, a = att.attention_dim, vd = att.value_dim;
  const int pb = att.position_buckets, tb = att.time_buckets;
  const double scale = att.scale, inv_n = att.inv_n;
  const std::int64_t pairs = seq.batch * heads;
  // Per (sequence, head): its bias gradients, summed over sequences in order below.
  std::vector<double> partial(static_cast<std::size_t>(pairs * (pb + tb)), 0.0);
#pragma omp parallel if (seq.tokens >= 64)
  {
    std::vector<double> dq_acc(static_cast<std::size_t>(a));  // [a]
    std::vector<double> dk_acc, dv_acc;                       // [n, a], [n, v]
#pragma omp for schedule(dynamic)
    for (std::int64_t bh = 0; bh < pairs; ++bh) {
      const std::int64_t b = bh / heads;
      const int h = static_cast<int>(bh % heads);
      const Span s = sequence(seq, b);
      const std::int64_t history = s.n - seq.targets;
      const T* pos = position + static_cast<std::int64_t>(h) * pb;
      const T* tim = time + static_cast<std::int64_t>(h) * tb;
      double* dpos = partial.data() + bh * (pb + tb);
      double* dtim = dpos + pb;
      dk_acc.assign(static_cast<std::size_t>(s.n * a), 0.0);
      dv_acc.assign(static_cast<std::size_t>(s.n * vd), 0.0);
      for (std::int64_t i = 0; i < s.n; ++i) {
        const T* qi = q.row(s.begin + i) + h * a;
        const T* gi = dout.row(s.begin + i) + h * vd;
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (std::int64_t j = 0; j <= i; ++j) {
          if (!visible(i, j, history)) continue;
          const T* kj = k.row(s.begin + j) + h * a;
          const T* vj = v.row(s.begin + j) + h * vd;
          double dot = 0.0, dw = 0.0;
          for (int c = 0; c < a; ++c)
            dot += static_cast<double>(qi[c]) * static_cast<double>(kj[c]);
          for (int c = 0; c < vd; ++c)
            dw += static_cast<double>(gi[c]) * static_cast<double>(vj[c]);
          const Bias bk =
              bias_buckets(att, i, j, seq.timestamps[s.begin + i], seq.timestamps[s.begin + j]);
          const double score = scale * dot + static_cast<double>(pos[bk.position]) +
                               static_cast<double>(tim[bk.time]);
          const double sig = detail::stable_sigmoid(score);
          const double w = inv_n * score * sig;                              // A(i, j)
          const double ds = inv_n * dw * sig * (1.0 + score * (1.0 - sig));  // dL / ds
          dpos[bk.position] += ds;
          dtim[bk.time] += ds;
          double* dkj = dk_acc.data() + j * a;
          double* dvj = dv_acc.data() + j * vd;
          for (int c = 0; c < a; ++c) {
            dq_acc[c] += ds * static_cast<double>(kj[c]);
            dkj[c] += ds * static_cast<double>(qi[c]);
          }
          for (int c = 0; c < vd; ++c) dvj[c] += w * static_cast<double>(gi[c]);
        }
        T* dqi = dq.row(s.begin + i) + h * a;
        for (int c = 0; c < a; ++c) dqi[c] = static_cast<T>(scale * dq_acc[c]);
      }
      for (std::int64_t j = 0; j < s.n; ++j) {
        T* dkj = dk.row(s.begin + j) + h * a;
        T* dvj = dv.row(s.begin + j) + h * vd;
        for (int c = 0; c < a; ++c) dkj[c] = static_cast<T>(scale * dk_acc[j * a + c]);
        for (int c = 0; c < vd; ++c) dvj[c] = static_cast<T>(dv_acc[j * vd + c]);
      }
    }
  }
  for (int h = 0; h < heads; ++h) {
    for (int p = 0; p < pb + tb; ++p) {
      double sum = 0.0;
      for (std::int64_t b = 0; b < seq.batch; ++b) sum += partial[(b * heads + h) * (pb + tb) + p];
      if (p < pb)
        dposition[h * pb + p] = static_cast<T>(sum);
      else
        dtime[h * tb + p - pb] = static_cast<T>(sum);
    }
  }
}

#define PARITY_SEQUENCE_OPS(T)                                                                   \
  template void layer_norm_forward<T>(MatView<const T>, const T*, const T*, double, MatView<T>,  \
                                      T*, T*);                                                   \
  template void layer_norm_backward<T>(MatView<const T>, const T*, const T*, const T*,           \
                                       MatView<const T>, MatView<T>, T*, T*);                    \
  template void norm_mul_forward<T>(MatView<const T>, MatView<const T>, double, MatView<T>, T*,  \
                                    T*);                                                         \
  template void norm_mul_backward<T>(MatView<const T>, MatView<const T>, const T*, const T*,     \
                                     MatView<const T>, MatView<T>, MatView<T>);                  \
  template void silu_forward<T>(MatView<const T>, MatView<T>);                                   \
  template void silu_backward<T>(MatView<const T>, MatView<const T>, MatView<T>);                \
  template void add_into<T>(MatView<const T>, MatView<T>);                                       \
  template void gather_rows<T>(MatView<const T>, const std::int64_t*, MatView<T>);               \
  template void scatter_add_rows<T>(MatView<const T>, const std::int64_t*, MatView<T>);          \
  template void hstu_attention_forward<T>(const SequenceBatch&, const HstuAttention&, const T*,  \
                                          const T*, MatView<const T>, MatView<const T>,          \
                                          MatView<const T>, MatView<T>);                         \
  template void hstu_attention_backward<T>(const SequenceBatch&, const HstuAttention&, const T*, \
                                           const T*, MatView<const T>, MatView<const T>,         \
                                           MatView<const T>, MatView<const T>, MatView<T>,       \
                                           MatView<T>, MatView<T>, T*, T*);

PARITY_SEQUENCE_OPS(float)
PARITY_SEQUENCE_OPS(double)
#undef PARITY_SEQUENCE_OPS

}  // namespace parity::cpu
