// Resource failures are errors, at once (R-RT-1, issue #34): an allocation that fails inside a
// stream op or on a rank's host thread, a system error, wakes every rank from its waits, and
// `run` rethrows the first failure naming the rank, the stream and the op — never a terminate,
// never a timeout that names a bystander. A run that asks for an estimate is refused before any
// thread starts.
#include <gtest/gtest.h>

#include <atomic>

#include <chrono>
#include <new>
#include <system_error>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/limits.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;

/// Runs `fn` on 8 ranks where rank 5's compute stream op throws `what`, the others waiting for
/// it in an all_reduce; returns the error and how long the run took to fail.
template <class Throw>
std::pair<Error, double> fail_in_op(Throw&& thrower, int ranks = 8) {
  WorldOptions o;
  o.n_ranks = ranks;
  o.timeout =
      std::chrono::milliseconds(30000);  // a timeout would take 30 s: the test takes far less
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run(o, [&](Rank& rank) {
      Group world = Group::world(rank);
      if (rank.id() == 5)
        rank.compute_stream().launch({.name = "matmul 64x64x64"}, [&] { thrower(); });
      Tensor t = Tensor::zeros({16}, DType::f32);
      all_reduce(world, t).synchronize();
    });
  } catch (const Error& e) {
    return {e, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  }
  ADD_FAILURE() << "the run did not fail";
  return {Error(Errc::internal, ""), 0};
}

TEST(FailurePaths, AnAllocationThatFailsInAStreamOpNamesRankStreamAndOp) {
  const auto [e, seconds] = fail_in_op([] { throw std::bad_alloc(); });
  EXPECT_EQ(e.code(), Errc::resource_exhausted) << e.what();
  for (const char* f :
       {"rank 5 failed", "stream 'compute' op 'matmul 64x64x64'", "out of memory", "more"})
    EXPECT_NE(e.message().find(f), std::string::npos) << f << " in " << e.message();
  EXPECT_LT(seconds, 5.0);  // every waiting rank woke and unwound, long before the 30 s timeout
}

TEST(FailurePaths, ASystemErrorInAStreamOpIsAResourceError) {
  const auto [e, seconds] = fail_in_op(
      [] {
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
      },
      64);
  EXPECT_EQ(e.code(), Errc::resource_exhausted) << e.what();
  for (const char* f : {"rank 5 failed", "stream 'compute' op 'matmul 64x64x64'",
                        "Resource temporarily unavailable", "threads"})
    EXPECT_NE(e.message().find(f), std::string::npos) << f << " in " << e.message();
  EXPECT_LT(seconds, 10.0);
}

TEST(FailurePaths, AnotherExceptionInAnOpIsNamedToo) {
  const auto [e, seconds] = fail_in_op([] { throw std::runtime_error("disk on fire"); });
  EXPECT_EQ(e.code(), Errc::rank_exception);
  EXPECT_NE(e.message().find("rank 5 failed: stream 'compute' op 'matmul 64x64x64' threw: disk "
                             "on fire"),
            std::string::npos)
      << e.message();
}

TEST(FailurePaths, AnAllocationThatFailsOnAHostThreadNamesIt) {
  WorldOptions o;
  o.n_ranks = 8;
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(
      [&] {
        run(o, [&](Rank& rank) {
          Group world = Group::world(rank);
          if (rank.id() == 3) throw std::bad_alloc();
          Tensor t = Tensor::zeros({16}, DType::f32);
          all_reduce(world, t).synchronize();
        });
      },
      Errc::resource_exhausted, {"rank 3 failed: host thread: out of memory"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // A second run works (R-RT-1).
  run(8, [](Rank& rank) {
    Group world = Group::world(rank);
    Tensor t = Tensor::zeros({16}, DType::f32);
    all_reduce(world, t).synchronize();
  });
}

TEST(FailurePaths, ARunThatAsksForAnEstimateIsRefusedBeforeAnyThreadStarts) {
  WorldOptions o;
  o.n_ranks = 64;
  o.estimate_bytes_per_rank = std::int64_t(1) << 50;  // a petabyte per rank
  std::atomic<bool> started{false};  // written by every rank thread of the second run
  expect_error([&] { run(o, [&](Rank&) { started = true; }); }, Errc::too_large,
               {"a run of 64 ranks", "needs about", "of memory", "fewer ranks"});
  EXPECT_FALSE(started.load());
  // What fits runs.
  o.estimate_bytes_per_rank = 1024;
  o.n_ranks = 4;
  run(o, [&](Rank&) { started = true; });
  EXPECT_TRUE(started.load());
}

TEST(FailurePaths, TheEstimateCheckSaysEveryLimitAndTheWayOut) {
  Estimate e{.what = "the request",
             .memory_bytes = std::int64_t(1) << 60,
             .threads = 3,
             .host_seconds = 1e9,
             .way_out = "do less"};
  expect_error([&] { check_estimate(e, 60); }, Errc::too_large,
               {"the request needs about", "GiB of memory", "more than half of the",
                "would take about 1000000000 s", "60 s budget", "do less"});
  e.memory_bytes = 1 << 20;
  e.host_seconds = 1;
  EXPECT_NO_THROW(check_estimate(e, 60));
  // The time budget from the environment, checked like every variable.
  EXPECT_GT(default_max_seconds(), 0);
  const MemoryLimits m = memory_limits();
  EXPECT_GT(m.bytes(), 0);
  EXPECT_FALSE(m.source().empty());
  EXPECT_GE(host_cores(), 1);
}

}  // namespace
}  // namespace cocemu
