#include "cocemu/collectives/plan.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <utility>

#include "cocemu/runtime/error.h"

namespace cocemu {

const char* to_string(CollOp op) {
  switch (op) {
    case CollOp::all_reduce:
      return "all_reduce";
    case CollOp::reduce_scatter:
      return "reduce_scatter";
    case CollOp::all_gather:
      return "all_gather";
    case CollOp::broadcast:
      return "broadcast";
    case CollOp::reduce:
      return "reduce";
    case CollOp::gather:
      return "gather";
    case CollOp::scatter:
      return "scatter";
    case CollOp::all_to_all:
      return "all_to_all";
    case CollOp::barrier:
      return "barrier";
  }
  return "?";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
    case ReduceOp::prod:
      return "prod";
  }
  return "?";
}

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::automatic:
      return "auto";
    case Algorithm::ring:
      return "ring";
    case Algorithm::direct:
      return "direct";
    case Algorithm::hierarchical:
      return "hierarchical";
    case Algorithm::tree:
      return "tree";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto") return Algorithm::automatic;
  if (s == "ring") return Algorithm::ring;
  if (s == "direct") return Algorithm::direct;
  if (s == "hierarchical") return Algorithm::hierarchical;
  if (s == "tree") return Algorithm::tree;
  COCEMU_FAIL(Errc::invalid_argument,
              "unknown collective algorithm '{}'; allowed: auto, ring, direct, hierarchical, tree",
              s);
}

std::int64_t segment_offset(std::int64_t count, int n, int s) {
  const std::int64_t base = count / n, extra = count % n;
  return s * base + std::min<std::int64_t>(s, extra);
}

std::int64_t segment_length(std::int64_t count, int n, int s) {
  return count / n + (s < count % n ? 1 : 0);
}

Plan build_plan(const PlanRequest& req) {
  COCEMU_CHECK(req.n >= 1, Errc::internal, "plan for {} ranks", req.n);
  COCEMU_CHECK(req.algorithm != Algorithm::automatic, Errc::internal,
               "build_plan needs a resolved algorithm");
  Plan plan = req.algorithm == Algorithm::ring           ? build_ring_plan(req)
              : req.algorithm == Algorithm::hierarchical ? build_hierarchical_plan(req)
              : req.algorithm == Algorithm::tree         ? build_tree_plan(req)
                                                         : build_direct_plan(req);
  // Rounds where nobody moves anything (small counts) need no synchronisation.
  std::erase_if(plan.rounds, [](const std::vector<Step>& r) { return r.empty(); });
  return plan;
}

ModeledCollective model_collective(const DeviceProfile& p, CollOp op,
                                   const std::vector<int>& world_ranks, std::int64_t count,
                                   DType dtype, std::uint64_t size_bytes, Algorithm algo,
                                   bool deterministic, int root) {
  PlanRequest req{op, algo, int(world_ranks.size()), count, root, deterministic, {}};
  for (int w : world_ranks)
    req.nodes.push_back(p.topology.node_of(w));
  return model_plan(p, std::move(req), dtype, size_bytes, world_ranks);
}

ModeledCollective model_plan(const DeviceProfile& p, PlanRequest req, DType dtype,
                             std::uint64_t size_bytes, const std::vector<int>& world_ranks) {
  COCEMU_CHECK_ARG(req.n >= 1, "{}: the group has {} ranks; it needs at least 1", to_string(req.op),
                   req.n);
  COCEMU_CHECK_ARG(req.root >= 0 && req.root < req.n,
                   "{}: root {} is out of range; allowed 0..{} (group ranks)", to_string(req.op),
                   req.root, req.n - 1);
  const auto modeled = [&](Algorithm a) {
    req.algorithm = a;
    ModeledCollective m{build_plan(req), {}};
    m.cost = price_plan(m.plan, p, dtype, world_ranks);
    return m;
  };
  if (req.algorithm != Algorithm::automatic) return modeled(req.algorithm);
  const bool multi_node = std::ranges::any_of(req.nodes, [&](int n) { return n != req.nodes[0]; });
  const AlgorithmRule& rule = p.auto_rule(size_bytes, multi_node);
  if (rule.cheapest.empty()) return modeled(parse_algorithm(rule.algorithm));
  // A priced choice: every candidate's plan for this call (with its fallbacks: a candidate that
  // does not apply prices the plan it falls back to), the cheapest kept, ties to the first.
  std::optional<ModeledCollective> best;
  for (const std::string& name : rule.cheapest) {
    ModeledCollective m = modeled(parse_algorithm(name));
    if (!best || m.cost.total_ns < best->cost.total_ns) best = std::move(m);
  }
  return std::move(*best);
}

PlanCost price_plan(const Plan& plan, const DeviceProfile& p, DType dtype,
                    const std::vector<int>& world_ranks) {
  const auto it = p.algorithms.find(to_string(plan.algorithm));
  COCEMU_CHECK(it != p.algorithms.end(), Errc::invalid_argument,
               "device profile '{}' has no cost entry for algorithm '{}'", p.name,
               to_string(plan.algorithm));
  const CollectiveAlgorithmCost& a = it->second;
  const Topology& topo = p.topology;
  // Every buffer is priced in the call's dtype, scratch included: NCCL and HCCL move partially
  // reduced data in the buffer's dtype. The executor keeps its partial sums in f32 (f64) so that
  // deterministic mode is exact; that is an emulator device, not wire traffic.
  const double elem = double(size_of(dtype));
  int n = int(world_ranks.size());
  for (const auto& round : plan.rounds)
    for (const Step& st : round) {
      n = std::max(n, st.actor + 1);
      for (const BufRef& b : st.srcs)
        n = std::max(n, b.rank + 1);
      for (const BufRef& b : st.dsts)
        n = std::max(n, b.rank + 1);
    }
  const auto node = [&](int member) {
    return std::size_t(member) < world_ranks.size() ? topo.node_of(world_ranks[member]) : 0;
  };
  const std::size_t nn = std::size_t(n);
  PlanCost cost;
  cost.link_use.assign(nn, 0);
  std::vector<std::pair<std::uint64_t, double>> pairs;  // (from · n + to, bytes) of a round
  std::vector<double> out(nn), in(nn), net_out(nn), net_in(nn), local(nn);
  // The NICs reach their own measured fraction of their rate where the profile gives one.
  const double net_eff = topo.inter_efficiency > 0 ? topo.inter_efficiency : a.bandwidth_efficiency;
  // The hierarchical plan writes its inter-node exchange as one round per chunk, but on the wire
  // the node peers run the profile's inter-node algorithm, whose steps each pay the latency: a
  // ring, 2·(N − 1) steps, or halving-doubling, 2·⌈log₂ N⌉. The chunks pipeline behind the
  // first, so the first round that crosses nodes pays those steps and later ones one each.
  int fill_steps = 1;
  if (plan.algorithm == Algorithm::hierarchical) {
    std::vector<int> nodes;
    for (int w : world_ranks)
      nodes.push_back(topo.node_of(w));
    std::sort(nodes.begin(), nodes.end());
    const int N = int(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
    if (N > 1)
      fill_steps = a.inter_node == CollectiveAlgorithmCost::InterNode::ring
                       ? 2 * (N - 1)
                       : 2 * int(std::bit_width(unsigned(N - 1)));
  }
  for (const auto& round : plan.rounds) {
    pairs.clear();
    std::fill(out.begin(), out.end(), 0.0);
    std::fill(in.begin(), in.end(), 0.0);
    std::fill(net_out.begin(), net_out.end(), 0.0);
    std::fill(net_in.begin(), net_in.end(), 0.0);
    std::fill(local.begin(), local.end(), 0.0);
    bool crosses = false;
    // A transfer from member `from` to `to`: on a peer link (or the switch port) inside a node,
    // on both NICs between nodes.
    const auto move = [&](int from, int to, double b) {
      if (node(from) == node(to)) {
        pairs.push_back({std::uint64_t(from) * nn + std::uint64_t(to), b});
        out[std::size_t(from)] += b;
        in[std::size_t(to)] += b;
        cost.link_use[std::size_t(from)] |= kIntraOut;
        cost.link_use[std::size_t(to)] |= kIntraIn;
      } else {
        crosses = true;
        net_out[std::size_t(from)] += b;
        net_in[std::size_t(to)] += b;
        cost.link_use[std::size_t(from)] |= kInterOut;
        cost.link_use[std::size_t(to)] |= kInterIn;
      }
    };
    for (const Step& st : round) {
      const std::size_t actor = std::size_t(st.actor);
      const double b = double(st.count) * elem;
      for (const BufRef& s : st.srcs) {
        local[actor] += b;
        if (s.rank != st.actor) move(s.rank, st.actor, b);
      }
      for (const BufRef& d : st.dsts) {
        local[actor] += b;
        if (d.rank != st.actor) move(st.actor, d.rank, b);
      }
    }
    double link_s = 0, net_s = 0, local_s = 0, busiest = 0;
    std::sort(pairs.begin(), pairs.end());
    for (std::size_t k = 0; k < pairs.size();) {  // bytes per peer link
      double b = 0;
      const std::uint64_t key = pairs[k].first;
      for (; k < pairs.size() && pairs[k].first == key; ++k)
        b += pairs[k].second;
      link_s = std::max(link_s, b / topo.intra_per_peer);
    }
    for (std::size_t r = 0; r < nn; ++r) {
      link_s = std::max({link_s, out[r] / topo.intra_per_device, in[r] / topo.intra_per_device});
      if (crosses)
        net_s = std::max(
            {net_s, net_out[r] / topo.inter_per_device, net_in[r] / topo.inter_per_device});
      busiest = std::max(busiest, out[r] + net_out[r]);
      local_s = std::max(local_s, local[r] / p.memory_bandwidth);
    }
    // Links and local memory work overlap; the slower one bounds the round (the NICs at net_eff).
    // A round that crosses nodes pays the network's extra hop latency on top of the step α.
    const double hop_ns =
        crosses ? std::max(0.0, topo.inter_latency_ns - topo.intra_latency_ns) : 0.0;
    const int steps = crosses ? std::exchange(fill_steps, 1) : 1;
    const double ns = steps * (a.step_latency_ns + hop_ns) +
                      std::max({link_s / a.bandwidth_efficiency, net_s / net_eff, local_s}) * 1e9;
    cost.round_ns.push_back(ns);
    cost.total_ns += ns;
    cost.max_link_bytes += std::uint64_t(busiest);
  }
  if (plan.rounds.empty()) cost.total_ns = a.step_latency_ns;  // a barrier still synchronises
  return cost;
}

}  // namespace cocemu
