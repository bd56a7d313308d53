// What other languages need from the runtime (issue #36): tensors over memory cocemu did not
// allocate, a run's failure naming its rank in the error itself, and the configs found from where
// the code lives.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::run_ranks;

TEST(Library, WrappedMemoryIsUsedInPlaceAndKeptAlive) {
  std::vector<std::weak_ptr<std::vector<float>>> owners(4);
  std::vector<std::shared_ptr<std::vector<float>>> buffers(4);
  run_ranks(4, [&](Rank& rank) {
    auto owner = std::make_shared<std::vector<float>>(6, float(rank.id() + 1));
    buffers[std::size_t(rank.id())] = owner;
    owners[std::size_t(rank.id())] = owner;
    // A view of elements 2..5 of the owner's memory, as a [2, 2] tensor.
    const std::shared_ptr<std::byte[]> storage(owner, reinterpret_cast<std::byte*>(owner->data()));
    const Tensor t = Tensor::wrap(storage, 2 * sizeof(float), {2, 2}, DType::f32);
    EXPECT_EQ(t.raw(), owner->data() + 2);
    EXPECT_EQ(t.storage().get(), storage.get());
    EXPECT_EQ(t.offset_bytes(), 2 * sizeof(float));
    EXPECT_EQ(t.rows(1, 2).offset_bytes(), 4 * sizeof(float));
    Group world = Group::world(rank);
    all_reduce(world, t);
    rank.synchronize();
  });
  for (std::size_t r = 0; r < 4; ++r) {  // elements 0 and 1 are outside the view
    const float own = float(r + 1);
    EXPECT_EQ(*buffers[r], (std::vector<float>{own, own, 10, 10, 10, 10}));
  }
  // The tensors (and the collective's copies of them) are gone: only `buffers` holds the owners.
  for (std::size_t r = 0; r < 4; ++r)
    EXPECT_EQ(owners[r].use_count(), 1);
  testing::expect_error([] { Tensor::wrap(nullptr, 0, {1}, DType::f32); }, Errc::invalid_argument,
                        {"without storage"});
}

TEST(Library, RunErrorsCarryTheFailingRank) {
  try {
    run_ranks(3, [](Rank& rank) {
      if (rank.id() == 2) throw std::runtime_error("rank two fails");
      Group world = Group::world(rank);
      barrier(world);
    });
    FAIL() << "run did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 2);
    EXPECT_EQ(e.code(), Errc::rank_exception);
  }
  try {
    run_ranks(2, [](Rank& rank) {
      if (rank.id() == 1) COCEMU_FAIL(Errc::mismatch, "on purpose");
    });
    FAIL() << "run did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.code(), Errc::mismatch);
  }
  EXPECT_EQ(Error(Errc::internal, "plain").rank(), -1);
}

TEST(Library, Int64Uint8AndBoolCollectives) {
  EXPECT_EQ(parse_dtype("int64"), DType::i64);
  EXPECT_EQ(parse_dtype("u8"), DType::u8);
  EXPECT_EQ(parse_dtype("bool"), DType::boolean);
  EXPECT_EQ(name_of(DType::boolean), "bool");
  EXPECT_FALSE(is_floating(DType::i64));
  testing::expect_error([] { parse_dtype("u16"); }, Errc::invalid_argument,
                        {"unknown dtype 'u16'", "i64, u8, bool"});
  const std::int64_t big = std::int64_t(1) << 40;  // beyond 32 bits: must not be truncated
  std::vector<std::vector<std::int64_t>> i64s(3);
  std::vector<std::vector<int>> u8s(3), ors(3), ands(3), maxes(3);
  run_ranks(3, [&](Rank& rank) {
    Group world = Group::world(rank);
    const int me = rank.id();
    const Tensor a = Tensor::zeros({2}, DType::i64);
    a.data<std::int64_t>()[0] = big * (me + 1);
    a.data<std::int64_t>()[1] = -big;
    const Tensor u = Tensor::zeros({1}, DType::u8);
    u.data<std::uint8_t>()[0] = std::uint8_t(100 + 50 * me);  // 100 + 150 + 200 wraps mod 256
    const Tensor b1 = Tensor::zeros({2}, DType::boolean), b2 = Tensor::zeros({2}, DType::boolean),
                 b3 = Tensor::zeros({2}, DType::boolean);
    for (const Tensor& b : {b1, b2, b3}) {
      b.data<bool>()[0] = me == 1;  // one rank true
      b.data<bool>()[1] = true;     // every rank true
    }
    all_reduce(world, a);
    all_reduce(world, u);
    all_reduce(world, b1);                          // sum: or
    all_reduce(world, b2, {.op = ReduceOp::prod});  // and
    all_reduce(world, b3, {.op = ReduceOp::max});   // or
    rank.synchronize();
    const auto r = std::size_t(me);
    i64s[r] = {a.data<std::int64_t>()[0], a.data<std::int64_t>()[1]};
    u8s[r] = {u.data<std::uint8_t>()[0]};
    ors[r] = {b1.data<bool>()[0], b1.data<bool>()[1]};
    ands[r] = {b2.data<bool>()[0], b2.data<bool>()[1]};
    maxes[r] = {b3.data<bool>()[0], b3.data<bool>()[1]};
  });
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(i64s[r], (std::vector<std::int64_t>{6 * big, -3 * big}));
    EXPECT_EQ(u8s[r], (std::vector<int>{(100 + 150 + 200) % 256}));
    EXPECT_EQ(ors[r], (std::vector<int>{1, 1}));
    EXPECT_EQ(ands[r], (std::vector<int>{0, 1}));
    EXPECT_EQ(maxes[r], (std::vector<int>{1, 1}));
  }
  const Tensor t = Tensor::from<double>({3}, std::vector<double>{0, 2, -1}, DType::boolean);
  EXPECT_EQ(t.item(0), 0);
  EXPECT_EQ(t.item(1), 1);  // any nonzero is true
  EXPECT_EQ(t.to(DType::i64).item(2), 1);
}

TEST(Library, ConfigDirOfTheBuildTreeAndTheEnvironment) {
  const char* saved = std::getenv("COCEMU_CONFIG_DIR");
  const std::string keep = saved ? saved : "";
  ::unsetenv("COCEMU_CONFIG_DIR");
  const std::filesystem::path dir = config_dir();  // this test program lives in the build tree
  EXPECT_TRUE(std::filesystem::exists(dir / "devices" / "ascend-910b.yaml")) << dir;
  EXPECT_EQ(dir.filename(), "configs");
  ::setenv("COCEMU_CONFIG_DIR", "/elsewhere/configs", 1);
  EXPECT_EQ(config_dir(), "/elsewhere/configs");
  ::setenv("COCEMU_CONFIG_DIR", "", 1);  // empty: as if unset
  EXPECT_EQ(std::filesystem::path(config_dir()), dir);
  if (saved)
    ::setenv("COCEMU_CONFIG_DIR", keep.c_str(), 1);
  else
    ::unsetenv("COCEMU_CONFIG_DIR");
}

}  // namespace
}  // namespace cocemu
