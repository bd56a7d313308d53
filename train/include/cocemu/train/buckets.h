#pragma once
/// How a stage's gradients are grouped for their data-parallel reduction (and, with the
/// distributed optimizer, its parameters for their all-gather), shared by the emulated ranks
/// (ParamBuffers) and the step model:
///  - Megatron's DDP (the default): one buffer per model chunk, never a bucket across chunks;
///    buckets of max(40M, 1M·dp) elements (distributed_data_parallel.py: bucket_size =
///    max(40000000, 1000000 * dp_group.size()), dp without cp) on pipeline rank 0's first chunk
///    only; one bucket per chunk on later pipeline ranks, on chunks > 0 (training.py passes
///    disable_bucketing for them) and without --overlap-grad-reduce (bucket_size None);
///  - an explicit bucket_mb (PyTorch DDP's bucket_cap_mb): buckets of that many MB of reduced
///    gradients on every stage and chunk (one per chunk without overlap);
///  - bucket_params > 0: that many parameters per bucket (per chunk);
///  - gradient_aggregation_group G > 0 (MindFormers' comm-fusion groups, LayerSetting in
///    mindformers/models/utils.py): with pp > 1 every layer in one group and the embedding and
///    LM head in another; with pp = 1 layer i in group i / max((L + 1) / G, 1), the embedding and
///    LM head in the first group (MindSpore's default fusion index, that of the first layers).
/// A bucket closes when it holds at least its size (parameters are never split), as Megatron's
/// _compute_default_per_buffer_param_layout does.
#include <cstdint>
#include <vector>

#include "cocemu/train/layout.h"

namespace cocemu::layers::train {

/// One parameter of a stage's gradient buffer, in the order the backward finalizes them.
struct GradParam {
  int chunk = 0;            ///< model chunk on this stage
  std::int64_t layer = -1;  ///< the model's layer index; -1: the embedding or the LM head
  std::int64_t numel = 0;   ///< elements on this rank (after TP)
};

/// Megatron's default DDP bucket: max(40M, 1M·dp) elements.
std::int64_t megatron_bucket_elements(int dp);

/// The dtype a stage's gradients are reduced in: f32 (f64 for f64 models), or the model's
/// 16-bit dtype with grad_reduce_in_fp32 false.
DType reduce_dtype(const TrainLayout& layout);

/// The bucket of each parameter of `params` (in backward order) on `stage`, numbered 0.. in the
/// order of their first parameter: buckets of one model chunk are contiguous in that order
/// except MindFormers' groups, whose members may be apart.
std::vector<int> assign_buckets(const DecoderShape& model, const TrainLayout& layout, int stage,
                                const std::vector<GradParam>& params);

}  // namespace cocemu::layers::train
