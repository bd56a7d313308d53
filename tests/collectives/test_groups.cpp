// Process groups (R-CO-1): new_group, split and the Megatron-ordered mesh; collectives on
// sub-groups involve exactly their members.
#include <gtest/gtest.h>

#include <mutex>

#include "cocemu/collectives/ops.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;
using testing::run_ranks;

TEST(Groups, NewGroupOfOddRanks) {
  run_ranks(7, [](Rank& rank) {
    Group odd = new_group(rank, {1, 3, 5});
    Group evens = new_group(rank, {6, 4, 2, 0});  // order defines group ranks
    const bool is_odd = rank.id() % 2 == 1;
    EXPECT_EQ(odd.is_member(), is_odd);
    EXPECT_EQ(evens.is_member(), !is_odd);
    if (!is_odd) {
      EXPECT_EQ(evens.rank(), (6 - rank.id()) / 2);
      EXPECT_EQ(evens.world_rank_of(0), 6);
    }
    Group& mine = is_odd ? odd : evens;
    Tensor t = Tensor::zeros({5}, DType::i32);
    for (int i = 0; i < 5; ++i)
      t.data<std::int32_t>()[i] = rank.id() + i;
    all_reduce(mine, t);
    rank.synchronize();
    const int base = is_odd ? 1 + 3 + 5 : 0 + 2 + 4 + 6;
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(t.data<std::int32_t>()[i], base + mine.size() * i);
    expect_error([&] { all_reduce(is_odd ? evens : odd, t); }, Errc::invalid_argument,
                 {"not a member of group"});
  });
}

TEST(Groups, NewGroupArgumentsAreChecked) {
  run_ranks(3, [](Rank& rank) {
    expect_error([&] { new_group(rank, {0, 0}); }, Errc::invalid_argument, {"duplicates"});
    expect_error([&] { new_group(rank, {0, 7}); }, Errc::invalid_argument, {"must lie in 0..2"});
  });
  expect_error(
      [] {
        run_ranks(2, [](Rank& rank) {
          new_group(rank, rank.id() == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0});
        });
      },
      Errc::mismatch, {"new_group call #0 disagrees"});
}

TEST(Groups, SplitByColorAndKey) {
  run_ranks(6, [](Rank& rank) {
    Group world = Group::world(rank);
    // Color by parity; key reverses the order within a color. Rank 5 opts out.
    const int color = rank.id() == 5 ? -1 : rank.id() % 2;
    Group g = split(world, color, -rank.id());
    if (rank.id() == 5) {
      EXPECT_FALSE(g.is_member());
      return;
    }
    const std::vector<int> want = color == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{3, 1};
    EXPECT_EQ(g.ranks(), want);
    Tensor t = Tensor::zeros({1}, DType::i32);
    t.data<std::int32_t>()[0] = 1 << rank.id();
    all_reduce(g, t);
    rank.synchronize();
    EXPECT_EQ(t.data<std::int32_t>()[0], color == 0 ? 1 + 4 + 16 : 2 + 8);
  });
}

TEST(Groups, MeshFollowsMegatronOrder) {
  // tp=2, cp=2, dp=2 on 8 ranks: rank = tp + 2·(cp + 2·dp).
  std::mutex mu;
  std::vector<std::vector<int>> tp(8), cp(8), dp(8);
  run_ranks(8, [&](Rank& rank) {
    Mesh m = make_mesh(rank, {.tp = 2, .cp = 2, .dp = 2, .pp = 1});
    EXPECT_EQ(m.tp_rank, rank.id() % 2);
    EXPECT_EQ(m.cp_rank, rank.id() / 2 % 2);
    EXPECT_EQ(m.dp_rank, rank.id() / 4);
    EXPECT_EQ(m.tp.rank(), m.tp_rank);
    EXPECT_EQ(m.pp.size(), 1);
    std::lock_guard lock(mu);
    tp[rank.id()] = m.tp.ranks();
    cp[rank.id()] = m.cp.ranks();
    dp[rank.id()] = m.dp.ranks();
  });
  EXPECT_EQ(tp[5], (std::vector<int>{4, 5}));
  EXPECT_EQ(cp[5], (std::vector<int>{5, 7}));
  EXPECT_EQ(dp[5], (std::vector<int>{1, 5}));
  EXPECT_EQ(cp[0], (std::vector<int>{0, 2}));
  // pp is the slowest dimension.
  run_ranks(8, [&](Rank& rank) {
    Mesh m = make_mesh(rank, {.tp = 2, .cp = 1, .dp = 1, .pp = 4});
    EXPECT_EQ(m.pp.ranks(), (std::vector<int>{rank.id() % 2, rank.id() % 2 + 2, rank.id() % 2 + 4,
                                              rank.id() % 2 + 6}));
    Tensor t = Tensor::zeros({3}, DType::f32);
    t.data<float>()[0] = float(rank.id());
    all_reduce(m.pp, t);
    rank.synchronize();
    EXPECT_EQ(t.item(0), rank.id() % 2 == 0 ? 12.0 : 16.0);
  });
  expect_error([] { run_ranks(4, [](Rank& rank) { make_mesh(rank, {.tp = 3}); }); },
               Errc::invalid_argument, {"tp·cp·dp·pp", "must equal the world size 4"});
}

}  // namespace
}  // namespace cocemu

namespace cocemu {
namespace {

// The world limit is 256 ranks (32 nodes of 8): collectives at that size are exact.
TEST(LargeWorld, TwoHundredFiftySixRanksAllReduceAndGatherExactly) {
  constexpr int n = 256;
  WorldOptions o;
  // 770 threads on 2 cores start slowly under ThreadSanitizer: a wait for a peer that has not
  // started yet sees no progress for seconds.
  o.timeout = std::chrono::minutes(3);
  testing::run_ranks(
      n,
      [](Rank& rank) {
        Group world = Group::world(rank);
        const int r = rank.id();
        std::vector<float> mine(64);
        for (int i = 0; i < 64; ++i)
          mine[std::size_t(i)] = float((r * 7 + i) % 13);
        Tensor x = Tensor::from<float>({64}, mine);
        all_reduce(world, x);
        Tensor gathered = Tensor::zeros({n}, DType::f32);
        all_gather(world, gathered, Tensor::from<float>({1}, std::vector<float>{float(r)}));
        rank.synchronize();
        for (int i = 0; i < 64; ++i) {
          double want = 0;
          for (int p = 0; p < n; ++p)
            want += double((p * 7 + i) % 13);
          ASSERT_EQ(x.item(i), want) << "rank " << r << " element " << i;
        }
        for (int p = 0; p < n; ++p)
          ASSERT_EQ(gathered.item(p), double(p)) << "rank " << r;
      },
      o);
}

}  // namespace
}  // namespace cocemu
