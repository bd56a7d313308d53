// Hierarchical all_reduce for groups that span nodes (NCCL's and HCCL's multi-node shape):
//   1. inside each node, a reduce-scatter: the member with local index s reduces segment s of its
//      node's inputs (one round over the fast intra-node fabric);
//   2. between nodes, an all-reduce of segment s among the members with local index s, one per
//      node: each reduces one sub-segment from all of them and writes it to all of them (one
//      round; each member's NIC carries 2·(N−1)/N of its segment, as a ring would);
//   3. inside each node, an all-gather of the segments;
// large calls pipelined in chunks so that the three phases overlap on their different links.
// The partial sums are not in rank order, so deterministic mode uses the direct plan (rank-ordered
// sums in one round) and every op but all_reduce, or a group whose nodes hold different numbers of
// members, the ring plan instead — each priced on the links it crosses.
#include <algorithm>

#include "algorithms/common.h"

namespace cocemu {

Plan build_hierarchical_plan(const PlanRequest& req) {
  const std::vector<std::vector<int>> local = algo::members_by_node(req);
  const std::size_t L = local.front().size(), N = local.size();
  const bool even = std::ranges::all_of(local, [&](const auto& m) { return m.size() == L; });
  if (req.op != CollOp::all_reduce || req.deterministic || N < 2 || !even) {
    // Deterministic mode needs rank-ordered sums: the direct plan (one round, so a large world's
    // host threads synchronise once); otherwise the ring, as NCCL's other multi-node ops.
    Plan p = req.deterministic ? build_direct_plan(req) : build_ring_plan(req);
    p.algorithm = req.deterministic ? Algorithm::direct : Algorithm::ring;
    return p;
  }
  // Large calls are pipelined in chunks, as NCCL pipelines its multi-node all_reduce: round r
  // runs chunk r's reduce-scatter, chunk r−1's inter-node exchange and chunk r−2's all-gather,
  // which use different links (or both directions of the fabric), so a round costs the slowest
  // of them. One chunk per 2^20 elements, at most 8.
  // Each of the inter-node steps (one per non-empty sub-segment: min(L·N, count) of them) reads
  // from and writes to all N nodes, unbounded by the flat plans' check (an all_reduce of 1 MiB
  // over 65,536 members is 5·10⁸ references, tens of GB). Refused past four flat plans' worth.
  const double refs =
      std::min(double(L) * double(N), double(std::max<std::int64_t>(req.count, 1))) * double(N);
  COCEMU_CHECK(refs <= kMaxFlatPlanSteps * 4, Errc::too_large,
               "a hierarchical {} of {} elements over {} nodes of {} members needs {:.3g} buffer "
               "references per chunk (each local index's inter-node step reads and writes every "
               "node); at most {:.3g} are built: use fewer nodes or smaller groups",
               to_string(req.op), req.count, N, L, refs, kMaxFlatPlanSteps * 4);
  const std::int64_t c = req.count;
  const int chunks = int(std::clamp<std::int64_t>(c >> 20, 1, 8));
  Plan plan{req.op, Algorithm::hierarchical, {}, c};
  plan.rounds.resize(std::size_t(chunks + 2));
  for (int ch = 0; ch < chunks; ++ch) {
    const std::int64_t base = segment_offset(c, chunks, ch), size = segment_length(c, chunks, ch);
    const auto off = [&](std::size_t s) { return base + segment_offset(size, int(L), int(s)); };
    const auto len = [&](std::size_t s) { return segment_length(size, int(L), int(s)); };
    auto& rs = plan.rounds[std::size_t(ch)];
    auto& ar = plan.rounds[std::size_t(ch + 1)];
    auto& ag = plan.rounds[std::size_t(ch + 2)];
    // 1. Intra-node reduce-scatter into scratch (partial sums of the node).
    for (std::size_t k = 0; k < N; ++k)
      for (std::size_t s = 0; s < L; ++s) {
        if (len(s) == 0) continue;
        const int m = local[k][s];
        Step st{Step::reduce, m, {}, {{m, Buf::scratch, off(s)}}, len(s), false};
        for (std::size_t j = 0; j < L; ++j)  // from the segment's owner on, like arrival order
          st.srcs.push_back({local[k][(s + j) % L], Buf::in, off(s)});
        rs.push_back(std::move(st));
      }
    // 2. Inter-node all-reduce of segment s among the N members with local index s.
    for (std::size_t s = 0; s < L; ++s)
      for (std::size_t t = 0; t < N; ++t) {
        const std::int64_t sub_off = off(s) + segment_offset(len(s), int(N), int(t)),
                           sub_len = segment_length(len(s), int(N), int(t));
        if (sub_len == 0) continue;
        const int actor = local[t][s];
        Step st{Step::reduce, actor, {}, {}, sub_len, true};
        for (std::size_t k = 0; k < N; ++k) {
          st.srcs.push_back({local[(t + k) % N][s], Buf::scratch, sub_off});
          st.dsts.push_back({local[k][s], Buf::out, sub_off});
        }
        ar.push_back(std::move(st));
      }
    // 3. Intra-node all-gather of the reduced segments.
    for (std::size_t k = 0; k < N; ++k)
      for (std::size_t s = 0; s < L; ++s) {
        if (len(s) == 0 || L == 1) continue;
        const int m = local[k][s];
        Step st{Step::copy, m, {{m, Buf::out, off(s)}}, {}, len(s), false};
        for (std::size_t j = 0; j < L; ++j)
          if (j != s) st.dsts.push_back({local[k][j], Buf::out, off(s)});
        ag.push_back(std::move(st));
      }
  }
  return plan;
}

}  // namespace cocemu
