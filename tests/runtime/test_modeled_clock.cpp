// The modeled clock (R-RT-6): small programs whose schedule can be worked out by hand.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cocemu/runtime/cost_model.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::round_profile;
using testing::run_ranks;

WorldOptions with(std::shared_ptr<const DeviceProfile> p) {
  WorldOptions o;
  o.profile = std::move(p);
  return o;
}

const ScheduledOp& at(const RunResult& r, int rank, const std::string& name) {
  for (const OpRecord& op : r.graph.ranks[std::size_t(rank)].ops)
    if (op.name == name) return r.timeline.at({rank, op.index});
  ADD_FAILURE() << "no op named " << name;
  static ScheduledOp none;
  return none;
}

TEST(ModeledClock, OpsOnAStreamFollowEachOther) {
  const RunResult r = run_ranks(
      1,
      [](Rank& rank) {
        rank.compute_stream().launch({.name = "a", .work_ns = 100}, [] {});
        rank.compute_stream().launch({.name = "b", .work_ns = 200}, [] {});
      },
      with(round_profile()));
  EXPECT_EQ(at(r, 0, "a").start_ns, 0);
  EXPECT_EQ(at(r, 0, "a").end_ns, 100);
  EXPECT_EQ(at(r, 0, "b").start_ns, 100);
  EXPECT_EQ(at(r, 0, "b").end_ns, 300);
}

TEST(ModeledClock, EventsOrderStreamsAndNothingElseDoes) {
  const RunResult r = run_ranks(
      1,
      [](Rank& rank) {
        Stream& c = rank.compute_stream();
        Stream& m = rank.comm_stream();
        c.launch({.name = "produce", .work_ns = 500}, [] {});
        m.launch({.name = "independent", .cls = OpClass::comm, .work_ns = 100}, [] {});
        m.wait(c.record());
        m.launch({.name = "consume", .cls = OpClass::comm, .work_ns = 200}, [] {});
      },
      with(round_profile()));
  EXPECT_EQ(at(r, 0, "independent").start_ns, 0);  // not ordered after "produce"
  EXPECT_EQ(at(r, 0, "consume").start_ns, 500);    // ordered by the event
  EXPECT_EQ(at(r, 0, "consume").end_ns, 700);
  EXPECT_EQ(at(r, 0, "wait compute").start_ns, 100);  // the stream idles from 100 to 500
  EXPECT_EQ(at(r, 0, "wait compute").end_ns, 500);
}

TEST(ModeledClock, LaunchOverheadAdvancesTheHostClock) {
  // Launch cost 100 ns per op: launches at [0,100] and [100,200]; kernels at [100,1100] and
  // [1100,2100]; the host's synchronize waits from 200 to 2100.
  const RunResult r = run_ranks(
      1,
      [](Rank& rank) {
        rank.compute_stream().launch({.name = "k1", .work_ns = 1000}, [] {});
        rank.compute_stream().launch({.name = "k2", .work_ns = 1000}, [] {});
        rank.compute_stream().synchronize();
      },
      with(round_profile("host: {launch_overhead_ns: 100, fused_launch_overhead_ns: 300}")));
  EXPECT_EQ(at(r, 0, "launch k1").end_ns, 100);
  EXPECT_EQ(at(r, 0, "k1").start_ns, 100);
  EXPECT_EQ(at(r, 0, "launch k2").start_ns, 100);
  EXPECT_EQ(at(r, 0, "k2").start_ns, 1100);
  EXPECT_EQ(at(r, 0, "synchronize compute").start_ns, 200);
  EXPECT_EQ(at(r, 0, "synchronize compute").end_ns, 2100);
  // Host bound: 10 tiny kernels of 10 ns each cost 10 launches.
  const RunResult h = run_ranks(
      1,
      [](Rank& rank) {
        for (int i = 0; i < 10; ++i)
          rank.compute_stream().launch({.name = "tiny", .work_ns = 10}, [] {});
        rank.compute_stream().launch({.name = "fused", .work_ns = 10, .launch = LaunchKind::fused},
                                     [] {});
      },
      with(round_profile("host: {launch_overhead_ns: 100, fused_launch_overhead_ns: 300}")));
  EXPECT_EQ(at(h, 0, "fused").start_ns, 1300);
  EXPECT_EQ(h.timeline.makespan_ns(), 1310);
}

TEST(ModeledClock, ContentionSlowsOverlappingComputeAndComm) {
  // compute 1000 ns and comm 500 ns start together; each runs at half speed while both run:
  // comm finishes at 1000 (500 of work), compute has done 500 and finishes the rest by 1500.
  const RunResult r = run_ranks(
      1,
      [](Rank& rank) {
        rank.compute_stream().launch({.name = "gemm", .work_ns = 1000}, [] {});
        rank.comm_stream().launch({.name = "xfer", .cls = OpClass::comm, .work_ns = 500}, [] {});
      },
      with(round_profile("contention: {compute_slowdown: 2.0, comm_slowdown: 2.0}")));
  EXPECT_EQ(at(r, 0, "xfer").end_ns, 1000);
  EXPECT_EQ(at(r, 0, "gemm").end_ns, 1500);
}

// Ops running at once share the device memory by their traffic (ContentionModel): here 1 byte
// per ns. A copy asking for all of it beside a transfer asking for half: requests 1.5, both run
// 1/1.5 as fast. A second transfer (on another link, so no link is shared) raises them to 2.0:
// contention grows with what runs at once. A GEMM asking for a fifth beside the same transfer
// stays under the bandwidth and nothing slows.
TEST(ModeledClock, MemoryContentionGrowsWithWhatRunsAtOnce) {
  const auto profile = with(round_profile("memory: {bandwidth_bytes_per_s: 1.0e9}"));
  auto copy_beside = [&](int transfers) {
    return run_ranks(
        1,
        [transfers](Rank& rank) {
          rank.compute_stream().launch({.name = "copy", .work_ns = 1000, .hbm_bytes = 1000}, [] {});
          Stream* streams[] = {&rank.comm_stream(), &rank.new_stream("comm 2")};
          const std::uint8_t links[] = {kIntraOut, kInterOut};
          for (int i = 0; i < transfers; ++i)
            streams[i]->launch({.name = fmt::format("xfer{}", i),
                                .cls = OpClass::comm,
                                .work_ns = 1000,
                                .hbm_bytes = 500,
                                .link_use = links[i]},
                               [] {});
        },
        profile);
  };
  const RunResult one = copy_beside(1), two = copy_beside(2);
  EXPECT_EQ(at(one, 0, "copy").end_ns, 1500);
  EXPECT_EQ(at(one, 0, "xfer0").end_ns, 1500);
  EXPECT_EQ(at(two, 0, "copy").end_ns, 2000);
  EXPECT_EQ(at(two, 0, "xfer1").end_ns, 2000);
  const RunResult gemm = run_ranks(
      1,
      [](Rank& rank) {
        rank.compute_stream().launch({.name = "gemm", .work_ns = 1000, .hbm_bytes = 200}, [] {});
        rank.comm_stream().launch(
            {.name = "xfer", .cls = OpClass::comm, .work_ns = 1000, .hbm_bytes = 500}, [] {});
      },
      profile);
  EXPECT_EQ(at(gemm, 0, "gemm").end_ns, 1000);
  EXPECT_EQ(at(gemm, 0, "xfer").end_ns, 1000);
  // overlapped_ns, the rule fused kernels price their steps with, applies the same sharing.
  ContentionModel cm;
  cm.memory_bytes_per_ns = 1;
  EXPECT_DOUBLE_EQ(overlapped_ns(1000, 1000, cm, 1000, 500), 1500);
  EXPECT_DOUBLE_EQ(overlapped_ns(1000, 1000, cm, 200, 500), 1000);
}

TEST(ModeledClock, RendezvousStartsTogetherAndEndsTogether) {
  // Rank 0 reaches the collective at 300, rank 1 at 0: both run it from 300; it takes as long as
  // its slowest member's work (400).
  const RunResult r = run_ranks(
      2,
      [](Rank& rank) {
        if (rank.id() == 0) {
          rank.compute_stream().launch({.name = "late", .work_ns = 300}, [] {});
          rank.comm_stream().wait(rank.compute_stream().record());
        }
        rank.comm_stream().launch({.name = "coll",
                                   .cls = OpClass::comm,
                                   .work_ns = rank.id() == 0 ? 200.0 : 400.0,
                                   .rendezvous = {{"k", 2}}},
                                  [] {});
      },
      with(round_profile()));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(at(r, i, "coll").start_ns, 300);
    EXPECT_EQ(at(r, i, "coll").end_ns, 700);
  }
}

TEST(ModeledClock, UnjoinedRendezvousIsReported) {
  try {
    run_ranks(2, [](Rank& rank) {
      if (rank.id() == 0)
        rank.comm_stream().launch(
            {.name = "lonely", .cls = OpClass::comm, .work_ns = 1, .rendezvous = {{"never", 2}}},
            [] {});
    });
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::mismatch);
    EXPECT_NE(std::string(e.what()).find("('lonely') expects 2 participants, 1 joined"),
              std::string::npos)
        << e.what();
  }
}

TEST(ModeledClock, GemmCostFollowsTheProfile) {
  const auto p = round_profile();
  // 2·m·n·k flops at 1 TFLOP/s: 2·100·100·100 = 2e6 flops = 2000 ns.
  EXPECT_DOUBLE_EQ(gemm_ns(*p, 100, 100, 100, DType::f32), 2000.0);
}

}  // namespace
}  // namespace cocemu
