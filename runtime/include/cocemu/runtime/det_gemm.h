#pragma once
/// Tiling-invariant GEMM for deterministic mode. Every output element is
///   c[i][j] = fma(a[i][k-1], b[k-1][j], … fma(a[i][1], b[1][j], a[i][0]·b[0][j]) …)
/// accumulated in the storage precision, in order of k, whatever the shape of the call. So a
/// product computed whole, in row chunks (script-side CoC), or tile by tile (fused kernels) has
/// the same bits — which OpenBLAS does not guarantee (its small-matrix and edge kernels
/// accumulate in other orders). Packed, cache-blocked, with an AVX-512 micro-kernel for f32.
#include <cstdint>
#include <vector>

namespace cocemu::blas {

/// C[m, n] = op(A) · op(B), row-major; op(A) = A [m, k] or, with trans_a, Aᵀ for A [k, m];
/// op(B) = B [k, n] or, with trans_b, Bᵀ for B [n, k].
void det_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
              bool trans_a, const float* b, std::int64_t ldb, bool trans_b, float* c,
              std::int64_t ldc);
void det_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const double* a, std::int64_t lda,
              bool trans_a, const double* b, std::int64_t ldb, bool trans_b, double* c,
              std::int64_t ldc);

/// op(B) packed once for many products that share it (row chunks of script-side CoC, the steps
/// of a fused kernel): each call then skips re-packing B. Same arithmetic, same bits.
class PackedB {
 public:
  PackedB(const float* b, std::int64_t ldb, bool trans_b, std::int64_t k, std::int64_t n);
  std::int64_t k() const { return k_; }
  std::int64_t n() const { return n_; }

 private:
  friend void det_gemm(std::int64_t, const float*, std::int64_t, bool, const PackedB&, float*,
                       std::int64_t);
  std::int64_t k_, n_;
  std::vector<float> data_;
};

/// C[m, b.n()] = op(A) · op(B) with B packed beforehand; bitwise equal to the unpacked call.
void det_gemm(std::int64_t m, const float* a, std::int64_t lda, bool trans_a, const PackedB& b,
              float* c, std::int64_t ldc);

}  // namespace cocemu::blas
