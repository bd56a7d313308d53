#include "cocemu/train/buckets.h"

#include <algorithm>
#include <map>

#include "cocemu/runtime/error.h"

namespace cocemu::layers::train {

std::int64_t megatron_bucket_elements(int dp) {
  return std::max<std::int64_t>(40'000'000, 1'000'000 * std::int64_t(dp));
}

DType reduce_dtype(const TrainLayout& l) {
  if (l.dtype == DType::f64) return DType::f64;
  return l.grad_reduce_in_fp32 || l.dtype == DType::f32 ? DType::f32 : l.dtype;
}

std::vector<int> assign_buckets(const DecoderShape& m, const TrainLayout& l, int stage,
                                const std::vector<GradParam>& params) {
  std::vector<int> out(params.size(), 0);
  if (l.gradient_aggregation_group > 0) {
    // MindFormers' fusion groups, numbered here in the order their first member appears.
    const std::int64_t dis =
        std::max<std::int64_t>((m.num_layers + 1) / l.gradient_aggregation_group, 1);
    std::map<std::int64_t, int> ids;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      const std::int64_t group =
          l.pp > 1 ? (p.layer >= 0 ? 1 : 0) : std::max<std::int64_t>(p.layer, 0) / dis;
      out[i] = ids.try_emplace(group, int(ids.size())).first->second;
    }
    return out;
  }
  // Buckets in backward order, each closed when it holds its size; never across chunks.
  const std::size_t e = size_of(reduce_dtype(l));
  int bucket = 0;
  std::int64_t held = 0, count = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (i > 0 && p.chunk != params[i - 1].chunk && count > 0) {
      ++bucket;
      held = count = 0;
    }
    out[i] = bucket;
    held += p.numel;
    ++count;
    bool close = false;
    if (l.bucket_params > 0)
      close = count >= l.bucket_params;
    else if (!l.overlap_grad_reduce)
      close = false;  // Megatron: bucket_size None without overlap, one bucket per chunk
    else if (l.bucket_mb > 0)
      close = double(held) * double(e) >= l.bucket_mb * 1e6;
    else if (stage == 0 && p.chunk == 0)
      close = held >= megatron_bucket_elements(l.dp);
    if (close && i + 1 < params.size()) {
      ++bucket;
      held = count = 0;
    }
  }
  return out;
}

}  // namespace cocemu::layers::train
