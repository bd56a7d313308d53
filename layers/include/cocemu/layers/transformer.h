#pragma once
/// A GPT/LLaMA-style transformer layer on a tensor-parallel group, forward and backward:
///   h1 = x + attn.out(attention(split_heads(attn.qkv(rmsnorm(x)))))
///   y  = h1 + mlp.down(act(mlp.up(rmsnorm(h1))))
/// with Megatron's sharding (QKV and MLP-up column parallel, attention-out and MLP-down row
/// parallel, query heads and KV groups split across ranks), GQA (kv_heads < heads), GeLU
/// (GPT/BLOOM) or SwiGLU (LLaMA: mlp.up produces gate and up halves), and sequence parallelism
/// on or off. The six CoC segments are named on their ops (Rank::set_segment) and in the trace:
/// "fwd attn.qkv" (comm first), "fwd attn.out" (compute first), "fwd mlp.up" (comm first),
/// "fwd mlp.down" (compute first), "bwd mlp.down" and "bwd attn.out" (comm first). Only
/// grad-input matmuls are split; grad-weight matmuls are not. Core attention is the local causal
/// flash attention of attention/ (16-bit inputs are widened to f32 for it, as flash kernels
/// accumulate in f32). RMSNorm has no learnable scale here. In a dry run (WorldOptions::numerics
/// false) pass `TransformerWeights::shapes`: nothing is allocated or computed, only modeled.
#include <memory>

#include "cocemu/attention/context_parallel.h"
#include "cocemu/collectives/group.h"
#include "cocemu/layers/linear.h"

namespace cocemu::layers {

enum class Activation : std::uint8_t { gelu, swiglu };

struct TransformerConfig {
  std::int64_t seq = 64, batch = 1, hidden = 64, heads = 4, ffn = 256;
  std::int64_t kv_heads = 0;  ///< KV groups (GQA); 0 = heads
  Activation activation = Activation::gelu;
  bool sequence_parallel = true;
  DType dtype = DType::f32;
  /// Megatron's selective recompute (--recompute-granularity selective): core attention is
  /// recomputed in the backward (with CP, its communication too) instead of kept.
  bool recompute_core_attention = false;
  /// Core attention as one flash-attention kernel (default), or unfused as Megatron ran it
  /// before FlashAttention: QKᵀ as a batched GEMM, the fused scale-mask-softmax and the dropout
  /// over the [b·h, s, s] scores in memory, then P·V (the numerics are the same; the price
  /// differs). Context-parallel attention is always flash.
  bool flash_attention = true;
  /// Unfused attention: the scale-mask-softmax as one fused kernel (Megatron's default), or,
  /// false (--no-masked-softmax-fusion), as its torch fallback in f32 (priced by
  /// unfused_attention_ns).
  bool masked_softmax_fusion = true;

  std::int64_t kv() const { return kv_heads ? kv_heads : heads; }
  std::int64_t head_dim() const { return hidden / heads; }
  /// Output columns of the QKV projection and of MLP-up (SwiGLU doubles it).
  std::int64_t qkv_width() const { return (heads + 2 * kv()) * head_dim(); }
  std::int64_t up_width() const { return activation == Activation::swiglu ? 2 * ffn : ffn; }
};

/// Full (unsharded) weights, as a single-rank model would hold them.
struct TransformerWeights {
  Tensor qkv;   ///< [qkv_width, hidden]: rows of q (heads), then k, then v (kv groups)
  Tensor out;   ///< [hidden, hidden]
  Tensor up;    ///< [up_width, hidden]: SwiGLU: gate rows, then up rows
  Tensor down;  ///< [hidden, ffn]
  static TransformerWeights random(const TransformerConfig& c, std::uint64_t seed);
  /// Shapes only, for dry runs.
  static TransformerWeights shapes(const TransformerConfig& c);
};

/// Context parallelism for a layer: its core attention runs as MindSpeed's CP attention over
/// `group` (the layer's rows are then this rank's tokens, attn::token_positions order).
struct ContextParallel {
  Group group;
  attn::CpConfig config;
};

class TransformerLayer {
 public:
  /// With `cp` (a group of more than one rank), x holds this cp rank's seq/cp tokens.
  TransformerLayer(Group& tp, const TransformerConfig& config, const TransformerWeights& full,
                   const ContextParallel* cp = nullptr);
  /// x: [seq·batch, hidden] rows in (s, b) order, or this rank's [seq·batch/tp, hidden] with SP.
  Tensor forward(const Tensor& x, const LinearOptions& options);
  Tensor backward(const Tensor& dy, const LinearOptions& options);
  const ColumnParallelLinear& qkv() const { return *qkv_; }
  const RowParallelLinear& attn_out() const { return *out_; }
  const ColumnParallelLinear& mlp_up() const { return *up_; }
  const RowParallelLinear& mlp_down() const { return *down_; }
  ColumnParallelLinear& qkv() { return *qkv_; }
  RowParallelLinear& attn_out() { return *out_; }
  ColumnParallelLinear& mlp_up() { return *up_; }
  RowParallelLinear& mlp_down() { return *down_; }

  /// Everything one forward keeps for its backward (the layer's and its linears'). A pipeline
  /// holds one per micro-batch in flight: take it after a forward, restore it before that
  /// micro-batch's backward. Dropping it (full recompute) frees those activations.
  struct Context;
  std::shared_ptr<Context> take_context();
  void restore_context(std::shared_ptr<Context> context);

 private:
  struct Saved;
  void local_attention_forward(Rank& rank, const std::shared_ptr<Saved>& s, const Tensor& out,
                               const Tensor& lse, const char* name) const;
  Group tp_;
  TransformerConfig c_;
  std::unique_ptr<attn::CpAttention> cp_attn_;
  int cp_size_ = 1;
  std::unique_ptr<ColumnParallelLinear> qkv_, up_;
  std::unique_ptr<RowParallelLinear> out_, down_;
  std::shared_ptr<Saved> saved_;
};

}  // namespace cocemu::layers
