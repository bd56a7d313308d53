#pragma once
// Compute-stream kernels used by the layers: each launches one op on the rank's current stream,
// priced by the cost model, doing the numerics on the stream worker.
#include <memory>
#include <mutex>
#include <string>

#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/det_gemm.h"

#include "cocemu/runtime/tensor.h"
#include "cocemu/runtime/world.h"

namespace cocemu::layers::detail {

/// What MindSpeed's matmul_soc_friendly did to a GEMM's operands before it runs: the price of
/// the GEMM follows (the numerics do not change: a layout copy or zero padding of k leaves every
/// product the same).
struct SocPricing {
  bool weight_col_major = false;  ///< the weight was copied to column-major
  std::int64_t padded_k = 0;      ///< k after zero-padding; 0 when not padded
};

/// c[m, n] = op(a) · op(b) with the tiling-invariant GEMM; 16-bit inputs are widened to f32 and
/// the result rounded once. Priced with the operands' layouts (b transposed is column-major) and
/// `soc`.
void matmul(Rank& rank, const std::string& name, const Tensor& a, bool trans_a, const Tensor& b,
            bool trans_b, const Tensor& c, SocPricing soc = {});
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
  bool transposed() const { return trans_; }

 private:
  Tensor w_;
  bool trans_, deterministic_;
  mutable std::once_flag packed_once_;
  mutable std::unique_ptr<blas::PackedB> packed_;
};
/// `matmul` of a row chunk against a shared weight operand.
void matmul(Rank& rank, const std::string& name, const Tensor& a,
            std::shared_ptr<const WeightOperand> w, const Tensor& c, SocPricing soc = {});
/// Modeled time of an m×k·k×n GEMM in `dtype` on this rank's profile, with its operands' layouts
/// and what matmul_soc_friendly did to them.
double gemm_cost_ns(const Rank& rank, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                    GemmLayout layout, SocPricing soc = {});
/// y[i, :] += bias (rounded once to y's dtype).
void add_bias(Rank& rank, const Tensor& y, const Tensor& bias);
void add_bias_now(const Tensor& y, const Tensor& bias);
/// The dtype of a weight's main_grad: f32 (Megatron's), f64 for f64 weights.
DType grad_dtype(DType weight);
/// main_grad += g.
void accumulate(Rank& rank, const Tensor& main_grad, const Tensor& g);
/// The weight gradient main_grad (f32) += dyᵀ·x, dy [m, n], x [m, k]. With `fusion` (Megatron's
/// gradient_accumulation_fusion) one GEMM accumulates into main_grad with f32 sums (16-bit
/// inputs are widened, the product is not rounded to their dtype); without, a GEMM into a
/// gradient of the input dtype and then an `accumulate` pass.
void weight_grad(Rank& rank, const std::string& name, const Tensor& dy, const Tensor& x,
                 const Tensor& main_grad, bool fusion);
/// db (f32) += column sums of dy.
void bias_grad(Rank& rank, const Tensor& db, const Tensor& dy);
/// Row blocks [a, b, per] -> [b, a, per] (MindSpeed's shuffle_as_coc_*): src and dst [a·b·per, …].
void shuffle_rows(Rank& rank, const Tensor& src, const Tensor& dst, std::int64_t a, std::int64_t b);
/// Columns [col0, col0 + w) of `wide` [m, W] = `narrow` [m, w] (into_wide), or the reverse.
void copy_columns(Rank& rank, const Tensor& narrow, const Tensor& wide, std::int64_t col0,
                  bool into_wide);
/// Normal(0, scale) values from seed (std::mt19937_64), rounded once to `dtype`: initial weights.
Tensor random_normal(const Shape& shape, DType dtype, std::uint64_t seed, double scale);
/// A zero tensor with storage unless the run is a dry run.
Tensor alloc(const Rank& rank, const Shape& shape, DType dtype);
/// As `alloc`, with unspecified contents (Tensor::empty): for outputs that a GEMM or a collective
/// writes whole before anything reads them.
Tensor alloc_out(const Rank& rank, const Shape& shape, DType dtype);

/// Memory-bound work on the current stream, priced as `bytes` of device-memory traffic.
template <class Fn>
void elementwise(Rank& rank, const std::string& name, std::uint64_t bytes, Fn fn) {
  rank.current_stream().launch({.name = name,
                                .cls = OpClass::compute,
                                .work_ns = memory_ns(rank.profile(), bytes),
                                .hbm_bytes = bytes},
                               std::move(fn));
}
/// Element i of any dtype as double; `set` stores a double rounded once to the tensor's dtype
/// (the elementwise numerics run in double).
double at(const Tensor& t, std::int64_t i);
void set(const Tensor& t, std::int64_t i, double v);
/// RMSNorm without a learnable scale, eps 1e-6: y = x / rms(x) per row; rms (f64 [rows]) saved.
void rmsnorm(Rank& rank, const Tensor& x, const Tensor& y, const Tensor& rms);
/// Its backward: accum += (dy − x̂·mean(dy·x̂)) / rms, x̂ = x / rms.
void rmsnorm_backward(Rank& rank, const Tensor& x, const Tensor& rms, const Tensor& dy,
                      const Tensor& accum);

}  // namespace cocemu::layers::detail
