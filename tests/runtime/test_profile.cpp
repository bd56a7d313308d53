// Device profiles (R-RT-7): the shipped profiles load; parsing is strict with file:line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;
using testing::round_profile_yaml;

TEST(Profile, ShippedProfilesLoad) {
  for (const char* name : {"ascend-910b", "h100-sxm"}) {
    const DeviceProfile p = load_named_profile(name);
    EXPECT_EQ(p.name, name);
    EXPECT_EQ(p.topology.devices_per_node, 8);
    EXPECT_GT(p.peak(DType::bf16), p.peak(DType::f32));
    EXPECT_GT(p.topology.intra_per_peer, 0);
    EXPECT_TRUE(p.algorithms.count("ring") && p.algorithms.count("direct"));
    EXPECT_GT(p.launch_overhead_ns, 0);
    EXPECT_GE(p.contention.compute_slowdown, 1.0);
  }
  const DeviceProfile h = load_named_profile("h100-sxm");
  EXPECT_EQ(h.auto_rule(4096).algorithm, "direct");
  EXPECT_EQ(h.auto_rule(64 << 20).algorithm, "ring");
  EXPECT_DOUBLE_EQ(h.peak(DType::bf16), 9.894e14);
}

TEST(Profile, EverySourcedNumberHasAComment) {
  // Each numeric key of the shipped profiles is preceded (within its block) by a comment line.
  for (const char* name : {"ascend-910b", "h100-sxm"}) {
    std::ifstream in(config_dir() + "/devices/" + name + ".yaml");
    std::string line;
    int comments = 0, numbers = 0;
    while (std::getline(in, line)) {
      if (line.find('#') != std::string::npos) ++comments;
      if (line.find(": ") != std::string::npos &&
          line.find_first_of("0123456789") != std::string::npos &&
          line.find('#') == std::string::npos)
        ++numbers;
    }
    EXPECT_GT(comments, numbers / 2) << name;
  }
}

TEST(Profile, UnknownKeyNamesFileAndLine) {
  std::string text = round_profile_yaml();
  text += "\nflux_capacitor: 1\n";
  expect_error([&] { parse_device_profile(text, "my.yaml"); }, Errc::parse_error,
               {"my.yaml:", "unknown key 'flux_capacitor'"});
  std::string nested = round_profile_yaml("topology: {warp_drive: 3}");
  expect_error([&] { parse_device_profile(nested, "n.yaml"); }, Errc::parse_error,
               {"n.yaml:", "unknown key 'topology.warp_drive'"});
}

TEST(Profile, MissingKeyIsAnError) {
  std::string text = round_profile_yaml();
  const auto pos = text.find("memory:");
  const auto end = text.find('\n', text.find("bandwidth_bytes_per_s", pos));
  text.erase(pos, end - pos + 1);
  expect_error([&] { parse_device_profile(text, "m.yaml"); }, Errc::parse_error,
               {"m.yaml", "missing required key 'memory'"});
}

TEST(Profile, OutOfRangeAndMalformedValuesAreErrors) {
  expect_error(
      [] {
        parse_device_profile(round_profile_yaml("contention: {comm_slowdown: 0.5}"), "c.yaml");
      },
      Errc::parse_error, {"c.yaml:", "contention.comm_slowdown", "0.5", "[1, 10]"});
  expect_error(
      [] {
        parse_device_profile(round_profile_yaml("memory: {bandwidth_bytes_per_s: fast}"), "d.yaml");
      },
      Errc::parse_error, {"d.yaml:", "must be a number", "fast"});
  expect_error([] { parse_device_profile("name: [unclosed\n", "s.yaml"); }, Errc::parse_error,
               {"s.yaml:", "YAML syntax error"});
  expect_error(
      [] {
        parse_device_profile(
            round_profile_yaml("collectives: {auto: [{max_bytes: 100, algorithm: tree}]}"),
            "a.yaml");
      },
      Errc::parse_error, {"a.yaml:", "'tree'", "ring, direct"});
  expect_error(
      [] {
        parse_device_profile(
            round_profile_yaml("collectives: {auto: [{max_bytes: 100, algorithm: ring}]}"),
            "b.yaml");
      },
      Errc::parse_error, {"b.yaml", "max_bytes .inf"});
  expect_error([] { load_device_profile("/nonexistent/profile.yaml"); }, Errc::invalid_argument,
               {"/nonexistent/profile.yaml"});
}

TEST(CostModel, GemmEfficiencyFallsForSmallAndUnalignedShapes) {
  const DeviceProfile p = load_named_profile("ascend-910b");
  const double big = gemm_efficiency(p, 4096, 4096, 4096, DType::bf16);
  const double small = gemm_efficiency(p, 64, 64, 64, DType::bf16);
  const double unaligned = gemm_efficiency(p, 4096, 4000, 4096, DType::bf16);  // 8000 B rows
  const double f = 2.0 * 4096 * 4096 * 4096;
  EXPECT_DOUBLE_EQ(big, p.gemm.max_efficiency * f / (f + p.gemm.half_efficiency_flops));
  EXPECT_LT(small, 0.1 * big);
  EXPECT_NEAR(unaligned / big, p.gemm.unaligned_efficiency, 0.01);
  // Compute-bound GEMM time: 2mnk / (peak · efficiency).
  const double ns = gemm_ns(p, 4096, 4096, 4096, DType::bf16);
  EXPECT_NEAR(ns, 2.0 * 4096 * 4096 * 4096 / (p.peak(DType::bf16) * big) * 1e9, 1.0);
  EXPECT_EQ(memory_ns(p, 0), p.kernel_min_ns);
  EXPECT_EQ(launch_ns(p, LaunchKind::fused), p.fused_launch_overhead_ns);
}

// Flash attention: a row of L keys runs at L/(L + overhead) of the long-row efficiency, the
// backward at attention_backward_efficiency of the forward's, with 2.5 times its FLOPs; a causal
// mask halves both the pairs and the keys per row.
TEST(CostModel, AttentionPaysPerRowAndBackward) {
  const DeviceProfile p = load_named_profile("h100-sxm");
  ASSERT_GT(p.attention_row_overhead_keys, 0);
  ASSERT_LT(p.attention_backward_efficiency, 1);
  const std::int64_t heads = 16, d = 128;
  auto rate = [&](std::int64_t s, double visible, bool backward) {
    const double flops = 4.0 * heads * double(s) * double(s) * d * visible * (backward ? 2.5 : 1);
    return flops / attention_ns(p, heads, s, s, d, DType::bf16, visible, backward);
  };
  auto expected = [&](std::int64_t s, double visible, bool backward) {
    const double flops = 4.0 * heads * double(s) * double(s) * d * visible * (backward ? 2.5 : 1);
    const double keys = double(s) * visible;
    return p.peak(DType::bf16) * 1e-9 * p.gemm.max_efficiency * flops /
           (flops + p.gemm.half_efficiency_flops) * p.attention_efficiency * keys /
           (keys + p.attention_row_overhead_keys) *
           (backward ? p.attention_backward_efficiency : 1);
  };
  for (const std::int64_t s : {512, 4096, 16384})
    for (const double visible : {1.0, 0.5})
      for (const bool backward : {false, true})
        EXPECT_NEAR(rate(s, visible, backward) / expected(s, visible, backward), 1.0, 1e-12)
            << s << " " << visible << " " << backward;
  // Short rows are slower per FLOP than long ones, the causal forward slower than the unmasked.
  EXPECT_LT(rate(512, 1.0, false), 0.8 * rate(16384, 1.0, false));
  EXPECT_LT(rate(4096, 0.5, false), rate(4096, 1.0, false));
  EXPECT_LT(rate(4096, 1.0, true), rate(4096, 1.0, false));
  // A profile without the two parameters prices as before them.
  DeviceProfile plain = p;
  plain.attention_row_overhead_keys = 0;
  plain.attention_backward_efficiency = 1;
  const double flops = 4.0 * heads * 4096.0 * 4096.0 * d;
  EXPECT_DOUBLE_EQ(attention_ns(plain, heads, 4096, 4096, d, DType::bf16, 1.0, false),
                   flash_attention_ns(plain, flops, d, DType::bf16, 0, 0, false));
}

}  // namespace
}  // namespace cocemu
