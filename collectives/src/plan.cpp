#include "cocemu/collectives/plan.h"

#include <algorithm>

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
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto") return Algorithm::automatic;
  if (s == "ring") return Algorithm::ring;
  if (s == "direct") return Algorithm::direct;
  COCEMU_FAIL(Errc::invalid_argument,
              "unknown collective algorithm '{}'; allowed: auto, ring, direct", s);
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
  Plan plan = req.algorithm == Algorithm::ring ? build_ring_plan(req) : build_direct_plan(req);
  // Rounds where nobody moves anything (small counts) need no synchronisation.
  std::erase_if(plan.rounds, [](const std::vector<Step>& r) { return r.empty(); });
  return plan;
}

PlanCost price_plan(const Plan& plan, const DeviceProfile& p, DType dtype) {
  const auto it = p.algorithms.find(to_string(plan.algorithm));
  COCEMU_CHECK(it != p.algorithms.end(), Errc::invalid_argument,
               "device profile '{}' has no cost entry for algorithm '{}'", p.name,
               to_string(plan.algorithm));
  const CollectiveAlgorithmCost& a = it->second;
  // Every buffer is priced in the call's dtype, scratch included: NCCL and HCCL move partially
  // reduced data in the buffer's dtype. The executor keeps its partial sums in f32 (f64) so that
  // deterministic mode is exact; that is an emulator device, not wire traffic.
  const double elem = double(size_of(dtype));
  PlanCost cost;
  int n = 0;
  for (const auto& round : plan.rounds)
    for (const Step& st : round) {
      n = std::max(n, st.actor + 1);
      for (const BufRef& b : st.srcs)
        n = std::max(n, b.rank + 1);
      for (const BufRef& b : st.dsts)
        n = std::max(n, b.rank + 1);
    }
  const std::size_t nn = std::size_t(n);
  std::vector<double> link(nn * nn), out(nn), in(nn), local(nn);
  for (const auto& round : plan.rounds) {
    // Bytes per directed link, per rank out and in, and locally touched bytes per actor.
    std::fill(link.begin(), link.end(), 0.0);
    std::fill(out.begin(), out.end(), 0.0);
    std::fill(in.begin(), in.end(), 0.0);
    std::fill(local.begin(), local.end(), 0.0);
    for (const Step& st : round) {
      const std::size_t a = std::size_t(st.actor);
      auto bytes_of = [&](const BufRef&) { return double(st.count) * elem; };
      for (const BufRef& s : st.srcs) {
        const double b = bytes_of(s);
        local[a] += b;
        if (s.rank != st.actor) {
          link[std::size_t(s.rank) * nn + a] += b;
          out[std::size_t(s.rank)] += b;
          in[a] += b;
        }
      }
      for (const BufRef& d : st.dsts) {
        const double b = bytes_of(d);
        local[a] += b;
        if (d.rank != st.actor) {
          link[a * nn + std::size_t(d.rank)] += b;
          out[a] += b;
          in[std::size_t(d.rank)] += b;
        }
      }
    }
    double link_s = 0, local_s = 0, busiest = 0;
    for (double b : link)
      link_s = std::max(link_s, b / p.link_per_peer_bandwidth);
    for (std::size_t r = 0; r < nn; ++r) {
      link_s =
          std::max({link_s, out[r] / p.link_per_rank_bandwidth, in[r] / p.link_per_rank_bandwidth});
      busiest = std::max(busiest, out[r]);
      local_s = std::max(local_s, local[r] / p.memory_bandwidth);
    }
    // Links and local memory work overlap; the slower one bounds the round.
    const double ns = a.step_latency_ns + std::max(link_s / a.bandwidth_efficiency, local_s) * 1e9;
    cost.round_ns.push_back(ns);
    cost.total_ns += ns;
    cost.max_link_bytes += std::uint64_t(busiest);
  }
  if (plan.rounds.empty()) cost.total_ns = a.step_latency_ns;  // a barrier still synchronises
  return cost;
}

}  // namespace cocemu
