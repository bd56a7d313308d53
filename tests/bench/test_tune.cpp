// `cocemu tune` at the run's layout (#33 item 5): its keys are the shapes that run looks up, it
// can leave the fused kernels out, it says how to apply the file in MindSpeed; `train` and
// `bench` warn when a customized_coc matches none of their GEMM shapes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "cocemu/bench/tune.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/train/config.h"
#include "testing.h"

namespace cocemu::bench {
namespace {

std::string cocemu(const std::string& args, int* status) {
  return testing::run_command(std::string(COCEMU_BINARY) + " " + args, status);
}

std::set<std::string> keys_of(const std::string& coc_file) {
  std::set<std::string> keys;
  for (const auto& [key, v] : layers::load_coc_config(coc_file).customized_coc)
    keys.insert(key);
  return keys;
}

std::set<int> values_of(const std::string& coc_file) {
  std::set<int> values;
  for (const auto& [key, v] : layers::load_coc_config(coc_file).customized_coc)
    values.insert(v);
  return values;
}

// Tuned at mbs 2, seq 1024, tp 4 (flags or a train config): every key is a shape that run looks
// up; tuned at the model file's layout instead, the keys match nothing there and train says so.
TEST(Tune, KeysAreTheShapesOfTheRunsLayout) {
  const std::string dir = ::testing::TempDir() + "/cocemu_tune_layout";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  int status = 0;
  std::string out = cocemu(
      "tune --model llama2-7b --micro-batch-size 2 --seq-length 1024 "
      "--tensor-model-parallel-size 4 --sequence-parallel -o " +
          dir + "/at_layout.yaml",
      &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("--use-ascend-coc"), std::string::npos) << "how to apply it in MindSpeed";
  EXPECT_NE(out.find("Layer as tuned: 2048 tokens"), std::string::npos) << out;
  std::ofstream(dir + "/run.yaml") << "parallel_config:\n  model_parallel: 4\n  "
                                      "use_seq_parallel: true\nrunner_config:\n  batch_size: 2\n"
                                      "model:\n  model_config:\n    seq_length: 1024\ntrain:\n  "
                                      "model: llama2-7b\n";
  out = cocemu("tune --config " + dir + "/run.yaml -o " + dir + "/from_config.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(keys_of(dir + "/at_layout.yaml"), keys_of(dir + "/from_config.yaml"));

  TrainSettings s = parse_train_config(
      "parallel_config:\n  model_parallel: 4\n  use_seq_parallel: true\nrunner_config:\n  "
      "batch_size: 2\nmodel:\n  model_config:\n    seq_length: 1024\ntrain:\n  model: llama2-7b\n",
      "run.yaml");
  const std::vector<std::string> run = run_gemm_keys(resolve_settings(s, true));
  const std::set<std::string> run_keys(run.begin(), run.end());
  ASSERT_FALSE(keys_of(dir + "/at_layout.yaml").empty());
  for (const auto& k : keys_of(dir + "/at_layout.yaml"))
    EXPECT_TRUE(run_keys.count(k)) << k << " is not a shape of the run";

  const std::string train =
      "train --dry-run --engine priced --model llama2-7b "
      "--tensor-model-parallel-size 4 --micro-batch-size 2 --seq-length "
      "1024 --global-batch-size 8 --out-dir " +
      dir + "/t --coc-config ";
  out = cocemu(train + dir + "/at_layout.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out.find("matches none"), std::string::npos) << out;
  out = cocemu("tune --model llama2-7b -o " + dir + "/model_file.yaml", &status);  // mbs 1, tp 8
  ASSERT_EQ(status, 0) << out;
  out = cocemu(train + dir + "/model_file.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("warning: " + dir +
                     "/model_file.yaml: customized_coc matches none of this "
                     "run's GEMM shapes"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(*run_keys.begin()), std::string::npos) << "lists the run's shapes: " << out;
}

// tune --no-fused (or --strategies) tunes script-side splits only.
TEST(Tune, NoFusedTunesScriptSplitsOnly) {
  const std::string dir = ::testing::TempDir() + "/cocemu_tune_nofused";
  std::filesystem::create_directories(dir);
  int status = 0;
  std::string out = cocemu("tune --model llama2-70b -o " + dir + "/all.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  ASSERT_TRUE(values_of(dir + "/all.yaml").count(-1)) << "fused wins somewhere by default";
  out = cocemu("tune --model llama2-70b --no-fused -o " + dir + "/script.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_FALSE(values_of(dir + "/script.yaml").count(-1)) << out;
  EXPECT_NE(out.find("--coc-parallel-num"), std::string::npos) << out;
  out = cocemu("tune --model llama2-70b --strategies script-p2 -o " + dir + "/p2.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  for (const int v : values_of(dir + "/p2.yaml"))
    EXPECT_TRUE(v == 1 || v == 2) << v;
  out = cocemu("tune --model llama2-70b --strategies script-p3 -o " + dir + "/p3.yaml", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("script-p3"), std::string::npos) << out;
}

// bench warns (one stderr line naming the file and the layer's shapes) when a customized_coc
// matches none of the layer's GEMMs, and not when one matches.
TEST(Tune, BenchWarnsWhenCustomizedCocMatchesNothing) {
  const std::string dir = ::testing::TempDir() + "/cocemu_bench_unmatched";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/other.yaml") << "customized_coc:\n  \"[123, 456, 789]\": -1\n";
  int status = 0;
  std::string out = cocemu("tune --model llama2-7b -o " + dir + "/mine.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  const std::string bench =
      "bench --model llama2-7b --dry-run --no-progress --out-dir " + dir + "/b --coc-config ";
  out = cocemu(bench + dir + "/other.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("cocemu bench: warning: " + dir +
                     "/other.yaml: customized_coc matches "
                     "none"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("[4096, 4096, 1536]"), std::string::npos) << "the layer's shapes: " << out;
  out = cocemu(bench + dir + "/mine.yaml", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out.find("matches none"), std::string::npos) << out;
}

}  // namespace
}  // namespace cocemu::bench
