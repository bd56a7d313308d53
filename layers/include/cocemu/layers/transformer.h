#pragma once
/// A GPT-style transformer layer on a tensor-parallel group, forward and backward:
///   h1 = x + attn.out(attention(split_heads(attn.qkv(rmsnorm(x)))))
///   y  = h1 + mlp.down(gelu(mlp.up(rmsnorm(h1))))
/// with Megatron's sharding (QKV and MLP-up column parallel, attention-out and MLP-down row
/// parallel, heads split across ranks) and sequence parallelism on or off. The six CoC segments
/// carry their names in the trace: forward attn.qkv (comm first), attn.out (compute first),
/// mlp.up (comm first), mlp.down (compute first); backward mlp.down and attn.out (comm first).
/// Only grad-input matmuls are split; grad-weight matmuls are not. Core attention is the local
/// causal flash attention of attention/. RMSNorm has no learnable scale here.
#include <memory>

#include "cocemu/collectives/group.h"
#include "cocemu/layers/linear.h"

namespace cocemu::layers {

struct TransformerConfig {
  std::int64_t seq = 64, batch = 1, hidden = 64, heads = 4, ffn = 256;
  bool sequence_parallel = true;
  DType dtype = DType::f32;
};

/// Full (unsharded) weights, as a single-rank model would hold them.
struct TransformerWeights {
  Tensor qkv;   ///< [3·hidden, hidden]: rows of q, then k, then v
  Tensor out;   ///< [hidden, hidden]
  Tensor up;    ///< [ffn, hidden]
  Tensor down;  ///< [hidden, ffn]
  static TransformerWeights random(const TransformerConfig& c, std::uint64_t seed);
};

class TransformerLayer {
 public:
  TransformerLayer(Group& tp, const TransformerConfig& config, const TransformerWeights& full);
  /// x: [seq·batch, hidden] rows in (s, b) order, or this rank's [seq·batch/tp, hidden] with SP.
  Tensor forward(const Tensor& x, const LinearOptions& options);
  Tensor backward(const Tensor& dy, const LinearOptions& options);
  const ColumnParallelLinear& qkv() const { return *qkv_; }
  const RowParallelLinear& attn_out() const { return *out_; }
  const ColumnParallelLinear& mlp_up() const { return *up_; }
  const RowParallelLinear& mlp_down() const { return *down_; }

 private:
  struct Saved;
  Group tp_;
  TransformerConfig c_;
  std::unique_ptr<ColumnParallelLinear> qkv_, up_;
  std::unique_ptr<RowParallelLinear> out_, down_;
  std::shared_ptr<Saved> saved_;
};

}  // namespace cocemu::layers
