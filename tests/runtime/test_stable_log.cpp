// StableLog: the append-only container of op records (stable addresses, populated chunks).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/runtime/stable_log.h"

namespace cocemu {
namespace {

// Past the growing chunks (64 .. 512 elements, 960 in all) into three huge-page ones (2 MiB each:
// 65536 strings of 32 bytes).
constexpr int kMany = 960 + 3 * 65536 + 17;

TEST(StableLog, AppendedElementsKeepTheirAddressesAndOrder) {
  StableLog<std::string> log;
  EXPECT_TRUE(log.empty());
  std::vector<const std::string*> where;
  for (int i = 0; i < kMany; ++i)
    where.push_back(&log.emplace_back("op " + std::to_string(i)));
  ASSERT_EQ(log.size(), std::size_t(kMany));
  for (int i = 0; i < kMany; ++i) {
    EXPECT_EQ(&log[std::size_t(i)], where[std::size_t(i)]) << i;
    ASSERT_EQ(log[std::size_t(i)], "op " + std::to_string(i));
  }
  int i = 0;
  for (const std::string& s : log)
    ASSERT_EQ(s, "op " + std::to_string(i++));
  EXPECT_EQ(i, kMany);
  EXPECT_EQ(log.front(), "op 0");
  EXPECT_EQ(log.back(), "op " + std::to_string(kMany - 1));
}

// Chunks after the growing ones are 2 MiB huge-page candidates: each starts on a 2 MiB boundary
// (the kernel can back it with one huge page) and holds 2 MiB of elements.
TEST(StableLog, LaterChunksAreWholeAlignedHugePages) {
  StableLog<std::string> log;
  for (int i = 0; i < kMany; ++i)
    log.emplace_back();
  constexpr std::uintptr_t kHuge = std::uintptr_t(2) << 20;
  constexpr std::size_t kPerChunk = kHuge / sizeof(std::string);
  for (std::size_t first = 960; first + kPerChunk <= std::size_t(kMany); first += kPerChunk) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(&log[first]) % kHuge, 0u) << first;
    EXPECT_EQ(&log[first + kPerChunk - 1] + 1, &log[first] + kPerChunk) << first;
  }
}

TEST(StableLog, CopiesMovesAndDestroysEveryElement) {
  auto alive = std::make_shared<int>(0);
  StableLog<std::shared_ptr<int>> log;
  for (int i = 0; i < 5000; ++i)
    log.push_back(alive);
  EXPECT_EQ(alive.use_count(), 5001);
  {
    const StableLog<std::shared_ptr<int>> copy = log;
    EXPECT_EQ(copy.size(), 5000u);
    EXPECT_EQ(alive.use_count(), 10001);
  }
  EXPECT_EQ(alive.use_count(), 5001);
  StableLog<std::shared_ptr<int>> moved = std::move(log);
  EXPECT_EQ(moved.size(), 5000u);
  EXPECT_EQ(log.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(alive.use_count(), 5001);
  moved.clear();
  EXPECT_TRUE(moved.empty());
  EXPECT_EQ(alive.use_count(), 1);
  moved.push_back(alive);  // usable again after clear
  EXPECT_EQ(moved.size(), 1u);
}

}  // namespace
}  // namespace cocemu
