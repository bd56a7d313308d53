#pragma once
/// The training step on the emulated ranks (R-TR-1..6): a decoder of transformer layers with
/// Megatron's vocab-parallel embedding and cross-entropy, pipeline stages fed by p2p transfers,
/// gradient accumulation over micro-batches, bucketed data-parallel gradient reduction that
/// overlaps the backward, and Adam on fp32 master weights — optionally sharded over dp
/// (Megatron's distributed optimizer).
///
/// Streams per rank: compute; TP collectives on the comm stream; DP reductions on their own
/// stream ("dp comm", PyTorch gives each process group its own); every pipeline transfer on a
/// stream of its own link and direction ("pp fwd in", "pp fwd out", "pp bwd in", "pp bwd out").
/// The host enqueues a whole iteration without blocking; events order the streams, so the
/// modeled timeline shows the pipeline as the schedule lays it out. Pipeline transfers go out in
/// Megatron's p2p calls (pipeline.h, pipeline_steps): in 1F1B (and interleaved without
/// overlap_p2p_comm) a stage's compute waits for every send and receive of a call, in the
/// overlapped interleaved schedule only for its receives.
///
/// Context parallelism runs each layer's core attention as MindSpeed's CP attention (ring,
/// Ulysses, hybrid, double ring) over the cp group, on this rank's seq/cp tokens (the
/// load-balanced causal split); gradients are then reduced over dp × cp, as Megatron's
/// data-parallel group with context parallelism. Selective recompute recomputes core attention
/// (with CP, its transfers too) in the backward.
///
/// MindSpore's micro_batch_interleave_num = 2 (multi-copy) splits each micro-batch in two along
/// the batch; each copy runs on its own compute stream and TP communicator, and the copies'
/// losses add up as MindSpore's MicroBatchInterleaved sums them (so gradients and their norm are
/// twice a mean's; the reported loss is divided by the copies, as MindFormers logs it).
///
/// Not modeled: tied embeddings (the LM head is untied, as LLaMA's), gradient clipping (the
/// global gradient norm is computed and all-reduced every iteration, as Megatron logs it, but not
/// applied: clipping by a norm whose partial sums depend on the stage split would make pipeline
/// layouts differ in the last bits).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/layers/linear.h"
#include "cocemu/runtime/world.h"
#include "cocemu/train/layout.h"
#include "cocemu/train/pipeline.h"

namespace cocemu::layers::train {

struct Adam {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
};

struct TrainOptions {
  DecoderShape model;
  TrainLayout layout;
  int iterations = 3;
  std::uint64_t seed = 1;  ///< weights and data
  Adam adam;
  /// The TP linears' CoC options (strategy, tiling; `per_shape` for a tuned config).
  LinearOptions linear;
  /// Record every rank's op ranges of each model part (TrainResult::pieces), for the step model.
  bool record_pieces = false;
};

/// Rank 0's ops [first_op, end_op) of one part of one pass: "embedding fwd", "layer fwd",
/// "loss fwd", "loss bwd", "layer bwd", "embedding bwd".
struct PieceRange {
  std::string what;
  std::uint32_t first_op = 0, end_op = 0;
  int rank = 0;  ///< whose record the range is in
};

/// One forward or backward of the pipeline picture: a rank's ops [first_op, end_op) in its
/// record (the last iteration).
struct PipelineBlock {
  int rank = 0, stage = 0;
  PipelineAction action;
  std::uint32_t first_op = 0, end_op = 0;
};

struct TrainResult {
  std::vector<double> loss;       ///< per iteration, mean over tokens (copies too); empty dry
  std::vector<double> grad_norm;  ///< per iteration, the global gradient norm; empty dry
  /// Updated parameters of the dp-rank-0, cp-rank-0 ranks: "layer3.mlp.up tp1" → shard.
  std::map<std::string, Tensor> weights;
  std::vector<PipelineBlock> blocks;
  std::vector<PieceRange> pieces;  ///< with TrainOptions::record_pieces
  /// Per rank, the index of its first op of each iteration (to cut the timeline).
  std::vector<std::vector<std::uint32_t>> iteration_first_op;
  /// Per rank, the index after its last iteration's ops (what follows, the final parameter
  /// all-gathers of --overlap-param-gather, belongs to no iteration).
  std::vector<std::uint32_t> end_op;
  std::int64_t padded_vocab = 0;
  std::vector<std::string> warnings;
  RunResult run;
};

/// Megatron's padded vocabulary: a multiple of 128 × tp.
std::int64_t padded_vocab(std::int64_t vocab, int tp);

/// Device-memory bytes of Megatron's vocab-parallel cross-entropy kernels on a rank's
/// [tokens, V/tp] logits of `elements` values in `dtype`, computed in `acc` (f32; f64 for f64
/// models). The per-row gathers and all_reduces are small and priced apart.
/// Unfused (megatron/core/tensor_parallel/cross_entropy.py, Megatron's default): each kernel reads
/// and writes whole tensors — `.float()` (a copy unless dtype is acc), the row max, `-= max` in
/// place, exp in place, the row sum, the softmax `div_` kept for backward, and in backward `mul_`
/// by the loss gradient and the cast back to dtype.
/// Fused (--cross-entropy-loss-fusion, megatron/core/fusions/fused_cross_entropy.py): each
/// jit-fused function is one pass — cast and max (the f32 copy is written), subtract, exp and sum
/// (read and write in place), the softmax div_, and in backward the gradient and the cast.
struct CrossEntropyTraffic {
  CrossEntropyTraffic(std::uint64_t elements, DType dtype, DType acc, bool fused);
  std::uint64_t max = 0;      // cast to acc (if needed) + row max
  std::uint64_t target = 0;   // logits -= max (fused: inside exp_sum)
  std::uint64_t exp_sum = 0;  // exp in place + row sum
  std::uint64_t loss = 0;     // softmax: div_ by the sum
  std::uint64_t grad = 0;     // backward: mul_ + cast to dtype (if needed)
};

/// One micro-batch of synthetic data: token ids and next-token labels, rows in (s, b) order
/// (Megatron's [s, b, h] activations flattened). Sample i of iteration t is the same on every
/// rank and in every layout: it is global sample t · global_batch + i.
struct TokenBatch {
  std::vector<std::int32_t> tokens, labels;
};
TokenBatch synthetic_batch(std::uint64_t seed, std::int64_t vocab, std::int64_t seq,
                           std::int64_t batch, std::int64_t first_sample);

/// The initial full (unsharded) weights: the embedding table and the LM head [padded vocab,
/// hidden], and layer i's weights (TransformerWeights::random with a seed of its own).
Tensor initial_embedding(const TrainOptions& o, std::int64_t padded_vocab);
Tensor initial_head(const TrainOptions& o, std::int64_t padded_vocab);
std::uint64_t layer_seed(const TrainOptions& o, std::int64_t layer);

/// Runs `options.iterations` training iterations on layout.world() ranks. `world` gives the
/// profile, numerics (false: a dry run) and determinism; its n_ranks is ignored.
TrainResult train(const TrainOptions& options, WorldOptions world);

}  // namespace cocemu::layers::train
