// Ring algorithms: each member talks only to its ring neighbours, one block per round.
//  - all_reduce (non-deterministic mode): the classic reduce-scatter ring (partial sums travel
//    rank r-1 -> r, each member adding its contribution) followed by the all-gather ring.
//  - all_reduce / reduce_scatter / reduce in deterministic mode: a pipelined chain along the ring
//    0 -> 1 -> ... -> n-1, so every element is summed in rank order with f32 partials (bitwise
//    equal to the direct algorithm); all_reduce then passes results on around the ring n-1 -> 0 ->
//    ...
//  - all_gather: blocks travel around the ring; broadcast: a pipelined chain from the root;
//    gather/scatter/all_to_all: one peer offset per round (pairwise exchange).
// A group that spans nodes with L members on each runs its reduce-scatter and all-gather rings
// (all_reduce's two halves, reduce_scatter, all_gather) on up to L channels, as NCCL does: each
// channel carries its own part of every block around its own ring, and channel c leaves every
// node through local member c's NIC, so the node's L NICs share the inter-node traffic (one ring
// would put all of it on one NIC per node: L times slower than measured, e.g. 360 GB/s busbw for
// reduce_scatter on 4 nodes of 8 H100, NVIDIA/nccl issue 1229).
#include <algorithm>
#include <map>

#include "algorithms/common.h"

namespace cocemu {

using algo::copy_step;
using algo::mod;

namespace {

/// The rings a non-deterministic ring collective runs on: one over the members in group order,
/// or, for a group spanning N ≥ 2 nodes with the same L ≥ 2 members on each, one channel per
/// local member (at most one per 4096 elements of the smallest block, as NCCL uses fewer channels
/// for small messages). Channel c visits each node's members from local index c + 1 on, so it
/// leaves every node through member c and enters the next through member c + 1.
std::vector<std::vector<int>> ring_channels(const PlanRequest& req, std::int64_t smallest_block) {
  const int n = req.n;
  std::vector<int> identity(static_cast<std::size_t>(n));
  for (int m = 0; m < n; ++m)
    identity[std::size_t(m)] = m;
  if (req.deterministic || req.nodes.size() != std::size_t(n)) return {identity};
  std::vector<std::vector<int>> by_node;  // nodes in order of first appearance
  std::map<int, std::size_t> index;
  for (int m = 0; m < n; ++m) {
    const auto [it, fresh] = index.try_emplace(req.nodes[std::size_t(m)], by_node.size());
    if (fresh) by_node.emplace_back();
    by_node[it->second].push_back(m);
  }
  const std::size_t L = by_node.front().size();
  const bool even = std::ranges::all_of(by_node, [&](const auto& v) { return v.size() == L; });
  // Assumption: 4096 elements per channel at least (NCCL's per-size channel count is not
  // published as a figure; the references test only the large-message plateau).
  const int channels = int(std::clamp<std::int64_t>(smallest_block / 4096, 1, std::int64_t(L)));
  if (by_node.size() < 2 || L < 2 || !even || channels < 2) return {identity};
  std::vector<std::vector<int>> rings(static_cast<std::size_t>(channels));
  for (std::size_t c = 0; c < rings.size(); ++c)
    for (const auto& members : by_node)
      for (std::size_t j = 0; j < L; ++j)
        rings[c].push_back(members[(c + 1 + j) % L]);
  return rings;
}

/// Channel c's part of a block of `length` elements: (offset within the block, length).
std::pair<std::int64_t, std::int64_t> channel_part(std::int64_t length, std::size_t channels,
                                                   std::size_t c) {
  return {segment_offset(length, int(channels), int(c)),
          segment_length(length, int(channels), int(c))};
}

/// Classic ring reduce-scatter over n segments given by (offset, length), on every channel's ring
/// (ring[i] is the member at position i) with its part of each segment; the fully reduced segment
/// s ends at member s, written to `out(s)`.
template <class Off, class Len, class Out>
void ring_reduce_scatter(Plan& plan, const std::vector<std::vector<int>>& rings, Off off, Len len,
                         Out out) {
  const int n = int(rings.front().size());
  for (int t = 0; t + 1 < n; ++t) {
    std::vector<Step> round;
    for (std::size_t c = 0; c < rings.size(); ++c) {
      const auto& ring = rings[c];
      for (int i = 0; i < n; ++i) {
        const int r = ring[std::size_t(i)], prev = ring[std::size_t(mod(i - 1, n))],
                  s = ring[std::size_t(mod(i - t - 2, n))];
        const auto [part, part_len] = channel_part(len(s), rings.size(), c);
        if (part_len == 0) continue;
        const std::int64_t o = off(s) + part;
        BufRef dst = out(s);
        dst.offset += part;
        Step st{Step::reduce, r, {}, {}, part_len, t + 2 == n};
        st.srcs.push_back(t == 0 ? BufRef{prev, Buf::in, o} : BufRef{prev, Buf::scratch, o});
        st.srcs.push_back({r, Buf::in, o});
        st.dsts.push_back(t + 2 == n ? dst : BufRef{r, Buf::scratch, o});
        round.push_back(std::move(st));
      }
    }
    plan.rounds.push_back(std::move(round));
  }
}

/// Pipelined chain reduction in rank order over `chunks`; chunk c's result goes to `final_dst(c)`.
/// If `pass_on`, results then travel on around the ring n-1 -> 0 -> 1 -> ... -> n-2 (all_reduce).
template <class Off, class Len, class Dst>
void chain_reduce(Plan& plan, int n, int chunks, Off off, Len len, Dst final_dst, bool pass_on) {
  const int reduce_rounds = chunks + n - 2;
  const int total = pass_on ? reduce_rounds + n - 1 : reduce_rounds;
  for (int t = 0; t < total; ++t) {
    std::vector<Step> round;
    for (int k = 1; k < n; ++k) {  // member k adds its contribution to chunk t - (k - 1)
      const int c = t - (k - 1);
      if (c < 0 || c >= chunks || len(c) == 0) continue;
      Step st{Step::reduce, k, {}, {}, len(c), k == n - 1};
      st.srcs.push_back(k == 1 ? BufRef{0, Buf::in, off(c)} : BufRef{k - 1, Buf::scratch, off(c)});
      st.srcs.push_back({k, Buf::in, off(c)});
      st.dsts.push_back(k == n - 1 ? final_dst(c) : BufRef{k, Buf::scratch, off(c)});
      round.push_back(std::move(st));
    }
    if (pass_on) {
      for (int h = 1; h < n; ++h) {  // hop h: member h-1 copies chunk c from its ring predecessor
        const int c = t - (n - 2) - h;
        if (c < 0 || c >= chunks || len(c) == 0) continue;
        const int dst = h - 1, src = mod(dst - 1, n);
        round.push_back(copy_step(dst, {src, Buf::out, off(c)}, {dst, Buf::out, off(c)}, len(c)));
      }
    }
    plan.rounds.push_back(std::move(round));
  }
}

}  // namespace

Plan build_ring_plan(const PlanRequest& req) {
  const int n = req.n;
  const std::int64_t c = req.count;
  Plan plan{req.op, Algorithm::ring, {}, 0};
  if (n == 1 || req.op == CollOp::barrier) {  // nothing travels: same steps as direct
    Plan p = build_direct_plan(req);
    p.algorithm = Algorithm::ring;
    return p;
  }
  algo::check_flat_plan_size(req, "ring");
  auto seg_off = [&](int s) { return segment_offset(c, n, s); };
  auto seg_len = [&](int s) { return segment_length(c, n, s); };
  switch (req.op) {
    case CollOp::all_reduce:
      plan.scratch_elems = c;
      if (req.deterministic) {
        chain_reduce(
            plan, n, n, seg_off, seg_len,
            [&](int s) {
              return BufRef{n - 1, Buf::out, seg_off(s)};
            },
            true);
      } else {
        const auto rings = ring_channels(req, seg_len(n - 1));
        ring_reduce_scatter(plan, rings, seg_off, seg_len, [&](int s) {
          return BufRef{s, Buf::out, seg_off(s)};
        });
        for (int u = 0; u + 1 < n; ++u) {  // all-gather ring
          std::vector<Step> round;
          for (std::size_t ch = 0; ch < rings.size(); ++ch) {
            const auto& ring = rings[ch];
            for (int i = 0; i < n; ++i) {
              const int r = ring[std::size_t(i)], prev = ring[std::size_t(mod(i - 1, n))],
                        s = ring[std::size_t(mod(i - 1 - u, n))];
              const auto [part, part_len] = channel_part(seg_len(s), rings.size(), ch);
              if (part_len > 0)
                round.push_back(copy_step(r, {prev, Buf::out, seg_off(s) + part},
                                          {r, Buf::out, seg_off(s) + part}, part_len));
            }
          }
          plan.rounds.push_back(std::move(round));
        }
      }
      break;
    case CollOp::reduce_scatter: {
      plan.scratch_elems = std::int64_t(n) * c;
      auto off = [&](int s) { return std::int64_t(s) * c; };
      auto len = [&](int) { return c; };
      if (req.deterministic)
        chain_reduce(
            plan, n, n, off, len,
            [&](int s) {
              return BufRef{s, Buf::out, 0};
            },
            false);
      else
        ring_reduce_scatter(plan, ring_channels(req, c), off, len, [&](int s) {
          return BufRef{s, Buf::out, 0};
        });
      break;
    }
    case CollOp::reduce:
      plan.scratch_elems = c;
      chain_reduce(
          plan, n, n, seg_off, seg_len,
          [&](int s) {
            return BufRef{req.root, Buf::out, seg_off(s)};
          },
          false);
      break;
    case CollOp::all_gather: {
      const auto rings = ring_channels(req, c);
      for (int t = 0; t + 1 < n; ++t) {
        std::vector<Step> round;
        for (std::size_t ch = 0; ch < rings.size(); ++ch) {
          const auto& ring = rings[ch];
          const auto [part, part_len] = channel_part(c, rings.size(), ch);
          for (int i = 0; i < n && part_len > 0; ++i) {
            const int r = ring[std::size_t(i)], prev = ring[std::size_t(mod(i - 1, n))],
                      s = ring[std::size_t(mod(i - 1 - t, n))];
            if (t == 0) {
              round.push_back(copy_step(r, {r, Buf::in, part},
                                        {r, Buf::out, std::int64_t(r) * c + part}, part_len));
              round.push_back(copy_step(r, {prev, Buf::in, part},
                                        {r, Buf::out, std::int64_t(s) * c + part}, part_len));
            } else {
              round.push_back(copy_step(r, {prev, Buf::out, std::int64_t(s) * c + part},
                                        {r, Buf::out, std::int64_t(s) * c + part}, part_len));
            }
          }
        }
        plan.rounds.push_back(std::move(round));
      }
      break;
    }
    case CollOp::broadcast: {
      // Chain from the root in n chunks: hop h delivers chunk t - (h - 1) to member root + h.
      for (int t = 0; t < n + n - 2; ++t) {
        std::vector<Step> round;
        for (int h = 1; h < n; ++h) {
          const int ch = t - (h - 1);
          if (ch < 0 || ch >= n || seg_len(ch) == 0) continue;
          const int dst = mod(req.root + h, n), src = mod(req.root + h - 1, n);
          round.push_back(copy_step(dst, {src, h == 1 ? Buf::in : Buf::out, seg_off(ch)},
                                    {dst, Buf::out, seg_off(ch)}, seg_len(ch)));
        }
        plan.rounds.push_back(std::move(round));
      }
      break;
    }
    case CollOp::gather:
    case CollOp::scatter:
    case CollOp::all_to_all: {
      const auto l = algo::all_to_all_layout(req);
      for (int t = 0; t < n; ++t) {  // round t: member r exchanges with r + t
        std::vector<Step> round;
        for (int r = 0; r < n; ++r) {
          const int p = mod(r + t, n);
          if (req.op == CollOp::all_to_all && l.counts[r][p] > 0)
            round.push_back(copy_step(r, {r, Buf::in, l.send_off[r][p]},
                                      {p, Buf::out, l.recv_off[p][r]}, l.counts[r][p]));
          if (req.op == CollOp::gather && p == req.root && c > 0)
            round.push_back(copy_step(r, {r, Buf::in, 0}, {p, Buf::out, std::int64_t(r) * c}, c));
          if (req.op == CollOp::scatter && r == req.root && c > 0)
            round.push_back(copy_step(p, {r, Buf::in, std::int64_t(p) * c}, {p, Buf::out, 0}, c));
        }
        if (!round.empty()) plan.rounds.push_back(std::move(round));
      }
      break;
    }
    case CollOp::barrier:
      break;
  }
  return plan;
}

}  // namespace cocemu
