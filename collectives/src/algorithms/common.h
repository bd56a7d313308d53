#pragma once
// Helpers shared by the algorithm builders.
#include <algorithm>
#include <map>
#include <vector>

#include "cocemu/collectives/plan.h"
#include "cocemu/runtime/error.h"

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

/// Refuses a ring or direct plan of more than kMaxFlatPlanSteps steps per phase. An op that
/// splits `count` into n segments has n · min(n, count) of them; all_gather, reduce_scatter,
/// gather, scatter and all_to_all count each member's own piece, and every piece meets every
/// member (n² steps however small the pieces: a ring all_gather of 4 elements over 65,536
/// members is 4·10⁹ steps).
inline void check_flat_plan_size(const PlanRequest& req, const char* algorithm) {
  const double n = double(req.n);
  const bool per_member = req.op == CollOp::all_gather || req.op == CollOp::reduce_scatter ||
                          req.op == CollOp::gather || req.op == CollOp::scatter ||
                          req.op == CollOp::all_to_all;
  const double steps =
      req.count <= 0
          ? n
          : n * (per_member ? n : std::min(n, double(std::max<std::int64_t>(req.count, 1))));
  COCEMU_CHECK(steps <= kMaxFlatPlanSteps, Errc::too_large,
               "a {} {} of {} elements over {} members needs a plan of {:.3g} steps per phase "
               "(every member with every segment); at most {:.3g} are built: use smaller groups "
               "(more tp, cp or pp, less dp) or fewer nodes",
               algorithm, to_string(req.op), req.count, req.n, steps, kMaxFlatPlanSteps);
}

/// The members of each node the group spans ([node][local index] -> member, nodes in ascending
/// order, members in group order); one node if the request places none.
inline std::vector<std::vector<int>> members_by_node(const PlanRequest& req) {
  std::map<int, std::vector<int>> by_node;
  for (int m = 0; m < req.n; ++m)
    by_node[req.nodes.empty() ? 0 : req.nodes[std::size_t(m)]].push_back(m);
  std::vector<std::vector<int>> local;
  for (auto& [node, members] : by_node)
    local.push_back(std::move(members));
  return local;
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
