// A world on several hosts (runtime/hosts.h) joined in process by the loopback transport: the
// same program gives the same bits and the same modeled timeline on 1, 2 and 4 hosts.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/symmetric.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;

constexpr int kRanks = 8;

/// Runs `fn` on kRanks ranks spread over `hosts` in-process hosts; one result per host.
std::vector<RunResult> run_on_hosts(int hosts, const std::function<void(Rank&)>& fn,
                                    WorldOptions options = {}) {
  options.n_ranks = kRanks;
  options.timeout = std::chrono::milliseconds(20000);
  if (hosts == 1) return {run(options, fn)};
  return testing::on_loopback_hosts<RunResult>(hosts, [&](std::shared_ptr<HostLink> link) {
    WorldOptions o = options;
    o.hosts = std::move(link);
    return run(o, fn);
  });
}

Tensor filled(std::int64_t n, int rank, int salt) {
  Tensor t = Tensor::zeros({n}, DType::f32);
  std::uint32_t s = std::uint32_t(rank * 7919 + salt * 104729 + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    t.data<float>()[i] = float(std::int32_t(s >> 8) % 2000) / 997.0f;
  }
  return t;
}

/// Every kind of call a training step makes across hosts, each rank's outputs appended to
/// `out[rank]` as raw bytes.
void program(Rank& rank, std::vector<std::vector<std::byte>>& out) {
  const int me = rank.id();
  auto keep = [&](const Tensor& t) {
    rank.synchronize();
    auto& o = out[std::size_t(me)];
    const auto* p = static_cast<const std::byte*>(t.raw());
    o.insert(o.end(), p, p + t.nbytes());
  };
  Group world = Group::world(rank);
  // Megatron-like groups: tp within a host of 4 (or 2), dp across them.
  std::vector<Group> dp, tp;
  for (int i = 0; i < 4; ++i)
    dp.push_back(new_group(rank, {i, i + 4}, fmt::format("dp{}", i)));
  for (int i = 0; i < 2; ++i)
    tp.push_back(new_group(rank, {4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3}, fmt::format("tp{}", i)));
  Group& my_dp = dp[std::size_t(me % 4)];
  Group& my_tp = tp[std::size_t(me / 4)];

  Tensor small = filled(1000, me, 1);  // a small call (one actor on one host)
  all_reduce(world, small);
  keep(small);
  Tensor big = filled(300000, me, 2);  // 1.2 MB: per-member rounds on one host
  all_reduce(world, big, {.algo = Algorithm::ring});
  keep(big);
  Tensor grads = filled(40000, me, 3);
  all_reduce(my_dp, grads, {.op = ReduceOp::avg});
  keep(grads);
  Tensor shard = Tensor::zeros({20000}, DType::f32);
  reduce_scatter(my_dp, shard, filled(40000, me, 4));
  keep(shard);
  Tensor gathered = Tensor::zeros({2 * 20000}, DType::f32);
  all_gather(my_dp, gathered, shard);
  keep(gathered);
  Tensor act = filled(5000, me, 5);
  all_reduce(my_tp, act);
  keep(act);
  Tensor root = filled(777, me, 6);
  broadcast(world, root, 5);
  keep(root);
  // Uneven all_to_all: rank r sends (p + r) % 3 + 1 rows of 16 to rank p.
  std::vector<std::int64_t> in_splits, out_splits;
  for (int p = 0; p < kRanks; ++p) {
    in_splits.push_back((p + me) % 3 + 1);
    out_splits.push_back((me + p) % 3 + 1);
  }
  std::int64_t in_rows = 0, out_rows = 0;
  for (int p = 0; p < kRanks; ++p) {
    in_rows += in_splits[std::size_t(p)];
    out_rows += out_splits[std::size_t(p)];
  }
  Tensor a2a_in = filled(in_rows * 16, me, 7).reshape({in_rows, 16});
  Tensor a2a_out = Tensor::zeros({out_rows, 16}, DType::f32);
  all_to_all(world, a2a_out, a2a_in, out_splits, in_splits);
  keep(a2a_out);
  // A split across hosts, then a call on each half.
  Group half = split(world, me % 2, -me);
  Tensor h = filled(3000, me, 8);
  all_reduce(half, h);
  keep(h);
  // A ring of sends: each rank's right neighbour is on the other host for ranks 3 and 7.
  Tensor to_right = filled(4096, me, 9), from_left = Tensor::zeros({4096}, DType::f32);
  batch_isend_irecv(world, {{P2POp::send, to_right, (me + 1) % kRanks},
                            {P2POp::recv, from_left, (me + kRanks - 1) % kRanks}})
      .synchronize();
  keep(from_left);
  barrier(world);
}

void expect_same_timeline(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.timeline.n_ranks(), b.timeline.n_ranks()) << what;
  for (int r = 0; r < a.timeline.n_ranks(); ++r) {
    const auto& x = a.timeline.rank(r);
    const auto& y = b.timeline.rank(r);
    ASSERT_EQ(x.size(), y.size()) << what << " rank " << r;
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x[i].start_ns, y[i].start_ns) << what << " rank " << r << " op " << i;
      ASSERT_EQ(x[i].end_ns, y[i].end_ns) << what << " rank " << r << " op " << i;
    }
  }
  EXPECT_EQ(a.timeline.makespan_ns(), b.timeline.makespan_ns()) << what;
}

TEST(Hosts, SameBitsAndTimelineOnOneTwoAndFourHosts) {
  std::vector<std::vector<std::byte>> one(kRanks);
  const RunResult single = run_on_hosts(1, [&](Rank& r) { program(r, one); })[0];
  for (const int hosts : {2, 4}) {
    std::vector<std::vector<std::byte>> many(kRanks);
    const std::vector<RunResult> results = run_on_hosts(hosts, [&](Rank& r) { program(r, many); });
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(one[std::size_t(r)].size(), many[std::size_t(r)].size()) << hosts << " rank " << r;
      EXPECT_EQ(std::memcmp(one[std::size_t(r)].data(), many[std::size_t(r)].data(),
                            one[std::size_t(r)].size()),
                0)
          << "rank " << r << "'s outputs differ on " << hosts << " hosts";
    }
    for (int h = 0; h < hosts; ++h)
      expect_same_timeline(single, results[std::size_t(h)], fmt::format("host {} of {}", h, hosts));
  }
}

/// Runs `fn` on 2 in-process hosts that are expected to fail; each host's error message.
std::vector<std::string> failures_on_two_hosts(
    const std::function<void(Rank&)>& fn,
    std::chrono::milliseconds timeout = WorldOptions{}.timeout) {
  return testing::on_loopback_hosts<std::string>(2, [&](std::shared_ptr<HostLink> link) {
    WorldOptions o;
    o.n_ranks = kRanks;
    o.hosts = std::move(link);
    o.timeout = timeout;
    try {
      run(o, fn);
      return std::string("(no error)");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  });
}

TEST(Hosts, ARankThatFailsIsReportedOnTheOtherHost) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto messages = failures_on_two_hosts([](Rank& rank) {
    Group world = Group::world(rank);
    if (rank.id() == 6) throw std::runtime_error("rank six gives up");
    Tensor t = Tensor::zeros({16}, DType::f32);
    all_reduce(world, t);
    rank.synchronize();
  });
  EXPECT_NE(messages[1].find("rank six gives up"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("host 1 failed"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("rank six gives up"), std::string::npos) << messages[0];
  // Reported, not waited out: well within the 60 s wait timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(Hosts, HostsThatRunDifferentProgramsNameEachOther) {
  // Host 1's ranks make one call more; host 0's have finished and wait for host 1's recorded ops.
  // Whichever wait ends first, its host tells the other, so each error names the other host.
  const auto messages = failures_on_two_hosts(
      [](Rank& rank) {
        Group world = Group::world(rank);
        Tensor t = Tensor::zeros({16}, DType::f32);
        all_reduce(world, t);
        if (rank.id() >= 4) all_reduce(world, t);
        rank.synchronize();
      },
      testing::short_timeout(std::chrono::milliseconds(1000)));
  const bool zero_names_one = messages[0].find("host 1 failed") != std::string::npos ||
                              messages[0].find("recorded ops of host 1") != std::string::npos;
  const bool one_names_zero = messages[1].find("host 0 failed") != std::string::npos ||
                              messages[1].find("on host 0") != std::string::npos;
  EXPECT_TRUE(zero_names_one) << messages[0];
  EXPECT_TRUE(one_names_zero) << messages[1];
}

TEST(Hosts, CallsThatDisagreeAcrossHostsAreAMismatch) {
  const auto messages = failures_on_two_hosts([](Rank& rank) {
    Group world = Group::world(rank);
    Tensor t = Tensor::zeros({rank.id() == 6 ? 17 : 16}, DType::f32);
    all_reduce(world, t);
    rank.synchronize();
  });
  // Each host finds it (or hears it from the other first).
  for (const std::string& m : messages)
    for (const char* fragment : {"collective mismatch on group world", "world rank 6", "count 17"})
      EXPECT_NE(m.find(fragment), std::string::npos) << m;
}

TEST(Hosts, SymmetricMemoryAcrossHostsIsRefused) {
  expect_error(
      [] {
        run_on_hosts(2, [](Rank& rank) {
          if (rank.id() == 3 || rank.id() == 4) SymmetricBuffer::allocate(rank, {3, 4}, 64, 1);
        });
      },
      Errc::invalid_argument, {"team [3,4] spans hosts", "within a host's 4 ranks"});
}

TEST(Hosts, RanksMustDivideOverTheHosts) {
  LoopbackHosts link(3);
  WorldOptions o;
  o.n_ranks = kRanks;
  o.hosts = link.link(0);
  expect_error([&] { run(o, [](Rank&) {}); }, Errc::invalid_argument,
               {"8 ranks do not divide evenly over 3 hosts"});
}

}  // namespace
}  // namespace cocemu
