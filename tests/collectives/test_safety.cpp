// Safety (R-CO-6): ranks that disagree about a call get a clear error naming both calls; a rank
// that skips a call makes the others time out with a message naming it; a rank that throws makes
// run() rethrow with its id; bad arguments are rejected with the value seen and what is allowed.
#include <gtest/gtest.h>

#include <chrono>

#include "cocemu/collectives/ops.h"
#include "cocemu/collectives/plan.h"
#include "testing.h"

namespace cocemu {
namespace {

using namespace std::chrono_literals;
using testing::expect_error;
using testing::run_ranks;

WorldOptions short_timeout() {
  WorldOptions o;
  o.timeout = testing::short_timeout(300ms);
  return o;
}

TEST(Safety, DifferentOpsNameBothCalls) {
  for (std::int64_t count : {16, 1 << 16}) {  // the small-call fast path and the general path
    expect_error(
        [&] {
          run_ranks(
              4,
              [&](Rank& rank) {
                Group g = Group::world(rank);
                Tensor t = Tensor::zeros({count * 4}, DType::f32),
                       s = Tensor::zeros({count}, DType::f32);
                if (rank.id() == 2)
                  all_gather(g, t, s).synchronize();
                else
                  all_reduce(g, s).synchronize();
              },
              short_timeout());
        },
        Errc::mismatch,
        {"collective mismatch on group world", "all_reduce(seq 0", "all_gather(seq 0",
         "world rank 2"});
  }
}

TEST(Safety, DifferentCountDtypeOrRootAreMismatches) {
  expect_error(
      [] {
        run_ranks(
            3,
            [](Rank& rank) {
              Group g = Group::world(rank);
              all_reduce(g, Tensor::zeros({rank.id() == 1 ? 9 : 8}, DType::f32)).synchronize();
            },
            short_timeout());
      },
      Errc::mismatch, {"count 8", "count 9"});
  // A small call (run by its last member) against a large one (every member runs its steps):
  // both start with the same join, so they meet and the mismatch is named, not a timeout.
  expect_error(
      [] {
        run_ranks(
            3,
            [](Rank& rank) {
              Group g = Group::world(rank);
              all_reduce(g, Tensor::zeros({rank.id() == 2 ? 1 << 20 : 1024}, DType::f32))
                  .synchronize();
            },
            short_timeout());
      },
      Errc::mismatch, {"count 1024", "count 1048576"});
  expect_error(
      [] {
        run_ranks(
            3,
            [](Rank& rank) {
              Group g = Group::world(rank);
              all_reduce(g, Tensor::zeros({8}, rank.id() == 0 ? DType::f64 : DType::f32))
                  .synchronize();
            },
            short_timeout());
      },
      Errc::mismatch, {"dtype f64", "dtype f32"});
  expect_error(
      [] {
        run_ranks(
            3,
            [](Rank& rank) {
              Group g = Group::world(rank);
              broadcast(g, Tensor::zeros({8}, DType::f32), rank.id() == 2 ? 1 : 0).synchronize();
            },
            short_timeout());
      },
      Errc::mismatch, {"root 0", "root 1"});
  expect_error(
      [] {
        run_ranks(
            2,
            [](Rank& rank) {
              Group g = Group::world(rank);
              all_reduce(g, Tensor::zeros({8}, DType::f32),
                         {.op = rank.id() == 0 ? ReduceOp::sum : ReduceOp::max})
                  .synchronize();
            },
            short_timeout());
      },
      Errc::mismatch, {"op sum", "op max"});
}

TEST(Safety, SkippedCallTimesOutNamingTheMissingRank) {
  expect_error(
      [] {
        run_ranks(
            4,
            [](Rank& rank) {
              Group g = Group::world(rank);
              Tensor t = Tensor::zeros({1 << 16}, DType::f32);
              all_reduce(g, t).synchronize();                      // seq 0: everyone
              if (rank.id() != 3) all_reduce(g, t).synchronize();  // seq 1: rank 3 skips it
            },
            short_timeout());
      },
      Errc::timeout,
      {"timed out", "all_reduce(seq 1",
       "not yet joined: group rank 3 (world rank 3, "
       "last joined seq 0)",
       "what each rank was last doing", "algo direct dtype f32 seq 1"});  // the op in the report
}

TEST(Safety, SkippingOneCallThenCallingAnotherIsAMismatch) {
  expect_error(
      [] {
        run_ranks(
            3,
            [](Rank& rank) {
              Group g = Group::world(rank);
              Tensor t = Tensor::zeros({64}, DType::f32), big = Tensor::zeros({192}, DType::f32);
              if (rank.id() != 0) all_reduce(g, t).synchronize();
              all_gather(g, big, t).synchronize();
            },
            short_timeout());
      },
      Errc::mismatch, {"all_reduce(seq 0", "all_gather(seq 0"});
}

TEST(Safety, RankThrowingDuringCollectivesUnwindsEveryone) {
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(
      [] {
        run_ranks(8, [](Rank& rank) {
          Group g = Group::world(rank);
          Tensor t = Tensor::zeros({1000}, DType::f32);
          all_reduce(g, t).synchronize();
          if (rank.id() == 5) throw Error(Errc::invalid_argument, "rank five gave up");
          all_reduce(g, t).synchronize();  // the others wait here for rank 5
        });
      },
      Errc::invalid_argument, {"rank 5", "rank five gave up"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);  // not the 10 s timeout
}

TEST(Safety, BadArgumentsAreRejected) {
  run_ranks(2, [](Rank& rank) {
    Group g = Group::world(rank);
    expect_error([&] { all_reduce(g, Tensor::zeros({4}, DType::i32), {.op = ReduceOp::avg}); },
                 Errc::invalid_argument,
                 {"avg needs a floating dtype", "i32", "on rank", "group world"});
    expect_error(
        [&] { all_gather(g, Tensor::zeros({7}, DType::f32), Tensor::zeros({4}, DType::f32)); },
        Errc::invalid_argument, {"all_gather", "2 × 4 = 8", "has 7"});
    expect_error(
        [&] { reduce_scatter(g, Tensor::zeros({4}, DType::f32), Tensor::zeros({4}, DType::f32)); },
        Errc::invalid_argument, {"reduce_scatter", "2 × 4 = 8", "has 4"});
    expect_error(
        [&] { all_reduce(g, Tensor::zeros({4}, DType::f32), Tensor::zeros({4}, DType::f64)); },
        Errc::invalid_argument, {"same dtype", "f32[4]", "f64[4]"});
    Tensor x = Tensor::zeros({8}, DType::f32);
    expect_error([&] { all_reduce(g, x.flat(0, 4), x.flat(2, 6)); }, Errc::invalid_argument,
                 {"overlap", "identical (in place) or disjoint"});
    expect_error([&] { broadcast(g, x, 2); }, Errc::invalid_argument,
                 {"root 2 out of range", "0..1"});
    expect_error(
        [&] { all_to_all(g, Tensor::zeros({3}, DType::f32), Tensor::zeros({3}, DType::f32)); },
        Errc::invalid_argument, {"divisible by the group size 2"});
    expect_error(
        [&] {
          all_to_all(g, Tensor::zeros({2, 1}, DType::f32), Tensor::zeros({2, 1}, DType::f32),
                     {1, 1}, {3, -1});
        },
        Errc::invalid_argument, {"split sizes must be >= 0"});
    expect_error([&] { all_reduce(g, Tensor()); }, Errc::invalid_argument, {"undefined"});
    barrier(g).synchronize();
  });
  expect_error(
      [] {
        run_ranks(
            2,
            [](Rank& rank) {
              Group g = Group::world(rank);
              const std::int64_t rows = 2;
              std::vector<std::int64_t> in{1, 1}, out{1, 1};
              if (rank.id() == 0)
                out = {2, 0};  // rank 0 expects 2 rows from itself; rank 0 sends it 1
              all_to_all(g, Tensor::zeros({rows, 3}, DType::f32),
                         Tensor::zeros({rows, 3}, DType::f32), out, in)
                  .synchronize();
            },
            short_timeout());
      },
      Errc::mismatch, {"sends 3 elements to group rank 0, which expects 6"});
}

// Pricing a call without running it (cocemu.collective_ns) checks the root as the call does: a
// root of -1 or past the group used to index past the plan's buffers (a double free).
TEST(Safety, ModeledCollectiveRefusesARootOutsideTheGroup) {
  const DeviceProfile p = load_named_profile("ascend-910b");
  const std::vector<int> world{0, 1, 2, 3};
  for (const int root : {-1, 4, 1 << 30})
    expect_error(
        [&] {
          model_collective(p, CollOp::broadcast, world, 1024, DType::f32, 4096,
                           Algorithm::automatic, true, root);
        },
        Errc::invalid_argument, {"broadcast", "root " + std::to_string(root), "allowed 0..3"});
  const ModeledCollective ok = model_collective(p, CollOp::broadcast, world, 1024, DType::f32, 4096,
                                                Algorithm::automatic, true, 3);
  EXPECT_GT(ok.cost.total_ns, 0);
}

}  // namespace
}  // namespace cocemu
