// Sensitivity (R-TO-4): each assumption of a profile scaled x0.5 and x2, one at a time; the
// conclusions that change are reported and marked fragile, in bench, tune and attention.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cocemu/bench/layer_bench.h"
#include "cocemu/bench/sensitivity.h"
#include "testing.h"

namespace cocemu::bench {
namespace {

TEST(Sensitivity, ParametersScaleAsTheirKindAllows) {
  const DeviceProfile p = load_named_profile("ascend-910b");
  EXPECT_DOUBLE_EQ(p.scaled("host.launch_overhead_ns", 2).launch_overhead_ns,
                   2 * p.launch_overhead_ns);
  // Efficiencies are fractions: capped at 1.
  EXPECT_DOUBLE_EQ(p.scaled("compute.gemm.unaligned_efficiency", 2).gemm.unaligned_efficiency, 1);
  // Contention factors scale their excess over 1: 1.10 -> 1.20 and 1.05.
  EXPECT_DOUBLE_EQ(p.scaled("contention.compute_slowdown", 2).contention.compute_slowdown, 1.2);
  EXPECT_DOUBLE_EQ(p.scaled("contention.compute_slowdown", 0.5).contention.compute_slowdown, 1.05);
  EXPECT_DOUBLE_EQ(
      p.scaled("collectives.direct.step_latency_ns", 0.5).algorithms.at("direct").step_latency_ns,
      p.algorithms.at("direct").step_latency_ns / 2);
  testing::expect_error([&] { p.scaled("warp.drive", 2); }, Errc::invalid_argument,
                        {"no parameter 'warp.drive'", "host.launch_overhead_ns"});
  // Every shipped profile lists its assumptions, each a real parameter.
  for (const char* name : {"ascend-910b", "h100-sxm", "a100-sxm"}) {
    const DeviceProfile q = load_named_profile(name);
    EXPECT_GE(q.assumptions.size(), 10u) << name;
    for (const std::string& key : q.assumptions)
      EXPECT_NO_THROW(q.scaled(key, 2)) << name << " " << key;
  }
  testing::expect_error(
      [] {
        parse_device_profile(testing::round_profile_yaml("{assumptions: [host.warp_drive]}"),
                             "a.yaml");
      },
      Errc::parse_error, {"a.yaml:", "assumption 'host.warp_drive'"});
}

// A conclusion that depends on one assumption crossing a threshold flips only there.
TEST(Sensitivity, FlipsAreFoundAndNamed) {
  const DeviceProfile p = load_named_profile("ascend-910b");  // launch overhead 20 µs
  const Sensitivity s = sensitivity(p, [](std::shared_ptr<const DeviceProfile> q) {
    return Conclusions{{"host", q->launch_overhead_ns > 15000 ? "slow" : "fast"},
                       {"always", "same"}};
  });
  EXPECT_EQ(s.runs, 1 + 2 * int(p.assumptions.size()));
  ASSERT_EQ(s.flips.size(), 1u);
  EXPECT_EQ(s.flips[0].parameter, "host.launch_overhead_ns");
  EXPECT_EQ(s.flips[0].factor, 0.5);
  EXPECT_EQ(s.flips[0].from, "slow");
  EXPECT_EQ(s.flips[0].to, "fast");
  EXPECT_EQ(s.fragile("host"), "host.launch_overhead_ns x0.5 -> fast");
  EXPECT_EQ(s.fragile("always"), "");
  const std::string text = format_sensitivity(s);
  EXPECT_NE(text.find("1 of 2 conclusions are fragile"), std::string::npos) << text;
}

// The main job: flips found on the modeled layer are marked in the report and the JSON.
TEST(Sensitivity, BenchMarksFragileConclusions) {
  const std::string dir = ::testing::TempDir() + "/cocemu_sens";
  std::filesystem::remove_all(dir);
  int status = 0;
  const std::string out = testing::run_command(
      std::string(COCEMU_BINARY) + " bench --dry-run --model llama2-70b --sensitivity " +
          "--no-progress --out-dir " + dir,
      &status);
  ASSERT_EQ(status, 0) << out;
  std::ifstream f(dir + "/bench.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  const auto& s = j["sensitivity"];
  EXPECT_EQ(s["runs"].get<int>(), 1 + 2 * int(s["parameters"].size()));
  int fragile = 0;
  for (const auto& c : s["conclusions"]) {
    bool flips = false;
    for (const auto& fl : s["flips"])
      flips = flips || fl["conclusion"] == c["conclusion"];
    EXPECT_EQ(c["fragile"].get<bool>(), flips) << c["conclusion"];
    fragile += flips;
  }
  // Whatever flips is marked in the human report too.
  EXPECT_EQ(fragile > 0, out.find("[fragile: ") != std::string::npos) << out;
  EXPECT_NE(out.find("# sensitivity: each of"), std::string::npos);
}

TEST(Sensitivity, TuneAndAttentionReportTheirChoices) {
  int status = 0;
  const std::string yaml = ::testing::TempDir() + "/cocemu_sens_tune.yaml";
  const std::string tune = testing::run_command(
      std::string(COCEMU_BINARY) + " tune --model llama2-7b --sensitivity -o " + yaml, &status);
  ASSERT_EQ(status, 0) << tune;
  EXPECT_NE(tune.find("# sensitivity: each of"), std::string::npos) << tune;
  EXPECT_NE(tune.find("choice"), std::string::npos) << tune;
  const std::string attn = testing::run_command(
      std::string(COCEMU_BINARY) +
          " attention --dry-run --cp 4 --seq 4096 --heads 8 --head-dim 64 --dtype bf16 "
          "--sensitivity",
      &status);
  ASSERT_EQ(status, 0) << attn;
  EXPECT_NE(attn.find("double ring, window 2"), std::string::npos) << attn;
  EXPECT_NE(attn.find("best window: ring = "), std::string::npos) << attn;
}

}  // namespace
}  // namespace cocemu::bench

namespace cocemu::bench {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// R-TO-2: large worlds are priced without a thread per device — one representative call per
// collective, priced as the emulator prices it. Where both run (64 ranks, 8 nodes of 8), the
// shortcut equals the full emulation's modeled times, deterministic and not.
TEST(LargeWorlds, DryRunPricingEqualsTheFullEmulation) {
  for (const char* mode : {"", " --nondeterministic"}) {
    const std::string full = ::testing::TempDir() + "/cocemu_full.json",
                      dry = ::testing::TempDir() + "/cocemu_dry.json";
    const std::string args =
        std::string(" -n 64 --ops all_reduce,all_gather -b 262144 -e 262144") + mode;
    int status = 0;
    std::string out = testing::run_command(
        std::string(COCEMU_BINARY) + " collbench --samples 1 --check 0 --json " + full + args,
        &status);
    ASSERT_EQ(status, 0) << out;
    out = testing::run_command(
        std::string(COCEMU_BINARY) + " collbench --dry-run --json " + dry + args, &status);
    ASSERT_EQ(status, 0) << out;
    EXPECT_NE(out.find("DRY RUN"), std::string::npos);
    const nlohmann::json f = read_json(full)["rows"], d = read_json(dry)["rows"];
    std::size_t k = 0;
    for (const auto& row : f) {
      if (row["in_place"].get<bool>()) continue;
      ASSERT_LT(k, d.size());
      EXPECT_EQ(row["algo"], d[k]["algo"]) << row["op"] << mode;
      EXPECT_NEAR(row["modeled_us"].get<double>(), d[k]["modeled_us"].get<double>(), 1e-3)
          << row["op"] << mode;
      ++k;
    }
    EXPECT_EQ(k, d.size());
  }
  // A thousand ranks: modeled in well under the time a thread per rank would take to start.
  int status = 0;
  const std::string big = testing::run_command(
      std::string(COCEMU_BINARY) +
          " collbench --dry-run -n 1024 --ops all_reduce --nondeterministic -b 1048576 -e "
          "1048576",
      &status);
  ASSERT_EQ(status, 0) << big;
  EXPECT_NE(big.find("hierarchical"), std::string::npos) << big;
  const std::string refused =
      testing::run_command(std::string(COCEMU_BINARY) + " collbench --dry-run -n 2048", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(refused.find("--ranks: Value 2048 not in range 1 to 1024"), std::string::npos)
      << refused;
}

}  // namespace
}  // namespace cocemu::bench
