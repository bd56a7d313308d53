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

// The launch queue is bounded (issue 41 item 4): a host launching faster than its stream runs
// blocks at max_queued_ops ops, and the results and the device's modeled times are those of an
// unbounded queue (the model's host waits for the oldest op, as CUDA's does).
TEST(Streams, TheLaunchQueueIsBoundedAndChangesNoResultOrDeviceTime) {
  constexpr int kOps = 3000;
  struct Outcome {
    RunResult result;
    std::vector<std::vector<int>> order;
    std::vector<std::uint32_t> most;
  };
  const auto launch_all = [](int depth) {
    Outcome out;
    out.order.resize(2);
    out.most.assign(2, 0);
    WorldOptions o;
    o.n_ranks = 2;
    o.max_queued_ops = depth;
    out.result = run(o, [&](Rank& rank) {
      auto& order = out.order[std::size_t(rank.id())];
      Stream& s = rank.compute_stream();
      // The stream starts late: the host gets ahead by as many ops as the queue takes.
      s.launch({.name = "slow start", .work_ns = 50e3}, [] { std::this_thread::sleep_for(100ms); });
      for (int i = 0; i < kOps; ++i) {
        s.launch({.name = "op", .work_ns = 500e3}, [&order, i] { order.push_back(i); });
        out.most[std::size_t(rank.id())] = std::max(out.most[std::size_t(rank.id())], s.queued());
      }
      s.synchronize();
    });
    return out;
  };
  const Outcome bounded = launch_all(WorldOptions::kDefaultMaxQueuedOps);
  const Outcome unbounded = launch_all(1 << 20);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(bounded.most[r], std::uint32_t(WorldOptions::kDefaultMaxQueuedOps));
    EXPECT_GT(unbounded.most[r], std::uint32_t(WorldOptions::kDefaultMaxQueuedOps));
    ASSERT_EQ(bounded.order[r].size(), std::size_t(kOps));
    EXPECT_EQ(bounded.order[r], unbounded.order[r]);
  }
  // Same graph, same device timeline; the bounded host launches later (it waited).
  const ModelGraph& g = bounded.result.graph;
  ASSERT_EQ(g.ranks[0].ops.size(), unbounded.result.graph.ranks[0].ops.size());
  EXPECT_EQ(bounded.result.timeline.makespan_ns(), unbounded.result.timeline.makespan_ns());
  std::int64_t host_waited = 0;
  for (const OpRecord& op : g.ranks[0].ops) {
    const auto& b = bounded.result.timeline.at({0, op.index});
    const auto& u = unbounded.result.timeline.at({0, op.index});
    if (op.cls == OpClass::host) {
      host_waited = std::max(host_waited, b.start_ns - u.start_ns);
    } else if (op.cls == OpClass::compute) {
      EXPECT_EQ(b.start_ns, u.start_ns) << op.name << " " << op.index;
      EXPECT_EQ(b.end_ns, u.end_ns) << op.name << " " << op.index;
    }
  }
  EXPECT_GT(host_waited, 0);
}

TEST(Streams, AHostBlockedOnAFullQueueTimesOutSayingSo) {
  WorldOptions o;
  o.n_ranks = 1;
  o.max_queued_ops = 4;
  o.timeout = 300ms;
  testing::expect_error(
      [&] {
        run(o, [](Rank& rank) {
          Stream& s = rank.compute_stream();
          World* world = &rank.world();
          auto started = std::make_shared<std::atomic<bool>>(false);
          s.launch({.name = "gate"}, [world, started] {  // holds the stream until the run fails
            started->store(true);
            while (!world->aborted())
              std::this_thread::sleep_for(1ms);
          });
          while (!started->load())  // the worker runs it (the host would, were it idle)
            std::this_thread::sleep_for(1ms);
          for (int i = 0; i < 10; ++i)
            s.launch({.name = "op"}, [] {});
        });
      },
      Errc::timeout,
      {"room in the launch queue of rank 0 stream 'compute' (4 ops queued, at most 4"});
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
