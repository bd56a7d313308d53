// PyTorch Work semantics (R-CO-3) and the modeled timeline of collectives (R-RT-6): work.wait()
// makes the compute stream wait without blocking the host; collectives end at the same modeled time
// everywhere; hand-worked programs give golden modeled times.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <set>
#include <string>
#include <thread>

#include "cocemu/collectives/group.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/cost_model.h"
#include "testing.h"

namespace cocemu {
namespace {

using namespace std::chrono_literals;
using testing::round_profile;
using testing::run_ranks;

TEST(Async, WorkWaitDoesNotBlockTheHostButOrdersTheComputeStream) {
  run_ranks(2, [](Rank& rank) {
    Group g = Group::world(rank);
    Tensor t = Tensor::zeros({4}, DType::f32);
    t.data<float>()[0] = float(rank.id() + 1);
    if (rank.id() == 1) std::this_thread::sleep_for(150ms);  // rank 1 joins late
    const auto t0 = std::chrono::steady_clock::now();
    Work w = all_reduce(g, t, {.async_op = true});
    w.wait();
    const auto host_time = std::chrono::steady_clock::now() - t0;
    float seen = -1;
    rank.compute_stream().launch({.name = "consumer"}, [&] { seen = t.data<float>()[0]; });
    if (rank.id() == 0) {
      EXPECT_LT(host_time, 100ms) << "wait() must not block the host";
      EXPECT_FALSE(w.is_completed());
    }
    rank.compute_stream().synchronize();
    EXPECT_EQ(seen, 3.0f);
    EXPECT_TRUE(w.is_completed());
  });
}

TEST(Async, BackToBackSmallCallsOnOneBufferSeeEachOthersResults) {
  // Small calls on one group start ahead of each other on the comm stream (launch_split): each
  // must still read the previous call's output. Ten in-place all_reduces of x = rank + 1, with
  // an all_gather of the running value by pairs in between (another group: the stream finishes
  // the world's calls before starting it), checked exactly.
  run_ranks(8, [](Rank& rank) {
    Group world = Group::world(rank);
    Group pair = split(world, rank.id() / 2, 0);
    Tensor x = Tensor::zeros({257}, DType::f64);
    for (std::int64_t i = 0; i < 257; ++i)
      x.data<double>()[i] = double(rank.id() + 1) + double(i);
    std::vector<Tensor> gathered;
    for (int k = 0; k < 10; ++k) {
      all_reduce(world, x, {.async_op = true});
      if (k % 3 == 2) {
        gathered.push_back(Tensor::zeros({2 * 257}, DType::f64));
        all_gather(pair, gathered.back(), x, {.async_op = true});
      }
    }
    rank.comm_stream().synchronize();
    // After k calls: element i is 8^(k-1) · (36 + 8·i).
    auto after = [](int k, std::int64_t i) { return std::pow(8.0, k - 1) * (36.0 + 8.0 * i); };
    for (std::int64_t i = 0; i < 257; ++i)
      ASSERT_EQ(x.data<double>()[i], after(10, i)) << "element " << i;
    for (std::size_t g = 0; g < gathered.size(); ++g)
      for (std::int64_t i = 0; i < 2 * 257; ++i)
        ASSERT_EQ(gathered[g].data<double>()[i], after(int(3 * g + 3), i % 257))
            << "gather " << g << " element " << i;
  });
}

TEST(Async, CollectiveWaitsForTheProducerOnTheCurrentStream) {
  run_ranks(3, [](Rank& rank) {
    Group g = Group::world(rank);
    Tensor t = Tensor::zeros({1000}, DType::i32);
    rank.compute_stream().launch({.name = "slow producer"}, [&] {
      std::this_thread::sleep_for(30ms);
      for (int i = 0; i < 1000; ++i)
        t.data<std::int32_t>()[i] = rank.id() + 1;
    });
    all_reduce(g, t).synchronize();  // must see the producer's values
    EXPECT_EQ(t.data<std::int32_t>()[999], 6);
  });
}

TEST(Async, CollectiveEndsAtTheSameModeledTimeOnEveryRank) {
  const RunResult r = run_ranks(
      4,
      [](Rank& rank) {
        Group g = Group::world(rank);
        rank.compute_stream().launch({.name = "uneven", .work_ns = 1000.0 * (rank.id() + 1)},
                                     [] {});
        all_reduce(g, Tensor::zeros({1024}, DType::f32));
      },
      [] {
        WorldOptions o;
        o.profile = round_profile();
        return o;
      }());
  std::vector<ScheduledOp> ends;
  for (int k = 0; k < 4; ++k)
    for (const auto& op : r.graph.ranks[k].ops)
      if (op.cls == OpClass::comm) ends.push_back(r.timeline.at({k, op.index}));
  ASSERT_EQ(ends.size(), 4u);
  for (const auto& e : ends) {
    EXPECT_EQ(e.start_ns, 4000);  // the slowest producer
    EXPECT_EQ(e.end_ns, ends[0].end_ns);
  }
}

// Serial matmul -> all_reduce versus the same work split into 4 chunks over two streams, on the
// round-number profile (1 TFLOP/s, links 1 byte/ns, direct all_reduce, no α).
//  matmul 100x100x100 = 2e6 flop = 2000 ns; a quarter = 500 ns.
//  direct all_reduce of C f32 on 2 ranks: each directed link carries C/2·4 bytes read and C/2·4
//  written = 4C bytes -> 4C ns. C = 1000 -> 4000 ns; a quarter (250) -> 1000 ns.
//  serial: 2000 + 4000 = 6000. split: mm1 [0,500], ar1..ar4 back to back on comm from 500:
//  [500,1500] [1500,2500] [2500,3500] [3500,4500] (each waits for its matmul, which is earlier).
// With 100 ns launch overhead per op (script side): serial = launch mm [0,100], mm [100,2100],
// launch ar [100,200], ar [2100,6100]. Split: launches every 100 ns in the order mm1 ar1 mm2 ar2 …;
// mm_i starts at max(its launch end, mm_{i-1} end): 100, 600, 1100, 1600; ar_i starts at
// max(launch end, ar_{i-1} end, mm_i end): 600, 1600, 2600, 3600 -> ends 4600.
double program(int chunks, double launch_ns) {
  WorldOptions o;
  o.profile = round_profile(
      fmt::format("host: {{launch_overhead_ns: {}, fused_launch_overhead_ns: 0}}", launch_ns));
  const RunResult r = run_ranks(
      2,
      [&](Rank& rank) {
        Group g = Group::world(rank);
        Tensor out = Tensor::zeros({1000}, DType::f32);
        for (int i = 0; i < chunks; ++i) {
          const std::int64_t m = 100 / chunks;
          rank.compute_stream().launch(
              {.name = fmt::format("matmul[{}/{}]", i + 1, chunks),
               .work_ns = gemm_ns(rank.profile(), m, 100, 100, DType::f32)},
              [] {});
          all_reduce(g, out.flat(i * 1000 / chunks, (i + 1) * 1000 / chunks),
                     {.async_op = true, .label = fmt::format("[{}/{}]", i + 1, chunks)});
        }
      },
      o);
  return double(r.timeline.makespan_ns());
}

TEST(ModeledGolden, SerialVersusFourChunksOnTwoStreams) {
  EXPECT_EQ(program(1, 0), 6000);
  EXPECT_EQ(program(4, 0), 4500);
  EXPECT_EQ(program(1, 100), 6100);
  EXPECT_EQ(program(4, 100), 4600);
}

TEST(ModeledGolden, RingPlanCostsItsRounds) {
  // Ring all_reduce on 4 ranks, non-deterministic (reduce-scatter + all-gather ring): 6 rounds,
  // each moving one segment of C/4 f32 over each link. C = 4000 -> 4000 bytes per link per round
  // -> 4000 ns at 1 byte/ns, plus α = 100 ns per round: 6 · 4100 = 24600 ns.
  WorldOptions o;
  o.profile =
      round_profile("collectives: {ring: {step_latency_ns: 100, bandwidth_efficiency: 1.0}}");
  o.deterministic = false;
  const RunResult r = run_ranks(
      4,
      [](Rank& rank) {
        Group g = Group::world(rank);
        all_reduce(g, Tensor::zeros({4000}, DType::f32), {.algo = Algorithm::ring});
      },
      o);
  EXPECT_EQ(r.timeline.makespan_ns(), 24600);
  const OpRecord* coll = nullptr;
  for (const auto& op : r.graph.ranks[0].ops)
    if (op.cls == OpClass::comm) coll = &op;
  ASSERT_NE(coll, nullptr);
  ASSERT_TRUE(coll->phases);
  EXPECT_EQ(coll->phases->size(), 6u);
  EXPECT_NE(op_detail(*coll).find("algo ring"), std::string::npos);
  EXPECT_NE(op_detail(*coll).find(" seq "), std::string::npos);
}

// A collective's record carries its group's shared detail and its own sequence number; its
// rendezvous key is short and names the group by a number unique in the world, so calls with the
// same sequence number in different groups (world, new_group, split) never meet, and every member
// of one call records the same key.
TEST(Async, CallsOfDifferentGroupsHaveDistinctKeysAndDetails) {
  const RunResult r = run_ranks(4, [](Rank& rank) {
    Group world = Group::world(rank);
    Group all = new_group(rank, {0, 1, 2, 3}, "all");
    Group half = split(world, rank.id() / 2, rank.id());
    for (Group* g : {&world, &all, &half, &world})
      all_reduce(*g, Tensor::zeros({16}, DType::f32));
  });
  std::vector<std::string> first_keys;
  for (int rk = 0; rk < 4; ++rk) {
    std::vector<std::string> keys, details;
    for (const auto& op : r.graph.ranks[std::size_t(rk)].ops)
      if (op.cls == OpClass::comm) {
        ASSERT_EQ(op.rendezvous.size(), 1u);
        keys.push_back(op.rendezvous[0].key);
        details.push_back(op_detail(op));
        EXPECT_LE(op.rendezvous[0].key.size(), 15u) << op.rendezvous[0].key;  // inline buffer
      }
    ASSERT_EQ(keys.size(), 4u);
    EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), 4u) << rk;
    EXPECT_EQ(details[0], "group world algo direct dtype f32 seq 0") << rk;
    EXPECT_EQ(details[1], "group all algo direct dtype f32 seq 0") << rk;
    EXPECT_EQ(details[3], "group world algo direct dtype f32 seq 1") << rk;
    if (rk == 0) first_keys = keys;
    if (rk == 1) {
      EXPECT_EQ(keys, first_keys);  // ranks 0 and 1 share every group
    }
  }
}

}  // namespace
}  // namespace cocemu
