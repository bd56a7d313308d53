#include "cocemu/attention/local_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/error.h"

namespace cocemu::attn {

namespace {

constexpr std::int64_t kTileQ = 256;  // query rows per tile
constexpr std::int64_t kTileK = 256;  // key rows per tile

/// exp for f32 softmax tiles: 2^n · e^y with |y| <= ln2/2 and a degree-6 Taylor polynomial
/// (relative error < 2e-7, about 2 ulp); branch-free so the loops vectorise. Arguments below -87
/// give ~1e-38 (the caller zeroes masked entries exactly). f64 uses std::exp.
inline float fast_exp(float x) {
  x = std::clamp(x, -87.0f, 88.0f);
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest
  const float y = (t - n) * 0.693147180559945309f;
  float p = 1.0f / 720;
  p = p * y + 1.0f / 120;
  p = p * y + 1.0f / 24;
  p = p * y + 1.0f / 6;
  p = p * y + 0.5f;
  p = p * y + 1.0f;
  p = p * y + 1.0f;
  const std::int32_t e = (static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(e);
}
inline float exp_of(float x) {
  return fast_exp(x);
}
inline double exp_of(double x) {
  return std::exp(x);
}

template <class T>
constexpr T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

/// Row pointer arithmetic of a [B, N, S, D] or [S, B, N·D] tensor (D contiguous).
template <class T>
struct Rows {
  T* p = nullptr;
  std::int64_t sb = 0, sh = 0, ss = 0;
  T* at(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return p + b * sb + h * sh + s * ss;
  }
};

template <class T>
Rows<T> rows_of(const Tensor& t, Layout layout, const AttentionShape& sh, std::int64_t heads,
                std::int64_t len, const char* what) {
  COCEMU_CHECK_ARG(t.dtype() == dtype_of<T>(), "attention: {} is {}, expected {}", what,
                   t.describe(), name_of(dtype_of<T>()));
  COCEMU_CHECK_ARG(t.numel() == sh.batch * heads * len * sh.head_dim,
                   "attention: {} {} does not hold batch {} × heads {} × length {} × head_dim {}",
                   what, t.describe(), sh.batch, heads, len, sh.head_dim);
  Rows<T> r;
  r.p = t.data<T>();
  const std::int64_t d = sh.head_dim;
  if (layout == Layout::bnsd) {
    r.sb = heads * len * d;
    r.sh = len * d;
    r.ss = d;
  } else {
    r.ss = sh.batch * heads * d;
    r.sb = heads * d;
    r.sh = d;
  }
  return r;
}

void check_args(const AttentionArgs& a) {
  const AttentionShape& s = a.shape;
  COCEMU_CHECK_ARG(s.batch >= 1 && s.q_heads >= 1 && s.kv_heads >= 1 && s.head_dim >= 1 &&
                       s.q_len >= 0 && s.kv_len >= 0,
                   "attention: invalid shape batch {} heads {}/{} lengths {}/{} head_dim {}",
                   s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim);
  COCEMU_CHECK_ARG(s.q_heads % s.kv_heads == 0,
                   "attention: query heads {} must be a multiple of key/value heads {}", s.q_heads,
                   s.kv_heads);
  COCEMU_CHECK_ARG(a.q_pos && a.k_pos && std::int64_t(a.q_pos->size()) == s.q_len &&
                       std::int64_t(a.k_pos->size()) == s.kv_len,
                   "attention: positions must be given for every query ({}) and key ({}) row",
                   s.q_len, s.kv_len);
  COCEMU_CHECK_ARG(a.mask.kind != MaskKind::general || a.mask.general,
                   "attention: a general mask needs its [S, S] matrix");
}

/// Visibility of one tile: 0 = nothing visible, 1 = everything, 2 = partial (vis filled).
template <class PosQ, class PosK>
int classify(const MaskSpec& mask, const PosQ& qp, const PosK& kp, std::int64_t i0, std::int64_t bq,
             std::int64_t j0, std::int64_t bk, std::vector<std::uint8_t>& vis) {
  if (mask.kind == MaskKind::none) return 1;
  if (mask.kind == MaskKind::causal) {
    std::int64_t qmin = qp[i0], qmax = qp[i0], kmin = kp[j0], kmax = kp[j0];
    for (std::int64_t i = 0; i < bq; ++i)
      qmin = std::min(qmin, qp[i0 + i]), qmax = std::max(qmax, qp[i0 + i]);
    for (std::int64_t j = 0; j < bk; ++j)
      kmin = std::min(kmin, kp[j0 + j]), kmax = std::max(kmax, kp[j0 + j]);
    if (kmax <= qmin) return 1;
    if (kmin > qmax) return 0;
  }
  vis.resize(std::size_t(bq * bk));
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < bq; ++i)
    for (std::int64_t j = 0; j < bk; ++j) {
      const bool v = mask.visible(qp[i0 + i], kp[j0 + j]);
      vis[std::size_t(i * bk + j)] = v;
      count += v;
    }
  if (count == 0) return 0;
  if (count == bq * bk) return 1;
  return 2;
}

template <class T>
void forward_impl(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& lse) {
  const AttentionShape& s = a.shape;
  const auto Q = rows_of<T>(q, a.layout, s, s.q_heads, s.q_len, "q");
  const auto K = rows_of<T>(k, a.layout, s, s.kv_heads, s.kv_len, "k");
  const auto V = rows_of<T>(v, a.layout, s, s.kv_heads, s.kv_len, "v");
  const auto O = rows_of<T>(out, a.layout, s, s.q_heads, s.q_len, "out");
  COCEMU_CHECK_ARG(lse.dtype() == dtype_of<T>() && lse.numel() == s.batch * s.q_heads * s.q_len,
                   "attention: lse {} must be [{}, {}, {}] of {}", lse.describe(), s.batch,
                   s.q_heads, s.q_len, name_of(dtype_of<T>()));
  T* L = lse.data<T>();
  const std::int64_t D = s.head_dim, group = s.q_heads / s.kv_heads;
  const T scale = T(a.scale > 0 ? a.scale : 1.0 / std::sqrt(double(D)));
  const auto& qp = *a.q_pos;
  const auto& kp = *a.k_pos;
  std::vector<T> S(std::size_t(kTileQ * kTileK)), acc(std::size_t(kTileQ * D));
  std::vector<T> m(kTileQ), l(kTileQ);
  std::vector<std::uint8_t> vis;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.q_heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i0 = 0; i0 < s.q_len; i0 += kTileQ) {
        const std::int64_t bq = std::min(kTileQ, s.q_len - i0);
        std::fill(m.begin(), m.end(), neg_inf<T>());
        std::fill(l.begin(), l.end(), T(0));
        std::fill(acc.begin(), acc.end(), T(0));
        for (std::int64_t j0 = 0; j0 < s.kv_len; j0 += kTileK) {
          const std::int64_t bk = std::min(kTileK, s.kv_len - j0);
          const int cls = classify(a.mask, qp, kp, i0, bq, j0, bk, vis);
          if (cls == 0) continue;
          blas::gemm_raw<T>(false, true, bq, bk, D, scale, Q.at(b, h, i0), Q.ss, K.at(b, g, j0),
                            K.ss, T(0), S.data(), bk);
          for (std::int64_t i = 0; i < bq; ++i) {
            T* row = S.data() + i * bk;
            if (cls == 2)
              for (std::int64_t j = 0; j < bk; ++j)
                if (!vis[std::size_t(i * bk + j)]) row[j] = neg_inf<T>();
            T mx = neg_inf<T>();
            for (std::int64_t j = 0; j < bk; ++j)
              mx = std::max(mx, row[j]);
            const T m_new = std::max(m[std::size_t(i)], mx);
            if (m_new == neg_inf<T>()) {  // nothing visible in this row yet
              std::fill(row, row + bk, T(0));
              continue;
            }
            T sum = 0;
            for (std::int64_t j = 0; j < bk; ++j) {
              const T p = row[j] == neg_inf<T>() ? T(0) : exp_of(row[j] - m_new);
              row[j] = p;
              sum += p;
            }
            const T corr =
                m[std::size_t(i)] == neg_inf<T>() ? T(0) : exp_of(m[std::size_t(i)] - m_new);
            l[std::size_t(i)] = l[std::size_t(i)] * corr + sum;
            T* arow = acc.data() + i * D;
            if (corr != T(1))
              for (std::int64_t d = 0; d < D; ++d)
                arow[d] *= corr;
            m[std::size_t(i)] = m_new;
          }
          blas::gemm_raw<T>(false, false, bq, D, bk, T(1), S.data(), bk, V.at(b, g, j0), V.ss, T(1),
                            acc.data(), D);
        }
        for (std::int64_t i = 0; i < bq; ++i) {
          T* orow = O.at(b, h, i0 + i);
          const T li = l[std::size_t(i)];
          T* lrow = L + (b * s.q_heads + h) * s.q_len + i0 + i;
          if (li > 0) {
            const T inv = T(1) / li;
            for (std::int64_t d = 0; d < D; ++d)
              orow[d] = acc[std::size_t(i * D + d)] * inv;
            *lrow = m[std::size_t(i)] + std::log(li);
          } else {
            std::fill(orow, orow + D, T(0));
            *lrow = neg_inf<T>();
          }
        }
      }
    }
}

template <class T>
void backward_impl(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& dout, const Tensor& lse, const Tensor& delta, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv) {
  const AttentionShape& s = a.shape;
  const auto Q = rows_of<T>(q, a.layout, s, s.q_heads, s.q_len, "q");
  const auto K = rows_of<T>(k, a.layout, s, s.kv_heads, s.kv_len, "k");
  const auto V = rows_of<T>(v, a.layout, s, s.kv_heads, s.kv_len, "v");
  const auto dO = rows_of<T>(dout, a.layout, s, s.q_heads, s.q_len, "dout");
  const auto dQ = rows_of<T>(dq, a.layout, s, s.q_heads, s.q_len, "dq");
  const auto dK = rows_of<T>(dk, a.layout, s, s.kv_heads, s.kv_len, "dk");
  const auto dV = rows_of<T>(dv, a.layout, s, s.kv_heads, s.kv_len, "dv");
  const T* L = lse.data<T>();
  const T* Dl = delta.data<T>();
  const std::int64_t D = s.head_dim, group = s.q_heads / s.kv_heads;
  const T scale = T(a.scale > 0 ? a.scale : 1.0 / std::sqrt(double(D)));
  const auto& qp = *a.q_pos;
  const auto& kp = *a.k_pos;
  std::vector<T> P(std::size_t(kTileQ * kTileK)), dP(std::size_t(kTileQ * kTileK));
  std::vector<T> dKt(std::size_t(kTileK * D)), dVt(std::size_t(kTileK * D));
  std::vector<std::uint8_t> vis;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t g = 0; g < s.kv_heads; ++g)
      for (std::int64_t j0 = 0; j0 < s.kv_len; j0 += kTileK) {
        const std::int64_t bk = std::min(kTileK, s.kv_len - j0);
        std::fill(dKt.begin(), dKt.end(), T(0));
        std::fill(dVt.begin(), dVt.end(), T(0));
        bool any = false;
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
          for (std::int64_t i0 = 0; i0 < s.q_len; i0 += kTileQ) {
            const std::int64_t bq = std::min(kTileQ, s.q_len - i0);
            const int cls = classify(a.mask, qp, kp, i0, bq, j0, bk, vis);
            if (cls == 0) continue;
            any = true;
            blas::gemm_raw<T>(false, true, bq, bk, D, scale, Q.at(b, h, i0), Q.ss, K.at(b, g, j0),
                              K.ss, T(0), P.data(), bk);
            const T* lrow = L + (b * s.q_heads + h) * s.q_len + i0;
            for (std::int64_t i = 0; i < bq; ++i) {
              T* row = P.data() + i * bk;
              const T li = lrow[i];
              for (std::int64_t j = 0; j < bk; ++j) {
                const bool visible = cls == 1 || vis[std::size_t(i * bk + j)];
                row[j] = visible && li != neg_inf<T>() ? exp_of(row[j] - li) : T(0);
              }
            }
            // dV += Pᵀ·dO ; dP = dO·Vᵀ ; dS = P∘(dP − delta) ; dQ += scale·dS·K ; dK += scale·dSᵀ·Q
            blas::gemm_raw<T>(true, false, bk, D, bq, T(1), P.data(), bk, dO.at(b, h, i0), dO.ss,
                              T(1), dVt.data(), D);
            blas::gemm_raw<T>(false, true, bq, bk, D, T(1), dO.at(b, h, i0), dO.ss, V.at(b, g, j0),
                              V.ss, T(0), dP.data(), bk);
            const T* drow = Dl + (b * s.q_heads + h) * s.q_len + i0;
            for (std::int64_t i = 0; i < bq; ++i)
              for (std::int64_t j = 0; j < bk; ++j) {
                const std::size_t idx = std::size_t(i * bk + j);
                dP[idx] = P[idx] * (dP[idx] - drow[i]);
              }
            blas::gemm_raw<T>(false, false, bq, D, bk, scale, dP.data(), bk, K.at(b, g, j0), K.ss,
                              T(1), dQ.at(b, h, i0), dQ.ss);
            blas::gemm_raw<T>(true, false, bk, D, bq, scale, dP.data(), bk, Q.at(b, h, i0), Q.ss,
                              T(1), dKt.data(), D);
          }
        if (!any) continue;
        for (std::int64_t j = 0; j < bk; ++j) {
          T* krow = dK.at(b, g, j0 + j);
          T* vrow = dV.at(b, g, j0 + j);
          for (std::int64_t d = 0; d < D; ++d) {
            krow[d] += dKt[std::size_t(j * D + d)];
            vrow[d] += dVt[std::size_t(j * D + d)];
          }
        }
      }
}

template <class T>
void reference_impl(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& out, const Tensor& lse) {
  const AttentionShape& s = a.shape;
  const auto Q = rows_of<T>(q, a.layout, s, s.q_heads, s.q_len, "q");
  const auto K = rows_of<T>(k, a.layout, s, s.kv_heads, s.kv_len, "k");
  const auto V = rows_of<T>(v, a.layout, s, s.kv_heads, s.kv_len, "v");
  const auto O = rows_of<T>(out, a.layout, s, s.q_heads, s.q_len, "out");
  T* L = lse.data<T>();
  const std::int64_t D = s.head_dim, group = s.q_heads / s.kv_heads;
  const double scale = a.scale > 0 ? a.scale : 1.0 / std::sqrt(double(D));
  std::vector<double> sc(std::size_t(s.kv_len));
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.q_heads; ++h)
      for (std::int64_t i = 0; i < s.q_len; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < s.kv_len; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += double(Q.at(b, h, i)[d]) * double(K.at(b, h / group, j)[d]);
          sc[std::size_t(j)] =
              a.mask.visible((*a.q_pos)[std::size_t(i)], (*a.k_pos)[std::size_t(j)])
                  ? dot * scale
                  : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, sc[std::size_t(j)]);
        }
        T* orow = O.at(b, h, i);
        T* lrow = L + (b * s.q_heads + h) * s.q_len + i;
        if (mx == -std::numeric_limits<double>::infinity()) {
          std::fill(orow, orow + D, T(0));
          *lrow = neg_inf<T>();
          continue;
        }
        double sum = 0;
        std::vector<double> o(std::size_t(D), 0.0);
        for (std::int64_t j = 0; j < s.kv_len; ++j) {
          const double p = std::exp(sc[std::size_t(j)] - mx);
          sum += p;
          for (std::int64_t d = 0; d < D; ++d)
            o[std::size_t(d)] += p * double(V.at(b, h / group, j)[d]);
        }
        for (std::int64_t d = 0; d < D; ++d)
          orow[d] = T(o[std::size_t(d)] / sum);
        *lrow = T(mx + std::log(sum));
      }
}

template <class T>
void reference_backward_impl(const AttentionArgs& a, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& dout, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv) {
  const AttentionShape& s = a.shape;
  const auto Q = rows_of<T>(q, a.layout, s, s.q_heads, s.q_len, "q");
  const auto K = rows_of<T>(k, a.layout, s, s.kv_heads, s.kv_len, "k");
  const auto V = rows_of<T>(v, a.layout, s, s.kv_heads, s.kv_len, "v");
  const auto dO = rows_of<T>(dout, a.layout, s, s.q_heads, s.q_len, "dout");
  const auto dQ = rows_of<T>(dq, a.layout, s, s.q_heads, s.q_len, "dq");
  const auto dK = rows_of<T>(dk, a.layout, s, s.kv_heads, s.kv_len, "dk");
  const auto dV = rows_of<T>(dv, a.layout, s, s.kv_heads, s.kv_len, "dv");
  const std::int64_t D = s.head_dim, group = s.q_heads / s.kv_heads, Sq = s.q_len, Sk = s.kv_len;
  const double scale = a.scale > 0 ? a.scale : 1.0 / std::sqrt(double(D));
  std::vector<double> P(std::size_t(Sq * Sk)), dP(std::size_t(Sq * Sk));
  std::vector<double> gk(std::size_t(s.batch * s.kv_heads * Sk * D)), gv(gk.size());
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.q_heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = 0; i < Sq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < Sk; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += double(Q.at(b, h, i)[d]) * double(K.at(b, g, j)[d]);
          const bool vis = a.mask.visible((*a.q_pos)[std::size_t(i)], (*a.k_pos)[std::size_t(j)]);
          P[std::size_t(i * Sk + j)] = vis ? dot * scale : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, P[std::size_t(i * Sk + j)]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < Sk; ++j) {
          double& x = P[std::size_t(i * Sk + j)];
          x = mx == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(x - mx);
          sum += x;
        }
        for (std::int64_t j = 0; j < Sk; ++j)
          P[std::size_t(i * Sk + j)] = sum > 0 ? P[std::size_t(i * Sk + j)] / sum : 0.0;
      }
      for (std::int64_t i = 0; i < Sq; ++i) {
        double rowdot = 0;  // Σ_j P·dP = Σ_d dO·O
        for (std::int64_t j = 0; j < Sk; ++j) {
          double x = 0;
          for (std::int64_t d = 0; d < D; ++d)
            x += double(dO.at(b, h, i)[d]) * double(V.at(b, g, j)[d]);
          dP[std::size_t(i * Sk + j)] = x;
          rowdot += P[std::size_t(i * Sk + j)] * x;
        }
        for (std::int64_t j = 0; j < Sk; ++j) {
          const double pij = P[std::size_t(i * Sk + j)];
          const double ds = pij * (dP[std::size_t(i * Sk + j)] - rowdot);
          for (std::int64_t d = 0; d < D; ++d) {
            dQ.at(b, h, i)[d] += T(scale * ds * double(K.at(b, g, j)[d]));
            gk[std::size_t(((b * s.kv_heads + g) * Sk + j) * D + d)] +=
                scale * ds * double(Q.at(b, h, i)[d]);
            gv[std::size_t(((b * s.kv_heads + g) * Sk + j) * D + d)] +=
                pij * double(dO.at(b, h, i)[d]);
          }
        }
      }
    }
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t g = 0; g < s.kv_heads; ++g)
      for (std::int64_t j = 0; j < Sk; ++j)
        for (std::int64_t d = 0; d < D; ++d) {
          dK.at(b, g, j)[d] = T(gk[std::size_t(((b * s.kv_heads + g) * Sk + j) * D + d)]);
          dV.at(b, g, j)[d] = T(gv[std::size_t(((b * s.kv_heads + g) * Sk + j) * D + d)]);
        }
}

template <class Fn>
void dispatch(DType t, Fn&& fn) {
  COCEMU_CHECK_ARG(t == DType::f32 || t == DType::f64, "attention supports f32 and f64, got {}",
                   name_of(t));
  if (t == DType::f32)
    fn(float{});
  else
    fn(double{});
}

}  // namespace

Tensor make_attention_tensor(Layout layout, std::int64_t batch, std::int64_t heads,
                             std::int64_t len, std::int64_t head_dim, DType dtype) {
  if (layout == Layout::bnsd) return Tensor::zeros({batch, heads, len, head_dim}, dtype);
  return Tensor::zeros({len, batch, heads * head_dim}, dtype);
}

Tensor convert_layout(const Tensor& t, Layout from, Layout to, std::int64_t heads,
                      std::int64_t head_dim) {
  std::int64_t batch, len;
  if (from == Layout::bnsd) {
    batch = t.size(0);
    len = t.size(2);
  } else {
    len = t.size(0);
    batch = t.size(1);
  }
  Tensor out = make_attention_tensor(to, batch, heads, len, head_dim, t.dtype());
  if (from == to) {
    out.copy_from(t);
    return out;
  }
  dispatch(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    AttentionShape sh{batch, heads, heads, len, len, head_dim};
    const auto src = rows_of<T>(t, from, sh, heads, len, "tensor");
    const auto dst = rows_of<T>(out, to, sh, heads, len, "tensor");
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t s = 0; s < len; ++s)
          std::memcpy(dst.at(b, h, s), src.at(b, h, s), std::size_t(head_dim) * sizeof(T));
  });
  return out;
}

void attention_forward(const AttentionArgs& args, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse) {
  check_args(args);
  dispatch(q.dtype(), [&](auto tag) { forward_impl<decltype(tag)>(args, q, k, v, out, lse); });
}

void attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& dout, const Tensor& lse, const Tensor& delta,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  check_args(args);
  dispatch(q.dtype(), [&](auto tag) {
    backward_impl<decltype(tag)>(args, q, k, v, dout, lse, delta, dq, dk, dv);
  });
}

Tensor attention_delta(const AttentionArgs& a, const Tensor& out, const Tensor& dout) {
  const AttentionShape& s = a.shape;
  Tensor delta = Tensor::zeros({s.batch, s.q_heads, s.q_len}, out.dtype());
  dispatch(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const auto O = rows_of<T>(out, a.layout, s, s.q_heads, s.q_len, "out");
    const auto dO = rows_of<T>(dout, a.layout, s, s.q_heads, s.q_len, "dout");
    T* d = delta.data<T>();
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.q_heads; ++h)
        for (std::int64_t i = 0; i < s.q_len; ++i) {
          T acc = 0;
          const T* o = O.at(b, h, i);
          const T* g = dO.at(b, h, i);
          for (std::int64_t x = 0; x < s.head_dim; ++x)
            acc += o[x] * g[x];
          d[(b * s.q_heads + h) * s.q_len + i] = acc;
        }
  });
  return delta;
}

void merge_partial(const AttentionArgs& a, const Tensor& out, const Tensor& lse,
                   const Tensor& out_b, const Tensor& lse_b) {
  const AttentionShape& s = a.shape;
  dispatch(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const auto O = rows_of<T>(out, a.layout, s, s.q_heads, s.q_len, "out");
    const auto Ob = rows_of<T>(out_b, a.layout, s, s.q_heads, s.q_len, "partial out");
    T* L = lse.data<T>();
    const T* Lb = lse_b.data<T>();
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.q_heads; ++h)
        for (std::int64_t i = 0; i < s.q_len; ++i) {
          const std::int64_t idx = (b * s.q_heads + h) * s.q_len + i;
          const T la = L[idx], lb = Lb[idx];
          if (lb == neg_inf<T>()) continue;  // nothing new for this row
          T* o = O.at(b, h, i);
          const T* ob = Ob.at(b, h, i);
          if (la == neg_inf<T>()) {
            std::memcpy(o, ob, std::size_t(s.head_dim) * sizeof(T));
            L[idx] = lb;
            continue;
          }
          const T hi = std::max(la, lb), lo = std::min(la, lb);
          const T lse_new = hi + std::log1p(std::exp(lo - hi));
          const T wa = std::exp(la - lse_new), wb = std::exp(lb - lse_new);
          for (std::int64_t d = 0; d < s.head_dim; ++d)
            o[d] = o[d] * wa + ob[d] * wb;
          L[idx] = lse_new;
        }
  });
}

std::int64_t visible_pairs(const AttentionArgs& a) {
  return visibility(a).pairs;
}

Visibility visibility(const AttentionArgs& a) {
  check_args(a);
  Visibility v;
  const auto& qp = *a.q_pos;
  const auto& kp = *a.k_pos;
  if (a.mask.kind == MaskKind::none) {
    v.pairs = a.shape.q_len * a.shape.kv_len;
    v.rows = a.shape.kv_len > 0 ? a.shape.q_len : 0;
    v.keys = a.shape.q_len > 0 ? a.shape.kv_len : 0;
  } else if (a.mask.kind == MaskKind::causal) {
    std::vector<std::int64_t> ks(kp.begin(), kp.end());
    std::sort(ks.begin(), ks.end());
    std::int64_t last_q = std::numeric_limits<std::int64_t>::min();
    for (std::int64_t p : qp) {
      const std::int64_t seen = std::upper_bound(ks.begin(), ks.end(), p) - ks.begin();
      v.pairs += seen;
      v.rows += seen > 0;
      last_q = std::max(last_q, p);
    }
    v.keys = std::upper_bound(ks.begin(), ks.end(), last_q) - ks.begin();
  } else {
    std::vector<char> key_seen(kp.size(), 0);
    for (std::int64_t p : qp) {
      std::int64_t seen = 0;
      for (std::size_t j = 0; j < kp.size(); ++j) {
        const bool on = a.mask.general->at(p, kp[j]);
        seen += on;
        key_seen[j] |= char(on);
      }
      v.pairs += seen;
      v.rows += seen > 0;
    }
    v.keys = std::count(key_seen.begin(), key_seen.end(), char(1));
  }
  const std::int64_t bh = a.shape.batch * a.shape.q_heads;
  v.pairs *= bh;
  v.rows *= bh;
  return v;
}

void reference_attention(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& out, const Tensor& lse) {
  check_args(args);
  dispatch(q.dtype(), [&](auto tag) { reference_impl<decltype(tag)>(args, q, k, v, out, lse); });
}

void reference_attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& dout, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv) {
  check_args(args);
  dq.fill_zero();
  dispatch(q.dtype(), [&](auto tag) {
    reference_backward_impl<decltype(tag)>(args, q, k, v, dout, dq, dk, dv);
  });
}

}  // namespace cocemu::attn
