#pragma once
// Compute-stream kernels used by the layers: each launches one op on the rank's current stream,
// priced by the cost model, doing the numerics on the stream worker.
#include <memory>
#include <mutex>
#include <string>

#include "cocemu/runtime/det_gemm.h"

#include "cocemu/runtime/tensor.h"
#include "cocemu/runtime/world.h"

namespace cocemu::layers::detail {

/// c[m, n] = op(a) · op(b) with the tiling-invariant GEMM; 16-bit inputs are widened to f32 and
/// the result rounded once. `weight_transposed` only affects the price (matmul_soc_friendly).
void matmul(Rank& rank, const std::string& name, const Tensor& a, bool trans_a, const Tensor& b,
            bool trans_b, const Tensor& c, bool weight_transposed = false);
/// The numerics of `matmul` alone (for fused kernels, already on a worker): det_gemm in
/// deterministic mode, OpenBLAS (whose bits depend on the shape of the call) otherwise.
void gemm_now(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
              bool deterministic);
/// op(w) shared by the GEMMs of many row chunks (script-side chunks, fused-kernel steps). In
/// deterministic mode an f32 weight is packed for det_gemm once, on first use on a worker,
/// instead of once per chunk; the bits are the same.
class WeightOperand {
 public:
  WeightOperand(Tensor w, bool trans, bool deterministic)
      : w_(std::move(w)), trans_(trans), deterministic_(deterministic) {}
  /// c = a · op(w).
  void gemm_now(const Tensor& a, const Tensor& c) const;

 private:
  Tensor w_;
  bool trans_, deterministic_;
  mutable std::once_flag packed_once_;
  mutable std::unique_ptr<blas::PackedB> packed_;
};
/// `matmul` of a row chunk against a shared weight operand.
void matmul(Rank& rank, const std::string& name, const Tensor& a,
            std::shared_ptr<const WeightOperand> w, const Tensor& c, bool weight_transposed);
/// Modeled time of an m×k·k×n GEMM in `dtype` on this rank's profile.
double gemm_cost_ns(const Rank& rank, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                    bool weight_transposed);
/// y[i, :] += bias (rounded once to y's dtype).
void add_bias(Rank& rank, const Tensor& y, const Tensor& bias);
void add_bias_now(const Tensor& y, const Tensor& bias);
/// main_grad (f32) += g.
void accumulate(Rank& rank, const Tensor& main_grad, const Tensor& g);
/// db (f32) += column sums of dy.
void bias_grad(Rank& rank, const Tensor& db, const Tensor& dy);
/// Row blocks [a, b, per] -> [b, a, per] (MindSpeed's shuffle_as_coc_*): src and dst [a·b·per, …].
void shuffle_rows(Rank& rank, const Tensor& src, const Tensor& dst, std::int64_t a, std::int64_t b);
/// Columns [col0, col0 + w) of `wide` [m, W] = `narrow` [m, w] (into_wide), or the reverse.
void copy_columns(Rank& rank, const Tensor& narrow, const Tensor& wide, std::int64_t col0,
                  bool into_wide);
/// A zero tensor with storage unless the run is a dry run.
Tensor alloc(const Rank& rank, const Shape& shape, DType dtype);

}  // namespace cocemu::layers::detail
