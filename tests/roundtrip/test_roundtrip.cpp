// R-PL-5: what `cocemu plan` writes loads in the next tool. For a small search on every shipped
// profile (and in detail on an Ascend and an NVIDIA one), the winner's YAML (read from another
// working directory) and its flags (the command plan prints) go back into `cocemu train --dry-run`,
// which must reproduce the planned iteration to the nanosecond; the flags must be the platform's
// (no Ascend-only flag for NVIDIA) and a shell must be able to paste them.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "testing.h"

namespace cocemu {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

/// Runs `cocemu ARGS` in `dir` through a shell (so `$(cat FILE)` expands as a user's would).
std::string cocemu_in(const std::string& dir, const std::string& args, int* status) {
  return testing::run_command("cd '" + dir + "' && " + COCEMU_BINARY + " " + args, status);
}

/// The `cocemu train …` command plan printed after "check: " for its flags file.
std::string printed_flags_command(const std::string& plan_out) {
  const std::string marker = "  check: cocemu train --dry-run";
  const auto at = plan_out.find(marker);
  if (at == std::string::npos) return "";
  const auto start = at + std::string("  check: cocemu ").size();
  return plan_out.substr(start, plan_out.find('\n', start) - start);
}

struct Planned {
  std::string dir, out;
  nlohmann::json json;
};

/// `cocemu plan` in a fresh directory, its files in `out/` there.
Planned plan_in(const std::string& name, const std::string& args) {
  Planned p;
  p.dir = ::testing::TempDir() + "/cocemu_roundtrip_" + name;
  std::filesystem::remove_all(p.dir);
  std::filesystem::create_directories(p.dir + "/elsewhere");
  int status = 0;
  p.out = cocemu_in(p.dir,
                    "plan " + args +
                        " --threads 1 --top 2 --max-cp 2 --max-vpp 2 --no-heuristic-compare "
                        "--out-dir out --json plan.json",
                    &status);
  EXPECT_EQ(status, 0) << p.out;
  if (status == 0) p.json = read_json(p.dir + "/plan.json");
  return p;
}

/// The winner's YAML, given to train from another directory (its CoC path is relative to it).
std::int64_t train_yaml(const Planned& p, std::string* out) {
  int status = 0;
  *out = cocemu_in(p.dir + "/elsewhere",
                   "train --config ../out/plan.winner.yaml --dry-run --engine priced --out-dir t",
                   &status);
  EXPECT_EQ(status, 0) << *out;
  if (status != 0) return -1;
  return read_json(p.dir + "/elsewhere/t/train.json")["iteration_ns"].get<std::int64_t>();
}

/// The flags file, through the command plan printed for it.
std::int64_t train_flags(const Planned& p, std::string* out) {
  const std::string cmd = printed_flags_command(p.out);
  EXPECT_FALSE(cmd.empty()) << p.out;
  int status = 0;
  *out = cocemu_in(p.dir, cmd + " --out-dir tf", &status);
  EXPECT_EQ(status, 0) << cmd << "\n" << *out;
  if (status != 0) return -1;
  return read_json(p.dir + "/tf/train.json")["iteration_ns"].get<std::int64_t>();
}

void expect_pasteable(const std::string& flags) {
  ASSERT_FALSE(flags.empty());
  EXPECT_EQ(flags.find('#'), std::string::npos) << "a comment would eat the rest: " << flags;
  EXPECT_EQ(flags.find('\n'), flags.size() - 1) << "one line: " << flags;
  EXPECT_EQ(flags.rfind("--", 0), 0u) << flags;
}

// Ascend 910B: the winner uses MindSpore's multi-copy and MindSpeed's CoC per GEMM shape. Its
// YAML (MindFormers: batch_size one copy, gradient_accumulation_steps at pipeline_stage 1)
// reproduces it; the flags (Megatron has no multi-copy) reproduce the best one-copy layout, with
// MindSpeed's CoC switches.
TEST(RoundTrip, Ascend910bYamlAndFlagsReproduceThePlan) {
  const Planned p = plan_in("910b",
                            "--model llama2-7b --profile ascend-910b --nodes 1 "
                            "--global-batch 16 --seq 32768");
  ASSERT_FALSE(p.json.is_null());
  const auto& best = p.json["best"];
  EXPECT_EQ(best["micro_batch_interleave_num"].get<int>(), 2) << p.out;
  std::string out;
  EXPECT_EQ(train_yaml(p, &out), best["iteration_ns"].get<std::int64_t>()) << out;
  const std::string yaml = slurp(p.dir + "/out/plan.winner.yaml");
  EXPECT_NE(yaml.find("batch_size: 1  # one copy"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("gradient_accumulation_steps: 8"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("micro_batch_num"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("gradients_mean: false"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("coc_config: plan.coc.yaml"), std::string::npos) << yaml;

  ASSERT_TRUE(p.json.contains("flags_candidate")) << p.out;
  const auto& flagged = p.json["flags_candidate"];
  EXPECT_EQ(flagged["micro_batch_interleave_num"].get<int>(), 1);
  const std::string flags = slurp(p.dir + "/out/plan.winner.flags");
  expect_pasteable(flags);
  EXPECT_NE(flags.find("--use-ascend-coc"), std::string::npos) << flags;
  EXPECT_EQ(flags.find("--tp-comm-overlap"), std::string::npos) << flags;
  EXPECT_EQ(train_flags(p, &out), flagged["iteration_ns"].get<std::int64_t>()) << out;
}

// H100: the platform's TP overlap is Megatron-LM's --tp-comm-overlap; no Ascend flag, no CoC
// file; YAML and flags reproduce the winner (LLaMA2-70B on 2 nodes: a TP winner whose linears
// are large enough for Transformer Engine's split GEMMs to pay).
TEST(RoundTrip, H100YamlAndFlagsReproduceThePlanWithoutAscendFlags) {
  const Planned p = plan_in("h100",
                            "--model llama2-70b --profile h100-sxm --nodes 2 "
                            "--global-batch 16 --seq 4096");
  ASSERT_FALSE(p.json.is_null());
  const auto& best = p.json["best"];
  EXPECT_TRUE(best["tp_comm_overlap"].get<bool>()) << p.out;
  EXPECT_FALSE(p.json.contains("flags_candidate"));
  std::string out;
  EXPECT_EQ(train_yaml(p, &out), best["iteration_ns"].get<std::int64_t>()) << out;
  const std::string flags = slurp(p.dir + "/out/plan.winner.flags");
  expect_pasteable(flags);
  for (const char* ascend :
       {"--use-ascend-coc", "--coc-fused-kernel", "--coc-parallel-num", "--context-parallel-algo"})
    EXPECT_EQ(flags.find(ascend), std::string::npos) << ascend << " in " << flags;
  EXPECT_NE(flags.find("--tp-comm-overlap"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--sequence-parallel"), std::string::npos) << flags;
  EXPECT_FALSE(std::filesystem::exists(p.dir + "/out/plan.coc.yaml"));
  EXPECT_EQ(slurp(p.dir + "/out/plan.winner.yaml").find("coc_config"), std::string::npos);
  EXPECT_EQ(train_flags(p, &out), best["iteration_ns"].get<std::int64_t>()) << out;
  EXPECT_NE(p.out.find("Transformer Engine's split GEMMs"), std::string::npos) << p.out;
}

/// The device profiles `cocemu` reads: the folder its error for an unknown profile names
/// ("no DIR/NAME.yaml"), listed.
std::vector<std::string> shipped_profiles() {
  int status = 0;
  const std::string err = testing::run_command(
      std::string(COCEMU_BINARY) +
          " plan --profile no-such-profile --model llama2-7b --nodes 1 --global-batch 8 2>&1",
      &status);
  const std::string marker = "(no ", tail = "/no-such-profile.yaml)";
  const auto start = err.find(marker), end = err.find(tail);
  if (start == std::string::npos || end == std::string::npos || end < start) {
    ADD_FAILURE() << "no profile folder in: " << err;
    return {};
  }
  const std::string dir = err.substr(start + marker.size(), end - start - marker.size());
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Every shipped profile, with the collectives as a cluster runs them (plan's default) and, on one
// profile, rank-ordered (--deterministic): the flags file alone — `cocemu train --dry-run --engine
// priced --model M --profile P --nodes N $(cat FILE)`, no other setting — reproduces the flags'
// candidate to the nanosecond, and the YAML the winner. Two nodes, so that the gradient
// reduction crosses them and NCCL/HCCL's algorithms price differently from rank-ordered sums.
TEST(RoundTrip, EveryProfilesFlagsFileAloneReproducesThePlan) {
  const std::vector<std::string> profiles = shipped_profiles();
  ASSERT_GE(profiles.size(), 4u);
  for (const std::string& profile : profiles) {
    for (const bool deterministic : {false, true}) {
      if (deterministic && profile != "h100-sxm") continue;
      SCOPED_TRACE(profile + (deterministic ? " --deterministic" : ""));
      const Planned p = plan_in("every_" + profile + (deterministic ? "_det" : ""),
                                "--model llama2-7b --profile " + profile +
                                    " --nodes 2 --global-batch 32 --seq 4096" +
                                    (deterministic ? " --deterministic" : ""));
      ASSERT_FALSE(p.json.is_null());
      const std::string cmd = printed_flags_command(p.out);
      // The command plan prints adds only the model, the profile, the nodes and the CoC file.
      EXPECT_EQ(cmd.find("determin"), std::string::npos) << cmd;
      const std::string flags = slurp(p.dir + "/out/plan.winner.flags");
      expect_pasteable(flags);
      EXPECT_NE(flags.find(deterministic ? " --deterministic-mode" : " --nondeterministic"),
                std::string::npos)
          << flags;
      const auto& flagged =
          p.json.contains("flags_candidate") ? p.json["flags_candidate"] : p.json["best"];
      std::string out;
      EXPECT_EQ(train_flags(p, &out), flagged["iteration_ns"].get<std::int64_t>()) << out;
      EXPECT_EQ(train_yaml(p, &out), p.json["best"]["iteration_ns"].get<std::int64_t>()) << out;
    }
  }
}

// The hand-off: LLaMA2-70B on 8 H100 nodes, where NCCL's algorithms and rank-ordered
// sums price 1.5% apart: the flags file alone gives the winner's iteration.
TEST(RoundTrip, H100EightNodesFlagsFileAloneGivesTheWinnersIteration) {
  const Planned p = plan_in("h100_8",
                            "--model llama2-70b --profile h100-sxm --nodes 8 "
                            "--global-batch 256 --seq 4096");
  ASSERT_FALSE(p.json.is_null());
  ASSERT_FALSE(p.json.contains("flags_candidate"));
  std::string out;
  int status = 0;
  out = cocemu_in(p.dir,
                  "train --dry-run --engine priced --model llama2-70b --profile h100-sxm "
                  "--nodes 8 $(cat out/plan.winner.flags) --out-dir tf",
                  &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(read_json(p.dir + "/tf/train.json")["iteration_ns"].get<std::int64_t>(),
            p.json["best"]["iteration_ns"].get<std::int64_t>());
}

}  // namespace
}  // namespace cocemu
