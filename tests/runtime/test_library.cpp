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
