// `cocemu train` (R-TR-2, R-TR-9, R-TR-10): the layout rules one by one, settings from flags and
// MindFormers YAML, the report and its files, and the step model against the emulated step.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cocemu/train/config.h"
#include "cocemu/train/layout.h"
#include "cocemu/train/step_model.h"
#include "cocemu/train/trainer.h"
#include "testing.h"

namespace cocemu::layers::train {
namespace {

DecoderShape shape() {
  DecoderShape m;
  m.hidden = 64;
  m.heads = 8;
  m.kv_heads = 4;
  m.ffn = 128;
  m.num_layers = 8;
  m.vocab = 1000;
  m.seq = 32;
  return m;
}

TrainLayout layout(int tp, int dp, int pp) {
  TrainLayout l;
  l.tp = tp;
  l.dp = dp;
  l.pp = pp;
  l.micro_batch_size = 2;
  l.global_batch_size = 2 * dp * 2 * pp;
  l.sequence_parallel = tp > 1;
  return l;
}

void expect_rule(const DecoderShape& m, const TrainLayout& l, int world,
                 const std::vector<std::string>& fragments) {
  testing::expect_error([&] { check_layout(m, l, world); }, Errc::invalid_argument, fragments);
}

// R-TR-2: every MindFormers rule and Megatron assertion, one by one, with its numbers.
TEST(TrainLayoutRules, EachRuleIsAClearError) {
  const DecoderShape m = shape();
  EXPECT_NO_THROW(check_layout(m, layout(2, 2, 2), 8));
  expect_rule(m, layout(2, 2, 2), 16,
              {"data_parallel 2", "model_parallel 2", "pipeline_stage 2",
               "= 8 must equal the number of devices, 16"});
  {
    TrainLayout l = layout(2, 2, 2);
    l.global_batch_size = 10;
    expect_rule(m, l, 8, {"global batch size 10", "micro batch size 2", "data parallel 2 = 4"});
  }
  {
    TrainLayout l = layout(1, 1, 4);
    l.global_batch_size = 6;  // 3 micro-batches for 4 stages
    expect_rule(m, l, 4, {"micro_batch_num 3", "pipeline_stage 4"});
  }
  {
    DecoderShape odd = m;
    odd.hidden = 66;
    odd.heads = 6;
    odd.kv_heads = 6;
    expect_rule(odd, layout(4, 1, 1), 4,
                {"hidden_size 66 is not divisible by model_parallel 4", "rearrangement"});
  }
  {
    DecoderShape few = m;
    few.kv_heads = 2;
    expect_rule(few, layout(4, 1, 1), 4, {"KV groups 2", "model_parallel 4"});
  }
  {
    DecoderShape five = m;
    five.num_layers = 5;
    expect_rule(five, layout(1, 1, 2), 2, {"num_layers 5", "pipeline_stage 2", "explicit split"});
    TrainLayout split = layout(1, 1, 2);
    split.stage_layers = {3, 2};
    const auto warn = check_layout(five, split, 2);
    ASSERT_EQ(warn.warnings.size(), 1u);
    EXPECT_NE(warn.warnings[0].find("uneven"), std::string::npos);
    split.stage_layers = {3, 3};
    expect_rule(five, split, 2, {"sums to 6 layers, not 5"});
  }
  {
    TrainLayout l = layout(1, 1, 2);
    l.vpp = 2;
    expect_rule(m, l, 2, {"virtual pipeline stages (2)", "interleaved"});
    l.schedule = PipelineSchedule::interleaved;
    l.global_batch_size = 6;  // 3 micro-batches, not a multiple of 2 stages
    expect_rule(m, l, 2, {"micro_batch_num 3", "multiple of pipeline_stage 2"});
  }
  {
    TrainLayout l = layout(1, 1, 1);
    l.micro_batch_interleave = 3;
    expect_rule(m, l, 1, {"micro_batch_interleave_num must be 1 or 2, not 3"});
    l.micro_batch_interleave = 2;
    l.micro_batch_size = 3;
    l.global_batch_size = 3;
    expect_rule(m, l, 1, {"micro batch size 3 must be even"});
  }
  {
    DecoderShape v = m;
    v.vocab = 1001;
    const auto warn = check_layout(v, layout(2, 2, 2), 8);
    ASSERT_FALSE(warn.warnings.empty());
    EXPECT_NE(warn.warnings[0].find("vocab_size 1001"), std::string::npos);
  }
  {
    // MindSpeed's context-parallel attention is flash attention: unfused attention with cp > 1
    // is refused, not priced as something else.
    TrainOptions o;
    o.model = m;
    o.model.flash_attention = false;
    o.layout = layout(1, 1, 1);
    o.layout.cp = 2;
    o.layout.global_batch_size = 2;
    WorldOptions dry;
    dry.numerics = false;
    testing::expect_error([&] { train(o, dry); }, Errc::invalid_argument,
                          {"context parallel 2 with unfused core attention"});
  }
  {
    // Sequence parallelism splits [s, b, h] along s only (Megatron's _split_along_first_dim
    // asserts s % tp == 0): seq 34 over tp 4 fails even though 34 × micro-batch 2 divides.
    DecoderShape s34 = m;
    s34.seq = 34;
    expect_rule(s34, layout(4, 1, 1), 4,
                {"seq_length / context_parallel = 34 / 1 = 34", "model_parallel 4"});
    TrainLayout no_sp = layout(4, 1, 1);
    no_sp.sequence_parallel = false;
    EXPECT_NO_THROW(check_layout(s34, no_sp, 4));
  }
}

std::string cocemu(const std::string& args, int* status) {
  return testing::run_command(std::string(COCEMU_BINARY) + " train " + args, status);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// R-TR-10: the default real-numerics step, its JSON fields and files; the pipeline SVG renders.
TEST(TrainCli, DefaultRunReportsEveryFigure) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_cli";
  std::filesystem::remove_all(dir);
  int status = 0;
  const std::string out = cocemu("--out-dir " + dir, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("tp2 cp1 dp2 pp2"), std::string::npos) << out;
  const auto j = read_json(dir + "/train.json");
  for (const char* k : {"iteration_ns", "tokens_per_s", "mfu", "bubble_fraction", "exposed_comm_ns",
                        "memory", "peak_memory_bytes", "oom", "layout", "dry_run"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_FALSE(j["dry_run"].get<bool>());
  EXPECT_GT(j["iteration_ns"].get<double>(), 0);
  EXPECT_GT(j["bubble_fraction"].get<double>(), 0);
  for (const char* k : {"TP", "CP", "DP", "PP"})
    EXPECT_TRUE(j["exposed_comm_ns"].contains(k)) << k;
  EXPECT_EQ(j["loss"].size(), 3u);
  for (const char* f : {"train.pipeline.svg", "train.svg", "train.trace.json"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + f)) << f;
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "rsvg-convert not installed (bootstrap.sh installs librsvg2-bin)";
  ASSERT_EQ(
      std::system(("rsvg-convert -o " + dir + "/p.png " + dir + "/train.pipeline.svg").c_str()), 0);
  std::ifstream p(dir + "/p.png", std::ios::binary);
  char magic[8] = {};
  p.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

// A dry run says so everywhere it reports; a full-size world goes to the step model.
TEST(TrainCli, FullSizeDryRunUsesTheStepModelAndSaysSo) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_dry";
  std::filesystem::remove_all(dir);
  int status = 0;
  const std::string out = cocemu(
      "--dry-run --model llama2-70b --nodes 64 --tensor-model-parallel-size 8 "
      "--pipeline-model-parallel-size 8 --global-batch-size 1024 --out-dir " +
          dir,
      &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("[ dry run"), std::string::npos) << out;
  EXPECT_NE(out.find("step model"), std::string::npos) << out;
  const auto j = read_json(dir + "/train.json");
  EXPECT_TRUE(j["dry_run"].get<bool>());
  EXPECT_NE(j["note"].get<std::string>().find("no numerics"), std::string::npos);
  EXPECT_EQ(j["world"].get<int>(), 512);
  EXPECT_TRUE(j["loss"].empty());
  const std::string svg = [&] {
    std::ifstream in(dir + "/train.pipeline.svg");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  EXPECT_NE(svg.find("dry run"), std::string::npos);
  // Without --dry-run the same world is refused, naming the limit.
  const std::string err = cocemu(
      "--model llama2-70b --nodes 64 --tensor-model-parallel-size 8 "
      "--pipeline-model-parallel-size 8 --global-batch-size 1024 --out-dir " +
          dir,
      &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("512 devices"), std::string::npos) << err;
  EXPECT_NE(err.find("--dry-run"), std::string::npos) << err;
}

// The step model prices a data-parallel group by its plan: 4096 members of a ring are refused at
// once with a clear error (before: 16 GB and 85 s at 512 nodes, out of memory at 1024).
TEST(TrainCli, DataParallelGroupTooLargeToPriceIsAClearError) {
  int status = 0;
  const std::string err = cocemu(
      "--dry-run --engine model --model llama2-7b --nodes 512 --tensor-model-parallel-size 1 "
      "--global-batch-size 4096 --use-distributed-optimizer --out-dir " +
          ::testing::TempDir() + "/cocemu_train_too_large",
      &status);
  EXPECT_NE(status, 0);
  for (const char* want : {"4096 members", "steps per phase", "smaller groups"})
    EXPECT_NE(err.find(want), std::string::npos) << want << "\n" << err;
}

// R-TR-9: a MindFormers file sets the layout; a flag that disagrees is an error naming both; an
// unknown key is an error with file:line.
TEST(TrainCli, MindFormersYamlAndFlagsMustAgree) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_yaml";
  std::filesystem::create_directories(dir);
  const std::string cfg = dir + "/parallel.yaml";
  std::ofstream(cfg) << "parallel:\n"
                        "  enable_parallel_optimizer: true\n"
                        "parallel_config:\n"
                        "  data_parallel: 2\n"
                        "  model_parallel: 2\n"
                        "  pipeline_stage: 2\n"
                        "  use_seq_parallel: true\n"
                        "  micro_batch_num: 4\n"
                        "recompute_config:\n"
                        "  recompute: true\n"
                        "runner_config:\n"
                        "  batch_size: 2\n";
  int status = 0;
  std::string out = cocemu("--config " + cfg + " --dry-run --out-dir " + dir, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("tp2 cp1 dp2 pp2 mbs2 gbs16 1f1b sp dist-opt recompute-full"),
            std::string::npos)
      << out;
  out = cocemu("--config " + cfg + " --tensor-model-parallel-size 4 --dry-run --out-dir " + dir,
               &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--tensor-model-parallel-size = 4 disagrees with " + cfg + ":5"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("model_parallel = 2"), std::string::npos) << out;
  std::ofstream(cfg) << "parallel_config:\n  model_parallel: 2\n  pipline_stage: 2\n";
  out = cocemu("--config " + cfg + " --dry-run --out-dir " + dir, &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find(cfg + ":3"), std::string::npos) << out;
  EXPECT_NE(out.find("pipline_stage"), std::string::npos) << out;
}

// Megatron's --cross-entropy-loss-fusion, as a flag or in the `train:` section: the layout says
// so and the loss takes fewer passes over the logits, so the step models faster.
TEST(TrainCli, CrossEntropyFusionIsAFlagAndASetting) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_ce";
  std::filesystem::create_directories(dir);
  const std::string args =
      "--dry-run --model llama2-7b --nodes 1 --tensor-model-parallel-size 8 "
      "--global-batch-size 4 --out-dir " +
      dir;
  int status = 0;
  const std::string unfused = cocemu(args, &status);
  ASSERT_EQ(status, 0) << unfused;
  const double unfused_ns = read_json(dir + "/train.json")["iteration_ns"].get<double>();
  const std::string fused = cocemu(args + " --cross-entropy-loss-fusion", &status);
  ASSERT_EQ(status, 0) << fused;
  EXPECT_EQ(unfused.find("ce-fusion"), std::string::npos) << unfused;
  EXPECT_NE(fused.find("ce-fusion"), std::string::npos) << fused;
  const double fused_ns = read_json(dir + "/train.json")["iteration_ns"].get<double>();
  EXPECT_LT(fused_ns, unfused_ns);
  const std::string cfg = dir + "/ce.yaml";
  std::ofstream(cfg) << "train:\n  cross_entropy_loss_fusion: true\n";
  const std::string from_file = cocemu(args + " --config " + cfg, &status);
  ASSERT_EQ(status, 0) << from_file;
  EXPECT_EQ(read_json(dir + "/train.json")["iteration_ns"].get<double>(), fused_ns);
}

// The pipeline scatter/gather is a flag and a `train:` setting; real numerics are the same bits.
TEST(TrainCli, PipelineScatterGatherIsAFlagAndASetting) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_sg";
  std::filesystem::create_directories(dir);
  const std::string args =
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --no-sequence-parallel "
      "--iterations 2 --out-dir " +
      dir;
  int status = 0;
  const std::string whole = cocemu(args, &status);
  ASSERT_EQ(status, 0) << whole;
  const nlohmann::json w = read_json(dir + "/train.json");
  const std::string sliced = cocemu(args + " --scatter-gather-tensors-in-pipeline", &status);
  ASSERT_EQ(status, 0) << sliced;
  const nlohmann::json s = read_json(dir + "/train.json");
  EXPECT_EQ(whole.find("pp-scatter-gather"), std::string::npos) << whole;
  EXPECT_NE(sliced.find("pp-scatter-gather"), std::string::npos) << sliced;
  ASSERT_EQ(s["loss"].size(), 2u);
  EXPECT_EQ(s["loss"], w["loss"]);
  EXPECT_EQ(s["grad_norm"], w["grad_norm"]);
  const std::string cfg = dir + "/sg.yaml";
  std::ofstream(cfg) << "train:\n  scatter_gather_tensors_in_pipeline: true\n";
  const std::string from_file = cocemu(args + " --config " + cfg, &status);
  ASSERT_EQ(status, 0) << from_file;
  EXPECT_NE(from_file.find("pp-scatter-gather"), std::string::npos) << from_file;
}

// Bad layouts from the command line: clear errors naming the numbers, never a hang.
TEST(TrainCli, BadLayoutsAreClearErrors) {
  struct Case {
    std::string args;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases{
      {"--pipeline-model-parallel-size 4 --global-batch-size 4",
       {"micro_batch_num 2", "pipeline_stage 4"}},
      {"--global-batch-size 7", {"global batch size 7", "micro batch size 2"}},
      {"--tensor-model-parallel-size 3", {"8 devices", "not divisible by tp 3"}},
      {"--schedule zigzag", {"unknown pipeline schedule 'zigzag'", "gpipe, 1f1b, interleaved"}},
      {"--coc script-p3", {"'script-p3'", "serial, script-p2"}},
      {"--model llama2-70b --nodes 2 --tensor-model-parallel-size 8 --dry-run "
       "--global-batch-size 3",
       {"global batch size 3", "data parallel 2"}},
      {"--context-parallel-size 2 --pipeline-model-parallel-size 1",
       {"context parallel attention runs its numerics in f32 or f64, not bf16", "--dtype f32"}},
      {"--context-parallel-size 2 --pipeline-model-parallel-size 1 --dtype f32 "
       "--context-parallel-algo zigzag_cp_algo",
       {"zigzag_cp_algo"}},
      {"--engine model", {"--engine model prices the iteration", "add --dry-run (8 devices)"}},
  };
  for (const auto& c : cases) {
    int status = 0;
    const std::string out = cocemu(c.args + " --out-dir " + ::testing::TempDir(), &status);
    EXPECT_NE(status, 0) << c.args;
    for (const auto& f : c.fragments)
      EXPECT_NE(out.find(f), std::string::npos) << c.args << " → " << out;
  }
}

// MindSpeed's _validate_cp_args divides the model's heads by tp·cp (Ulysses) or by the Ulysses
// degree × tp (hybrid) once: LLaMA2-7B's 32 heads take tp4 cp4 Ulysses and tp8 cp4 hybrid with
// Ulysses degree 2; tp4 cp16 (32 % 64) is refused with the model's head count.
TEST(TrainCli, UlyssesAndHybridDivideTheModelsHeadsOnce) {
  const std::string dir = " --out-dir " + ::testing::TempDir() + "/cocemu_train_cp";
  int status = 0;
  std::string out = cocemu(
      "--dry-run --engine model --model llama2-7b --nodes 2 --tensor-model-parallel-size 4 "
      "--context-parallel-size 4 --context-parallel-algo ulysses_cp_algo --global-batch-size 8" +
          dir,
      &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("tp4 cp4 dp1 pp1 mbs1 gbs8 1f1b sp ulysses"), std::string::npos) << out;
  out = cocemu(
      "--dry-run --engine model --model llama2-7b --nodes 4 --tensor-model-parallel-size 8 "
      "--context-parallel-size 4 --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 2 "
      "--global-batch-size 8" +
          dir,
      &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("hybrid-u2"), std::string::npos) << out;
  out = cocemu(
      "--dry-run --engine model --model llama2-7b --nodes 8 --tensor-model-parallel-size 4 "
      "--context-parallel-size 16 --context-parallel-algo ulysses_cp_algo --global-batch-size 8" +
          dir,
      &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("num_attention_heads 32 must be divisible"), std::string::npos) << out;
  EXPECT_NE(out.find("4 × 16"), std::string::npos) << out;
}

// --compare-coc runs every strategy and reports its gain over serial.
TEST(TrainCli, CompareCocReportsEachStrategy) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_cmp";
  std::filesystem::remove_all(dir);
  int status = 0;
  const std::string out = cocemu("--compare-coc --dry-run --out-dir " + dir, &status);
  ASSERT_EQ(status, 0) << out;
  const auto j = read_json(dir + "/train.json");
  ASSERT_EQ(j["compare_coc"].size(), 5u);
  EXPECT_EQ(j["compare_coc"][0]["coc"], "serial");
  EXPECT_EQ(j["compare_coc"][0]["gain_over_serial"].get<double>(), 0.0);
  for (const char* s : {"script-p2", "script-p8", "fused"})
    EXPECT_NE(out.find(s), std::string::npos) << out;
}

}  // namespace
}  // namespace cocemu::layers::train

namespace cocemu::bench {
namespace {

// The step model against the emulated step (both dry runs) on layouts both can run, beyond
// tests/train/test_engines.cpp's matrix (GPipe, recompute, fusion groups, bf16 reduction,
// scatter-gather pipeline tensors, uneven stages, unfused attention, NCCL's algorithms across
// nodes): within 2%, as the engines agree there.
TEST(StepModel, AgreesWithTheEmulatedStep) {
  layers::train::DecoderShape m;
  m.name = "mid";
  m.hidden = 2048;
  m.heads = 16;
  m.kv_heads = 16;
  m.ffn = 5504;
  m.num_layers = 8;
  m.vocab = 32000;
  m.seq = 2048;
  struct C {
    int tp, dp, pp, vpp;
    layers::train::PipelineSchedule s;
    layers::train::Recompute r;
    bool dist;
    int cp = 1;
    std::string cp_algo = "megatron_cp_algo";
    bool deterministic = true;
    bool overlap_param_gather = false;
    bool sequence_parallel = true, scatter_gather = false;
    int fusion_groups = 0;
    bool fp32_reduce = true;
    std::vector<std::int64_t> stage_layers = {};
    bool flash = true;
  };
  using layers::train::PipelineSchedule;
  using layers::train::Recompute;
  for (const C& c : {C{2, 2, 2, 1, PipelineSchedule::one_f_one_b, Recompute::none, false},
                     C{2, 1, 4, 1, PipelineSchedule::one_f_one_b, Recompute::none, false},
                     C{2, 2, 2, 2, PipelineSchedule::interleaved, Recompute::none, false},
                     C{4, 1, 2, 1, PipelineSchedule::one_f_one_b, Recompute::none, true},
                     C{2, 2, 2, 1, PipelineSchedule::gpipe, Recompute::full, false},
                     C{2, 4, 1, 1, PipelineSchedule::one_f_one_b, Recompute::none, true},
                     C{2, 1, 2, 1, PipelineSchedule::one_f_one_b, Recompute::none, false, 2},
                     C{2, 1, 1, 1, PipelineSchedule::one_f_one_b, Recompute::selective, false, 4,
                       "ulysses_cp_algo"},
                     // Two nodes, NCCL/HCCL's algorithms: the dp group's reduce-scatter and
                     // all-gather run on multi-channel rings across the nodes.
                     C{2, 8, 1, 1, PipelineSchedule::one_f_one_b, Recompute::none, true, 1,
                       "megatron_cp_algo", false},
                     // The parameter all-gathers beside the next iteration's forward.
                     C{2, 2, 2, 1, PipelineSchedule::one_f_one_b, Recompute::none, true, 1,
                       "megatron_cp_algo", true, true},
                     // 2021-2022 Megatron's pipeline tensors: TP slices, all-gathered.
                     C{4, 1, 2, 1, PipelineSchedule::one_f_one_b, Recompute::none, false, 1,
                       "megatron_cp_algo", true, false, false, true},
                     // MindFormers' fusion groups (4 over 8 layers), gradients reduced in bf16.
                     C{2, 4, 1, 1, PipelineSchedule::one_f_one_b, Recompute::none, false, 1,
                       "megatron_cp_algo", true, false, true, false, 4, false},
                     // Uneven stages.
                     C{2,
                       2,
                       2,
                       1,
                       PipelineSchedule::one_f_one_b,
                       Recompute::none,
                       true,
                       1,
                       "megatron_cp_algo",
                       true,
                       false,
                       true,
                       false,
                       0,
                       true,
                       {3, 5}},
                     // Megatron's unfused core attention (runs before FlashAttention).
                     C{2,
                       2,
                       2,
                       1,
                       PipelineSchedule::one_f_one_b,
                       Recompute::none,
                       false,
                       1,
                       "megatron_cp_algo",
                       true,
                       false,
                       false,
                       false,
                       0,
                       true,
                       {},
                       false}}) {
    TrainSetup s;
    s.dry_run = true;
    s.deterministic = c.deterministic;
    s.nodes = std::max(1, c.tp * c.dp * c.pp * c.cp / 8);
    s.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
    auto& o = s.options;
    o.model = m;
    o.layout.tp = c.tp;
    o.layout.dp = c.dp;
    o.layout.pp = c.pp;
    o.layout.vpp = c.vpp;
    o.layout.schedule = c.s;
    o.layout.recompute = c.r;
    o.layout.distributed_optimizer = c.dist;
    o.layout.overlap_param_gather = c.overlap_param_gather;
    o.layout.sequence_parallel = c.sequence_parallel;
    o.layout.scatter_gather_tensors_in_pipeline = c.scatter_gather;
    o.layout.gradient_aggregation_group = c.fusion_groups;
    o.layout.grad_reduce_in_fp32 = c.fp32_reduce;
    o.layout.stage_layers = c.stage_layers;
    o.model.flash_attention = c.flash;
    o.layout.cp = c.cp;
    o.layout.cp_algo = c.cp_algo;
    o.layout.micro_batch_size = 1;
    o.layout.global_batch_size = 8 * c.dp;
    o.iterations = 2;
    WorldOptions w;
    w.profile = s.profile;
    w.numerics = false;
    w.deterministic = c.deterministic;
    const auto emulated = report_from_run(s, layers::train::train(o, w));
    const auto modeled = model_step(s);
    const double ratio = double(modeled.iteration_ns) / double(emulated.iteration_ns);
    std::printf("%-70s step model / emulated %.3f\n", o.layout.describe().c_str(), ratio);
    EXPECT_NEAR(ratio, 1.0, 0.02) << o.layout.describe() << ": step model " << modeled.iteration_ns
                                  << " ns, emulated " << emulated.iteration_ns << " ns";
    EXPECT_NEAR(modeled.bubble_fraction, emulated.bubble_fraction, 0.06) << o.layout.describe();
    EXPECT_EQ(modeled.deterministic, c.deterministic);
    EXPECT_EQ(emulated.deterministic, c.deterministic);
    if (!c.deterministic) {
      // Rank-ordered sums cost more across nodes: one chain (or a direct exchange) carries
      // every byte through each node's NIC, the rings share the node's NICs.
      s.deterministic = true;
      EXPECT_GT(model_step(s).exposed_comm_ns.at("DP"), 1.5 * modeled.exposed_comm_ns.at("DP"))
          << o.layout.describe();
    }
  }
}

// The layout a report names is the whole layout: multi-copy and the CP algorithm are in the
// string and have JSON keys of their own.
TEST(TrainReport, LayoutNamesMultiCopyAndTheCpAlgorithm) {
  TrainSetup s;
  s.dry_run = true;
  s.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
  auto& l = s.options.layout;
  l.tp = 2;
  l.micro_batch_size = 2;
  l.global_batch_size = 4;
  l.micro_batch_interleave = 2;
  const TrainReport copies = model_step(s);
  EXPECT_NE(copies.layout.find(" 2-copy"), std::string::npos) << copies.layout;
  nlohmann::json j = to_json(copies);
  EXPECT_EQ(j.at("micro_batch_interleave_num"), 2);
  EXPECT_FALSE(j.contains("context_parallel_algo"));
  l.micro_batch_interleave = 1;
  EXPECT_EQ(model_step(s).layout.find("copy"), std::string::npos);
  l.cp = 2;
  l.cp_algo = "ulysses_cp_algo";
  const TrainReport ulysses = model_step(s);
  EXPECT_NE(ulysses.layout.find(" ulysses"), std::string::npos) << ulysses.layout;
  j = to_json(ulysses);
  EXPECT_EQ(j.at("context_parallel_algo"), "ulysses_cp_algo");
  EXPECT_EQ(j.at("micro_batch_interleave_num"), 1);
  l.cp_algo = "megatron_cp_algo";
  EXPECT_NE(l.describe().find(" ring"), std::string::npos) << l.describe();
  l.cp = 4;
  l.cp_algo = "hybrid_cp_algo";
  l.ulysses_degree_in_cp = 2;
  EXPECT_NE(l.describe().find(" hybrid-u2"), std::string::npos) << l.describe();
}

// MFU's numerator counts the LM head over Megatron's padded vocabulary (num_floating_point_
// operations uses padded_vocab_size): GPT-3's 50257 tokens are 51200 at tp 8.
TEST(TrainReport, ModelFlopsUseThePaddedVocabulary) {
  layers::train::DecoderShape m;
  m.hidden = 12288;
  m.heads = 96;
  m.ffn = 4 * 12288;
  m.swiglu = false;
  m.num_layers = 96;
  m.seq = 2048;
  m.vocab = 50257;
  layers::train::TrainLayout l;
  l.tp = 8;
  l.global_batch_size = 1536;
  // Narayanan et al. (2021), eq. 3: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) with V = 51200.
  const double B = 1536, s = 2048, L = 96, h = 12288, V = 51200;
  const double want = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
  EXPECT_NEAR(model_flops_per_iteration(m, l) / want, 1.0, 1e-12);
}

// Megatron's 1F1B blocks on each p2p call: a stage waits until its peer has posted the matching
// receive and the tensor has crossed, sends included. Across two nodes (tp 8 fills a node) with
// whole 32 MiB activations, the step model pays those transfers as the emulated step does;
// interleaved without overlap_p2p_comm (2021-2022 Megatron) blocks on its batched calls too.
TEST(StepModel, PaysBlockingPipelineTransfersAsTheEmulatorDoes) {
  for (const bool interleaved : {false, true}) {
    TrainSetup s;
    s.dry_run = true;
    s.nodes = interleaved ? 4 : 2;
    s.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
    auto& o = s.options;
    o.model.name = "llama2-7b, 8 layers";
    o.model.hidden = 4096;
    o.model.heads = 32;
    o.model.ffn = 11008;
    o.model.num_layers = 8;
    o.model.vocab = 32000;
    o.model.seq = 4096;
    auto& l = o.layout;
    l.tp = 8;
    l.pp = interleaved ? 4 : 2;
    l.sequence_parallel = false;
    l.micro_batch_size = 1;
    l.global_batch_size = 8;
    if (interleaved) {
      l.vpp = 2;
      l.schedule = layers::train::PipelineSchedule::interleaved;
      l.overlap_p2p_comm = false;
    }
    o.iterations = 2;
    WorldOptions w;
    w.profile = s.profile;
    w.numerics = false;
    const auto emulated = report_from_run(s, layers::train::train(o, w));
    const auto modeled = model_step(s);
    EXPECT_NEAR(double(modeled.iteration_ns) / double(emulated.iteration_ns), 1.0,
                interleaved ? 0.015 : 0.006)
        << l.describe() << ": step model " << modeled.iteration_ns << " ns, emulated "
        << emulated.iteration_ns << " ns";
    EXPECT_NEAR(modeled.exposed_comm_ns.at("PP"), emulated.exposed_comm_ns.at("PP"),
                0.1 * emulated.exposed_comm_ns.at("PP"))
        << l.describe();
    EXPECT_GT(modeled.exposed_comm_ns.at("PP"), 0.005 * double(modeled.iteration_ns));
    if (interleaved) {
      // The same layout with overlapped p2p (current Megatron's default) is faster.
      l.overlap_p2p_comm = true;
      EXPECT_LT(model_step(s).iteration_ns, modeled.iteration_ns);
    }
  }
}

// Megatron 2021-2022's scatter/gather of pipeline tensors: without SP each TP rank sends 1/tp of
// the activation over its own NIC and the receiver all-gathers over NVLink, so a pipeline across
// nodes waits far less on its transfers. With SP (tensors already sliced) it changes nothing.
TEST(StepModel, ScatterGatherSendsSlicesAcrossNodes) {
  TrainSetup s;
  s.dry_run = true;
  s.nodes = 2;
  s.profile = std::make_shared<const DeviceProfile>(load_named_profile("h100-sxm"));
  auto& o = s.options;
  o.model.name = "mid";
  o.model.hidden = 4096;
  o.model.heads = 32;
  o.model.ffn = 11008;
  o.model.num_layers = 4;
  o.model.vocab = 32000;
  o.model.seq = 4096;
  o.layout.tp = 8;
  o.layout.pp = 2;
  o.layout.dp = 1;
  o.layout.sequence_parallel = false;
  o.layout.micro_batch_size = 1;
  o.layout.global_batch_size = 8;
  const TrainReport whole = model_step(s);
  o.layout.scatter_gather_tensors_in_pipeline = true;
  const TrainReport sliced = model_step(s);
  EXPECT_NE(sliced.layout.find("pp-scatter-gather"), std::string::npos) << sliced.layout;
  // A 32 MiB activation: whole over one 50 GB/s NIC, or 4 MiB per NIC plus an NVLink all-gather.
  EXPECT_LT(sliced.exposed_comm_ns.at("PP"), 0.5 * whole.exposed_comm_ns.at("PP"))
      << whole.exposed_comm_ns.at("PP") << " ns whole";
  EXPECT_LT(sliced.iteration_ns, whole.iteration_ns);
  o.layout.sequence_parallel = true;
  const TrainReport sp_on = model_step(s);
  o.layout.scatter_gather_tensors_in_pipeline = false;
  EXPECT_EQ(model_step(s).iteration_ns, sp_on.iteration_ns);
  EXPECT_EQ(sp_on.layout.find("pp-scatter-gather"), std::string::npos) << sp_on.layout;
}

// 2021 Megatron's fp16 runs reduced their gradients in fp16 (no --accumulate-allreduce-grads-in-
// fp32): the step model then moves half the bytes per reduction and keeps 16-bit gradients, and
// the emulated ranks reduce each bucket in bf16 (half the bytes, the same buckets).
TEST(StepModel, SixteenBitGradientReductionMovesHalfTheBytes) {
  TrainSetup s;
  s.dry_run = true;
  s.deterministic = false;
  s.nodes = 2;
  s.profile = std::make_shared<const DeviceProfile>(load_named_profile("a100-sxm"));
  auto& o = s.options;
  o.model.hidden = 4096;
  o.model.heads = 32;
  o.model.kv_heads = 32;
  o.model.ffn = 16384;
  o.model.num_layers = 4;
  o.model.vocab = 32000;
  o.model.seq = 2048;
  o.layout.tp = 2;
  o.layout.dp = 8;
  o.layout.micro_batch_size = 1;
  o.layout.global_batch_size = 8;
  o.layout.overlap_grad_reduce = false;  // every reduction exposed after the backward
  const auto grads = [](const TrainReport& r) {
    for (const auto& t : r.memory.terms)
      if (t.name.find("gradients") != std::string::npos) return t.bytes;
    return 0.0;
  };
  const TrainReport wide = model_step(s);
  o.layout.grad_reduce_in_fp32 = false;
  const TrainReport narrow = model_step(s);
  const double ratio = narrow.exposed_comm_ns.at("DP") / wide.exposed_comm_ns.at("DP");
  EXPECT_GT(ratio, 0.45);
  EXPECT_LT(ratio, 0.55);
  EXPECT_LT(narrow.iteration_ns, wide.iteration_ns);
  EXPECT_GT(grads(wide), 0);
  EXPECT_DOUBLE_EQ(grads(narrow), grads(wide) / 2);
  o.model.num_layers = 2;  // a short emulated run: count the reductions' bytes
  o.iterations = 1;
  WorldOptions w;
  w.profile = s.profile;
  w.numerics = false;
  auto reduced_bytes = [&] {
    const auto r = layers::train::train(o, w);
    std::uint64_t bytes = 0;
    for (const auto& op : r.run.graph.ranks[0].ops)
      if (op.cls == OpClass::comm && op.name.find("grad bucket") != std::string::npos)
        bytes += op.bytes;
    return bytes;
  };
  const std::uint64_t half = reduced_bytes();
  o.layout.grad_reduce_in_fp32 = true;
  const std::uint64_t full = reduced_bytes();
  EXPECT_GT(full, 0u);
  EXPECT_EQ(2 * half, full);
}

}  // namespace
}  // namespace cocemu::bench
