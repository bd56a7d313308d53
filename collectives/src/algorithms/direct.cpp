// Direct ("one-shot through shared memory", HCCL's in-server mesh): every member reads or writes
// its peers' buffers in a single round. all_reduce is a reduce-scatter and an all-gather fused into
// that round: member s reduces segment s of every input and writes the result to every output, so
// in total each byte is read once and written once per member — the memory floor.
#include "algorithms/common.h"

namespace cocemu {

using algo::copy_step;
using algo::reduction_order;

namespace algo {
AllToAllLayout all_to_all_layout(const PlanRequest& req) {
  const int n = req.n;
  AllToAllLayout l;
  l.counts.assign(std::size_t(n), std::vector<std::int64_t>(std::size_t(n), req.count));
  if (!req.send_counts.empty()) l.counts = req.send_counts;
  l.send_off.assign(std::size_t(n), std::vector<std::int64_t>(std::size_t(n), 0));
  l.recv_off = l.send_off;
  for (int r = 0; r < n; ++r)
    for (int p = 1; p < n; ++p) {
      l.send_off[r][p] = l.send_off[r][p - 1] + l.counts[r][p - 1];
      l.recv_off[r][p] = l.recv_off[r][p - 1] + l.counts[p - 1][r];
    }
  return l;
}
}  // namespace algo

Plan build_direct_plan(const PlanRequest& req) {
  const int n = req.n;
  const std::int64_t c = req.count;
  algo::check_flat_plan_size(req, "direct");
  Plan plan{req.op, Algorithm::direct, {}, 0};
  std::vector<Step> round;
  switch (req.op) {
    case CollOp::all_reduce:
      // Member s reduces segment s of all inputs and writes it to all outputs.
      for (int s = 0; s < n; ++s) {
        const std::int64_t off = segment_offset(c, n, s), len = segment_length(c, n, s);
        if (len == 0) continue;
        Step st{Step::reduce, s, {}, {}, len, true};
        for (int j : reduction_order(n, s, req.deterministic))
          st.srcs.push_back({j, Buf::in, off});
        for (int j = 0; j < n; ++j)
          st.dsts.push_back({j, Buf::out, off});
        round.push_back(std::move(st));
      }
      break;
    case CollOp::reduce_scatter:
      for (int s = 0; s < n && c > 0; ++s) {
        Step st{Step::reduce, s, {}, {{s, Buf::out, 0}}, c, true};
        for (int j : reduction_order(n, s, req.deterministic))
          st.srcs.push_back({j, Buf::in, std::int64_t(s) * c});
        round.push_back(std::move(st));
      }
      break;
    case CollOp::reduce:
      for (int s = 0; s < n; ++s) {
        const std::int64_t off = segment_offset(c, n, s), len = segment_length(c, n, s);
        if (len == 0) continue;
        Step st{Step::reduce, s, {}, {{req.root, Buf::out, off}}, len, true};
        for (int j : reduction_order(n, s, req.deterministic))
          st.srcs.push_back({j, Buf::in, off});
        round.push_back(std::move(st));
      }
      break;
    case CollOp::all_gather:
      // Member r pushes its input to slot r of every output.
      for (int r = 0; r < n && c > 0; ++r) {
        Step st{Step::copy, r, {{r, Buf::in, 0}}, {}, c, false};
        for (int j = 0; j < n; ++j)
          st.dsts.push_back({j, Buf::out, std::int64_t(r) * c});
        round.push_back(std::move(st));
      }
      break;
    case CollOp::broadcast:
      // Every member pulls from the root (the work is spread over all members).
      for (int j = 0; j < n && c > 0; ++j)
        round.push_back(copy_step(j, {req.root, Buf::in, 0}, {j, Buf::out, 0}, c));
      break;
    case CollOp::gather:
      for (int r = 0; r < n && c > 0; ++r)
        round.push_back(
            copy_step(r, {r, Buf::in, 0}, {req.root, Buf::out, std::int64_t(r) * c}, c));
      break;
    case CollOp::scatter:
      for (int j = 0; j < n && c > 0; ++j)
        round.push_back(
            copy_step(j, {req.root, Buf::in, std::int64_t(j) * c}, {j, Buf::out, 0}, c));
      break;
    case CollOp::all_to_all: {
      const auto l = algo::all_to_all_layout(req);
      for (int r = 0; r < n; ++r)
        for (int p = 0; p < n; ++p)
          if (l.counts[r][p] > 0)
            round.push_back(copy_step(r, {r, Buf::in, l.send_off[r][p]},
                                      {p, Buf::out, l.recv_off[p][r]}, l.counts[r][p]));
      break;
    }
    case CollOp::barrier:
      break;
  }
  if (!round.empty()) plan.rounds.push_back(std::move(round));
  return plan;
}

}  // namespace cocemu
