#include "cocemu/runtime/det_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace cocemu::blas {

namespace {

constexpr std::int64_t MR = 6, NR = 32;               // register tile (f32)
constexpr std::int64_t KC = 256, MC = 96, NC = 2048;  // cache blocks

/// Packs B[p0:p0+kc, j0:j0+nc] into NR-wide panels (zero-padded): panel q holds [kc][NR].
void pack_b(const float* b, std::int64_t ldb, bool trans, std::int64_t p0, std::int64_t kc,
            std::int64_t j0, std::int64_t nc, float* out) {
  for (std::int64_t q = 0; q < nc; q += NR) {
    const std::int64_t w = std::min(NR, nc - q);
    float* dst = out + q * kc;
    if (!trans) {
      for (std::int64_t p = 0; p < kc; ++p) {
        float* row = dst + p * NR;
        std::memcpy(row, b + (p0 + p) * ldb + j0 + q, std::size_t(w) * sizeof(float));
        std::fill(row + w, row + NR, 0.0f);
      }
    } else {  // B's rows read in groups of 8, side by side; the panel written in 8-float runs
      for (std::int64_t j = 0; j < NR; j += 8) {
        const float* src[8];
        const std::int64_t g = std::clamp<std::int64_t>(w - j, 0, 8);
        for (std::int64_t t = 0; t < 8; ++t)
          src[t] = t < g ? b + (j0 + q + j + t) * ldb + p0 : nullptr;
        if (g == 8) {
          for (std::int64_t p = 0; p < kc; ++p)
#pragma GCC unroll 8
            for (std::int64_t t = 0; t < 8; ++t)
              dst[p * NR + j + t] = src[t][p];
        } else {
          for (std::int64_t p = 0; p < kc; ++p)
            for (std::int64_t t = 0; t < 8; ++t)
              dst[p * NR + j + t] = t < g ? src[t][p] : 0.0f;
        }
      }
    }
  }
}

/// Packs A[i0:i0+mc, p0:p0+kc] into MR-tall panels (zero-padded): panel r holds [kc][MR].
void pack_a(const float* a, std::int64_t lda, bool trans, std::int64_t i0, std::int64_t mc,
            std::int64_t p0, std::int64_t kc, float* out) {
  for (std::int64_t r = 0; r < mc; r += MR) {
    const std::int64_t h = std::min(MR, mc - r);
    float* dst = out + r * kc;
    if (trans) {  // A stored [k, m]: row p holds the MR values contiguously
      for (std::int64_t p = 0; p < kc; ++p) {
        const float* src = a + (p0 + p) * lda + i0 + r;
        for (std::int64_t i = 0; i < h; ++i)
          dst[p * MR + i] = src[i];
        for (std::int64_t i = h; i < MR; ++i)
          dst[p * MR + i] = 0.0f;
      }
    } else {  // MR rows read side by side, the panel written contiguously
      const float* rows[MR];
      for (std::int64_t i = 0; i < MR; ++i)
        rows[i] = i < h ? a + (i0 + r + i) * lda + p0 : nullptr;
      if (h == MR) {
        for (std::int64_t p = 0; p < kc; ++p)
#pragma GCC unroll 6
          for (std::int64_t i = 0; i < MR; ++i)
            dst[p * MR + i] = rows[i][p];
      } else {
        for (std::int64_t p = 0; p < kc; ++p)
          for (std::int64_t i = 0; i < MR; ++i)
            dst[p * MR + i] = i < h ? rows[i][p] : 0.0f;
      }
    }
  }
}

/// c[0:h, 0:w] = (first ? 0 : c) + Σ_p ap[p]·bp[p], element by element in order of p.
void micro_kernel(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc,
                  std::int64_t h, std::int64_t w, bool first) {
#if defined(__AVX512F__)
  __m512 acc[MR][2];
#pragma GCC unroll 6
  for (std::int64_t i = 0; i < MR; ++i)
    acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const __mmask16 m0 = w >= 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1);
  const __mmask16 m1 =
      w >= 32 ? __mmask16(0xffff) : (w > 16 ? __mmask16((1u << (w - 16)) - 1) : __mmask16(0));
  for (std::int64_t i = 0; i < MR; ++i) {
    if (first || i >= h) {
      acc[i][0] = _mm512_setzero_ps();
      acc[i][1] = _mm512_setzero_ps();
    } else {
      acc[i][0] = _mm512_maskz_loadu_ps(m0, c + i * ldc);
      acc[i][1] = _mm512_maskz_loadu_ps(m1, c + i * ldc + 16);
    }
  }
  for (std::int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(bp + p * NR), b1 = _mm512_load_ps(bp + p * NR + 16);
#pragma GCC unroll 6
    for (std::int64_t i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(ap[p * MR + i]);
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
  }
  for (std::int64_t i = 0; i < h; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  // 16 vector registers: the 6×32 tile runs as two 6×16 halves, 12 accumulators each. Every
  // element is the same FMA chain over p as in the AVX-512 kernel and the scalar loop.
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (std::int64_t j0 = 0; j0 < w; j0 += 16) {
    const int left = int(std::min<std::int64_t>(16, w - j0));
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(left - 8), lane);
    // Full-width tiles load and store C plainly: vmaskmovps stores are microcoded on AMD cores.
    const bool full = left == 16;
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (std::int64_t i = 0; i < MR; ++i) {
      if (first || i >= h) {
        acc[i][0] = _mm256_setzero_ps();
        acc[i][1] = _mm256_setzero_ps();
      } else if (full) {
        acc[i][0] = _mm256_loadu_ps(c + i * ldc + j0);
        acc[i][1] = _mm256_loadu_ps(c + i * ldc + j0 + 8);
      } else {
        acc[i][0] = _mm256_maskload_ps(c + i * ldc + j0, m0);
        acc[i][1] = _mm256_maskload_ps(c + i * ldc + j0 + 8, m1);
      }
    }
    const float* b = bp + j0;
    for (std::int64_t p = 0; p < kc; ++p) {
      const __m256 b0 = _mm256_load_ps(b + p * NR), b1 = _mm256_load_ps(b + p * NR + 8);
#pragma GCC unroll 6
      for (std::int64_t i = 0; i < MR; ++i) {
        const __m256 av = _mm256_broadcast_ss(ap + p * MR + i);
        acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
      }
    }
    // Constant indices only (unrolled), so the accumulators stay in registers in the loop above.
#pragma GCC unroll 6
    for (std::int64_t i = 0; i < MR; ++i)
      if (i < h && full) {
        _mm256_storeu_ps(c + i * ldc + j0, acc[i][0]);
        _mm256_storeu_ps(c + i * ldc + j0 + 8, acc[i][1]);
      } else if (i < h) {
        _mm256_maskstore_ps(c + i * ldc + j0, m0, acc[i][0]);
        _mm256_maskstore_ps(c + i * ldc + j0 + 8, m1, acc[i][1]);
      }
  }
#else
  for (std::int64_t i = 0; i < h; ++i)
    for (std::int64_t j = 0; j < w; ++j) {
      float acc = first ? 0.0f : c[i * ldc + j];
      for (std::int64_t p = 0; p < kc; ++p)
        acc = std::fma(ap[p * MR + i], bp[p * NR + j], acc);
      c[i * ldc + j] = acc;
    }
#endif
}

/// 64-byte aligned view of a float buffer allocated with 16 floats to spare.
float* aligned(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(p) + 63) & ~std::uintptr_t(63));
}

/// The blocked product over B's packed panels; `panel(j0, nc, p0, kc)` returns the packed
/// B[p0:p0+kc, j0:j0+nc]. The k blocks start at 0 for every call: per-element order depends on k
/// only.
template <class Panel>
void blocked(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
             bool trans_a, Panel panel, float* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (std::int64_t i = 0; i < m; ++i)
      std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  thread_local std::vector<float> abuf(std::size_t(MC * KC) + 16);
  float* ap = aligned(abuf.data());
  for (std::int64_t j0 = 0; j0 < n; j0 += NC) {
    const std::int64_t nc = std::min(NC, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += KC) {
      const std::int64_t kc = std::min(KC, k - p0);
      const float* bp = panel(j0, nc, p0, kc);
      for (std::int64_t i0 = 0; i0 < m; i0 += MC) {
        const std::int64_t mc = std::min(MC, m - i0);
        pack_a(a, lda, trans_a, i0, mc, p0, kc, ap);
        for (std::int64_t q = 0; q < nc; q += NR)
          for (std::int64_t r = 0; r < mc; r += MR)
            micro_kernel(kc, ap + r * kc, bp + q * kc, c + (i0 + r) * ldc + j0 + q, ldc,
                         std::min(MR, mc - r), std::min(NR, nc - q), p0 == 0);
      }
    }
  }
}

std::int64_t round_up(std::int64_t v, std::int64_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

void det_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
              bool trans_a, const float* b, std::int64_t ldb, bool trans_b, float* c,
              std::int64_t ldc) {
  thread_local std::vector<float> bbuf(std::size_t(NC * KC) + 16);
  float* bp = aligned(bbuf.data());
  blocked(
      m, n, k, a, lda, trans_a,
      [&](std::int64_t j0, std::int64_t nc, std::int64_t p0, std::int64_t kc) {
        pack_b(b, ldb, trans_b, p0, kc, j0, nc, bp);
        return static_cast<const float*>(bp);
      },
      c, ldc);
}

PackedB::PackedB(const float* b, std::int64_t ldb, bool trans_b, std::int64_t k, std::int64_t n)
    : k_(k), n_(n) {
  // Panels in the order `blocked` visits them: n blocks outer, k blocks inner.
  const std::int64_t total = k * round_up(n, NR);
  data_.resize(std::size_t(total) + 16);
  float* out = aligned(data_.data());
  for (std::int64_t j0 = 0; j0 < n; j0 += NC) {
    const std::int64_t nc = std::min(NC, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += KC) {
      const std::int64_t kc = std::min(KC, k - p0);
      pack_b(b, ldb, trans_b, p0, kc, j0, nc, out);
      out += kc * round_up(nc, NR);
    }
  }
}

void det_gemm(std::int64_t m, const float* a, std::int64_t lda, bool trans_a, const PackedB& b,
              float* c, std::int64_t ldc) {
  const float* base = aligned(const_cast<float*>(b.data_.data()));
  blocked(
      m, b.n_, b.k_, a, lda, trans_a,
      [&](std::int64_t j0, std::int64_t nc, std::int64_t p0, std::int64_t) {
        // Blocks before (j0, p0): j0 full-width column blocks of all of k, then p0 rows of this
        // one.
        return base + j0 * b.k_ + p0 * round_up(nc, NR);
      },
      c, ldc);
}

void det_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const double* a, std::int64_t lda,
              bool trans_a, const double* b, std::int64_t ldb, bool trans_b, double* c,
              std::int64_t ldc) {
  // f64 serves accuracy tests: a plain loop in the same per-element order.
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p)
        acc = std::fma(trans_a ? a[p * lda + i] : a[i * lda + p],
                       trans_b ? b[j * ldb + p] : b[p * ldb + j], acc);
      c[i * ldc + j] = acc;
    }
}

}  // namespace cocemu::blas
