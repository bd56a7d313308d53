// Regressions of the schedule and pricing review (issue "Eleven verified defects"), collectives
// part: the wire bytes of half-precision reductions, the blocking barrier, and the deadlock of
// unbatched isend/irecv cycles.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "cocemu/collectives/ops.h"
#include "cocemu/collectives/plan.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;
using testing::run_ranks;

// 7. NCCL and HCCL move partially reduced data in the buffer's dtype: a bf16 or f16 reduction
// costs half the f32 one on the round-number profile (no latency), whatever the plan keeps in its
// f32 scratch for exact sums.
TEST(ReviewCollectives, HalfPrecisionReductionsArePricedInTheirOwnDtype) {
  const auto p = testing::round_profile();
  for (CollOp op : {CollOp::all_reduce, CollOp::reduce_scatter, CollOp::reduce})
    for (Algorithm a : {Algorithm::ring, Algorithm::direct})
      for (bool det : {true, false}) {
        const Plan plan = build_plan({op, a, 8, 1 << 20, 0, det, {}});
        const double f32 = price_plan(plan, *p, DType::f32).total_ns;
        for (DType t : {DType::bf16, DType::f16})
          EXPECT_DOUBLE_EQ(price_plan(plan, *p, t).total_ns, f32 / 2)
              << to_string(op) << " " << to_string(a) << " det " << det << " " << name_of(t);
      }
}

// The figure: on the H100 profile a 16 MiB bf16 all_reduce was modeled at 214 GB/s busbw
// against 286 for f32. Same bytes, same busbw now.
TEST(ReviewCollectives, H100Bf16AllReduceHasTheF32BusBandwidth) {
  const DeviceProfile h = load_named_profile("h100-sxm");
  const std::int64_t bytes = 16 << 20;
  for (bool det : {true, false}) {
    const auto busbw = [&](DType t) {
      const std::int64_t count = bytes / std::int64_t(size_of(t));
      const Algorithm a = parse_algorithm(h.auto_rule(std::uint64_t(bytes)).algorithm);
      const double ns =
          price_plan(build_plan({CollOp::all_reduce, a, 8, count, 0, det, {}}), h, t).total_ns;
      return double(bytes) / ns * 2.0 * 7 / 8;  // GB/s
    };
    EXPECT_NEAR(busbw(DType::bf16), busbw(DType::f32), 1e-9 * busbw(DType::f32)) << det;
  }
}

// 8. barrier() without async_op blocks the host until every member has entered.
TEST(ReviewCollectives, BlockingBarrierWaitsForTheLatePeer) {
  for (bool async : {false, true}) {
    double waited_ms = 0;
    run_ranks(2, [&](Rank& rank) {
      Group g = Group::world(rank);
      if (rank.id() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
      const auto t0 = std::chrono::steady_clock::now();
      Work w = barrier(g, {.async_op = async});
      if (rank.id() == 0)
        waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
      w.synchronize();
    });
    if (async)
      EXPECT_LT(waited_ms, 300) << "an async barrier returns at once";
    else
      EXPECT_GE(waited_ms, 500) << "a blocking barrier waits for the late rank";
  }
}

// The blocking barrier is a host wait in the modeled timeline too: the host's next launch comes
// after the barrier's end.
TEST(ReviewCollectives, BlockingBarrierBlocksTheModeledHost) {
  const RunResult r = run_ranks(2, [](Rank& rank) {
    Group g = Group::world(rank);
    rank.compute_stream().launch({.name = "slow", .work_ns = 5000}, [] {});
    barrier(g);
    rank.compute_stream().launch({.name = "after", .work_ns = 10}, [] {});
  });
  std::int64_t after_launch = -1, barrier_end = -1;
  for (const OpRecord& op : r.graph.ranks[0].ops) {
    if (op.lane == 0 && op.name.find("after") != std::string::npos)
      after_launch = r.timeline.at({0, op.index}).start_ns;
    if (op.lane != 0 && op.name.rfind("barrier", 0) == 0)
      barrier_end = r.timeline.at({0, op.index}).end_ns;
  }
  ASSERT_GT(barrier_end, 0);
  EXPECT_GE(after_launch, barrier_end);
}

// 9. Each rank isends to its peer, then irecvs from it, unbatched: the numerics finish (sends are
// eager), but on NCCL/HCCL each send waits for the peer's receive, queued behind the peer's own
// send. `run` names the cycle and the way out.
TEST(ReviewCollectives, UnbatchedSendRecvCycleIsReportedAsADeadlock) {
  expect_error(
      [] {
        run_ranks(2, [](Rank& rank) {
          Group g = Group::world(rank);
          const int peer = 1 - rank.id();
          Tensor out = Tensor::zeros({4}, DType::f32), in = Tensor::zeros({4}, DType::f32);
          Work s = isend(g, out, peer);
          Work r = irecv(g, in, peer);
          s.wait();
          r.wait();
          rank.synchronize();
        });
      },
      Errc::invalid_argument,
      {"deadlocks", "rank 0 comm op", "'send 16B to 1' must start together with rank 1 comm op",
       "'recv 16B from 0'", "is queued behind rank 1 comm op", "'send 16B to 0'",
       "batch_isend_irecv", "parity"});
}

// The same exchange ordered by parity (even ranks send first) or batched runs.
TEST(ReviewCollectives, ParityOrderedOrBatchedExchangesRun) {
  for (bool batched : {false, true})
    run_ranks(4, [batched](Rank& rank) {
      Group g = Group::world(rank);
      const int me = rank.id(), next = (me + 1) % 4, prev = (me + 3) % 4;
      Tensor out = Tensor::zeros({4}, DType::f32), in = Tensor::zeros({4}, DType::f32);
      for (int i = 0; i < 4; ++i)
        out.data<float>()[i] = float(me);
      if (batched) {
        batch_isend_irecv(g, {{P2POp::send, out, next}, {P2POp::recv, in, prev}}).wait();
      } else if (me % 2 == 0) {
        isend(g, out, next).wait();
        irecv(g, in, prev).wait();
      } else {
        irecv(g, in, prev).wait();
        isend(g, out, next).wait();
      }
      rank.synchronize();
      EXPECT_EQ(in.item(0), prev);
    });
}

// A ring or direct plan has a step for every member and segment: a large buffer over thousands
// of members (a dry run's data-parallel group at 512 nodes) would need gigabytes of steps. Such a
// plan is refused at once with Errc::too_large, naming the call; a tiny call over as many members
// (the gradient norm's all_reduce over the world) has few steps and is still priced.
TEST(ReviewCollectives, FlatPlansTooLargeToBuildAreAClearError) {
  const auto p = testing::round_profile();
  for (Algorithm a : {Algorithm::ring, Algorithm::direct})
    expect_error(
        [&] {
          (void)build_plan({CollOp::reduce_scatter, a, 4096, 1 << 20, 0, false, {}});
        },
        Errc::too_large, {"reduce_scatter", "4096 members", "1.68e+07 steps", "smaller groups"});
  // n · min(n, count) at the limit is built: 2048 members of a large buffer, 4096 of one element.
  const Plan at_limit = build_plan({CollOp::all_reduce, Algorithm::ring, 2048, 4096, 0, false, {}});
  EXPECT_FALSE(at_limit.rounds.empty());
  const Plan tiny = build_plan({CollOp::all_reduce, Algorithm::ring, 4096, 1, 0, false, {}});
  EXPECT_GT(price_plan(tiny, *p, DType::f32).total_ns, 0);
}

}  // namespace
}  // namespace cocemu
