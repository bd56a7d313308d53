// Streams and events (R-RT-2, R-RT-3): in-order execution asynchronous to the host, cross-stream
// ordering only through events, query/synchronize, and real concurrency of separate streams.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "testing.h"

namespace cocemu {
namespace {

using namespace std::chrono_literals;
using testing::run_ranks;

TEST(Streams, OpsOnOneStreamRunInOrderAndAsynchronously) {
  run_ranks(2, [](Rank& rank) {
    std::vector<int> seen;
    std::atomic<bool> release{false};
    Stream& s = rank.compute_stream();
    s.launch({.name = "gate"}, [&] {
      while (!release.load())
        std::this_thread::sleep_for(1ms);
    });
    for (int i = 0; i < 50; ++i)
      s.launch({.name = "push"}, [&seen, i] { seen.push_back(i); });
    // The host got here while the gate still blocks the stream: launches are asynchronous.
    EXPECT_FALSE(s.query());
    EXPECT_TRUE(seen.empty());
    release = true;
    s.synchronize();
    ASSERT_EQ(seen.size(), 50u);
    for (int i = 0; i < 50; ++i)
      EXPECT_EQ(seen[i], i);
    EXPECT_TRUE(s.query());
  });
}

TEST(Streams, SplitOpsOfOneChainStartAheadAndCompleteInOrder) {
  // Five split ops queue behind a gate: four of chain A, then one of chain B. The worker starts
  // A's ops up to the window before finishing the first, finishes them in order, and starts B's
  // only after A's are done; each op completes (its event) when its finish returns.
  run_ranks(1, [](Rank& rank) {
    std::vector<std::string> log;  // only the stream's worker writes it
    std::atomic<bool> release{false};
    Stream& s = rank.comm_stream();
    s.launch({.name = "gate"}, [&] {
      while (!release.load())
        std::this_thread::sleep_for(1ms);
    });
    const int a = 0, b = 0;  // two chains: any two distinct addresses
    std::vector<Event> after(6);
    for (int i = 1; i <= 5; ++i) {
      const Event* previous = i > 1 ? &after[std::size_t(i - 1)] : nullptr;
      s.launch_split(
          {.name = fmt::format("split {}", i)}, i < 5 ? &a : &b,
          [&log, i, previous] {
            log.push_back(fmt::format("s{}{}", i, previous && previous->query() ? "+" : ""));
          },
          [&log, i, previous] {
            log.push_back(fmt::format("f{}{}", i, previous && previous->query() ? "+" : ""));
          });
      after[std::size_t(i)] = s.record();
    }
    release = true;
    s.synchronize();
    // "+": the previous op had completed when this part ran.
    std::vector<std::string> want;
    const int ahead = std::min(4, Stream::kSplitWindow);
    for (int i = 1; i <= ahead; ++i)
      want.push_back(fmt::format("s{}", i));
    for (int i = 1; i <= 4; ++i) {
      want.push_back(fmt::format("f{}{}", i, i > 1 ? "+" : ""));
      if (i + ahead <= 4) want.push_back(fmt::format("s{}", i + ahead));
    }
    want.insert(want.end(), {"s5+", "f5+"});
    EXPECT_EQ(log, want);
  });
}

TEST(Streams, EventOrdersAcrossStreams) {
  run_ranks(1, [](Rank& rank) {
    std::atomic<int> value{0};
    int observed = -1;
    Stream& a = rank.compute_stream();
    Stream& b = rank.comm_stream();
    a.launch({.name = "slow producer"}, [&] {
      std::this_thread::sleep_for(30ms);
      value = 42;
    });
    Event e = a.record();
    EXPECT_FALSE(e.query());
    b.wait(e);  // device-side: the host continues at once
    b.launch({.name = "consumer"}, [&] { observed = value.load(); });
    b.synchronize();
    EXPECT_EQ(observed, 42);
    EXPECT_TRUE(e.query());
  });
}

TEST(Streams, WithoutAnEventStreamsAreNotOrdered) {
  // Separate streams really run concurrently: the second stream's op finishes while the first is
  // still blocked.
  run_ranks(1, [](Rank& rank) {
    std::atomic<bool> release{false}, other_done{false};
    rank.compute_stream().launch({.name = "blocked"}, [&] {
      const auto deadline = std::chrono::steady_clock::now() + 5s;
      while (!release && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    });
    rank.comm_stream().launch({.name = "free"}, [&] { other_done = true; });
    rank.comm_stream().synchronize();
    EXPECT_TRUE(other_done);
    EXPECT_FALSE(rank.compute_stream().query());
    release = true;
    rank.synchronize();
  });
}

TEST(Streams, EventSynchronizeBlocksTheHostUntilDone) {
  run_ranks(1, [](Rank& rank) {
    std::atomic<bool> done{false};
    rank.compute_stream().launch({.name = "work"}, [&] {
      std::this_thread::sleep_for(20ms);
      done = true;
    });
    Event e = rank.compute_stream().record();
    e.synchronize();
    EXPECT_TRUE(done);
    EXPECT_TRUE(e.query());
    Event empty = rank.new_stream("idle").record();
    EXPECT_TRUE(empty.query());
    empty.synchronize();
  });
}

// A host waiting for its stream runs the queued ops itself when the worker is not running them
// (runtime/src/world.cpp, StreamImpl::help). Whoever runs them, they run one at a time and in
// order: a plain int counts them (TSan sees a race if two threads ran ops at once).
TEST(Streams, OpsRunInOrderWhetherTheWorkerOrTheHostRunsThem) {
  run_ranks(2, [](Rank& rank) {
    Stream& s = rank.comm_stream();
    int next = 0, wrong = 0;
    for (int round = 0; round < 300; ++round) {
      Event middle;
      for (int i = 0; i < 8; ++i) {
        const int want = round * 8 + i;
        s.launch({.name = "count"}, [&, want] { wrong += next++ != want; });
        if (i == 3) middle = s.record();
      }
      if (round % 3 == 0) middle.synchronize();  // a wait for part of the queue
      if (round % 2 == 0) s.synchronize();       // a wait for all of it
    }
    s.synchronize();
    EXPECT_EQ(next, 300 * 8);
    EXPECT_EQ(wrong, 0);
  });
}

// After the host ran the ops up to an event, the worker takes over the rest by itself: the host
// waits for the last op without a stream call (before `released`, the worker waited for the host
// to run every queued op, and this hung).
TEST(Streams, AfterAHostWaitForPartTheWorkerRunsTheRest) {
  run_ranks(2, [](Rank& rank) {
    Stream& s = rank.compute_stream();
    for (int round = 0; round < 200; ++round) {
      std::atomic<bool> first{false}, last{false};
      s.launch({.name = "first"}, [&] { first = true; });
      Event e = s.record();
      s.launch({.name = "last"}, [&] { last = true; });
      e.synchronize();
      ASSERT_TRUE(first.load());
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (!last.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(50us);
      ASSERT_TRUE(last.load()) << "round " << round << ": the worker did not run the last op";
    }
  });
}

TEST(Streams, MoreStreamsCanBeCreated) {
  const RunResult r = run_ranks(2, [](Rank& rank) {
    Stream& extra = rank.new_stream("side");
    int x = 0;
    extra.launch({.name = "side op", .work_ns = 10}, [&] { x = 1; });
    extra.synchronize();
    EXPECT_EQ(x, 1);
  });
  ASSERT_EQ(r.graph.ranks[0].lane_names.size(), 4u);
  EXPECT_EQ(r.graph.ranks[0].lane_names[3], "side");
}

TEST(Streams, DryRunSkipsNumericsButModelsTime) {
  WorldOptions o;
  o.numerics = false;
  o.profile = testing::round_profile();
  int calls = 0;
  std::mutex mu;
  const RunResult r = run_ranks(
      2,
      [&](Rank& rank) {
        rank.compute_stream().launch({.name = "kernel", .work_ns = 500}, [&] {
          std::lock_guard lock(mu);
          ++calls;
        });
      },
      o);
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(r.numerics);
  EXPECT_EQ(r.timeline.makespan_ns(), 500);
}

}  // namespace
}  // namespace cocemu
