#pragma once
/// A training layout: how a decoder model is spread over tp × cp × dp × pp ranks (plus virtual
/// pipeline stages), how a global batch is cut into micro-batches, and which memory and overlap
/// features are on. The names follow Megatron/MindSpeed; MindFormers' `parallel_config` keys map
/// onto them (see train/config.h). `check_layout` applies Megatron's assertions and MindFormers'
/// rules (R-TR-2): every violation is an error naming the numbers; what MindFormers only warns
/// about comes back as warnings.
#include <cstdint>
#include <string>
#include <vector>

#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/dtype.h"

namespace cocemu::layers::train {

enum class PipelineSchedule : std::uint8_t { gpipe, one_f_one_b, interleaved };
enum class Recompute : std::uint8_t { none, selective, full };
const char* to_string(PipelineSchedule s);
const char* to_string(Recompute r);
PipelineSchedule parse_schedule(const std::string& name);  ///< gpipe, 1f1b, interleaved
Recompute parse_recompute(const std::string& name);        ///< none, selective, full

/// The decoder's shapes (a `configs/models/*.yaml` plus vocabulary and depth).
struct DecoderShape {
  std::string name = "tiny";
  std::int64_t hidden = 64, heads = 4, kv_heads = 0, ffn = 256, num_layers = 4, vocab = 256;
  std::int64_t seq = 32;
  bool swiglu = true;
  bool flash_attention = true;  ///< false: Megatron's unfused core attention (priced as such)
  /// Unfused attention only: false is Megatron's --no-masked-softmax-fusion (the softmax as
  /// separate f32 torch passes; TransformerConfig::masked_softmax_fusion).
  bool masked_softmax_fusion = true;
  std::int64_t kv() const { return kv_heads ? kv_heads : heads; }
};

struct TrainLayout {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int vpp = 1;                        ///< model chunks per stage (interleaved 1F1B)
  std::int64_t micro_batch_size = 1;  ///< sequences per micro-batch (per dp rank)
  std::int64_t global_batch_size = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = true;
  bool distributed_optimizer = false;  ///< Megatron's --use-distributed-optimizer
  bool gradients_mean = true;          ///< divide reduced gradients by dp
  int micro_batch_interleave = 1;      ///< MindSpore's micro_batch_interleave_num (1 or 2)
  /// Gradient buckets (buckets.h): the DP reduction of a bucket starts when its last gradient
  /// is ready. All zero: Megatron's DDP (max(40M, 1M·dp) elements per bucket on pipeline rank
  /// 0's first chunk, one bucket per chunk elsewhere and without overlap_grad_reduce).
  /// gradient_aggregation_group > 0: MindFormers' comm-fusion groups over the layers (one group
  /// of layers when pp > 1). bucket_params > 0: that many parameters per bucket. bucket_mb > 0:
  /// that many MB of reduced gradients per bucket on every stage (PyTorch DDP's bucket_cap_mb).
  int gradient_aggregation_group = 0;
  int bucket_params = 0;
  double bucket_mb = 0;
  /// Gradients accumulated and reduced in f32 (Megatron's --accumulate-allreduce-grads-in-fp32,
  /// forced with bf16); false: reduced in the 16-bit dtype, as 2021 Megatron's fp16 runs without
  /// that flag did (the emulated ranks round each bucket to it for its reduction and back).
  bool grad_reduce_in_fp32 = true;
  /// Explicit layers per stage (pp entries summing to num_layers); empty: an even split.
  std::vector<std::int64_t> stage_layers;
  DType dtype = DType::bf16;
  /// Context parallelism (MindSpeed's flags): megatron_cp_algo (ring), ulysses_cp_algo or
  /// hybrid_cp_algo; the double ring's window; Ulysses' degree inside hybrid.
  std::string cp_algo = "megatron_cp_algo";
  int cp_window_size = 1, ulysses_degree_in_cp = 0;
  bool use_cp_send_recv_overlap = false;
  /// Megatron's --overlap-grad-reduce (a bucket's DP reduction starts as soon as its last
  /// gradient is final; off: all reductions after the backward) and --overlap-param-gather (the
  /// distributed optimizer's parameter all-gathers go out after the update and the next
  /// iteration's forward waits for each bucket where it first reads it).
  bool overlap_grad_reduce = true;
  bool overlap_param_gather = false;
  /// Megatron's --overlap-p2p-comm for the interleaved schedule (its default since 2023-10): a
  /// stage does not wait for its sends. Off (2021-2022 Megatron, batched p2p), every p2p call
  /// blocks the stage until all its transfers are done (pipeline.h, P2PMode). Megatron's
  /// non-interleaved 1F1B always blocks; GPipe never does.
  bool overlap_p2p_comm = true;
  /// Megatron's --cross-entropy-loss-fusion: the loss runs as jit-fused kernels (fewer passes
  /// over the logits; see CrossEntropyTraffic) and one all_reduce carries the target logits and
  /// the exp-sums. The same numerics either way.
  bool cross_entropy_fusion = false;
  /// Megatron 2021-2022's scatter/gather of pipeline tensors (--scatter-gather-tensors-in-pipeline,
  /// on by default there, gone from Megatron-Core; Narayanan et al. 2021 §4.1): without sequence
  /// parallelism, each TP rank sends only its 1/tp slice of the activation (or its gradient) to
  /// the next stage, over its own link, and the receiving stage all-gathers the slices over its
  /// TP group before using them. Off, or with sequence parallelism, or tp 1: each TP rank sends
  /// its whole tensor. The same numerics either way.
  bool scatter_gather_tensors_in_pipeline = false;
  /// Whether pipeline tensors travel as 1/tp slices (the option on, tp > 1, no SP).
  bool pipeline_scatter_gather() const {
    return scatter_gather_tensors_in_pipeline && tp > 1 && !sequence_parallel;
  }
  Strategy coc = Strategy::serial;  ///< CoC strategy of the TP linears
  int coc_parallel_num = 1;         ///< script strategy: chunks

  int world() const { return tp * cp * dp * pp; }
  std::int64_t micro_batches() const { return global_batch_size / (micro_batch_size * dp); }
  /// "tp2 cp2 dp2 pp2 vpp2 mbs2 gbs16 interleaved sp dist-opt ring 2-copy": the sizes, the
  /// schedule, then every option that is on (or, for the overlaps and f32 gradient reduction,
  /// off), the CP algorithm, an explicit layer split and multi-copy.
  std::string describe() const;
};

struct LayoutCheck {
  std::vector<std::string> warnings;
};
/// Throws Errc::invalid_argument with the numbers for any impossible layout on `world_size`
/// devices; returns MindFormers' warnings (e.g. layers not divisible by stages with an explicit
/// split).
LayoutCheck check_layout(const DecoderShape& model, const TrainLayout& layout, int world_size);

/// Layers of stage s, chunk c: [first, first + count) in model order. Megatron's interleaved
/// assignment: chunk c of stage s holds the (c·pp + s)-th block of layers.
struct LayerRange {
  std::int64_t first = 0, count = 0;
};
LayerRange layers_of(const DecoderShape& model, const TrainLayout& layout, int stage, int chunk);

}  // namespace cocemu::layers::train
