#pragma once
// Megatron's tensor-parallel reductions (megatron/core/tensor_parallel/mappings.py, `_reduce`:
// "bypass the function if we are using only 1 GPU"; the column-parallel backward issues its
// grad-input all-reduce only with tp > 1): with one member in the TP group the tensor already
// holds the sum, so no collective is launched and nothing is priced. (Megatron's vocab-parallel
// cross-entropy calls torch.distributed.all_reduce directly, so those stay.)
#include "cocemu/collectives/ops.h"

namespace cocemu::layers::detail {

inline Work reduce_over_tp(Group& tp, const Tensor& tensor, const CollectiveOptions& o) {
  return tp.size() == 1 ? Work{} : all_reduce(tp, tensor, o);
}

}  // namespace cocemu::layers::detail
