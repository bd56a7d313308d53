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
/// the accumulation dtype and round once when storing to a data buffer. Large steps write with
/// non-temporal stores unless `may_stream` is false (small calls, whose outputs stay in cache).
void execute_plan(const Plan& plan, int me, int n, const std::vector<MemberBuffers>& bufs,
                  DType dtype, ReduceOp op, const std::function<void(int)>& between_rounds,
                  bool may_stream = true);

/// A plan's steps for one thread that runs every member's share (actor 0), round after round:
/// within a round, adjacent steps that read the same buffers in the same order at contiguous
/// offsets and write the same buffers contiguously become one step. The steps of one round never
/// read what another step of that round writes (members run them concurrently), so running them
/// one after another, and the rounds in order, combines every element from the same sources in
/// the same order: the results are bit for bit those of `plan`. A deterministic direct
/// all_reduce becomes one pass over the whole vector instead of n passes over its segments.
Plan merge_for_one_actor(const Plan& plan);

}  // namespace cocemu::detail
