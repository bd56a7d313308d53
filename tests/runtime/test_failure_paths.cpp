// Resource failures are errors, at once (R-RT-1, issue #34): an allocation that fails inside a
// stream op or on a rank's host thread, a system error, wakes every rank from its waits, and
// `run` rethrows the first failure naming the rank, the stream and the op — never a terminate,
// never a timeout that names a bystander. A run that asks for an estimate is refused before any
// thread starts.
#include <gtest/gtest.h>

#include <atomic>

#include <chrono>
#include <csignal>
#include <new>
#include <system_error>
#include <thread>

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

// Interrupts (issue 41 item 2): a run stops within about a second of an interrupt, every wait
// fails, and the error says where each rank was; a rank stuck in its own code is named and left.

/// Error and seconds from the interrupt to `run`'s return, for `fn` on 4 ranks where
/// `interrupt_check` answers "test interrupt" from 300 ms on.
std::pair<Error, double> interrupted(const std::function<void(Rank&)>& fn) {
  WorldOptions o;
  o.n_ranks = 4;
  o.timeout = std::chrono::milliseconds(60000);
  const auto t0 = std::chrono::steady_clock::now();
  const auto at = t0 + std::chrono::milliseconds(300);
  o.interrupt_check = [at]() -> std::string {
    return std::chrono::steady_clock::now() >= at ? "test interrupt" : "";
  };
  try {
    run(o, fn);
  } catch (const Error& e) {
    return {e, std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count()};
  }
  ADD_FAILURE() << "the run was not interrupted";
  return {Error(Errc::internal, ""), 0};
}

TEST(Interrupts, ADeadlockStopsAtOnceAndTheErrorSaysWhereEachRankWas) {
  // Rank 3 never joins the all_reduce: without the interrupt, 60 s to the timeout.
  const auto [e, seconds] = interrupted([](Rank& rank) {
    if (rank.id() == 3) return;
    Group world = Group::world(rank);
    Tensor t = Tensor::zeros({16}, DType::f32);
    all_reduce(world, t).synchronize();
  });
  EXPECT_EQ(e.code(), Errc::cancelled) << e.what();
  for (const char* f : {"run interrupted by test interrupt after", "what each rank was last doing",
                        "rank 0:", "all_reduce", "rank 3: [host] finished"})
    EXPECT_NE(e.message().find(f), std::string::npos) << f << " in " << e.message();
  EXPECT_EQ(e.message().find("still running"), std::string::npos) << e.message();
  EXPECT_LT(seconds, 2.0);
}

TEST(Interrupts, ARankInItsOwnCodeIsNamedAndLeftBehind) {
  // Nothing captured by reference: rank 2 outlives `run`, detached.
  const auto [e, seconds] = interrupted([](Rank& rank) {
    if (rank.id() == 2) std::this_thread::sleep_for(std::chrono::seconds(3));
    rank.synchronize();
  });
  EXPECT_EQ(e.code(), Errc::cancelled) << e.what();
  for (const char* f : {"rank 2 still running its own host code", "left running detached",
                        "rank 2: [host] running", "rank 1: [host] finished"})
    EXPECT_NE(e.message().find(f), std::string::npos) << f << " in " << e.message();
  EXPECT_LT(seconds, 2.0);                               // the 1 s grace, not the 3 s sleep
  std::this_thread::sleep_for(std::chrono::seconds(3));  // rank 2 returns and ends on its own
}

TEST(Interrupts, AProcessWideInterruptStopsEveryRunUntilCleared) {
  std::thread signaller([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    request_interrupt(SIGINT);  // what the CLI's signal handler calls
  });
  WorldOptions o;
  o.n_ranks = 2;
  expect_error(
      [&] {
        run(o, [](Rank& rank) {
          Group world = Group::world(rank);
          Tensor t = Tensor::zeros({4}, DType::f32);
          if (rank.id() == 0) recv(world, t, 1);  // nobody sends
        });
      },
      Errc::cancelled, {"run interrupted by SIGINT (Ctrl-C)", "rank 0:", "recv"});
  signaller.join();
  EXPECT_EQ(interrupt_requested(), SIGINT);
  request_interrupt(0);
  EXPECT_EQ(interrupt_requested(), 0);
  run(2, [](Rank&) {});
}

TEST(Timeouts, OutOfRangeTimeoutsAreRefusedAndADayIsAllowed) {
  // Beyond a day the deadline would overflow (1e10 s fired at once, 1e17 s wrapped to 1 ms).
  for (auto t : {kMaxTimeout + std::chrono::milliseconds(1), std::chrono::milliseconds(0),
                 std::chrono::milliseconds(-5),
                 std::chrono::milliseconds(std::numeric_limits<std::int64_t>::max())}) {
    WorldOptions o;
    o.n_ranks = 2;
    o.timeout = t;
    expect_error(
        [&] { run(o, [](Rank&) {}); }, Errc::invalid_argument,
        {fmt::format("run: timeout {} ms is out of range; allowed 1..86400000 ms", t.count())});
  }
  WorldOptions o;
  o.n_ranks = 4;
  o.timeout = kMaxTimeout;
  run(o, [](Rank& rank) {  // a rank 0.3 s late is waited for
    if (rank.id() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Group world = Group::world(rank);
    Tensor t = Tensor::zeros({4}, DType::f32);
    all_reduce(world, t).synchronize();
  });
}

TEST(FailurePaths, AHugeTensorIsRefusedWithItsSizeAndTheMemoryThereIs) {
  expect_error(
      [] { Tensor::zeros({std::int64_t(1) << 40}, DType::f32); }, Errc::too_large,
      {"a tensor of shape", "f32 needs 4096.0 GiB (4398046511104 bytes)", "may use", "dry run"});
}

}  // namespace
}  // namespace cocemu
