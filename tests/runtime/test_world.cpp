// The world of rank threads (R-RT-1): failures propagate with the rank id, every rank is woken from
// its waits, no thread is left behind, and waits are bounded with a message saying what they waited
// for.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "cocemu/runtime/sync.h"
#include "testing.h"

namespace cocemu {
namespace {

using namespace std::chrono_literals;
using testing::expect_error;
using testing::run_ranks;

TEST(World, RunsEveryRankOnItsOwnThread) {
  for (int n : {1, 3, 8, 16}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    std::mutex mu;
    std::set<std::thread::id> threads;
    run_ranks(n, [&](Rank& rank) {
      EXPECT_EQ(rank.world_size(), n);
      hits[std::size_t(rank.id())]++;
      std::lock_guard lock(mu);
      threads.insert(std::this_thread::get_id());
    });
    for (auto& h : hits)
      EXPECT_EQ(h.load(), 1);
    EXPECT_EQ(int(threads.size()), n);
  }
}

TEST(World, RejectsRankCountsOutOfRange) {
  expect_error([] { run_ranks(0, [](Rank&) {}); }, Errc::invalid_argument,
               {"n_ranks = 0", "1..256"});
  expect_error([] { run_ranks(257, [](Rank&) {}); }, Errc::invalid_argument, {"n_ranks = 257"});
}

TEST(World, AFailingRankUnwindsTheOthersAndRunRethrowsWithItsId) {
  // Rank 3 throws while every other rank is blocked waiting for a counter nobody will signal.
  auto counter = std::make_shared<Counter>();
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(
      [&] {
        run_ranks(8, [&](Rank& rank) {
          if (rank.id() == 3) {
            std::this_thread::sleep_for(20ms);
            throw std::runtime_error("boom in rank three");
          }
          counter->wait_geq(1, [] { return std::string("a signal that never comes"); });
        });
      },
      Errc::rank_exception, {"rank 3", "boom in rank three"});
  // The others were woken well before the 10 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // A second run works.
  int sum = 0;
  std::mutex mu;
  run_ranks(4, [&](Rank& rank) {
    std::lock_guard lock(mu);
    sum += rank.id();
  });
  EXPECT_EQ(sum, 6);
}

TEST(World, AFailingStreamOpIsRethrownWithItsRank) {
  expect_error(
      [] {
        run_ranks(4, [](Rank& rank) {
          rank.compute_stream().launch({.name = "bad kernel"}, [&] {
            if (rank.id() == 2)
              COCEMU_FAIL(Errc::invalid_argument, "kernel saw value 7, allowed < 5");
          });
          rank.synchronize();
        });
      },
      Errc::invalid_argument, {"rank 2", "value 7", "allowed < 5"});
}

TEST(World, TimedOutWaitSaysWhatItWaitedFor) {
  WorldOptions o;
  o.timeout = testing::short_timeout(200ms);
  auto counter = std::make_shared<Counter>();
  expect_error(
      [&] {
        run_ranks(
            2,
            [&](Rank& rank) {
              rank.note_activity("waiting for the answer");
              counter->wait_geq(5, [] { return std::string("the answer to be ready"); });
            },
            o);
      },
      Errc::timeout,
      {fmt::format("no progress for {} ms", o.timeout.count()), "the answer to be ready",
       "counter at 0, needed 5", "what each rank was last doing", "waiting for the answer"});
}

TEST(World, TimeoutComesFromTheEnvironment) {
  ::setenv("COCEMU_TIMEOUT_MS", "1234", 1);
  EXPECT_EQ(default_timeout().count(), 1234);
  ::setenv("COCEMU_TIMEOUT_MS", "soon", 1);
  expect_error([] { default_timeout(); }, Errc::invalid_argument, {"COCEMU_TIMEOUT_MS='soon'"});
  ::unsetenv("COCEMU_TIMEOUT_MS");
  EXPECT_EQ(default_timeout().count(), 60000);
  ::setenv("COCEMU_SCHEDULE_SEED", "17", 1);
  EXPECT_EQ(default_schedule_seed(), 17u);
  ::unsetenv("COCEMU_SCHEDULE_SEED");
  EXPECT_EQ(default_schedule_seed(), 0u);
}

TEST(World, SharedObjectsAreOnePerKey) {
  std::atomic<int> made{0};
  std::vector<const void*> seen(4);
  run_ranks(4, [&](Rank& rank) {
    auto p = rank.world().shared<int>("the-key", [&] {
      ++made;
      return std::make_shared<int>(7);
    });
    seen[std::size_t(rank.id())] = p.get();
  });
  EXPECT_EQ(made.load(), 1);
  for (auto* p : seen)
    EXPECT_EQ(p, seen[0]);
}

}  // namespace
}  // namespace cocemu
