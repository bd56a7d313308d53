// `cocemu bench` and `cocemu train` tell one story (issue 44): for a model config's layer — its
// shapes, attention kind, TP, sequence parallelism and micro-batch — the layer's forward+backward
// time bench reports under each CoC strategy is the layer time train composes its iteration from
// (emulate_parts: the same layer emulated inside a step; price_parts: the step model's prices),
// and so are the CoC gains over serial.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "cocemu/bench/layer_bench.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/config.h"
#include "cocemu/train/part_model.h"

namespace cocemu::bench {
namespace {

/// bench's strategy name → train's --coc value.
const std::map<std::string, std::string> kCoc{{"serial", "serial"},
                                              {"script P=2", "script-p2"},
                                              {"script P=4", "script-p4"},
                                              {"script P=8", "script-p8"},
                                              {"fused", "fused"}};

TrainSetup train_setup(const layers::ModelConfig& m, const std::string& coc) {
  TrainSettings s;
  s.model.set(m.name, "--model");
  s.profile.set("ascend-910b", "--profile");
  s.tp.set(m.tensor_model_parallel_size, "--tensor-model-parallel-size");
  s.sequence_parallel.set(m.sequence_parallel, "--sequence-parallel");
  s.micro_batch_size.set(m.micro_batch_size, "--micro-batch-size");
  s.global_batch_size.set(m.micro_batch_size, "--global-batch-size");
  s.nodes.set(1, "--nodes");
  s.dtype.set("bf16", "--dtype");
  s.coc.set(coc, "--coc");
  return resolve_settings(s, true);
}

class BenchAndTrain : public ::testing::TestWithParam<const char*> {};

TEST_P(BenchAndTrain, ReportTheSameLayerUnderEachCocStrategy) {
  const layers::ModelConfig m = layers::load_model_config(GetParam());
  BenchConfig c = bench_config(m.name, "ascend-910b");
  c.dry_run = true;
  c.repeats = 1;
  const BenchResult bench = run_bench(c);
  ASSERT_EQ(bench.strategies.size(), kCoc.size());
  // Inside a step the host has issued the layer's first ops while the embedding ran; bench's
  // standalone layer starts with the host one launch ahead of the device, so the forward's first
  // kernels may wait for their launch: by at most one launch (script-side or fused).
  const double launch =
      std::max(c.profile->launch_overhead_ns, c.profile->fused_launch_overhead_ns);
  double bench_serial = 0, emulated_serial = 0, priced_serial = 0;
  for (const StrategyResult& r : bench.strategies) {
    SCOPED_TRACE(m.name + " " + r.name);
    const TrainSetup t = train_setup(m, kCoc.at(r.name));
    EXPECT_EQ(t.options.layout.tp, c.tp);
    const StepParts emulated = emulate_parts(t), priced = price_parts(t);
    const double bench_ns = r.forward_device_ns + r.backward_device_ns;
    const double emulated_ns = emulated.layer_fwd.ns + emulated.layer_bwd.ns;
    const double priced_ns = priced.layer_fwd.ns + priced.layer_bwd.ns;
    EXPECT_GT(r.forward_device_ns, 0);
    EXPECT_GT(r.backward_device_ns, 0);
    EXPECT_LE(double(r.modeled_ns), bench_ns + 2 * launch) << "the standalone layer's makespan";
    // The backward is the same ops on the same timeline; the forward of the standalone layer may
    // wait for its first launches once more than inside a step (the host is not ahead yet).
    EXPECT_NEAR(r.backward_device_ns, emulated.layer_bwd.ns, 2);
    EXPECT_NEAR(r.forward_device_ns, emulated.layer_fwd.ns, launch + 2);
    EXPECT_LE(std::abs(bench_ns - emulated_ns), launch + 4)
        << "bench " << bench_ns << " ns, train (emulated parts) " << emulated_ns << " ns";
    EXPECT_LE(std::abs(priced_ns / bench_ns - 1), 0.005)
        << "bench " << bench_ns << " ns, train (priced parts) " << priced_ns << " ns";
    if (r.name == "serial") {
      bench_serial = bench_ns;
      emulated_serial = emulated_ns;
      priced_serial = priced_ns;
      continue;
    }
    // The CoC gain over serial, in percent: bench's is the one train composes (with each layer
    // time within `launch`, the gain S/F - 1 moves by at most launch·(1 + S/F)/F).
    const double gain = 100 * (bench_serial / bench_ns - 1);
    const double gain_bound = 100 * (launch + 4) * (1 + bench_serial / bench_ns) / bench_ns;
    EXPECT_NEAR(100 * (emulated_serial / emulated_ns - 1), gain, gain_bound);
    EXPECT_NEAR(100 * (priced_serial / priced_ns - 1), gain, 1.0);
  }
}

// BLOOM-7B as MindSpeed-LLM trains it (unfused attention, softmax in f32, micro-batch 4), and
// the LLaMA2-70B and GPT3-175B layers (flash attention, GQA and not).
INSTANTIATE_TEST_SUITE_P(Models, BenchAndTrain,
                         ::testing::Values("bloom-7b-mindspeed", "llama2-70b", "gpt3-175b"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace cocemu::bench
