#pragma once
/// Megatron's tensor-parallel linears with MindSpeed's CoC strategies.
///
///  ColumnParallelLinear: Y = X·Wᵀ + b, W [n/tp, k] (output features sharded).
///    no SP: forward = matmul; backward = grad-input matmul + all_reduce.
///    SP:    forward = all_gather(sequence) + matmul; backward = grad-input matmul +
///           reduce_scatter, weight grad from the gathered input (re-gathered when
///           recompute_all_gather, else saved from the forward).
///  RowParallelLinear: Y = X·Wᵀ + b, W [n, k/tp] (input features sharded).
///    no SP: forward = matmul + all_reduce; backward = matmul.
///    SP:    forward = matmul + reduce_scatter; backward = all_gather(grad output) + matmul.
/// Bias is added once, after any reduction. Weight gradients accumulate into a persistent f32 (f64
/// for f64 weights) `main_grad`. Each communicating pass runs with a strategy: serial, script (P
/// chunks over the compute and comm streams, MindSpeed's chunk layouts and reorders) or fused (one
/// tile-pipelined kernel on symmetric memory, see fused_kernels.h). In deterministic mode every
/// strategy gives the same bits: GEMMs are tiling-invariant (det_gemm) and reductions sum in rank
/// order.
///
/// m not divisible by P (or by tp·P where the reorder needs it): the script strategy uses the
/// largest P' in {8, 4, 2, 1} not above P that divides it (identical results; the trace name
/// shows the P actually used).
#include <cstdint>
#include <memory>
#include <utility>

#include "cocemu/collectives/group.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/tensor.h"

namespace cocemu::layers {

struct LinearOptions {
  Strategy strategy = Strategy::serial;
  int parallel_num = 1;          ///< script: chunks (1 = MindSpeed's rewrite mode)
  std::int64_t tile_rows = 128;  ///< fused: rows per tile
  int tiles_per_step = 2;        ///< fused: tiles per communication step
  bool recompute_all_gather = true;
  bool enable_coc_in_column_backward = false;
  /// Megatron's default (--no-gradient-accumulation-fusion turns it off): the weight-gradient
  /// GEMM accumulates into the f32 main_grad in one kernel (MindSpeed: npu_matmul_add_fp32);
  /// false: a GEMM into a gradient of the input dtype, then a separate main_grad += pass.
  bool gradient_accumulation_fusion = true;
  /// MindSpeed's matmul_soc_friendly on script ops with P > 1: the weight copied to column-major
  /// or k zero-padded, priced as copies and a differently shaped GEMM (numerics unchanged).
  bool matmul_soc_friendly = true;
  std::int64_t k_min = 1024, k_max = 4096;  ///< the k range in which k may be padded
  std::string label;                        ///< trace name prefix, e.g. "mlp.up"
  /// If set, every op takes its options from this config for its own [m, k, n] (m as MindSpeed
  /// counts it: gathered for the SP column forward and row backward; k and n of the local GEMM,
  /// for the backward its grad-input product), as MindSpeed's get_parallel_num does.
  std::shared_ptr<const CocConfig> per_shape;
};

/// Strategy options for one op from a CoC config (MindSpeed's get_parallel_num).
LinearOptions options_for(const CocConfig& config, std::int64_t m, std::int64_t k, std::int64_t n);
/// A given strategy with the config's other switches (tiling, recompute, SoC-friendly operands).
LinearOptions options_for(const CocConfig& config, Strategy strategy, int parallel_num);
/// The config switches an op's options carry (tiling, recompute, SoC-friendly operands, the k
/// range): options_for's inverse, without strategy or per-shape entries.
CocConfig switches_of(const LinearOptions& options);

class ColumnParallelLinear {
 public:
  /// weight: this rank's shard [n/tp, k]; bias: [n/tp] or undefined.
  ColumnParallelLinear(Group& tp, Tensor weight, Tensor bias, bool sequence_parallel,
                       bool gather_output = false);
  /// x: [m, k], or [m/tp, k] with sequence parallel. Returns [m, n/tp] ([m, n] if gather_output).
  Tensor forward(const Tensor& x, const LinearOptions& o = {});
  /// dy like the forward's output; returns dX like x. Accumulates main_grad and bias_grad.
  Tensor backward(const Tensor& dy, const LinearOptions& o = {});
  const Tensor& weight() const { return weight_; }
  const Tensor& main_grad() const { return main_grad_; }
  const Tensor& bias_grad() const { return bias_grad_; }
  /// What the backward needs from one forward. A pipeline keeps one per micro-batch in flight:
  /// take it after the forward, restore it before that micro-batch's backward.
  struct Saved {
    Tensor input;
    bool gathered = false;
  };
  Saved take_saved() { return {std::exchange(saved_input_, Tensor()), saved_is_gathered_}; }
  void restore_saved(Saved s) {
    saved_input_ = std::move(s.input);
    saved_is_gathered_ = s.gathered;
  }
  /// Moves the weight into `weight` and the gradient into `grad` (views of a model's contiguous
  /// parameter and f32 gradient buffers, as Megatron's DDP lays them out); same shapes, the
  /// weight's values are copied.
  void bind(const Tensor& weight, const Tensor& grad);

 private:
  Group tp_;
  Tensor weight_, bias_, main_grad_, bias_grad_;
  bool sp_, gather_output_;
  Tensor saved_input_;  // x (no SP, or SP with recompute) or the gathered x (SP, no recompute)
  bool saved_is_gathered_ = false;
};

class RowParallelLinear {
 public:
  /// weight: this rank's shard [n, k/tp]; bias: [n] or undefined.
  RowParallelLinear(Group& tp, Tensor weight, Tensor bias, bool sequence_parallel,
                    bool input_is_parallel = true);
  /// x: [m, k/tp] ([m, k] if !input_is_parallel). Returns [m, n], or [m/tp, n] with SP.
  Tensor forward(const Tensor& x, const LinearOptions& o = {});
  Tensor backward(const Tensor& dy, const LinearOptions& o = {});
  const Tensor& weight() const { return weight_; }
  const Tensor& main_grad() const { return main_grad_; }
  const Tensor& bias_grad() const { return bias_grad_; }
  Tensor take_saved() { return std::exchange(saved_input_, Tensor()); }
  void restore_saved(Tensor input) { saved_input_ = std::move(input); }
  /// As ColumnParallelLinear::bind.
  void bind(const Tensor& weight, const Tensor& grad);

 private:
  Group tp_;
  Tensor weight_, bias_, main_grad_, bias_grad_;
  bool sp_, input_is_parallel_;
  Tensor saved_input_;
};

/// Prints the first values of each of `blocks` row blocks of a tensor (MindSpeed's
/// print_tensor_value), so a rewrite run and a CoC run can be compared; blocks default to
/// parallel_num·tp. Returns the text it printed.
std::string print_tensor_value(const std::string& label, const Tensor& t, int rank, int blocks,
                               int values = 5);

}  // namespace cocemu::layers
