// Robustness of the parsers (issue "Robustness"): each case the fuzzing campaign found — a crash,
// a silent acceptance or an unclear error — is now a clear error naming the file, key or variable.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/npy.h"
#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;

/// An .npy file with `header` (padded and terminated as NumPy does) and `data_bytes` zero bytes.
std::string npy(const std::string& header, std::size_t data_bytes, int major = 1) {
  std::string h = header;
  const std::size_t pre = major == 1 ? 10 : 12;
  h += std::string((64 - (pre + h.size() + 1) % 64) % 64, ' ') + "\n";
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  out += char(h.size() & 0xff);
  out += char((h.size() >> 8) & 0xff);
  if (major != 1) out += std::string(2, '\0');
  return out + h + std::string(data_bytes, '\0');
}

TEST(NpyParser, ReadsWhatNumPyWrites) {
  const Tensor t =
      parse_npy(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24), "ok.npy");
  EXPECT_EQ(t.describe(), "f32[2, 3]");
  EXPECT_EQ(
      parse_npy(npy("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", 4), "b").dtype(),
      DType::i8);
  EXPECT_EQ(
      parse_npy(npy("{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (), }", 8, 2), "v2")
          .numel(),
      1);
}

TEST(NpyParser, BadHeadersAreClearErrors) {
  const auto bad = [](const std::string& bytes, const std::vector<std::string>& fragments) {
    expect_error([&] { parse_npy(bytes, "x.npy"); }, Errc::invalid_argument, fragments);
  };
  // A descr of 60,000 characters and a shape of 300,000 ones overflowed the regex stack.
  bad(npy("{'descr': '" + std::string(60000, 'f') + "', 'fortran_order': False, 'shape': (1,), }",
          4),
      {"x.npy", "longer than 64"});
  std::string ones = "(";
  for (int i = 0; i < 300000; ++i)
    ones += "1, ";
  bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': " + ones + "), }", 4, 2),
      {"x.npy", "more than 4 dimensions"});
  // A dimension of 99999999999999999999 threw std::out_of_range.
  bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 4),
      {"x.npy", "above 2^50"});
  // 2^40 x ... declared in a 64-byte file: refused before any allocation.
  bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 2048), }", 0),
      {"x.npy", "more than 2^50 elements"});
  bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", 0),
      {"x.npy", "needs 4398046511104 data bytes, the file has 0"});
  // A v2 header claiming 0xFFFFFFFF bytes.
  std::string huge = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4, 2);
  huge[8] = huge[9] = huge[10] = huge[11] = char(0xff);
  bad(huge, {"x.npy", "claims 4294967295 bytes"});
  // Negative dimensions, a string dimension, format version 9, more data than declared.
  bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", 16),
      {"non-negative dimension"});
  bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 'a'), }", 4),
      {"non-negative dimension"});
  std::string v9 = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  v9[6] = 9;
  bad(v9, {"version 9.0"});
  bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12),
      {"needs 8 data bytes, the file has 12"});
  bad(npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4), {"'>f4'"});
  bad(npy("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", 4), {"Fortran"});
  bad(npy("{'descr': '<f4', 'shape': (1,), }", 4), {"must give"});
  bad(npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4),
      {"twice"});
  bad("\x93NUMPY", {"bad magic"});
}

TEST(NpyParser, NonFiniteValuesAreCounted) {
  Tensor t = Tensor::zeros({4}, DType::f32);
  t.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  t.data<float>()[3] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(count_non_finite(t), 2);
}

TEST(YamlParsers, DuplicatesSecondDocumentsAndBadTextAreErrors) {
  std::ifstream f(config_dir() + "/devices/ascend-910b.yaml");
  const std::string ok((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(ok.empty());
  // A second value for a key was silently ignored.
  expect_error([&] { parse_device_profile(ok + "name: again\n", "d.yaml"); }, Errc::parse_error,
               {"d.yaml:", "key 'name' appears twice"});
  expect_error([&] { parse_device_profile(ok + "---\nname: x\n", "m.yaml"); }, Errc::parse_error,
               {"m.yaml:", "a second YAML document"});
  expect_error([&] { parse_device_profile(ok + "---\n: [\n", "s.yaml"); }, Errc::parse_error,
               {"s.yaml"});
  // A non-UTF-8 name crashed the JSON writer.
  std::string bad_name = ok;
  bad_name.replace(bad_name.find("name: ascend-910b"), 17,
                   "name: ascend\xff\xfe"
                   "910b");
  expect_error([&] { parse_device_profile(bad_name, "u.yaml"); }, Errc::parse_error,
               {"u.yaml:", "'name' is not valid UTF-8"});
  // An input on which yaml-cpp's LoadAll looped for minutes (found by fuzzing).
  std::string looped = ok;
  looped.insert(looped.find("name:"), ", which\n");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(parse_device_profile(looped, "loop.yaml"), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // Deep nesting gives a clear error, not the parser's recursion.
  std::string deep = "name: x\nk: ";
  for (int i = 0; i < 100; ++i)
    deep += "[";
  for (int i = 0; i < 100; ++i)
    deep += "]";
  expect_error([&] { parse_device_profile(deep + "\n", "deep.yaml"); }, Errc::parse_error,
               {"deep.yaml:", "nested more than 32 levels"});
}

TEST(YamlParsers, CustomizedCocKeysOfAnyLength) {
  const auto none = [](const std::string&) { return std::optional<std::string>(); };
  // A 1,000,000-digit number and 200,000 spaces crashed the regex.
  expect_error(
      [&] {
        layers::parse_coc_config(
            "customized_coc:\n  ? \"[" + std::string(1000000, '7') + ", 1, 1]\"\n  : 2\n", "c.yaml",
            none);
      },
      Errc::parse_error, {"c.yaml:", "must be a shape", "below 2^40"});
  expect_error(
      [&] {
        layers::parse_coc_config(
            "customized_coc:\n  ? \"[" + std::string(200000, ' ') + "1, 1, 1x]\"\n  : 2\n",
            "c.yaml", none);
      },
      Errc::parse_error, {"c.yaml:", "must be a shape"});
  // Two spellings of one shape: one was dropped silently.
  expect_error(
      [&] {
        layers::parse_coc_config("customized_coc:\n  \"[8, 16, 32]\": 2\n  \"[8,16,32]\": 4\n",
                                 "c.yaml", none);
      },
      Errc::parse_error, {"two entries for the shape [8, 16, 32]"});
  const auto c =
      layers::parse_coc_config("customized_coc:\n  \" [ 8 ,16,  32 ] \": 4\n", "c.yaml", none);
  EXPECT_EQ(c.customized_coc.at("[8, 16, 32]"), 4);
}

TEST(Environment, ValuesAreNeverTruncated) {
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"COC_PARALLEL_NUM", "4294967298"},
                                                        {"USE_COC_FUSED_KERNEL", "4294967297"},
                                                        {"CC_MODE", "4294967295"},
                                                        {"COC_PARALLEL_NUM", " 2"},
                                                        {"COC_PARALLEL_NUM", ""}}) {
    const auto env = [&](const std::string& n) {
      return n == name ? std::optional<std::string>(value) : std::nullopt;
    };
    expect_error([&] { layers::parse_coc_config("{}", "c.yaml", env); }, Errc::invalid_argument,
                 {name, "is invalid; allowed"});
  }
  EXPECT_EQ(parse_integer("X", "42", 0, 100), 42);
  for (const char* bad : {"", "-1", " 5", "5 ", "1e3", "99999999999999999999999", "0x10"})
    expect_error([&] { parse_integer("X", bad, 0, 1000); }, Errc::invalid_argument,
                 {"X='", "must be an integer in 0..1000"});
  expect_error([] { checked_mul(std::int64_t(1) << 40, std::int64_t(1) << 40, "size"); },
               Errc::invalid_argument, {"size:", "exceeds"});
}

// Inputs the profile fuzz target found: each must be a clear error (a cocemu::Error), quickly.
TEST(YamlParsers, FuzzFindingsAreClearErrors) {
  for (const char* name : {"found-yaml-invalid-node.yaml", "found-loadall-loop.yaml"}) {
    const std::string path = std::string(COCEMU_SOURCE_DIR) + "/tests/fuzz/corpus/profile/" + name;
    std::ifstream f(path);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(text.empty()) << path;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(parse_device_profile(text, name), Error) << name;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << name;
  }
}

TEST(ConfigFiles, ADirectoryIsNamedAsSuch) {
  expect_error([] { load_device_profile(::testing::TempDir()); }, Errc::invalid_argument,
               {"is a directory, not a file"});
  expect_error([] { read_npy(::testing::TempDir()); }, Errc::invalid_argument, {"is a directory"});
}

}  // namespace
}  // namespace cocemu
