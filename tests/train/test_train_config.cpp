// `cocemu train`'s settings: a MindFormers config read with MindFormers' meaning (batch per copy,
// gradient accumulation at pipeline_stage 1, gradients_mean by parallel_mode, fusion groups,
// interleaving and offsets where MindFormers puts them), paths relative to the file, one set of
// layout fields for train and validate, Megatron's and MindSpeed's flags accepted with their
// meaning, and settings that would be accepted and then ignored refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/buckets.h"
#include "cocemu/train/config.h"
#include "cocemu/train/validate.h"
#include "testing.h"

namespace cocemu::bench {
namespace {

using testing::expect_error;

TrainSetup setup_of(const std::string& yaml, const std::string& origin = "mf.yaml") {
  return resolve_settings(parse_train_config(yaml, origin), true);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v)
    s += x + "\n";
  return s;
}

// A config written the way MindFormers' own examples are (research/telechat2's finetune YAML:
// run settings, datasets with anchors, callbacks, context, parallel with pipeline_config, model
// config with pp_interleave_num and shapes): the modeled keys take effect with MindFormers'
// meaning, the rest is listed as ignored, the shapes are checked against the model.
TEST(TrainConfig, MindFormersExampleConfigReadsWithMindFormersMeaning) {
  const std::string yaml = R"(seed: 0
output_dir: './output'
run_mode: 'finetune'
trainer:
  type: CausalLanguageModelingTrainer
  model_name: 'llama2_7b'
runner_config:
  epochs: 2
  batch_size: 1
  sink_mode: True
  sink_size: 1
optimizer:
  type: AdamW
  betas: [0.9, 0.95]
train_dataset: &train_dataset
  data_loader:
    type: MindDataset
    dataset_dir: ""
  batch_size: 6
train_dataset_task:
  type: CausalLanguageModelDataset
  dataset_config: *train_dataset
use_parallel: True
parallel:
  parallel_mode: 1 # 0-data parallel, 1-semi-auto parallel, 2-auto parallel, 3-hybrid parallel
  gradients_mean: False
  enable_alltoall: False
  full_batch: True
  search_mode: "sharding_propagation"
  enable_parallel_optimizer: True
  strategy_ckpt_save_file: "./ckpt_strategy.ckpt"
  pipeline_config:
    pipeline_interleave: True
    pipeline_scheduler: '1f1b'
  parallel_optimizer_config:
    gradient_accumulation_shard: False
    parallel_optimizer_threshold: 64
parallel_config:
  data_parallel: 2
  model_parallel: 2
  context_parallel: 1
  pipeline_stage: 2
  use_seq_parallel: True
  micro_batch_num: 4
  vocab_emb_dp: False
  gradient_aggregation_group: 4
micro_batch_interleave_num: 2
recompute_config:
  recompute: False
  select_recompute: True
  select_comm_recompute: [ 8, 8 ]
  mp_comm_recompute: True
callbacks:
  - type: MFLossMonitor
context:
  mode: 0
  device_target: "Ascend"
  max_device_memory: "58GB"
model:
  model_config:
    type: LlamaConfig
    batch_size: 1
    seq_length: 2048
    hidden_size: 4096
    num_layers: 32
    num_heads: 32
    vocab_size: 32000
    rms_norm_eps: 1.0e-5
    pp_interleave_num: 2
  arch:
    type: LlamaForCausalLM
train:
  model: llama2-7b
)";
  const TrainSettings s = parse_train_config(yaml, "mf.yaml");
  const std::string notes = joined(s.notes);
  for (const char* ignored :
       {"seed", "run_mode", "trainer", "optimizer", "train_dataset", "callbacks", "context",
        "parallel.full_batch", "parallel.search_mode", "runner_config.epochs",
        "recompute_config.select_comm_recompute", "model.model_config.rms_norm_eps",
        "model.model_config.type", "model.arch"})
    EXPECT_NE(notes.find(ignored), std::string::npos) << ignored << " in\n" << notes;
  EXPECT_NE(notes.find("ignored, not modeled"), std::string::npos) << notes;
  const TrainSetup t = resolve_settings(s, true);
  const auto& l = t.options.layout;
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.vpp, 2);
  EXPECT_EQ(l.schedule, layers::train::PipelineSchedule::interleaved);
  EXPECT_EQ(l.micro_batch_interleave, 2);
  // batch_size is one copy: 1 × 2 copies per micro-batch; global = 1 × dp 2 × 4 × 2.
  EXPECT_EQ(l.micro_batch_size, 2);
  EXPECT_EQ(l.global_batch_size, 16);
  EXPECT_EQ(t.options.model.seq, 2048);
  EXPECT_TRUE(l.gradients_mean) << "semi-auto, gradients_mean False: averaged gradients";
  EXPECT_TRUE(l.distributed_optimizer);
  EXPECT_EQ(l.recompute, layers::train::Recompute::selective);
  // MindFormers' fusion groups reach the layout as its own field (grouped in buckets.cpp).
  EXPECT_EQ(l.gradient_aggregation_group, 4);
  EXPECT_EQ(l.bucket_params, 0);

  // The model's shapes must agree with the model cocemu runs.
  std::string wrong = yaml;
  wrong.replace(wrong.find("hidden_size: 4096"), 17, "hidden_size: 5120");
  expect_error([&] { (void)setup_of(wrong); }, Errc::invalid_argument,
               {"mf.yaml:", "model.model_config.hidden_size = 5120", "llama2-7b", "4096"});
  // A key MindFormers does not have stays an error with its line.
  std::string typo = yaml;
  typo.replace(typo.find("use_parallel"), 12, "use_paralel");
  expect_error([&] { (void)parse_train_config(typo, "mf.yaml"); }, Errc::parse_error,
               {"mf.yaml:", "use_paralel"});
}

// runner_config.batch_size is one copy; with pipeline_stage 1 MindFormers counts micro-batches
// with gradient_accumulation_steps and resets micro_batch_num (noted, not silently used).
TEST(TrainConfig, PipelineStageOneCountsGradientAccumulationSteps) {
  const TrainSetup t = setup_of(R"(parallel_config:
  data_parallel: 4
  model_parallel: 2
  pipeline_stage: 1
  micro_batch_num: 16
micro_batch_interleave_num: 2
runner_config:
  batch_size: 2
  gradient_accumulation_steps: 3
train:
  model: llama2-7b
)");
  const auto& l = t.options.layout;
  EXPECT_EQ(l.micro_batch_size, 4);
  EXPECT_EQ(l.global_batch_size, 2 * 4 * 2 * 3);
  EXPECT_EQ(l.micro_batches(), 3);
  EXPECT_NE(joined(t.notes).find("micro_batch_num = 16 ignored"), std::string::npos)
      << joined(t.notes);
  // Megatron's micro-batch counts both copies: a flag saying otherwise disagrees.
  TrainSettings flag;
  flag.micro_batch_size.set(2, "--micro-batch-size");
  expect_error(
      [&] {
        (void)resolve_settings(merge_settings(flag, parse_train_config(R"(parallel_config:
  model_parallel: 2
micro_batch_interleave_num: 2
runner_config:
  batch_size: 2
train:
  model: llama2-7b
)",
                                                                       "mf.yaml")),
                               true);
      },
      Errc::invalid_argument, {"--micro-batch-size = 2", "batch_size", "one copy", "= 4"});
}

// gradients_mean follows MindSpore's parallel_mode: semi-auto (the default) false = averaged
// gradients; semi-auto true is refused; data parallel true = averaged, false = summed.
TEST(TrainConfig, GradientsMeanFollowsTheParallelMode) {
  const std::string layout = "parallel_config:\n  model_parallel: 1\ntrain:\n  tp: 1\n";
  auto mean = [&](const std::string& parallel) {
    return setup_of("parallel:\n" + parallel + layout).options.layout.gradients_mean;
  };
  EXPECT_TRUE(mean("  gradients_mean: false\n"));
  EXPECT_TRUE(mean("  parallel_mode: 2\n  gradients_mean: false\n"));
  EXPECT_TRUE(mean("  parallel_mode: 0\n  gradients_mean: true\n"));
  EXPECT_FALSE(mean("  parallel_mode: 0\n  gradients_mean: false\n"));
  expect_error([&] { (void)mean("  gradients_mean: true\n"); }, Errc::parse_error,
               {"mf.yaml:2", "gradients_mean true", "semi-auto", "false"});
  expect_error([&] { (void)mean("  parallel_mode: 3\n"); }, Errc::parse_error,
               {"parallel_mode 3", "not modeled"});
}

// gradient_aggregation_group: that many fusion groups over the layers (MindFormers'
// LayerSetting: group of layer i = i / max((L + 1) / G, 1)), a single group with pipeline
// stages; the flag means the same.
TEST(TrainConfig, GradientAggregationGroupCountsFusionGroups) {
  const TrainSetup pp1 = setup_of(R"(parallel_config:
  model_parallel: 8
  gradient_aggregation_group: 4
train:
  model: llama2-7b
)");
  EXPECT_EQ(pp1.options.layout.gradient_aggregation_group, 4);
  // pp = 1: layer i in group i / max((L + 1) / G, 1) = i / 8; the embedding with layer 0.
  std::vector<layers::train::GradParam> params;
  for (std::int64_t layer = 31; layer >= -1; --layer)
    params.push_back({0, layer, 1});
  const auto groups =
      layers::train::assign_buckets(pp1.options.model, pp1.options.layout, 0, params);
  EXPECT_EQ(groups.front(), 0) << "layer 31 is the first the backward finalizes";
  EXPECT_EQ(groups[31 - 24], 0);
  EXPECT_EQ(groups[31 - 23], 1);
  EXPECT_EQ(groups.back(), 3) << "the embedding groups with layer 0";
  EXPECT_EQ(*std::max_element(groups.begin(), groups.end()), 3);
  TrainSettings f;
  f.model.set("llama2-7b", "--model");
  f.tp.set(8, "--tensor-model-parallel-size");
  f.aggregation_groups.set(4, "--gradient-aggregation-group");
  EXPECT_EQ(resolve_settings(f, true).options.layout.gradient_aggregation_group, 4);
  // pp > 1: the layers in one group, the embedding and LM head in another.
  f.tp.set(4, "--tensor-model-parallel-size");
  f.pp.set(2, "--pipeline-model-parallel-size");
  const TrainSetup pp2 = resolve_settings(f, true);
  const auto staged =
      layers::train::assign_buckets(pp2.options.model, pp2.options.layout, 0, params);
  EXPECT_EQ(*std::max_element(staged.begin(), staged.end()), 1);
  EXPECT_EQ(staged.front(), 0);
  EXPECT_EQ(staged[30], 0);
  EXPECT_EQ(staged.back(), 1);
  f.bucket_mb.set(40, "--bucket-mb");
  expect_error([&] { (void)resolve_settings(f, true); }, Errc::invalid_argument,
               {"--gradient-aggregation-group", "--bucket-mb", "give one"});
}

// Script CoC at tensor parallel size 1 has no TP collective to overlap: an error naming the
// strategy and what tp 1 allows, from a flag and from a file (a validation reference's layout
// goes through the same resolution); serial and fused stay accepted there.
TEST(TrainConfig, ScriptCocAtTensorParallelOneIsRefused) {
  TrainSettings f;
  f.model.set("llama2-7b", "--model");
  f.tp.set(1, "--tensor-model-parallel-size");
  f.coc.set("script-p2", "--coc");
  expect_error(
      [&] { (void)resolve_settings(f, true); }, Errc::invalid_argument,
      {"--coc", "'script-p2'", "tensor parallel size is 1", "allowed at tp 1: serial, fused"});
  for (const char* ok : {"serial", "fused"}) {
    f.coc.set(ok, "--coc");
    EXPECT_NO_THROW((void)resolve_settings(f, true)) << ok;
  }
  f.tp.set(2, "--tensor-model-parallel-size");
  f.coc.set("script-p2", "--coc");
  EXPECT_NO_THROW((void)resolve_settings(f, true));
  expect_error(
      [] {
        (void)resolve_settings(parse_train_config("parallel_config:\n  model_parallel: 1\n"
                                                  "train:\n  model: llama2-7b\n  coc: script-p8\n",
                                                  "t.yaml"),
                               true);
      },
      Errc::invalid_argument, {"t.yaml:5", "'script-p8'", "tensor parallel size is 1"});
}

// MindFormers' names where MindFormers has them, MindSpeed's where MindSpeed does: each spelling
// in the other's place is an error that says where it goes.
TEST(TrainConfig, EachKeyInItsFrameworksPlace) {
  const TrainSetup ring = setup_of(R"(parallel_config:
  model_parallel: 2
  context_parallel: 2
  context_parallel_algo: colossalai_cp
train:
  model: llama2-7b
)");
  EXPECT_EQ(ring.options.layout.cp_algo, "megatron_cp_algo");
  const TrainSetup ulysses = setup_of(R"(parallel_config:
  model_parallel: 2
  context_parallel: 2
train:
  model: llama2-7b
  context_parallel_algo: ulysses_cp_algo
)");
  EXPECT_EQ(ulysses.options.layout.cp_algo, "ulysses_cp_algo");
  expect_error(
      [&] {
        (void)parse_train_config("parallel_config:\n  context_parallel_algo: ulysses_cp_algo\n",
                                 "mf.yaml");
      },
      Errc::parse_error, {"mf.yaml:2", "colossalai_cp, ulysses_cp, hybrid_cp", "train:"});
  expect_error(
      [&] { (void)parse_train_config("train:\n  context_parallel_algo: hybrid_cp\n", "mf.yaml"); },
      Errc::parse_error, {"mf.yaml:2", "MindFormers' name", "hybrid_cp_algo"});
  expect_error(
      [&] { (void)parse_train_config("parallel_config:\n  pp_interleave_num: 2\n", "mf.yaml"); },
      Errc::parse_error,
      {"mf.yaml:2", "pp_interleave_num", "pipeline_interleave", "model.model_config"});
  expect_error(
      [&] { (void)parse_train_config("parallel_config:\n  cp_window_size: 2\n", "mf.yaml"); },
      Errc::parse_error, {"cp_window_size", "train:"});
  // Interleaving needs both of MindFormers' keys; pp_interleave_num alone is MindFormers' 1.
  const TrainSettings alone =
      parse_train_config("model:\n  model_config:\n    pp_interleave_num: 4\n", "mf.yaml");
  EXPECT_FALSE(alone.vpp.value);
  EXPECT_NE(joined(alone.notes).find("pipeline_interleave is not true"), std::string::npos);
  expect_error(
      [&] {
        (void)parse_train_config("parallel:\n  pipeline_config:\n    pipeline_interleave: true\n",
                                 "mf.yaml");
      },
      Errc::parse_error, {"pipeline_interleave true needs", "pp_interleave_num"});
  // Refused rather than ignored: they change what would be modeled.
  for (const char* key : {"expert_parallel: 2", "seq_split_num: 2", "vocab_emb_dp: true"})
    EXPECT_THROW(
        (void)parse_train_config(std::string("parallel_config:\n  ") + key + "\n", "mf.yaml"),
        Error)
        << key;
  // MindFormers' offset: layers of stage s = num_layers / pp + offset[s].
  const TrainSetup offset = setup_of(R"(parallel_config:
  model_parallel: 2
  pipeline_stage: 4
  micro_batch_num: 4
model:
  model_config:
    num_layers: 32
    offset: [1, 0, 0, -1]
train:
  model: llama2-7b
)");
  EXPECT_EQ(offset.options.layout.stage_layers, (std::vector<std::int64_t>{9, 8, 8, 7}));
}

// Paths inside a file are relative to the file, wherever train runs.
TEST(TrainConfig, PathsInsideAFileAreRelativeToIt) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_paths";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/cfg/coc");
  std::filesystem::create_directories(dir + "/elsewhere");
  std::filesystem::copy_file(config_dir() + "/models/llama2-7b.yaml", dir + "/cfg/model.yaml");
  std::ofstream(dir + "/cfg/coc/tuned.yaml") << "customized_coc:\n  \"[4096, 4096, 1536]\": -1\n";
  std::ofstream(dir + "/cfg/run.yaml")
      << "parallel_config:\n  model_parallel: 8\ntrain:\n  model: model.yaml\n  profile: "
         "ascend-910b\n  coc_config: coc/tuned.yaml\n";
  const TrainSettings s = parse_train_config("train:\n  model: model.yaml\n  coc_config: c.yaml\n",
                                             "some/dir/run.yaml");
  EXPECT_EQ(*s.model.value, "some/dir/model.yaml");
  EXPECT_EQ(*s.coc_config.value, "some/dir/c.yaml");
  EXPECT_EQ(*parse_train_config("train:\n  model: llama2-7b\n", "some/dir/run.yaml").model.value,
            "llama2-7b")
      << "a name stays a name";
  int status = 0;
  const std::string out = testing::run_command(
      "cd '" + dir + "/elsewhere' && " + COCEMU_BINARY +
          " train --config ../cfg/run.yaml --dry-run --engine priced --out-dir t",
      &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("llama2-7b"), std::string::npos) << out;
}

std::string cocemu(const std::string& args, int* status) {
  return testing::run_command(std::string(COCEMU_BINARY) + " " + args, status);
}

double iteration_ns(const std::string& json) {
  std::ifstream in(json);
  return nlohmann::json::parse(in)["iteration_ns"].get<double>();
}

// Megatron-LM's and MindSpeed's flags for what cocemu models: accepted, with their meaning.
TEST(TrainConfig, MegatronAndMindSpeedFlagsTakeEffect) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_flags";
  std::filesystem::remove_all(dir);
  const std::string base =
      "train --dry-run --engine priced --model llama2-7b --tensor-model-parallel-size 2 "
      "--pipeline-model-parallel-size 2 --global-batch-size 16 --out-dir " +
      dir;
  int status = 0;
  auto run_cmd = [&](const std::string& command) {
    const std::string out = cocemu(command, &status);
    EXPECT_EQ(status, 0) << command << "\n" << out;
    return status == 0 ? iteration_ns(dir + "/train.json") : -1.0;
  };
  auto run = [&](const std::string& extra) { return run_cmd(base + " " + extra); };
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/none.yaml") << "customized_coc: {}\n";
  const double plain = run("");
  EXPECT_EQ(run("--overlap-grad-reduce --accumulate-allreduce-grads-in-fp32 --use-flash-attn "
                "--attention-backend flash --deterministic-mode --seq-length 4096 "
                "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
            run("--recompute-granularity full"))
      << "the defaults spelled out";
  EXPECT_GT(run("--no-overlap-grad-reduce"), plain) << "DP reductions after the backward";
  EXPECT_GT(run("--attention-backend unfused"), plain) << "unfused core attention";
  EXPECT_LT(run("--grad-reduce-in-bf16"), plain) << "half the DP bytes";
  EXPECT_EQ(run("--recompute-activations"), run("--recompute-granularity selective"));
  EXPECT_NE(run("--decoder-first-pipeline-num-layers 15 --decoder-last-pipeline-num-layers 17"),
            plain);
  EXPECT_EQ(run("--cp-comm-type p2p --context-parallel-size 2 --dtype bf16"),
            run("--context-parallel-algo megatron_cp_algo --context-parallel-size 2"));
  // The LCOC fused kernels run at TP 8 only (MindSpeed's feature doc): an 8-device world.
  const std::string tp8 =
      "train --dry-run --engine priced --model llama2-7b "
      "--tensor-model-parallel-size 8 --global-batch-size 16 --out-dir " +
      dir + " ";
  auto run8 = [&](const std::string& extra) { return run_cmd(tp8 + extra); };
  EXPECT_LT(run8("--use-ascend-coc --coc-fused-kernel"), run8(""));
  EXPECT_EQ(run8("--use-ascend-coc --coc-fused-kernel"), run8("--coc fused"));
  EXPECT_EQ(run("--use-ascend-coc --coc-parallel-num 4"), run("--coc script-p4"));
  const double h100 = run("--profile h100-sxm");
  EXPECT_LT(run("--profile h100-sxm --tp-comm-overlap"), h100);
  // Values cocemu does not model, and platform flags on the other platform, are errors.
  for (const auto& [extra, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"--recompute-granularity full --recompute-method block", "not modeled"},
           {"--recompute-granularity full --recompute-num-layers 2", "one layer at a time"},
           {"--recompute-activations --recompute-granularity full", "disagrees"},
           {"--tp-comm-overlap", "ascend-910b"},
           {"--profile h100-sxm --use-ascend-coc", "has no mindspeed_coc"},
           {"--profile h100-sxm --tp-comm-overlap --no-sequence-parallel", "sequence-parallel"},
           {"--coc-fused-kernel", "only with --use-ascend-coc"},
           {"--use-ascend-coc --coc-fused-kernel", "tensor parallel size 8 only"},
           {"--profile h100-sxm --tp-comm-overlap --coc-config " + dir + "/none.yaml",
            "chooses per shape"},
           {"--decoder-first-pipeline-num-layers 15 --decoder-last-pipeline-num-layers 18",
            "split evenly"},
           {"--deterministic-mode --nondeterministic", "cannot both"}}) {
    const std::string out = cocemu(base + " " + extra, &status);
    EXPECT_NE(status, 0) << extra;
    EXPECT_NE(out.find(fragment), std::string::npos) << extra << " → " << out;
  }
}

// #34: settings that were accepted and then ignored take effect or are errors naming the
// conflict.
TEST(TrainConfig, AcceptedThenIgnoredSettingsAreErrors) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_ignored";
  std::filesystem::create_directories(dir + "/a_directory");
  std::ofstream(dir + "/coc.yaml") << "customized_coc:\n  \"[128, 128, 128]\": -1\n";
  std::ofstream(dir + "/with_coc.yaml") << "train:\n  coc_config: coc.yaml\n";
  std::ofstream(dir + "/empty_split.yaml") << "train:\n  stage_layers: []\n";
  const std::string dry = " --dry-run --out-dir " + dir + "/out";
  int status = 0;
  for (const auto& [args, fragments] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"train --coc fused --coc-config " + dir + "/coc.yaml" + dry,
            {"--coc = fused", "--coc-config", "give one"}},
           {"train --coc fused --config " + dir + "/with_coc.yaml" + dry,
            {"--coc = fused", "with_coc.yaml:2 train.coc_config", "give one"}},
           {"train --cp-window-size 2" + dry,
            {"--cp-window-size = 2", "context_parallel_size is 1"}},
           {"train --context-parallel-size 2 --ulysses-degree-in-cp 2 --dtype f32" + dry,
            {"--ulysses-degree-in-cp = 2", "hybrid_cp_algo", "megatron_cp_algo"}},
           {"train --context-parallel-size 2 --context-parallel-algo ulysses_cp_algo "
            "--cp-window-size 2 --dtype f32" +
                dry,
            {"--cp-window-size = 2", "not ulysses_cp_algo"}},
           {"train --config " + dir + "/empty_split.yaml" + dry,
            {"empty_split.yaml:2", "stage_layers is empty"}},
           {"train --config " + dir + "/a_directory" + dry, {"is a directory"}},
       }) {
    const std::string out = cocemu(args, &status);
    EXPECT_NE(status, 0) << args;
    for (const auto& f : fragments)
      EXPECT_NE(out.find(f), std::string::npos) << args << " → " << out;
  }
}

// --compare-coc with a config that names a CoC file: each strategy overrides the file's
// per-shape choices (said so), and the configured run is a row of its own.
TEST(TrainConfig, CompareCocOverridesTheConfigsPerShapeChoices) {
  const std::string dir = ::testing::TempDir() + "/cocemu_train_compare";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Every shape of llama2-7b at tp 8, mbs 1, seq 4096 off: the configured run is serial.
  std::ofstream(dir + "/coc.yaml") << "customized_coc:\n"
                                      "  \"[4096, 4096, 1536]\": 1\n  \"[4096, 512, 4096]\": 1\n"
                                      "  \"[4096, 4096, 2752]\": 1\n  \"[4096, 1376, 4096]\": 1\n";
  std::ofstream(dir + "/run.yaml") << "parallel_config:\n  model_parallel: 8\ntrain:\n  model: "
                                      "llama2-7b\n  coc_config: coc.yaml\n";
  int status = 0;
  const std::string out = cocemu("train --config " + dir +
                                     "/run.yaml --dry-run --engine priced "
                                     "--compare-coc --out-dir " +
                                     dir + "/out",
                                 &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("overrides the per-shape choices of " + dir + "/run.yaml:5 train.coc_config"),
            std::string::npos)
      << out;
  std::ifstream in(dir + "/out/train.json");
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["compare_coc"].size(), 6u);
  EXPECT_EQ(j["compare_coc"][5]["coc"], "as configured");
  EXPECT_GT(j["compare_coc"][4]["gain_over_serial"].get<double>(), 0.01) << "fused";
  EXPECT_EQ(j["compare_coc"][5]["gain_over_serial"].get<double>(), 0.0) << "configured off";
}

// validate's training references go through train's reader: its layout fields (uneven stages,
// unfused attention, 16-bit gradient reduction, reduction after the backward) are accepted, and
// an unknown field is an error with its line.
TEST(TrainConfig, ValidateReadsTheSameLayoutFields) {
  auto reference = [](const std::string& extra) {
    return "references:\n"
           "  - name: test run\n"
           "    kind: training\n"
           "    device: a100-sxm-cuda11\n"
           "    model: {hidden: 2048, heads: 16, layers: 10, vocab: 51200, seq: 2048, attention: "
           "unfused}\n"
           "    gpus: 16\n"
           "    layout: {tp: 8, pp: 2, micro_batch_size: 1, global_batch_size: 32, recompute: "
           "full, sequence_parallel: false, distributed_optimizer: false, overlap_grad_reduce: "
           "false, grad_reduce_in_fp32: false" +
           extra +
           "}\n"
           "    flops: model\n"
           "    published: 100\n"
           "    source: a test\n";
  };
  const Validation even = validate(reference(""), "refs.yaml");
  const Validation uneven = validate(reference(", stage_layers: [4, 6]"), "refs.yaml");
  ASSERT_EQ(even.rows.size(), 1u);
  ASSERT_EQ(uneven.rows.size(), 1u);
  EXPECT_NE(even.rows[0].modeled, uneven.rows[0].modeled);
  expect_error([&] { (void)validate(reference(", stage_layer: [4, 6]"), "refs.yaml"); },
               Errc::parse_error, {"refs.yaml:", "stage_layer"});
  expect_error([&] { (void)validate(reference(", stage_layers: []"), "refs.yaml"); },
               Errc::parse_error, {"stage_layers is empty"});
}

}  // namespace
}  // namespace cocemu::bench
