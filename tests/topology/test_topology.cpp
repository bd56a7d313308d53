// Clusters (R-TO-1, R-TO-2, R-TO-5): profiles describe nodes, a fabric inside them and a network
// between them; every transfer is priced on the link it crosses; groups spanning nodes use the
// hierarchical all_reduce (exact, like every plan); the double ring's inner and outer transfers
// run side by side on their own links. Modeled times are worked out by hand on round numbers.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "cocemu/attention/context_parallel.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/collectives/plan.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;
using testing::run_ranks;

/// `per_node` devices per node; inside a node 1 B/ns per peer link (a full mesh, so a device's
/// links add up), between nodes 0.1 B/ns per device NIC; no latencies.
std::string two_level(int per_node, double intra = 1e9, double inter = 1e8,
                      const std::string& more = "") {
  return fmt::format(
      "{{topology: {{devices_per_node: {}, intra_node: {{fabric: mesh, per_peer_bytes_per_s: {}, "
      "per_device_bytes_per_s: {}, latency_ns: 0}}, inter_node: {{per_device_bytes_per_s: {}, "
      "latency_ns: 0}}}}, collectives: {{hierarchical: {{step_latency_ns: 0, "
      "bandwidth_efficiency: 1.0}}, tree: {{step_latency_ns: 0, bandwidth_efficiency: 1.0}}, "
      "auto_multi_node: [{{max_bytes: .inf, algorithm: hierarchical}}]}}{}}}",
      per_node, intra, 64 * intra, inter, more);
}

/// `text` with its occurrence of `from` replaced by `to`: a variant of a profile text (a
/// missing `from` fails the test).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

/// two_level's multi-node table with `rule` instead of its hierarchical rule.
std::string two_level_with_rule(int per_node, const std::string& rule) {
  return replaced(two_level(per_node), "[{max_bytes: .inf, algorithm: hierarchical}]",
                  "[" + rule + "]");
}

// R-TO-1: a transfer inside a node runs on a peer link, one between nodes on the NICs. A ring
// all_reduce (non-deterministic: reduce-scatter then all-gather, 6 rounds) of c = 1000 f32 on
// 4 ranks, 2 per node: every round each member sends c/4 elements = 1000 B to its successor; the
// pairs 1→2 and 3→0 cross nodes, 1000 B at 0.1 B/ns = 10000 ns, which bounds each round: 60000.
// Placed all on one node it would be 1000 ns a round: 6000.
TEST(Topology, EveryTransferIsPricedOnTheLinkItCrosses) {
  const auto p = testing::round_profile(two_level(2));
  const Plan ring = build_plan({CollOp::all_reduce, Algorithm::ring, 4, 1000, 0, false, {}});
  EXPECT_DOUBLE_EQ(price_plan(ring, *p, DType::f32, {0, 1, 2, 3}).total_ns, 60000);
  EXPECT_DOUBLE_EQ(price_plan(ring, *p, DType::f32).total_ns, 6000);
  // Placed 0 and 2 on node 0, 1 and 3 on node 1 (world ranks 0, 2, 1, 3 in group order): every
  // ring pair crosses.
  EXPECT_DOUBLE_EQ(price_plan(ring, *p, DType::f32, {0, 2, 1, 3}).total_ns, 60000);
  // A profile may give the NICs their own measured efficiency (H100: 0.90 on NCCL's
  // reduce_scatter across nodes): at 0.5 every round here is NIC-bound and takes twice as long;
  // on one node nothing changes.
  const auto with_efficiency = [](const std::string& e) {
    return replaced(two_level(2), "latency_ns: 0}}, collectives",
                    "latency_ns: 0, bandwidth_efficiency: " + e + "}}, collectives");
  };
  const auto slow = testing::round_profile(with_efficiency("0.5"));
  EXPECT_DOUBLE_EQ(price_plan(ring, *slow, DType::f32, {0, 1, 2, 3}).total_ns, 120000);
  EXPECT_DOUBLE_EQ(price_plan(ring, *slow, DType::f32).total_ns, 6000);
  expect_error([&] { testing::round_profile(with_efficiency("1.5")); }, Errc::parse_error,
               {"bandwidth_efficiency", "1.5"});
}

// R-TO-2: the hierarchical all_reduce of the same call: an intra-node reduce-scatter (each member
// reads its peer's half, 2000 B on a peer link: 2000 ns), an inter-node all-reduce of each half
// among the two members with the same local index (each reduces a quarter, reading it from its
// partner and writing the sum back, and the partner does the same: 2·1000 B each way over the
// NIC, 2·(N−1)/N of the half as in a ring: 20000 ns) and an intra-node all-gather (2000 ns):
// 24000 ns, against the ring's 60000.
TEST(Topology, HierarchicalAllReduceCrossesTheNetworkOnce) {
  const auto p = testing::round_profile(two_level(2));
  PlanRequest req{CollOp::all_reduce, Algorithm::hierarchical, 4, 1000, 0, false, {}};
  req.nodes = {0, 0, 1, 1};
  const Plan h = build_plan(req);
  EXPECT_EQ(h.algorithm, Algorithm::hierarchical);
  const PlanCost c = price_plan(h, *p, DType::f32, {0, 1, 2, 3});
  ASSERT_EQ(c.round_ns.size(), 3u);
  EXPECT_DOUBLE_EQ(c.round_ns[0], 2000);
  EXPECT_DOUBLE_EQ(c.round_ns[1], 20000);
  EXPECT_DOUBLE_EQ(c.round_ns[2], 2000);
  // Deterministic mode uses the direct plan (rank-ordered sums, one round); other ops the ring.
  req.deterministic = true;
  EXPECT_EQ(build_plan(req).algorithm, Algorithm::direct);
  req.deterministic = false;
  req.op = CollOp::reduce_scatter;
  EXPECT_EQ(build_plan(req).algorithm, Algorithm::ring);
}

// The hierarchical plan's inter-node exchange is one round per chunk, but the node peers run the
// profile's inter-node algorithm, each of whose steps pays the step latency: over 5 nodes a ring
// takes 2·4 steps (NCCL), halving-doubling 2·⌈log₂ 5⌉ = 6 (HCCL). Against the same profile with
// no latency (α = 100 ns): one chunk adds 100 + 8·100 + 100 ns with the ring (the intra-node
// rounds one step each), 100 + 6·100 + 100 with halving-doubling; with 3 chunks only the first
// crossing round pays the fill, the two others pipeline behind it at one step each (5 rounds:
// 1200 and 1000 ns more).
TEST(Topology, HierarchicalInterNodeStepsFollowTheProfilesAlgorithm) {
  const std::string base = two_level(2);
  const auto with = [&](const std::string& how) {
    return testing::round_profile(
        replaced(base, "hierarchical: {step_latency_ns: 0,",
                 "hierarchical: {step_latency_ns: 100, inter_node: " + how + ","));
  };
  const auto free = testing::round_profile(base), ring = with("ring"),
             hd = with("halving_doubling");
  std::vector<int> world(10);
  for (int r = 0; r < 10; ++r)
    world[std::size_t(r)] = r;
  for (const std::int64_t count : {std::int64_t(1000), std::int64_t(3) << 20}) {
    PlanRequest req{CollOp::all_reduce, Algorithm::hierarchical, 10, count, 0, false, {}};
    req.nodes = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4};
    const Plan h = build_plan(req);
    ASSERT_EQ(h.algorithm, Algorithm::hierarchical);
    const bool one = count == 1000;
    ASSERT_EQ(h.rounds.size(), one ? 3u : 5u);
    const double t0 = price_plan(h, *free, DType::f32, world).total_ns;
    EXPECT_DOUBLE_EQ(price_plan(h, *ring, DType::f32, world).total_ns - t0, one ? 1000 : 1200);
    EXPECT_DOUBLE_EQ(price_plan(h, *hd, DType::f32, world).total_ns - t0, one ? 800 : 1000);
  }
  expect_error([&] { with("tree"); }, Errc::parse_error,
               {"inter_node", "'tree'", "ring, halving_doubling"});
}

// The auto table picks the hierarchical plan for a group that spans nodes, and the run's modeled
// time is the plan's price; a group inside one node keeps the intra-node table (direct).
TEST(Topology, AutoChoosesByTopologyAndTheRunPricesThePlan) {
  WorldOptions wo;
  wo.profile = testing::round_profile(two_level(2));
  wo.deterministic = false;
  const RunResult r = run_ranks(
      4,
      [](Rank& rank) {
        Group world = Group::world(rank);
        Group node = split(world, rank.id() / 2, rank.id());
        Tensor x = Tensor::zeros({1000}, DType::f32);
        all_reduce(world, x);
        all_reduce(node, x);
        rank.synchronize();
      },
      wo);
  std::vector<std::pair<std::string, double>> seen;
  for (const OpRecord& op : r.graph.ranks[0].ops)
    if (op.cls == OpClass::comm) seen.push_back({op_detail(op), op.work_ns});
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0].first.find("algo hierarchical"), std::string::npos) << seen[0].first;
  EXPECT_DOUBLE_EQ(seen[0].second, 24000);
  EXPECT_NE(seen[1].first.find("algo direct"), std::string::npos) << seen[1].first;
  // Direct on 2 members: each reduces half (reads 2000 B) and writes it to the peer: 4000 ns.
  EXPECT_DOUBLE_EQ(seen[1].second, 4000);
}

// A `cheapest` rule in a run: every member prices both candidates, the call carries the cheaper
// (its detail names it, its modeled time is its price) and the sum is exact. 1000 f32 over 2
// nodes of 2 with free latency: the hierarchical plan's 24000 ns beat the tree, whose leaders
// carry every byte of their node over the NIC.
TEST(Topology, RunsTakeThePricedChoice) {
  WorldOptions wo;
  wo.profile = testing::round_profile(
      two_level_with_rule(2, "{max_bytes: .inf, cheapest: [tree, hierarchical]}"));
  wo.deterministic = false;
  const double tree = model_collective(*wo.profile, CollOp::all_reduce, {0, 1, 2, 3}, 1000,
                                       DType::f32, 4000, Algorithm::tree, false)
                          .cost.total_ns;
  ASSERT_GT(tree, 24000);
  std::vector<float> got(4);
  const RunResult r = run_ranks(
      4,
      [&](Rank& rank) {
        Group world = Group::world(rank);
        Tensor x = Tensor::zeros({1000}, DType::f32);
        for (std::int64_t i = 0; i < 1000; ++i)
          x.data<float>()[i] = float(rank.id() + 1) * float(i % 5);
        all_reduce(world, x);
        rank.synchronize();
        got[std::size_t(rank.id())] = x.data<float>()[999];
      },
      wo);
  for (float v : got)
    EXPECT_EQ(v, 40.0f);  // (1 + 2 + 3 + 4) · (999 % 5)
  int calls = 0;
  for (const OpRecord& op : r.graph.ranks[0].ops)
    if (op.cls == OpClass::comm) {
      ++calls;
      EXPECT_NE(op_detail(op).find("algo hierarchical"), std::string::npos) << op_detail(op);
      EXPECT_DOUBLE_EQ(op.work_ns, 24000);
    }
  EXPECT_EQ(calls, 1);
}

template <class T>
void fill(const Tensor& t, int r, std::int64_t salt) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<T>()[i] = store_as<T>(acc_t<T>(double((r * 5 + i + salt) % 7) - 3));
}

// A multi-node all_reduce plan is exact for every reduce op, dtype, count and placement (small
// integers: any summation order gives the exact answer), in place and out of place.
void expect_exact_all_reduce(Algorithm algo, std::initializer_list<int> node_counts) {
  for (int per_node : {1, 2, 3, 4})
    for (int nodes : node_counts) {
      const int n = per_node * nodes;
      WorldOptions wo;
      wo.profile = testing::round_profile(two_level(per_node));
      wo.deterministic = false;
      run_ranks(
          n,
          [&](Rank& rank) {
            Group g = Group::world(rank);
            for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32})
              for (std::int64_t c : {0, 1, 7, 13, 4096})
                for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
                  for (bool in_place : {false, true}) {
                    if (op == ReduceOp::avg && !is_floating(t)) continue;
                    visit_dtype(t, [&](auto tag) {
                      using T = decltype(tag);
                      if constexpr (!std::is_same_v<T, std::int8_t> &&
                                    !std::is_same_v<T, std::uint8_t>) {
                        Tensor in = Tensor::zeros({c}, t);
                        Tensor out = in_place ? in : Tensor::zeros({c}, t);
                        fill<T>(in, rank.id(), c);
                        all_reduce(g, in, out, {.op = op, .algo = algo});
                        rank.synchronize();
                        for (std::int64_t i = 0; i < c; ++i) {
                          double want = op == ReduceOp::max ? -1e9 : op == ReduceOp::min ? 1e9 : 0;
                          for (int r = 0; r < n; ++r) {
                            const double v = double((r * 5 + i + c) % 7) - 3;
                            want = op == ReduceOp::max   ? std::max(want, v)
                                   : op == ReduceOp::min ? std::min(want, v)
                                                         : want + v;
                          }
                          if (op == ReduceOp::avg) want /= n;
                          const T w = store_as<T>(acc_t<T>(want));
                          ASSERT_EQ(std::memcmp(&out.data<T>()[i], &w, sizeof(T)), 0)
                              << to_string(algo) << " n " << n << " per node " << per_node << " "
                              << name_of(t) << " c " << c << " op " << to_string(op) << " in place "
                              << in_place << " i " << i << ": " << out.item(i) << " vs " << want;
                        }
                      }
                    });
                  }
          },
          wo);
    }
}

TEST(Topology, HierarchicalAllReduceIsExact) {
  expect_exact_all_reduce(Algorithm::hierarchical, {2, 3, 4});
}

// The tree over 2, 3, 5 and 8 nodes: full and partial binomial trees, both halves.
TEST(Topology, TreeAllReduceIsExact) {
  expect_exact_all_reduce(Algorithm::tree, {2, 3, 5, 8});
}

// R-TO-2, NCCL's tree: an all_reduce of c = 1000 f32 on 4 nodes of 2 (8 ranks). Round 0: each
// node's leader (its first member) reduces its peer's input, both halves, 4000 B on the peer
// link: 4000 ns. Then ⌈log₂ 4⌉ = 2 rounds up and 2 down the trees; each half (500 elements,
// 2000 B) has its own tree, the second over the nodes mirrored, so every round every leader's NIC
// carries one half at most each way: 2000 B at 0.1 B/ns = 20000 ns (a single tree would put both
// halves on its inner nodes' NICs: 40000). Last, each leader copies the result to its peer:
// 4000 ns. 88000 ns in 6 rounds, against the ring's 2·(8 − 1) = 14.
TEST(Topology, TreeAllReduceUsesTwoMirroredTrees) {
  const auto p = testing::round_profile(two_level(2));
  PlanRequest req{CollOp::all_reduce, Algorithm::tree, 8, 1000, 0, false, {}};
  req.nodes = {0, 0, 1, 1, 2, 2, 3, 3};
  const Plan t = build_plan(req);
  EXPECT_EQ(t.algorithm, Algorithm::tree);
  const PlanCost c = price_plan(t, *p, DType::f32, {0, 1, 2, 3, 4, 5, 6, 7});
  const std::vector<double> want{4000, 20000, 20000, 20000, 20000, 4000};
  EXPECT_EQ(c.round_ns, want);
  // One member per node: no intra-node rounds; 3 nodes take ⌈log₂ 3⌉ = 2 rounds each way.
  req = {CollOp::all_reduce, Algorithm::tree, 3, 1000, 0, false, {}};
  req.nodes = {0, 1, 2};
  EXPECT_EQ(build_plan(req).rounds.size(), 4u);
  // Deterministic mode (the ring's rank-ordered chain), other ops and one node: the ring.
  req.deterministic = true;
  EXPECT_EQ(build_plan(req).algorithm, Algorithm::ring);
  req.deterministic = false;
  req.op = CollOp::all_gather;
  EXPECT_EQ(build_plan(req).algorithm, Algorithm::ring);
  req = {CollOp::all_reduce, Algorithm::tree, 4, 1000, 0, false, {}};
  req.nodes = {0, 0, 0, 0};
  EXPECT_EQ(build_plan(req).algorithm, Algorithm::ring);
}

// The GPU profiles' multi-node table prices the tree and the hierarchical plan (NCCL's ring
// through the nodes) for each call and keeps the cheaper, as NCCL's tuner picks by its cost
// model. Over 128 nodes of 8 H100s a 4 KiB all_reduce takes the tree (2 + 2·7 rounds, tens of µs;
// a ring of 1024 paid 2·1023 steps, 11.3 ms); so does 4 MiB, where the ring's 2·127 inter-node
// steps still cost more than the tree's unpipelined rounds; 64 MiB takes the hierarchical plan.
TEST(Topology, MultiNodeAllReducesTakeTheCheaperOfTreeAndRing) {
  const DeviceProfile h100 = load_named_profile("h100-sxm");
  std::vector<int> world(1024);
  for (int r = 0; r < 1024; ++r)
    world[std::size_t(r)] = r;
  const auto priced = [&](std::int64_t count, Algorithm a) {
    return model_collective(h100, CollOp::all_reduce, world, count, DType::f32,
                            std::uint64_t(count) * 4, a, false);
  };
  const ModeledCollective small = priced(1024, Algorithm::automatic);
  EXPECT_EQ(small.plan.algorithm, Algorithm::tree);
  EXPECT_EQ(small.plan.rounds.size(), 16u);
  EXPECT_LT(small.cost.total_ns, 200e3);
  for (const auto& [count, expected] :
       {std::pair{std::int64_t(1) << 20, Algorithm::tree},
        std::pair{std::int64_t(16) << 20, Algorithm::hierarchical}}) {
    const ModeledCollective chosen = priced(count, Algorithm::automatic);
    const double tree = priced(count, Algorithm::tree).cost.total_ns,
                 ring = priced(count, Algorithm::hierarchical).cost.total_ns;
    EXPECT_EQ(chosen.plan.algorithm, expected) << count;
    EXPECT_DOUBLE_EQ(chosen.cost.total_ns, std::min(tree, ring)) << count;
    EXPECT_NE(tree, ring) << count;
  }
  // Deterministic mode: both candidates fall back to rank-ordered plans (the tree to the ring's
  // chain, the hierarchical plan to the direct one), and the cheaper of those is kept.
  const auto det = [&](Algorithm a) {
    return model_collective(h100, CollOp::all_reduce, world, 1024, DType::f32, 4096, a, true);
  };
  const ModeledCollective chain = det(Algorithm::tree), direct = det(Algorithm::hierarchical);
  EXPECT_EQ(chain.plan.algorithm, Algorithm::ring);
  EXPECT_EQ(direct.plan.algorithm, Algorithm::direct);
  EXPECT_DOUBLE_EQ(det(Algorithm::automatic).cost.total_ns,
                   std::min(chain.cost.total_ns, direct.cost.total_ns));
  // A rule names an algorithm or candidates to price, not both or neither, nor an empty list.
  const auto with_rule = [](const std::string& r) { return two_level_with_rule(2, r); };
  EXPECT_NO_THROW(
      testing::round_profile(with_rule("{max_bytes: .inf, cheapest: [tree, hierarchical]}")));
  expect_error(
      [&] {
        testing::round_profile(
            with_rule("{max_bytes: .inf, algorithm: tree, cheapest: [tree, hierarchical]}"));
      },
      Errc::parse_error, {"either an `algorithm` or a `cheapest", "not both"});
  expect_error([&] { testing::round_profile(with_rule("{max_bytes: .inf}")); }, Errc::parse_error,
               {"not neither"});
  expect_error([&] { testing::round_profile(with_rule("{max_bytes: .inf, cheapest: []}")); },
               Errc::parse_error, {"lists no candidate"});
  expect_error(
      [&] { testing::round_profile(with_rule("{max_bytes: .inf, cheapest: [tree, bogus]}")); },
      Errc::parse_error, {"'bogus'", "has no cost entry"});
  // A profile's auto table may name the tree only with a cost entry for it: the H100 profile
  // without its `tree:` entry.
  std::ifstream file(config_dir() + "/devices/h100-sxm.yaml");
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const std::size_t at = text.find("\n  tree:\n");
  ASSERT_NE(at, std::string::npos);
  const std::size_t end = text.find("\n  #", at + 1);  // the comment after its two lines
  ASSERT_NE(end, std::string::npos);
  text.erase(at, end - at);
  for (const std::string line :
       {"  - collectives.tree.step_latency_ns\n", "  - collectives.tree.bandwidth_efficiency\n"})
    text.erase(text.find(line), line.size());
  expect_error([&] { parse_device_profile(text, "no-tree.yaml"); }, Errc::parse_error,
               {"no-tree.yaml", "'tree'", "hierarchical and tree"});
}

// NCCL's multi-node rings: a reduce_scatter of c = 8192 f32 per block on 4 ranks, 2 per node,
// runs on 2 channels (one per local member), each carrying half of every block, and channel c
// leaves each node through local member c. Every round each member sends 4096 elements = 16384 B
// over its NIC: 163840 ns at 0.1 B/ns, 3 rounds. One ring (no placement known to the plan) puts
// a whole block, 32768 B, on one NIC per node: twice as long.
TEST(Topology, MultiNodeRingsShareTheNodesNics) {
  const auto p = testing::round_profile(two_level(2));
  PlanRequest req{CollOp::reduce_scatter, Algorithm::ring, 4, 8192, 0, false, {}};
  const double one_ring = price_plan(build_plan(req), *p, DType::f32, {0, 1, 2, 3}).total_ns;
  req.nodes = {0, 0, 1, 1};
  const PlanCost channels = price_plan(build_plan(req), *p, DType::f32, {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(one_ring, 3 * 327680.0);
  ASSERT_EQ(channels.round_ns.size(), 3u);
  for (double ns : channels.round_ns)
    EXPECT_DOUBLE_EQ(ns, 163840);
  // Small blocks (under 4096 elements per channel) and deterministic mode keep one ring.
  req.count = 4000;
  EXPECT_DOUBLE_EQ(price_plan(build_plan(req), *p, DType::f32, {0, 1, 2, 3}).total_ns,
                   3 * 160000.0);
  req.count = 8192;
  req.deterministic = true;
  EXPECT_GT(price_plan(build_plan(req), *p, DType::f32, {0, 1, 2, 3}).total_ns, channels.total_ns);
}

// The multi-channel rings are exact: reduce_scatter, all_gather and the ring all_reduce on groups
// of 2–3 nodes with 2–4 members each, with blocks large enough for several channels and one that
// is not, against the sums worked out here (small integers: any order is exact).
TEST(Topology, MultiNodeRingsAreExact) {
  for (int per_node : {2, 3, 4})
    for (int nodes : {2, 3}) {
      const int n = per_node * nodes;
      WorldOptions wo;
      wo.profile = testing::round_profile(two_level(per_node));
      wo.deterministic = false;
      run_ranks(
          n,
          [&](Rank& rank) {
            Group g = Group::world(rank);
            for (std::int64_t c : {std::int64_t(100), std::int64_t(4096) * per_node + 5}) {
              const auto want = [&](std::int64_t i) {
                double sum = 0;
                for (int r = 0; r < n; ++r)
                  sum += double((r * 5 + i + c) % 7) - 3;
                return float(sum);
              };
              Tensor in = Tensor::zeros({c * n}, DType::f32);
              fill<float>(in, rank.id(), c);
              Tensor part = Tensor::zeros({c}, DType::f32);
              reduce_scatter(g, part, in, {.algo = Algorithm::ring});
              Tensor whole = Tensor::zeros({c * n}, DType::f32);
              all_gather(g, whole, part, {.algo = Algorithm::ring});
              Tensor sum = Tensor::zeros({c * n}, DType::f32);
              all_reduce(g, in, sum, {.algo = Algorithm::ring});
              rank.synchronize();
              for (std::int64_t i = 0; i < c * n; ++i) {
                ASSERT_EQ(whole.data<float>()[i], want(i))
                    << "n " << n << " per node " << per_node << " c " << c << " i " << i;
                ASSERT_EQ(sum.data<float>()[i], want(i))
                    << "n " << n << " per node " << per_node << " c " << c << " i " << i;
              }
            }
          },
          wo);
    }
}

// A send inside a node and one between nodes, 10000 B each: 10000 ns on a peer link, 100000 ns
// on the NICs; started together on one rank they do not share (different links).
TEST(Topology, PointToPointIsPricedOnItsPathAndLinksDoNotShare) {
  WorldOptions wo;
  wo.profile = testing::round_profile(two_level(2));
  const RunResult r = run_ranks(
      4,
      [](Rank& rank) {
        Group g = Group::world(rank);
        Group second = split(g, 0, rank.id());
        second.set_stream(rank.new_stream("second"));
        Tensor a = Tensor::zeros({2500}, DType::f32), b = Tensor::zeros({2500}, DType::f32);
        if (rank.id() == 0) {
          isend(g, a, 1);       // same node
          isend(second, b, 2);  // the other node
        } else if (rank.id() == 1) {
          irecv(g, a, 0);
        } else if (rank.id() == 2) {
          irecv(second, b, 0);
        }
        rank.synchronize();
      },
      wo);
  std::vector<ScheduledOp> sends;
  for (const OpRecord& op : r.graph.ranks[0].ops)
    if (op.cls == OpClass::comm) sends.push_back(r.timeline.at({0, op.index}));
  ASSERT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends[0].end_ns - sends[0].start_ns, 10000);
  EXPECT_EQ(sends[1].end_ns - sends[1].start_ns, 100000);
  EXPECT_EQ(sends[0].start_ns, sends[1].start_ns);
}

TEST(Topology, ProfilesDescribeClustersAndOldKeysStillWork) {
  const DeviceProfile p = load_named_profile("ascend-910b");
  EXPECT_EQ(p.topology.devices_per_node, 8);
  EXPECT_TRUE(p.topology.multi_node);
  EXPECT_FALSE(p.topology.intra_switch);
  EXPECT_TRUE(load_named_profile("h100-sxm").topology.intra_switch);
  // A world larger than a node needs an inter-node network.
  const std::string one_node =
      "{topology: {devices_per_node: 4, intra_node: {fabric: mesh, per_peer_bytes_per_s: 1.0e9, "
      "per_device_bytes_per_s: 3.0e9, latency_ns: 0}}}";
  WorldOptions wo;
  wo.profile = testing::round_profile(one_node);
  expect_error(
      [&] {
        run_ranks(
            8, [](Rank&) {}, wo);
      },
      Errc::invalid_argument,
      {"describes one node of 4 devices", "world of 8 ranks spans 2 nodes", "topology.inter_node"});
  // Bad fabric names and mixed old and new keys are parse errors naming the key.
  expect_error(
      [] {
        parse_device_profile(testing::round_profile_yaml("{topology: {intra_node: {fabric: ring, "
                                                         "per_device_bytes_per_s: 1.0e9, "
                                                         "latency_ns: 0}}}"),
                             "t.yaml");
      },
      Errc::parse_error, {"t.yaml:", "fabric 'ring'", "mesh", "switch"});
  expect_error(
      [] {
        parse_device_profile(testing::round_profile_yaml("{links: {per_peer_bytes_per_s: 1.0e9, "
                                                         "per_rank_bytes_per_s: 1.0e9, "
                                                         "latency_ns: 0}}"),
                             "m.yaml");
      },
      Errc::parse_error, {"m.yaml:", "'links' and 'topology' both given"});
}

// R-TO-5 with CP attention on two nodes of two (dry run, bf16, causal, cp = 4, one head of 128,
// c = 250 tokens per chunk: a KV message is T = 256000 B): peer links 8 B/ns (32000 ns a KV
// message), NICs 1 B/ns (256000 ns); forward blocks F = 64000 ns (the first, diagonal, 64128).
//  - plain ring: pairs 1→2 and 3→0 cross nodes, every step waits for a NIC transfer:
//    3·256000 + 64000 = 832000 ns to the end of the last block;
//  - double ring, window 2 (the windows are the nodes): the outer transfer crosses the network
//    once, posted at the start of window 0 and overlapped with its two steps (64128 + 64000) on
//    a link of its own, then window 1's steps: 256000 + 64000 + 64000 = 384000 ns.
double ring_forward_ns(int window) {
  WorldOptions o;
  o.numerics = false;
  o.profile = testing::round_profile(two_level(2, 8e9, 1e9));
  attn::CpConfig cfg;
  cfg.context_parallel_size = 4;
  cfg.cp_window_size = window;
  cfg.use_cp_send_recv_overlap = true;
  const attn::AttentionProblem p{1, 1, 1, 2000, 128, DType::bf16, nullptr, 0};
  const RunResult run = run_ranks(
      4,
      [&](Rank& rank) {
        Group world = Group::world(rank);
        attn::CpAttention a(world, cfg, p);
        const Tensor q = Tensor::shape_only({500, 1, 128}, DType::bf16);
        a.forward(q, q, q);
      },
      o);
  std::int64_t first = -1, last = -1;
  for (const OpRecord& op : run.graph.ranks[0].ops)
    if (op.lane != 0 && op.name.rfind("attn fwd[", 0) == 0) {
      const ScheduledOp t = run.timeline.at({0, op.index});
      if (first < 0) first = t.start_ns;
      last = t.end_ns;
    }
  return double(last - first);
}

TEST(Topology, DoubleRingHidesTheNetworkBehindTheInnerRing) {
  EXPECT_NEAR(ring_forward_ns(1), 832000, 4);
  EXPECT_NEAR(ring_forward_ns(2), 384000, 4);
}

// MindSpeed's double-ring observation (docs/zh/features/double-ring.md: a trimmed LLaMA2 at 32K
// tokens, cp 16 and no other parallelism, runs fastest with --cp-window-size 2, because larger
// windows run more communication beside compute, which contend for the NPU's memory bandwidth),
// checked on the 910B profile: one causal ring-attention forward, 32 heads of 128, 2048 tokens
// per rank, send/recv overlap, over 2 nodes of 8. The schedule prices what runs at once against
// the HBM (ContentionModel). With the traffic the kernels and transfers are priced with, the
// requests stay under the bandwidth and window 8 models fastest: the observation does not hold
// in the model. Starving the shared memory (a fortieth, a hypothetical bandwidth) makes every
// window slower but does not reverse the order: in the model the windows differ by how many KV
// blocks cross the slow inter-node link, which memory contention does not change.
double double_ring_ns(const DeviceProfile& profile, int window) {
  WorldOptions o;
  o.numerics = false;
  o.profile = std::make_shared<const DeviceProfile>(profile);
  attn::CpConfig cfg;
  cfg.context_parallel_size = 16;
  cfg.cp_window_size = window;
  cfg.use_cp_send_recv_overlap = true;
  const attn::AttentionProblem p{1, 32, 32, 32768, 128, DType::bf16, nullptr, 0};
  const RunResult run = run_ranks(
      16,
      [&](Rank& rank) {
        Group world = Group::world(rank);
        attn::CpAttention a(world, cfg, p);
        const Tensor q = Tensor::shape_only({2048, 1, 32 * 128}, DType::bf16);
        a.forward(q, q, q);
      },
      o);
  return double(run.timeline.makespan_ns());
}

TEST(Topology, DoubleRingWindowUnderMemoryContention) {
  const DeviceProfile npu = load_named_profile("ascend-910b");
  const double w2 = double_ring_ns(npu, 2), w8 = double_ring_ns(npu, 8);
  EXPECT_LT(w8, w2);
  DeviceProfile starved = npu;
  starved.contention.memory_bytes_per_ns /= 40;
  const double s2 = double_ring_ns(starved, 2), s8 = double_ring_ns(starved, 8);
  EXPECT_GT(s2, 2 * w2);  // the shared memory is what runs out
  EXPECT_GT(s8, 2 * w8);
  EXPECT_LT(s8, s2);
}

}  // namespace
}  // namespace cocemu
