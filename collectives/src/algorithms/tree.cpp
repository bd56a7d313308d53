// Tree all_reduce for groups that span nodes (NCCL's tree algorithm, which its tuner picks for
// small multi-node all_reduces: 2·log₂(nodes) steps instead of the ring's 2·(n − 1)):
//   1. inside each node, the node's first member (its leader) reduces the node's inputs (one
//      round over the fast intra-node fabric; none with one member per node);
//   2. between nodes, the leaders reduce up a binomial tree, ⌈log₂ N⌉ rounds: in the round of
//      distance d, the leader at tree position i (i a multiple of 2d) adds what the leader at
//      i + d holds; the root finishes the sum;
//   3. the same tree down, ⌈log₂ N⌉ rounds of copies from parent to child;
//   4. inside each node, the leader copies the result to the node's other members.
// As NCCL's double binary tree, the call is split in two halves on two trees, the second over the
// nodes in mirrored order, so that the leaves of one are the inner nodes of the other and every
// leader's NIC carries about one half each way. The trees are not pipelined in chunks: the
// profiles pick them for small calls only, where the rounds' latency is what counts; a large call
// on an explicit `tree` is priced, and runs, as these unpipelined rounds.
// Every other case takes the ring plan, as the profiles' tables gave these small calls before the
// tree: deterministic mode (the tree's partial sums are not in rank order; the ring's
// deterministic chain sums in rank order), every op but all_reduce (NCCL's tree runs all_reduce
// only) and a group on one node.

#include "algorithms/common.h"

namespace cocemu {

Plan build_tree_plan(const PlanRequest& req) {
  const std::vector<std::vector<int>> local = algo::members_by_node(req);
  const int N = int(local.size());
  if (req.op != CollOp::all_reduce || req.deterministic || N < 2) return build_ring_plan(req);
  // Some node has more than its leader.
  const bool intra = std::ranges::any_of(local, [](const auto& m) { return m.size() > 1; });
  int depth = 0;
  while ((1 << depth) < N)
    ++depth;
  const std::int64_t c = req.count;
  Plan plan{req.op, Algorithm::tree, {}, c};
  const std::size_t first_up = intra ? 1 : 0, first_down = first_up + std::size_t(depth);
  plan.rounds.resize(first_down + std::size_t(depth) + (intra ? 1 : 0));
  for (int half = 0; half < 2; ++half) {
    const std::int64_t off = segment_offset(c, 2, half), len = segment_length(c, 2, half);
    if (len == 0) continue;
    // Tree position i is node i in the first tree, node N − 1 − i in the second (mirrored).
    const auto leader = [&](int i) { return local[std::size_t(half == 0 ? i : N - 1 - i)][0]; };
    // Where each position's partial sum is: its input until it has reduced something.
    std::vector<bool> partial(std::size_t(N), intra);
    const auto held = [&](int i) {
      return BufRef{leader(i), partial[std::size_t(i)] ? Buf::scratch : Buf::in, off};
    };
    if (intra)  // 1. the node's sum at its leader
      for (const auto& members : local) {
        Step st{Step::reduce, members[0], {}, {{members[0], Buf::scratch, off}}, len, false};
        for (int m : members)
          st.srcs.push_back({m, Buf::in, off});
        plan.rounds[0].push_back(std::move(st));
      }
    for (int level = 0; level < depth; ++level) {  // 2. up the tree
      const int d = 1 << level;
      for (int i = 0; i + d < N; i += 2 * d) {
        const bool root = i == 0 && level == depth - 1;
        Step st{Step::reduce, leader(i), {held(i), held(i + d)}, {}, len, root};
        st.dsts.push_back(root ? BufRef{leader(0), Buf::out, off}
                               : BufRef{leader(i), Buf::scratch, off});
        partial[std::size_t(i)] = true;
        plan.rounds[first_up + std::size_t(level)].push_back(std::move(st));
      }
    }
    for (int level = depth - 1; level >= 0; --level) {  // 3. down the tree
      const int d = 1 << level;
      for (int i = 0; i + d < N; i += 2 * d)
        plan.rounds[first_down + std::size_t(depth - 1 - level)].push_back(algo::copy_step(
            leader(i), {leader(i), Buf::out, off}, {leader(i + d), Buf::out, off}, len));
    }
    if (intra)  // 4. the result to the node's other members
      for (const auto& members : local) {
        if (members.size() < 2) continue;
        Step st{Step::copy, members[0], {{members[0], Buf::out, off}}, {}, len, false};
        for (std::size_t j = 1; j < members.size(); ++j)
          st.dsts.push_back({members[j], Buf::out, off});
        plan.rounds.back().push_back(std::move(st));
      }
  }
  return plan;
}

}  // namespace cocemu
