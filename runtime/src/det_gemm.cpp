#include "cocemu/runtime/det_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace cocemu::blas {

namespace {

constexpr std::int64_t MR = 6, NR = 32;              // register tile (f32)
constexpr std::int64_t KC = 256, MC = 96, NC = 512;  // cache blocks

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
    } else {  // read each of B's rows contiguously, scatter into the panel's column
      for (std::int64_t j = 0; j < w; ++j) {
        const float* src = b + (j0 + q + j) * ldb + p0;
        for (std::int64_t p = 0; p < kc; ++p)
          dst[p * NR + j] = src[p];
      }
      for (std::int64_t j = w; j < NR; ++j)
        for (std::int64_t p = 0; p < kc; ++p)
          dst[p * NR + j] = 0.0f;
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
    } else {
      for (std::int64_t i = 0; i < MR; ++i) {
        if (i >= h) {
          for (std::int64_t p = 0; p < kc; ++p)
            dst[p * MR + i] = 0.0f;
          continue;
        }
        const float* src = a + (i0 + r + i) * lda + p0;
        for (std::int64_t p = 0; p < kc; ++p)
          dst[p * MR + i] = src[p];
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

}  // namespace

void det_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
              bool trans_a, const float* b, std::int64_t ldb, bool trans_b, float* c,
              std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (std::int64_t i = 0; i < m; ++i)
      std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  thread_local std::vector<float, std::allocator<float>> abuf, bbuf;
  abuf.resize(std::size_t(MC * KC) + 16);
  bbuf.resize(std::size_t(NC * KC) + 16);
  // 64-byte aligned views of the thread's pack buffers.
  auto align = [](float* p) {
    return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(p) + 63) &
                                    ~std::uintptr_t(63));
  };
  float* ap = align(abuf.data());
  float* bp = align(bbuf.data());
  for (std::int64_t j0 = 0; j0 < n; j0 += NC) {
    const std::int64_t nc = std::min(NC, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += KC) {  // k blocks from 0: the same for every call
      const std::int64_t kc = std::min(KC, k - p0);
      pack_b(b, ldb, trans_b, p0, kc, j0, nc, bp);
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
