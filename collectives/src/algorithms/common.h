#pragma once
// Helpers shared by the algorithm builders.
#include "cocemu/collectives/plan.h"

namespace cocemu::algo {

inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

/// The order in which a reduction visits the members' contributions to segment `s`: rank order in
/// deterministic mode; otherwise starting at the segment's owner, like arrival order on a device
/// where every owner starts from its own data.
inline std::vector<int> reduction_order(int n, int s, bool deterministic) {
  std::vector<int> order(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    order[std::size_t(i)] = deterministic ? i : mod(s + i, n);
  return order;
}

inline Step copy_step(int actor, BufRef src, BufRef dst, std::int64_t count) {
  return Step{Step::copy, actor, {src}, {dst}, count, false};
}

/// Element offsets of all_to_all blocks: where rank r's block for peer p starts in r's input, and
/// where the block from r starts in p's output.
struct AllToAllLayout {
  std::vector<std::vector<std::int64_t>> send_off, recv_off, counts;
};
AllToAllLayout all_to_all_layout(const PlanRequest& req);

}  // namespace cocemu::algo
