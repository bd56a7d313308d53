// What other languages need from the runtime (issue #36): the configs found from where the code
// lives.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu {
namespace {

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
