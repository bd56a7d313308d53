// Symmetric memory (R-RT-5): put/get into peers' copies, flags in peer memory with release/acquire
// ordering, and clear errors for out-of-range accesses and disagreeing allocations.
#include <gtest/gtest.h>

#include <cstring>

#include "cocemu/runtime/symmetric.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;
using testing::run_ranks;

TEST(Symmetric, RingOfPutsAndSignals) {
  constexpr int steps = 200;
  run_ranks(5, [](Rank& rank) {
    const int n = rank.world_size(), me = rank.id();
    std::vector<int> team(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      team[std::size_t(i)] = i;
    SymmetricBuffer buf = SymmetricBuffer::allocate(rank, team, 2 * sizeof(std::int64_t), 2);
    EXPECT_EQ(buf.team_rank(), me);
    // Each step writes a value into the right neighbour's slot (double-buffered), then signals;
    // the neighbour waits for the flag and checks it sees the value (release/acquire).
    const int right = (me + 1) % n;
    for (int s = 0; s < steps; ++s) {
      const std::int64_t v = std::int64_t(me) * 1000000 + s;
      const int slot = s % 2;
      if (s >= 2) buf.wait(1, std::uint32_t(s - 1), "the right neighbour to free the slot");
      buf.put(right, std::size_t(slot) * sizeof(v), &v, sizeof(v));
      buf.signal(right, 0);
      buf.wait(0, std::uint32_t(s + 1), "the left neighbour's value");
      std::int64_t got = 0;
      std::memcpy(&got, buf.local() + std::size_t(slot) * sizeof(v), sizeof(got));
      EXPECT_EQ(got, std::int64_t((me + n - 1) % n) * 1000000 + s);
      buf.signal((me + n - 1) % n, 1);  // slot consumed
    }
    std::int64_t peek = 0;
    buf.get(right, 0, &peek, sizeof(peek));
    EXPECT_EQ(peek % 1000000, steps - 2);
  });
}

TEST(Symmetric, BadAccessesAreClearErrors) {
  expect_error(
      [] {
        run_ranks(2, [](Rank& rank) {
          SymmetricBuffer buf = SymmetricBuffer::allocate(rank, {0, 1}, 64, 1);
          std::byte b[16]{};
          buf.put(1, 56, b, 16);
        });
      },
      Errc::invalid_argument, {"put on rank", "[56, 72)", "64 bytes"});
  expect_error(
      [] {
        run_ranks(2, [](Rank& rank) {
          SymmetricBuffer::allocate(rank, {0, 1}, rank.id() == 0 ? 64 : 128, 1);
        });
      },
      Errc::mismatch, {"asked for", "bytes"});
  expect_error(
      [] { run_ranks(3, [](Rank& rank) {
             SymmetricBuffer::allocate(rank, {0, 1}, 8, 1);
           }); },
      Errc::invalid_argument, {"rank 2 is not in the team [0,1]"});
}

TEST(Symmetric, WaitTimesOutNamingTheFlag) {
  WorldOptions o;
  o.timeout = testing::short_timeout(std::chrono::milliseconds(150));
  expect_error(
      [&] {
        run_ranks(
            2,
            [](Rank& rank) {
              SymmetricBuffer buf = SymmetricBuffer::allocate(rank, {0, 1}, 8, 3);
              if (rank.id() == 0) buf.wait(2, 1, "tile 4 from rank 1");
            },
            o);
      },
      Errc::timeout, {"symmetric flag slot 2 >= 1", "tile 4 from rank 1"});
}

}  // namespace
}  // namespace cocemu
