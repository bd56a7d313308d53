// CoC configuration (R-LA-4, R-LA-5): every key and environment variable, precedence, per-shape
// overrides, invalid values, and MindSpeed's rule against the TP recompute-comm optimisation.
#include <gtest/gtest.h>

#include <map>

#include "cocemu/layers/linear.h"
#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu::layers {
namespace {

using cocemu::testing::expect_error;

EnvLookup env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(CocConfig, ShippedFileParsesWithMindSpeedDefaults) {
  const CocConfig c = load_coc_config(config_dir() + "/coc.yaml", env({}));
  EXPECT_TRUE(c.matmul_soc_friendly);
  EXPECT_TRUE(c.recompute_all_gather);
  EXPECT_FALSE(c.enable_coc_in_column_backward);
  EXPECT_EQ(c.k_min, 1024);
  EXPECT_EQ(c.k_max, 4096);
  EXPECT_TRUE(c.customized_coc.empty());
  EXPECT_EQ(c.parallel_num, 1);
  EXPECT_FALSE(c.fused);
  EXPECT_EQ(choose(c, 4096, 1024, 1024).strategy, Strategy::serial);
}

TEST(CocConfig, EveryKeyIsRead) {
  const CocConfig c = parse_coc_config(R"(
matmul_soc_friendly: false
customized_coc: {"[4096, 1024,8192]": -1, "[2048, 512, 512]": 4, "[64, 64, 64]": 1}
recompute_all_gather: false
enable_coc_in_column_backward: true
k_min: 512
k_max: 2048
tile_rows: 64
tiles_per_step: 3
)",
                                       "t.yaml", env({{"COC_PARALLEL_NUM", "2"}}));
  EXPECT_FALSE(c.matmul_soc_friendly);
  EXPECT_FALSE(c.recompute_all_gather);
  EXPECT_TRUE(c.enable_coc_in_column_backward);
  EXPECT_EQ(c.k_min, 512);
  EXPECT_EQ(c.k_max, 2048);
  EXPECT_EQ(c.tile_rows, 64);
  EXPECT_EQ(c.tiles_per_step, 3);
  // Keys are normalised to MindSpeed's "[m, k, n]" spelling; per-shape values override the env.
  EXPECT_EQ(choose(c, 4096, 1024, 8192).strategy, Strategy::fused);
  EXPECT_EQ(choose(c, 2048, 512, 512).parallel_num, 4);
  EXPECT_EQ(choose(c, 64, 64, 64).strategy, Strategy::serial);
  const CocChoice other = choose(c, 1024, 1024, 1024);
  EXPECT_EQ(other.strategy, Strategy::script);
  EXPECT_EQ(other.parallel_num, 2);
  const LinearOptions o = options_for(c, 4096, 1024, 8192);
  EXPECT_EQ(o.tile_rows, 64);
  EXPECT_FALSE(o.recompute_all_gather);
  EXPECT_TRUE(o.enable_coc_in_column_backward);
}

TEST(CocConfig, EnvironmentPrecedence) {
  const std::string empty = "customized_coc: {}\n";
  EXPECT_EQ(choose(parse_coc_config(empty, "e", env({{"COC_PARALLEL_NUM", "8"}})), 4096, 1, 1)
                .parallel_num,
            8);
  // USE_COC_FUSED_KERNEL wins over COC_PARALLEL_NUM.
  EXPECT_EQ(choose(parse_coc_config(
                       empty, "e", env({{"COC_PARALLEL_NUM", "8"}, {"USE_COC_FUSED_KERNEL", "1"}})),
                   4096, 1, 1)
                .strategy,
            Strategy::fused);
  // CC_MODE 0 = original Megatron, 1 = rewrite (script code path with one chunk).
  EXPECT_EQ(choose(parse_coc_config(empty, "e", env({{"COC_PARALLEL_NUM", "4"}, {"CC_MODE", "0"}})),
                   4096, 1, 1)
                .strategy,
            Strategy::serial);
  const CocChoice rewrite =
      choose(parse_coc_config(empty, "e", env({{"CC_MODE", "1"}})), 4096, 1, 1);
  EXPECT_EQ(rewrite.strategy, Strategy::script);
  EXPECT_EQ(rewrite.parallel_num, 1);
  // m < P falls back to no split (MindSpeed's get_parallel_num).
  EXPECT_EQ(
      choose(parse_coc_config(empty, "e", env({{"COC_PARALLEL_NUM", "8"}})), 4, 1, 1).strategy,
      Strategy::serial);
}

TEST(CocConfig, InvalidValuesAreClearErrors) {
  expect_error(
      [] {
        parse_coc_config("{}", "e", env({{"COC_PARALLEL_NUM", "3"}}));
      },
      Errc::invalid_argument, {"COC_PARALLEL_NUM='3'", "1, 2, 4, 8"});
  expect_error(
      [] {
        parse_coc_config("{}", "e", env({{"USE_COC_FUSED_KERNEL", "yes"}}));
      },
      Errc::invalid_argument, {"USE_COC_FUSED_KERNEL='yes'", "0, 1"});
  expect_error(
      [] {
        parse_coc_config("{}", "e", env({{"CC_MODE", "5"}}));
      },
      Errc::invalid_argument, {"CC_MODE='5'", "-1, 0, 1, 2"});
  expect_error([] { parse_coc_config("customized_coc: {\"[1, 2, 3]\": 3}\n", "c.yaml", env({})); },
               Errc::parse_error, {"c.yaml:", "= 3", "-1 (fused), 1 (off), 2, 4, 8"});
  expect_error([] { parse_coc_config("customized_coc: {\"1x2x3\": 2}\n", "c.yaml", env({})); },
               Errc::parse_error, {"c.yaml:", "'1x2x3'", "[m, k, n]"});
  expect_error([] { parse_coc_config("k_min: 5000\nk_max: 10\n", "k.yaml", env({})); },
               Errc::parse_error, {"k.yaml", "k_min 5000", "k_max 10"});
  expect_error([] { parse_coc_config("coc_magic: true\n", "u.yaml", env({})); }, Errc::parse_error,
               {"u.yaml:", "unknown key 'coc_magic'"});
  // An unknown key of 1000 characters is shown by its start and its length, not whole.
  expect_error([] { parse_coc_config(std::string(1000, 'k') + ": 1\n", "l.yaml", env({})); },
               Errc::parse_error,
               {"l.yaml:1", "unknown key '" + std::string(60, 'k') + "…' (1000 characters)"});
  try {
    parse_coc_config(std::string(1000, 'k') + ": 1\n", "l.yaml", env({}));
  } catch (const cocemu::Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u) << e.what();
  }
  expect_error([] { parse_coc_config("tiles_per_step: 16\n", "p.yaml", env({})); },
               Errc::parse_error, {"p.yaml:", "tiles_per_step", "[1, 15]"});
}

// A key longer than YAML allows (1024 characters with its quotes): yaml-cpp says only "end of
// map flow not found" in a flow mapping; the error names the file, the line, the key's length and
// the limit, in flow and block style. A key at the limit is read (and refused as a shape).
TEST(CocConfig, AKeyLongerThanYamlAllowsNamesItsLengthAndTheLimit) {
  const std::string key = "[" + std::string(1020, '1') + ", 1, 1]";  // 1028 characters
  const std::string shown = std::to_string(key.size() + 2);          // with its quotes
  expect_error(
      [&] { parse_coc_config("customized_coc: {\"" + key + "\": 2}\n", "f.yaml", env({})); },
      Errc::parse_error,
      {"f.yaml:1", "a key of " + shown + " characters", "at most 1024", "[m, k, n]"});
  expect_error(
      [&] {
        parse_coc_config("k_min: 1\ncustomized_coc:\n  '" + key + "': 2\n", "b.yaml", env({}));
      },
      Errc::parse_error, {"b.yaml:3", "a key of " + shown + " characters", "at most 1024"});
  const std::string at_limit = "[" + std::string(1014, '1') + ", 1, 1]";  // 1022 + 2 quotes
  expect_error(
      [&] { parse_coc_config("customized_coc: {\"" + at_limit + "\": 2}\n", "l.yaml", env({})); },
      Errc::parse_error, {"l.yaml:", "must be a shape"});
  // Quotes inside a plain value or a comment are not keys.
  EXPECT_NO_THROW(parse_coc_config("k_min: 1  # it's \"" + std::string(1100, 'x') + "\": no key\n",
                                   "c.yaml", env({})));
}

TEST(CocConfig, CocCannotBeCombinedWithRecomputeCommOptimisation) {
  expect_error(
      [] {
        parse_coc_config("optimize_recomp_communication_level: 1\n", "r.yaml",
                         env({{"COC_PARALLEL_NUM", "4"}}));
      },
      Errc::invalid_argument, {"cannot be combined", "optimize_recomp_communication_level = 1"});
  // Without CoC the optimisation is allowed.
  EXPECT_EQ(parse_coc_config("optimize_recomp_communication_level: 1\n", "r.yaml", env({}))
                .optimize_recomp_communication_level,
            1);
}

TEST(CocConfig, MatmulSocFriendlyRules) {
  CocConfig c;
  // k = 1024 bf16 = 2048 B (512-aligned), n = 1000 (2000 B, not aligned) -> column-major weight.
  EXPECT_TRUE(soc_friendly(c, 4096, 1024, 1000, 4, 2).transpose_weight);
  EXPECT_FALSE(soc_friendly(c, 4096, 1024, 1024, 4, 2).transpose_weight);
  // k = 1025 (not 32-byte aligned, inside [k_min, k_max]) -> padded to a 512-byte multiple (1280).
  EXPECT_EQ(soc_friendly(c, 4096, 1025, 1024, 4, 2).padded_k, 1280);
  EXPECT_EQ(soc_friendly(c, 4096, 5001, 1024, 4, 2).padded_k, 5001);  // outside [k_min, k_max]
  c.matmul_soc_friendly = false;
  EXPECT_FALSE(soc_friendly(c, 4096, 1024, 1000, 4, 2).transpose_weight);
}

}  // namespace
}  // namespace cocemu::layers
