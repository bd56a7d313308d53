// Device profiles (R-RT-7): the shipped profiles load; parsing is strict with file:line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/names.h"
#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;
using testing::round_profile_yaml;

TEST(Profile, ShippedProfilesLoad) {
  for (const char* name : {"ascend-910b", "h100-sxm", "a100-sxm", "a100-sxm-cuda11"}) {
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

// A mistyped name lists the valid ones and suggests the nearest (the newcomer review's errors
// table: `--profile h100`).
TEST(Profile, UnknownNameListsTheValidOnes) {
  expect_error([] { load_named_profile("h100"); }, Errc::invalid_argument,
               {"unknown device profile 'h100'", "valid names: ", "ascend-910b", "h100-sxm",
                "(did you mean 'h100-sxm'?)"});
  expect_error([] { load_named_profile("ascend910b"); }, Errc::invalid_argument,
               {"did you mean 'ascend-910b'?"});
  // Nothing near: the list, no guess.
  try {
    load_named_profile("tpu-v5");
    ADD_FAILURE() << "an unknown profile loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid names: "), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
  // A path is a path: its own error, no name list.
  expect_error([] { load_named_profile("/nonexistent/h100.yaml"); }, Errc::invalid_argument,
               {"cannot open device profile '/nonexistent/h100.yaml'"});
}

TEST(Names, NearestNameByContainmentOrEditDistance) {
  const std::vector<std::string> models{"bloom-176b", "bloom-7b", "gpt3-175b", "llama2-70b",
                                        "llama2-7b"};
  EXPECT_EQ(nearest_name("llama-2-70b", models), "llama2-70b");
  EXPECT_EQ(nearest_name("LLaMA2-7B", models), "llama2-7b");
  EXPECT_EQ(nearest_name("gpt3", models), "gpt3-175b");
  EXPECT_EQ(nearest_name("bloom", models), "bloom-7b");  // the shortest containing it
  EXPECT_EQ(nearest_name("mixtral-8x7b", models), "");
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(valid_names_hint("x", {}, "/d"), "no .yaml files in '/d'");
  const std::string dir = ::testing::TempDir() + "/cocemu_names";
  std::filesystem::create_directories(dir + "/sub.yaml");  // a folder is not a name
  std::ofstream(dir + "/b.yaml") << "x";
  std::ofstream(dir + "/a.yaml") << "x";
  std::ofstream(dir + "/notes.txt") << "x";
  EXPECT_EQ(yaml_names_in(dir), (std::vector<std::string>{"a", "b"}));
}

TEST(Profile, EverySourcedNumberHasAComment) {
  // Each numeric key of the shipped profiles is preceded (within its block) by a comment line.
  for (const char* name : {"ascend-910b", "h100-sxm", "a100-sxm", "a100-sxm-cuda11"}) {
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

// A profile with `base:` is its base with the derived file's keys over it: mappings merge key by
// key, anything else replaces the base's.
TEST(Profile, DerivedProfileIsItsBaseWithItsOwnKeysOver) {
  const DeviceProfile base = load_named_profile("a100-sxm");
  const DeviceProfile cuda11 = load_named_profile("a100-sxm-cuda11");
  EXPECT_EQ(cuda11.name, "a100-sxm-cuda11");
  EXPECT_DOUBLE_EQ(cuda11.gemm.max_efficiency, 0.7061);
  EXPECT_NE(base.gemm.max_efficiency, cuda11.gemm.max_efficiency);
  // A key of a merged mapping (memory:) beside the base's.
  EXPECT_DOUBLE_EQ(cuda11.memory_in_training_efficiency, 0.7864);
  EXPECT_EQ(base.memory_in_training_efficiency, 1.0);
  // Everything else is the base's, siblings of the overridden key included.
  EXPECT_EQ(cuda11.gemm.half_efficiency_flops, base.gemm.half_efficiency_flops);
  EXPECT_EQ(cuda11.attention_efficiency, base.attention_efficiency);
  EXPECT_EQ(cuda11.peak(DType::bf16), base.peak(DType::bf16));
  EXPECT_EQ(cuda11.memory_bandwidth, base.memory_bandwidth);
  EXPECT_EQ(cuda11.topology.inter_per_device, base.topology.inter_per_device);
  EXPECT_EQ(cuda11.algorithms.at("ring").bandwidth_efficiency,
            base.algorithms.at("ring").bandwidth_efficiency);
  EXPECT_EQ(cuda11.auto_rules_multi_node.size(), base.auto_rules_multi_node.size());
  EXPECT_EQ(cuda11.assumptions, base.assumptions);

  const std::string dir = ::testing::TempDir() + "/cocemu_profile_base";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  // A nested number merges into its mapping; a list (the auto table) replaces the base's. A path
  // base is relative to the deriving file.
  write("base.yaml", round_profile_yaml());
  const DeviceProfile plain = load_device_profile(dir + "/base.yaml");
  const DeviceProfile d = load_device_profile(
      write("derived.yaml",
            "name: derived\nbase: base.yaml\ncollectives:\n  ring: {step_latency_ns: 777}\n"
            "  auto: [{max_bytes: .inf, algorithm: direct}]\n"));
  EXPECT_EQ(d.name, "derived");
  EXPECT_EQ(d.algorithms.at("ring").step_latency_ns, 777);
  EXPECT_EQ(d.algorithms.at("ring").bandwidth_efficiency,
            plain.algorithms.at("ring").bandwidth_efficiency);
  ASSERT_EQ(d.auto_rules.size(), 1u);
  EXPECT_EQ(d.auto_rules[0].algorithm, "direct");
  EXPECT_EQ(d.memory_bandwidth, plain.memory_bandwidth);

  // What is wrong with a base is an error naming the deriving file's line and the base.
  expect_error([&] { load_device_profile(write("lost.yaml", "name: lost\nbase: no-such\n")); },
               Errc::parse_error, {"lost.yaml:2", "base 'no-such'", "no-such.yaml"});
  write("a.yaml", "name: a\nbase: b.yaml\n");
  write("b.yaml", "name: b\nbase: a.yaml\n");
  expect_error([&] { load_device_profile(dir + "/a.yaml"); }, Errc::parse_error,
               {".yaml:2: base '", "more than 4 deep", "cycle"});
  expect_error([&] { load_device_profile(write("anon.yaml", "base: base.yaml\n")); },
               Errc::parse_error, {"anon.yaml", "its own 'name'"});
  expect_error([&] { load_device_profile(write("zero.yaml", "name: z\nbase: /dev/zero\n")); },
               Errc::parse_error, {"zero.yaml:2", "/dev/zero", "not a regular file"});
  // The derived file's own keys are checked like any profile's, naming its file.
  expect_error(
      [&] {
        load_device_profile(
            write("typo.yaml", "name: t\nbase: base.yaml\nmemory: {bandwith_bytes_per_s: 1}\n"));
      },
      Errc::parse_error, {"typo.yaml", "memory.bandwith_bytes_per_s"});
  expect_error([&] { load_device_profile("/dev/zero"); }, Errc::invalid_argument,
               {"/dev/zero", "not a regular file"});
}

TEST(CostModel, GemmEfficiencyFallsForSmallAndUnalignedShapes) {
  const DeviceProfile p = load_named_profile("ascend-910b");
  const double big = gemm_efficiency(p, 4096, 4096, 4096, DType::bf16);
  const double small = gemm_efficiency(p, 64, 64, 64, DType::bf16);
  const double unaligned = gemm_efficiency(p, 4096, 4000, 4096, DType::bf16);  // 8000 B rows
  const double f = 2.0 * 4096 * 4096 * 4096;
  // In a training step a kernel sustains the profile's in-training fraction of that.
  EXPECT_DOUBLE_EQ(big, p.gemm.max_efficiency * f / (f + p.gemm.half_efficiency_flops) *
                            p.in_training_efficiency);
  EXPECT_LT(p.in_training_efficiency, 1.0);
  DeviceProfile isolated = p;
  isolated.in_training_efficiency = 1;
  EXPECT_DOUBLE_EQ(gemm_efficiency(isolated, 4096, 4096, 4096, DType::bf16),
                   p.gemm.max_efficiency * f / (f + p.gemm.half_efficiency_flops));
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
           (backward ? p.attention_backward_efficiency : 1) * p.in_training_efficiency;
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
