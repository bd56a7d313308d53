// `cocemu attention` as a user choosing a CP layout drives it: every algorithm and window side by
// side (--compare, --sensitivity), shapes from a model file, heads counted as the model counts
// them, and no option accepted and then ignored (#33 items 18 and 20, #34, #35 item 4).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "cocemu/runtime/npy.h"
#include "testing.h"

namespace cocemu {
namespace {

std::string cocemu(const std::string& args, int* status) {
  return testing::run_command(std::string(COCEMU_BINARY) + " attention " + args, status);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/cocemu_attn_" + name;
}

// The newcomer review looped over windows by hand and never saw hybrid. One command models every
// option MindSpeed accepts for the request; hybrid's Ulysses stays inside a node of 8 (910B).
TEST(AttentionChoices, CompareModelsEveryAlgorithmAndWindow) {
  int status = 0;
  const std::string json = temp("compare.json");
  const std::string out = cocemu(
      "--cp 16 --seq 2048 --heads 16 --kv-heads 4 --head-dim 64 "
      "--overlap --compare --json " +
          json,
      &status);
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json j = read_json(json)["comparison"];
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : j["configurations"])
    rows[row["label"].get<std::string>()] = row;
  for (const char* label :
       {"ring", "double ring, window 2", "double ring, window 4", "double ring, window 8",
        "Ulysses 16", "hybrid: Ulysses 2 x ring 8", "hybrid: Ulysses 2 x double ring 8, window 2",
        "hybrid: Ulysses 2 x double ring 8, window 4", "hybrid: Ulysses 4 x ring 4",
        "hybrid: Ulysses 4 x double ring 4, window 2", "hybrid: Ulysses 8 x ring 2"})
    EXPECT_TRUE(rows.count(label)) << label << "\n" << out;
  EXPECT_EQ(rows.size(), 11u) << out;  // no hybrid whose Ulysses group spans two nodes
  EXPECT_TRUE(rows.at("ring")["requested"].get<bool>());
  // The best is the fastest, marked once, and named with its MindSpeed flags.
  std::int64_t fastest = INT64_MAX;
  int marked = 0;
  for (const auto& [label, row] : rows) {
    fastest = std::min(fastest, row["total_ns"].get<std::int64_t>());
    EXPECT_EQ(row["total_ns"].get<std::int64_t>(),
              row["forward_ns"].get<std::int64_t>() + row["backward_ns"].get<std::int64_t>());
    marked += row["best"].get<bool>();
  }
  EXPECT_EQ(marked, 1);
  const nlohmann::json& best = rows.at(j["best"].get<std::string>());
  EXPECT_EQ(best["total_ns"].get<std::int64_t>(), fastest);
  EXPECT_NE(out.find("best: " + j["best"].get<std::string>()), std::string::npos) << out;
  EXPECT_NE(out.find("MindSpeed flags: --context-parallel-size 16 " +
                     best["mindspeed_flags"].get<std::string>()),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("robustness: not checked"), std::string::npos) << out;
  // Each row is what a run of that configuration alone models.
  const std::string one = temp("one.json");
  ASSERT_EQ(0, (cocemu("--cp 16 --seq 2048 --heads 16 --kv-heads 4 --head-dim 64 --overlap "
                       "--dry-run --algo hybrid_cp_algo --ulysses-degree 4 --window 2 --json " +
                           one,
                       &status),
                status));
  const nlohmann::json single = read_json(one);
  const nlohmann::json& row = rows.at("hybrid: Ulysses 4 x double ring 4, window 2");
  EXPECT_EQ(single["forward_ns"], row["forward_ns"]);
  EXPECT_EQ(single["backward_ns"], row["backward_ns"]);
  // MindSpeed's rules decide what is listed: 6 heads allow no Ulysses degree above 2 (6 % 4).
  const std::string few = cocemu("--cp 8 --seq 1024 --heads 6 --head-dim 64 --compare", &status);
  ASSERT_EQ(status, 0) << few;
  EXPECT_NE(few.find("not valid: Ulysses 8"), std::string::npos) << few;
  EXPECT_NE(few.find("num_attention_heads 6 must be divisible"), std::string::npos) << few;
  EXPECT_NE(few.find("hybrid: Ulysses 2 x ring 4"), std::string::npos) << few;
  // A request MindSpeed refuses is still compared with what it accepts.
  const std::string refused =
      cocemu("--cp 8 --seq 1024 --heads 6 --head-dim 64 --algo ulysses_cp_algo --compare", &status);
  ASSERT_EQ(status, 0) << refused;
  EXPECT_NE(refused.find("not valid: Ulysses 8 (requested)"), std::string::npos) << refused;
  EXPECT_NE(refused.find("best: "), std::string::npos) << refused;
}

// The review's question in one command: LLaMA2-70B's heads, cp 16 over two 910B nodes, 32K.
TEST(AttentionChoices, ModelFileGivesTheShapesAndHybridIsConsidered) {
  int status = 0;
  const std::string json = temp("model.json");
  const std::string out =
      cocemu("--model llama2-70b --cp 16 --seq 32768 --overlap --compare --json " + json, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("heads 64 (KV 8) D=128 bf16, model llama2-70b"), std::string::npos) << out;
  const nlohmann::json j = read_json(json)["comparison"];
  bool hybrid8 = false;
  for (const auto& row : j["configurations"])
    hybrid8 = hybrid8 || row["label"] == "hybrid: Ulysses 8 x ring 2";
  EXPECT_TRUE(hybrid8) << out;
  // --model sets the shapes: giving them again is a conflict, not a silent override.
  const std::string both = cocemu("--model llama2-70b --heads 32 --dry-run", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(both.find("--heads conflicts with --model llama2-70b"), std::string::npos) << both;
  const std::string typo = cocemu("--model llama-2-70b --dry-run", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(typo.find("did you mean 'llama2-70b'?"), std::string::npos) << typo;
}

TEST(AttentionChoices, SensitivitySaysWhetherTheBestHolds) {
  int status = 0;
  const std::string json = temp("sens.json");
  const std::string out =
      cocemu("--cp 4 --seq 4096 --heads 8 --head-dim 64 --sensitivity --json " + json, &status);
  ASSERT_EQ(status, 0) << out;
  // The table (every option with times), then the verdict on the best.
  EXPECT_NE(out.find("double ring, window 2"), std::string::npos) << out;
  EXPECT_NE(out.find("hybrid: Ulysses 2 x ring 2"), std::string::npos) << out;
  EXPECT_TRUE(out.find("  robust: stays the best") != std::string::npos ||
              out.find("  fragile: the best changes when") != std::string::npos)
      << out;
  const nlohmann::json s = read_json(json)["sensitivity"];
  bool best = false, window = false;
  for (const auto& c : s["conclusions"]) {
    best = best || c["conclusion"] == "best configuration";
    window = window || c["conclusion"] == "best window: ring";
  }
  EXPECT_TRUE(best && window) << s.dump(2);
  EXPECT_EQ(s["runs"].get<int>(), 1 + 2 * int(s["parameters"].size()));
}

// #35 item 4: --heads is the model's num_attention_heads (all TP ranks), divided by --tp as
// Megatron does; said loudly when --tp splits it.
TEST(AttentionChoices, HeadsAreTheModelsTotalDividedByTp) {
  int status = 0;
  const std::string json = temp("heads.json");
  const std::string out = cocemu(
      "--dry-run --cp 2 --seq 512 --heads 64 --kv-heads 8 --head-dim 128 --tp 8 --json " + json,
      &status);
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j["heads_per_rank"], 8);
  EXPECT_EQ(j["kv_heads_per_rank"], 1);
  EXPECT_EQ(j["tp"], 8);
  EXPECT_NE(out.find("note: --heads 64 and --kv-heads 8 are the model's totals; with --tp 8 each "
                     "rank computes 8 query and 1 KV heads"),
            std::string::npos)
      << out;
  // Heads that do not split over TP are refused, as Megatron refuses them.
  const std::string bad = cocemu("--dry-run --heads 12 --tp 8", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(bad.find("must be divisible by --tp 8"), std::string::npos) << bad;
  // MindSpeed's Ulysses rule counts the model's heads once: 32 % (tp 4 x cp 4) = 0 is accepted
  // (each rank has 8 heads, which its 4 Ulysses ranks split), 24 is not.
  cocemu("--dry-run --algo ulysses_cp_algo --cp 4 --tp 4 --heads 32 --kv-heads 8 --seq 256",
         &status);
  EXPECT_EQ(status, 0);
  const std::string uly = cocemu(
      "--dry-run --algo ulysses_cp_algo --cp 4 --tp 4 --heads 24 --kv-heads 8 --seq 256", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(uly.find("num_attention_heads 24 must be divisible by tensor_model_parallel_size x "
                     "context_parallel_size = 4 x 4"),
            std::string::npos)
      << uly;
}

// #34 "accepted, then ignored": --ulysses-degree with an algorithm that does not read it, and a
// mask file that the default causal mask replaced.
TEST(AttentionChoices, NoOptionIsAcceptedAndIgnored) {
  int status = 0;
  for (const char* algo : {"megatron_cp_algo", "ulysses_cp_algo"}) {
    const std::string out =
        cocemu(fmt::format("--dry-run --cp 4 --ulysses-degree 2 --algo {}", algo), &status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << out;
    EXPECT_NE(out.find("--ulysses-degree 2 applies to --algo hybrid_cp_algo only"),
              std::string::npos)
        << out;
  }
  // An all-false mask runs as that mask: every row sees nothing, so out is 0 and nothing is NaN
  // (R-AT-1) — not causal attention.
  const std::string mask = temp("none_visible.npy"), dir = temp("none_visible_out");
  write_npy(mask, Tensor::zeros({64, 64}, DType::i8));
  std::filesystem::remove_all(dir);
  const std::string out = cocemu(
      "--cp 2 --seq 64 --heads 2 --head-dim 16 --mask-file " + mask + " --out-dir " + dir, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("mask general"), std::string::npos) << out;
  for (const char* name : {"out", "dq", "dk", "dv"}) {
    const Tensor t = read_npy(dir + "/" + name + ".npy");
    EXPECT_EQ(count_non_finite(t), 0) << name;
    EXPECT_TRUE(t.bitwise_equal(Tensor::zeros(t.shape(), t.dtype()))) << name;
  }
  // With --mask causal the mask file would be ignored: a conflict.
  const std::string both =
      cocemu("--cp 2 --seq 64 --heads 2 --head-dim 16 --mask causal --mask-file " + mask, &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(both.find("is a general mask but --mask is causal"), std::string::npos) << both;
  // Comparing models shapes only: inputs it would not read are refused.
  const std::string cmp = cocemu("--compare --svg " + temp("x.svg"), &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(cmp.find("--svg"), std::string::npos) << cmp;
}

// The default output is the answer, not rank 0's 130-line step table (that is --steps); the SVG
// title says the configuration and its bands mark forward and backward.
TEST(AttentionChoices, OutputIsShortAndTheTimelineSaysWhatRan) {
  int status = 0;
  const std::string svg = temp("cp.svg");
  const std::string args = "--dry-run --cp 8 --seq 4096 --heads 8 --head-dim 64 --window 4 ";
  std::string out = cocemu(args + "--svg " + svg, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out.find("rank 0 steps"), std::string::npos) << out;
  EXPECT_LT(std::count(out.begin(), out.end(), '\n'), 10) << out;
  std::ifstream f(svg);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  EXPECT_NE(text.find("cocemu attention: double ring, window 4 (megatron_cp_algo) \u2014 cp 8"),
            std::string::npos)
      << text.substr(0, 400);
  EXPECT_NE(text.find(">attention forward</text>"), std::string::npos);
  EXPECT_NE(text.find(">attention backward</text>"), std::string::npos);
  out = cocemu(args + "--steps", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("rank 0 steps"), std::string::npos) << out;
  EXPECT_GT(std::count(out.begin(), out.end(), '\n'), 20) << out;
}

// --help says units and meanings for every option (#35 item 4).
TEST(AttentionChoices, HelpSaysUnitsAndMeanings) {
  int status = 0;
  const std::string help = cocemu("--help", &status);
  ASSERT_EQ(status, 0) << help;
  // Each option's line (and its continuation lines) up to the next option.
  std::map<std::string, std::string> text;
  const std::regex option_line(R"(^\s+(-{1,2}[a-z][a-z-]*)(?:,--[a-z-]+)?\b(.*)$)");
  std::string current;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, option_line)) {
      // "--seq INT:INT in [1 - 16777216]=256   sequence length …": the description follows the
      // signature after two spaces, or starts on the next line.
      current = m[1];
      const std::string rest = m[2];
      const std::size_t gap = rest.find("  ");
      text[current] = gap == std::string::npos ? "" : rest.substr(gap);
    } else if (!current.empty()) {
      text[current] += " " + line;
    }
  }
  const std::map<std::string, std::vector<std::string>> says{
      {"--cp", {"ranks"}},
      {"--batch", {"sequences"}},
      {"--heads", {"num_attention_heads", "all TP ranks", "--tp"}},
      {"--kv-heads", {"num_query_groups", "all TP ranks"}},
      {"--seq", {"tokens"}},
      {"--head-dim", {"elements per head"}},
      {"--tp", {"divided"}},
      {"--window", {"ranks"}},
      {"--ulysses-degree", {"Ulysses ranks"}},
      {"--dtype", {"auto"}},
      {"--mask-file", {"[seq, seq]", "true"}},
      {"--q", {"[seq, batch, heads per rank, head-dim]"}},
      {"--json", {"ns"}},
      {"--steps", {"us"}},
      {"--model", {"configs/models"}},
      {"--compare", {"ms"}}};
  for (const auto& [option, words] : says) {
    ASSERT_TRUE(text.count(option)) << option << " missing from\n" << help;
    for (const std::string& w : words)
      EXPECT_NE(text[option].find(w), std::string::npos)
          << option << " help does not say '" << w << "': " << text[option];
  }
  // No option without a description.
  EXPECT_GE(text.size(), 30u) << help;
  for (const auto& [option, t] : text)
    EXPECT_GT(std::regex_replace(t, std::regex(R"(\s)"), "").size(), 8u)
        << option << " has no description: '" << t << "'";
}

}  // namespace
}  // namespace cocemu
