#pragma once
// The parts of the decoder model that are not transformer layers — Megatron's vocab-parallel
// embedding, the final norm with the vocab-parallel LM head and cross-entropy — and the
// parameter buffers the optimizer and the data-parallel gradient reduction work on.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/collectives/group.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/layers/linear.h"
#include "cocemu/runtime/tensor.h"
#include "cocemu/train/trainer.h"

namespace cocemu::layers::train::detail {

using Batch = TokenBatch;

/// Megatron's VocabParallelEmbedding: rank r of the TP group holds rows [r·V/tp, (r+1)·V/tp) of
/// the table; a lookup outside them gives zeros, and the TP reduction (reduce_scatter along the
/// sequence with SP, else all_reduce) completes every row. Backward all-gathers the gradient (SP)
/// and adds each row into the table gradient, in row order.
class VocabEmbedding {
 public:
  VocabEmbedding(Group& tp, const Tensor& full_table, bool sequence_parallel);
  /// `rows` = seq × micro-batch (the batch is not read in a dry run).
  Tensor forward(const std::shared_ptr<const Batch>& batch, std::int64_t rows);
  void backward(const std::shared_ptr<const Batch>& batch, const Tensor& dy);
  Tensor& weight() { return weight_; }
  Tensor& grad() { return grad_; }

 private:
  Group tp_;
  Tensor weight_, grad_;
  std::int64_t first_row_ = 0;
  bool sp_;
};

/// Final RMSNorm, the vocab-parallel LM head (a column-parallel linear, SP all-gather inside)
/// and Megatron's vocab-parallel cross-entropy (all_reduce of the row max, of the target logit
/// and of the exp-sums over TP). The loss of a micro-batch is the mean over its tokens; its
/// gradient is scaled by 1/micro_batches, as Megatron scales each micro-batch's loss.
class VocabLoss {
 public:
  VocabLoss(Group& tp, const Tensor& head_shard, std::int64_t vocab_first, bool sequence_parallel,
            DType dtype, bool fused_cross_entropy);
  struct Saved;
  /// x: the last layer's output. Writes the micro-batch loss to *loss when it has run.
  std::shared_ptr<Saved> forward(const Tensor& x, const std::shared_ptr<const Batch>& batch,
                                 const LinearOptions& o, std::shared_ptr<double> loss);
  /// The gradient with respect to x, for a loss scaled by `scale`.
  Tensor backward(const std::shared_ptr<Saved>& saved, double scale, const LinearOptions& o);
  ColumnParallelLinear& head() { return *head_; }

 private:
  Group tp_;
  std::unique_ptr<ColumnParallelLinear> head_;
  std::int64_t vocab_first_;
  bool sp_;
  bool fused_;
  DType dtype_;
};

/// One parameter in a model's contiguous buffers.
struct ParamSlot {
  std::string name;
  std::int64_t offset = 0, numel = 0;
  Shape shape;
  int chunk = 0;  ///< the model chunk it belongs to
};

/// A gradient bucket: a contiguous range of the buffers (padded to a multiple of dp when the
/// optimizer is sharded), reduced over DP as soon as its last parameter's gradient is final.
struct Bucket {
  std::int64_t offset = 0, numel = 0;
  std::int64_t state_offset = 0;  ///< where its (owned part of the) optimizer state starts
  int chunk = 0;
  int params = 0;   ///< parameters it holds
  int pending = 0;  ///< parameters whose gradients are not final yet (this iteration)
};

/// When the distributed optimizer's parameter all-gathers run (Megatron's
/// param_and_grad_buffer.py):
///  - after_update: each bucket's all-gather right after the update, synchronously (without
///    --overlap-param-gather);
///  - chained (--overlap-param-gather, no interleaving): nothing after the update; the next
///    forward's pre-hook for a bucket dispatches its all-gather if it is not out yet, waits for
///    it, and dispatches the next bucket's (finish_param_sync): the first bucket is exposed, the
///    others overlap the forward one bucket ahead;
///  - aligned (--overlap-param-gather with interleaving, align_param_gather): the schedule
///    dispatches whole chunks' all-gathers (start_gathers), the pre-hooks wait for them.
enum class ParamGather : std::uint8_t { after_update, chained, aligned };

/// Megatron's DDP grad buffer and (distributed) optimizer for one rank's parameters: parameters
/// (model dtype) and gradients (f32; f64 for f64 models) in contiguous buffers, bucket by
/// bucket (buckets.h decides which), each bucket's parameters in the order the backward
/// finalizes them; Adam on f32 (f64) master weights — all of them, or with `sharded` this DP
/// rank's 1/dp of every bucket, followed by an all-gather of the parameters.
class ParamBuffers {
 public:
  /// `bucket_of`: each slot's bucket (0..B−1). `reduce` (buckets.h reduce_dtype): the dtype
  /// gradients are reduced in; a 16-bit one rounds each bucket to it before the reduction and
  /// back after, as 16-bit gradient buffers would (the casts themselves are not priced: such a
  /// buffer has none). `overlap` (Megatron's --overlap-grad-reduce): a bucket's reduction
  /// launches as soon as its last gradient is final; else all of them launch after the backward.
  ParamBuffers(Rank& rank, std::vector<ParamSlot> slots, const std::vector<int>& bucket_of,
               DType dtype, DType reduce, int dp, int dp_rank, bool sharded, bool overlap,
               ParamGather gather);
  Tensor param(int i) const;
  Tensor grad(int i) const;
  const std::vector<ParamSlot>& slots() const { return slots_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  /// Start of an iteration: gradients to zero, every bucket pending.
  void zero_grad();
  /// Parameter i's gradient is final: launches its bucket's reduction when it was the last one
  /// (without overlap: marks it for finish_reductions).
  void grad_ready(int i, Group& dp);
  /// After the backward: launches the deferred reductions (no overlap), then the current stream
  /// waits for every bucket's reduction.
  void finish_reductions();
  /// The gradients this rank updates (all of them, or its shards), reduced over DP.
  Tensor owned_grads() const { return sharded_ ? grad_shard_ : grads_; }
  /// Adam (step `step`, from 1) on the owned part, the reduced gradients times `grad_scale`
  /// (1/dp with gradients_mean); with sharding, the parameter all-gathers as `gather` says.
  void update(Group& dp, int step, const Adam& adam, double grad_scale);
  /// Forward pre-hook of parameter i (chained and aligned gathers): the current stream waits for
  /// its bucket's all-gather (dispatched now if it is not out yet), then (chained) the next
  /// bucket's goes out. The host does not block.
  void wait_params(int i);
  /// aligned: dispatches the all-gathers of `chunk`'s buckets that are not out yet.
  void start_gathers(int chunk);
  /// After the last iteration: every all-gather not dispatched yet runs now (Megatron syncs the
  /// parameters this way before a checkpoint or an evaluation), so the parameters are current.
  void finish_gathers();
  /// Master weights from the parameters (once their values have been bound in).
  void init_master();
  /// The parameters' values (for reports and tests).
  const Tensor& params() const { return params_; }

 private:
  std::int64_t owned_offset(const Bucket& b) const;  ///< the part this rank updates
  std::int64_t owned_numel(const Bucket& b) const;
  void launch_reduction(int bucket, Group& dp);
  void dispatch_gather(int bucket);
  Rank& rank_;
  std::vector<ParamSlot> slots_;
  std::vector<int> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<Work> reductions_;
  /// 16-bit reductions: per launched bucket, the rounded gradient it reduced and where its f32
  /// result goes (copied back in finish_reductions).
  std::vector<std::pair<Tensor, Tensor>> narrowed_;
  DType dtype_, grad_dtype_, reduce_dtype_;
  int dp_, dp_rank_;
  bool sharded_;
  bool overlap_;
  ParamGather gather_;
  Group* gather_group_ = nullptr;  ///< the dp group of the last update (overlapped gathers)
  std::vector<Work> gathers_;      ///< per bucket: its parameter all-gather, once dispatched
  std::vector<char> dispatched_, chained_;
  std::vector<std::pair<int, Group*>> deferred_;  ///< buckets ready, launched after the backward
  Tensor params_, grads_;
  Tensor master_, exp_avg_, exp_avg_sq_;  ///< [total] or, sharded, Σ bucket shards
  Tensor grad_shard_, param_shard_;       ///< sharded: this rank's slices, reduced / updated
};

}  // namespace cocemu::layers::train::detail
