#pragma once
/// Tiling-invariant GEMM for deterministic mode. Every output element is
///   c[i][j] = fma(a[i][k-1], b[k-1][j], … fma(a[i][1], b[1][j], a[i][0]·b[0][j]) …)
/// accumulated in the storage precision, in order of k, whatever the shape of the call. So a
/// product computed whole, in row chunks (script-side CoC), or tile by tile (fused kernels) has
/// the same bits — which OpenBLAS does not guarantee (its small-matrix and edge kernels
/// accumulate in other orders). Packed, cache-blocked, with an AVX-512 micro-kernel for f32.
#include <cstdint>

namespace cocemu::blas {

/// C[m, n] = op(A) · op(B), row-major; op(A) = A [m, k] or, with trans_a, Aᵀ for A [k, m];
/// op(B) = B [k, n] or, with trans_b, Bᵀ for B [n, k].
void det_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
              bool trans_a, const float* b, std::int64_t ldb, bool trans_b, float* c,
              std::int64_t ldc);
void det_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const double* a, std::int64_t lda,
              bool trans_a, const double* b, std::int64_t ldb, bool trans_b, double* c,
              std::int64_t ldc);

}  // namespace cocemu::blas
