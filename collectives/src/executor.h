#pragma once
// Runs one member's share of a plan on real memory.
#include <functional>
#include <vector>

#include "cocemu/collectives/plan.h"

namespace cocemu::detail {

struct MemberBuffers {
  std::byte* in = nullptr;
  std::byte* out = nullptr;
  std::byte* scratch = nullptr;  // accumulation dtype
};

/// Executes the steps whose actor is `me`, round by round, calling `between_rounds(r)` after
/// every round but the last (a group barrier). Reductions combine sources in the listed order in
/// the accumulation dtype and round once when storing to a data buffer.
void execute_plan(const Plan& plan, int me, int n, const std::vector<MemberBuffers>& bufs,
                  DType dtype, ReduceOp op, const std::function<void(int)>& between_rounds);

}  // namespace cocemu::detail
