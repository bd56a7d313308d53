// `cocemu validate` (R-BE-3): the shipped references cited and within their bounds, published
// training runs and layer times against the modeled ones, the fused CoC gains, the calibration's
// exact accounting (fitted on, same as fit, tested by, untested, assumed layouts), and plan's
// search on published layouts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cocemu/runtime/profile.h"
#include "cocemu/train/validate.h"
#include "testing.h"

namespace cocemu::bench {
namespace {

TEST(Validate, ShippedReferencesAreCitedAndWithinBounds) {
  const Validation v = validate_shipped();
  EXPECT_GE(v.rows.size(), 14u);
  // The cost model's own references (devices, collectives, kernels); the training runs are
  // checked below.
  double max_parts = 0, sum_parts = 0;
  int parts = 0;
  for (const Reference& r : v.rows)
    if (!r.training && !r.gain_row) {
      max_parts = std::max(max_parts, std::fabs(r.delta_pct));
      sum_parts += std::fabs(r.delta_pct);
      ++parts;
    }
  EXPECT_LE(max_parts, 25.0);
  EXPECT_LE(sum_parts / parts, 10.0);
  int ascend = 0, multi_node = 0, tests = 0;
  for (const Reference& r : v.rows) {
    EXPECT_NE(r.source.find("http"), std::string::npos) << r.name;
    EXPECT_GT(r.modeled, 0) << r.name;
    ascend += r.device == "ascend-910b";
    multi_node += r.nodes > 1;
    tests += r.fitted.empty();
  }
  EXPECT_GE(ascend, 3);
  EXPECT_GE(multi_node, 2);
  EXPECT_GT(tests, int(v.rows.size()) / 2) << "most references must only test the model";
  const nlohmann::json j = nlohmann::json::parse(validation_json(v));
  ASSERT_EQ(j["references"].size(), v.rows.size());
  for (const char* key :
       {"name", "kind", "device", "nodes", "source", "published", "modeled", "delta"})
    EXPECT_TRUE(j["references"][0].contains(key)) << key;
  EXPECT_NEAR(j["max_abs_delta"].get<double>(), v.max_abs_delta_pct / 100, 1e-12);
  testing::expect_error(
      [] {
        validate(
            "references:\n  - {name: x, kind: gemm, device: h100-sxm, m: 1, n: 1, "
            "k: 1, dtype: bf16, published: 1, source: s, extra: 1}\n",
            "bad.yaml");
      },
      Errc::parse_error, {"bad.yaml", "extra"});
  testing::expect_error(
      [] {
        validate(
            "references:\n  - {name: x, kind: gemm, device: h100-sxm, m: 1, n: 1, "
            "k: 1, dtype: bf16, published: 1, source: s, fitted: [warp.drive]}\n",
            "fit.yaml");
      },
      Errc::parse_error, {"fit.yaml", "'warp.drive'", "h100-sxm"});
  // An attention reference names its pass and the benchmark's batch and heads.
  testing::expect_error(
      [] {
        validate(
            "references:\n  - {name: x, kind: attention, device: h100-sxm, seq: 4096, batch: 4, "
            "heads: 16, head_dim: 128, causal: true, pass: sideways, dtype: bf16, published: 1, "
            "source: s}\n",
            "pass.yaml");
      },
      Errc::parse_error, {"pass.yaml", "'sideways'", "forward, backward, forward+backward"});
  testing::expect_error(
      [] {
        validate(
            "references:\n  - {name: x, kind: attention, device: h100-sxm, seq: 4096, "
            "head_dim: 128, causal: true, pass: forward, dtype: bf16, published: 1, source: s}\n",
            "heads.yaml");
      },
      Errc::parse_error, {"heads.yaml", "batch"});
}

// R-PL-4: published training runs, each cited, its figure converted to model FLOPs when the
// source counts recompute, modeled by the step model with NCCL's algorithms. The issue's target
// is 15% each and 10% on average; the model does not reach it (README: 21 of 27 within 15%,
// mean 11.1%, worst +46.2%, the H100 rows). What it reaches today is asserted as a regression
// bound, so a change that makes it worse fails. Each row reports its modeled iteration and
// exposed communication, which must add up.
TEST(Validate, PublishedTrainingRuns) {
  const Validation v = validate_shipped();
  int rows = 0, converted = 0, timed = 0, within = 0;
  double sum = 0;
  for (const Reference& r : v.rows) {
    if (!r.training) continue;
    ++rows;
    EXPECT_NE(r.source.find("http"), std::string::npos) << r.name;
    EXPECT_GE(r.nodes, 1) << r.name;
    EXPECT_GT(r.modeled, 0) << r.name;
    EXPECT_GT(r.iteration_ms, 0) << r.name;
    double exposed = 0;
    for (const auto& [kind, ms] : r.exposed_comm_ms)
      exposed += ms;
    EXPECT_LT(exposed, r.iteration_ms) << r.name;
    EXPECT_NE(format_validation(v).find(fmt::format("modeled {:.1f} ms", r.iteration_ms)),
              std::string::npos)
        << r.name;
    if (r.conversion.starts_with("hardware FLOPs")) {
      ++converted;
      // 72(1 + s/6h + V/12lh) / 96(1 + s/6h + V/16lh) is a little over 3/4.
      EXPECT_GT(r.published / r.published_as_stated, 0.75) << r.name;
      EXPECT_LT(r.published / r.published_as_stated, 0.77) << r.name;
    } else if (r.conversion.starts_with("s per iteration")) {
      ++timed;
      // Korthikanti et al.'s 22B run with sequence parallelism and selective recompute: 4
      // sequences of 2048 through 48 layers of h = 6144 (vocabulary 51200) on 8 GPUs in 1.10 s,
      // 72·4·2048·48·6144²·(1 + 2048/36864 + 51200/(12·48·6144)) = 1.1436e15 model FLOPs:
      // 129.95 TFLOP/s per GPU, the README's 41.5% MFU of 312.
      if (r.name.find("22B") != std::string::npos &&
          r.name.find("selective") != std::string::npos) {
        EXPECT_NEAR(r.published, 129.95, 0.01) << r.name;
      }
    }
    sum += std::fabs(r.delta_pct);
    within += std::fabs(r.delta_pct) <= 15.0;
    EXPECT_LE(std::fabs(r.delta_pct), 47.0) << r.name;
  }
  EXPECT_GE(rows, 27);  // both tables whole (9 H100 rows, 10 A100 rows), Korthikanti's 8 runs
  EXPECT_GE(converted, 10);
  EXPECT_GE(timed, 8);
  // Regression guards, not the R-PL-4 target (15% each, 10% mean), which is not met. On the
  // CUDA 11 A100 profile, calibrated on Korthikanti et al.'s per-layer times, all 18 A100 runs
  // are within 11.6%; six of the nine H100 runs model 18-46% faster: 21 of 27 within 15%, mean
  // 11.1%.
  EXPECT_GE(within, 21);
  EXPECT_LE(sum / rows, 11.5);
  // A training reference with an unknown layout key is an error with file:line.
  testing::expect_error(
      [] {
        validate(
            "references:\n  - {name: x, kind: training, device: h100-sxm, gpus: 16, "
            "flops: model, published: 1, source: s, model: {hidden: 64, heads: 4, layers: "
            "2, vocab: 128, seq: 64}, layout: {tp: 1, pp: 1, global_batch_size: 16, "
            "micro_batch_size: 1, recompute: none, sequence_parallel: false, "
            "distributed_optimizer: false, overlap_grad_reduce: true, warp: 9}}\n",
            "train.yaml");
      },
      Errc::parse_error, {"train.yaml", "warp"});
}

// Korthikanti et al. Table 4: one layer of a 22B model, forward and backward, in five settings.
// The step model's layer (price_parts) has the table's structure: sequence parallelism saves
// forward time, a full recompute adds a forward to the backward, a selective one only its core
// attention.
TEST(Validate, PublishedLayerTimes) {
  const Validation v = validate_shipped();
  std::map<std::string, double> ms;
  for (const Reference& r : v.rows) {
    if (r.kind != "layer") continue;
    EXPECT_EQ(r.unit, "ms");
    EXPECT_LE(std::fabs(r.delta_pct), 5.0) << r.name;
    ms[r.name.substr(r.name.find("layer ") + 6)] = r.modeled;
  }
  ASSERT_EQ(ms.size(), 10u);
  auto at = [&](const std::string& pass, const std::string& setting) {
    const std::string key = pass + ", 8x A100, tp8, mbs 4, " + setting;
    EXPECT_TRUE(ms.count(key)) << key;
    return ms[key];
  };
  EXPECT_LT(at("forward", "SP"), at("forward", "no recompute"));
  EXPECT_NEAR(at("backward", "full recompute") - at("backward", "no recompute"),
              at("forward", "no recompute"), 0.05 * at("forward", "no recompute"));
  const double selective = at("backward", "selective recompute") - at("backward", "no recompute");
  EXPECT_GT(selective, 0);
  EXPECT_LT(selective, 0.25 * at("forward", "no recompute"));
  EXPECT_EQ(at("forward", "selective recompute"), at("forward", "no recompute"));
  testing::expect_error(
      [] {
        validate(
            "references:\n  - {name: x, kind: layer, pass: sideways, device: a100-sxm, gpus: 8, "
            "published: 1, source: s, model: {hidden: 64, heads: 4, layers: 2, vocab: 128, "
            "seq: 64}, layout: {tp: 8, pp: 1, global_batch_size: 1, micro_batch_size: 1, "
            "recompute: none, sequence_parallel: false, distributed_optimizer: false, "
            "overlap_grad_reduce: false}}\n",
            "layer.yaml");
      },
      Errc::parse_error, {"layer.yaml", "'sideways'", "forward, backward"});
}

// MindSpeed-LLM's 910B runs (tokens per second per NPU, layouts of its example scripts): the
// profile's in-training rate is fitted on LLaMA2-7B (TP 1: no fused kernel enters it) and tested
// by the five others, each within 20% but GPT3-175B (+24%: measured with May-2024 software, the
// one miss; README). MindSpeed's fused-kernel gains: the step cost fitted on LLaMA2-70B's, the two
// BLOOM gains test it, and the model keeps the published order BLOOM-7B < BLOOM-176B < LLaMA2-70B.
TEST(Validate, AscendTrainingRunsAndFusedKernelGains) {
  const Validation v = validate_shipped();
  int runs = 0, within = 0;
  std::map<std::string, double> gain;
  for (const Reference& r : v.rows) {
    if (r.device != "ascend-910b") continue;
    if (r.kind == "training") {
      ++runs;
      EXPECT_TRUE(r.conversion.starts_with("tokens/s per device")) << r.name;
      EXPECT_LE(std::fabs(r.delta_pct), 25.0) << r.name;
      within += std::fabs(r.delta_pct) <= 20.0;
      if (!r.fitted.empty()) {
        EXPECT_LT(std::fabs(r.delta_pct), 0.5) << r.name;
      }
    } else if (r.kind == "coc_gain") {
      EXPECT_TRUE(r.gain_row);
      EXPECT_LE(std::fabs(r.delta_pct), 4.0) << r.name;  // points
      for (const char* m : {"LLaMA2-70B", "BLOOM-7B", "BLOOM-176B"})
        if (r.name.find(m) != std::string::npos) gain[m] = r.modeled;
      if (!r.fitted.empty()) {
        EXPECT_LT(std::fabs(r.delta_pct), 0.2) << r.name;
      }
    }
  }
  EXPECT_EQ(runs, 6);
  EXPECT_GE(within, 5);
  ASSERT_EQ(gain.size(), 3u);
  EXPECT_LT(gain["BLOOM-7B"], gain["BLOOM-176B"]);
  EXPECT_LT(gain["BLOOM-176B"], gain["LLaMA2-70B"]);
}

// Korthikanti et al. Table 5, as iteration times: the model within 3.5% on average and 8% at
// worst (Calculon, run on the same eight runs: 3.65% and 8.87%).
TEST(Validate, KorthikantiTable5IterationTimes) {
  const Validation v = validate_shipped();
  double sum = 0, worst = 0;
  int n = 0;
  for (const Reference& r : v.rows)
    if (r.training && r.source.find("Korthikanti") != std::string::npos) {
      const double time_error = std::fabs(r.published / r.modeled - 1);
      sum += time_error;
      worst = std::max(worst, time_error);
      ++n;
    }
  ASSERT_EQ(n, 8);
  EXPECT_LE(100 * sum / n, 3.5);
  EXPECT_LE(100 * worst, 8.0);
}

// The reference kinds and conversions the Ascend and gain rows use, on a small model: a
// coc_gain is what `train --compare-coc` reports (serial / fused - 1, from the same two runs a
// training reference models), tokens/s per device converts to the same model TFLOP/s as the
// iteration time it implies, and stage_layers is Megatron's --num-layer-list.
TEST(Validate, GainsAndThroughputConversions) {
  const std::string model =
      "model: {hidden: 256, heads: 8, layers: 4, vocab: 1024, seq: 256}\n    gpus: 16\n"
      "    layout: {tp: 8, pp: 2, stage_layers: [1, 3], micro_batch_size: 1, global_batch_size: 8, "
      "recompute: none, sequence_parallel: true, distributed_optimizer: false, "
      "overlap_grad_reduce: false";
  const std::string yaml =
      "references:\n"
      "  - name: serial\n    kind: training\n    device: ascend-910b\n    " +
      model +
      ", coc: serial}\n    flops: iteration_seconds\n    published: 0.5\n    source: s\n"
      "  - name: fused\n    kind: training\n    device: ascend-910b\n    " +
      model +
      ", coc: fused}\n    flops: iteration_seconds\n    published: 0.5\n    source: s\n"
      "  - name: gain\n    kind: coc_gain\n    device: ascend-910b\n    " +
      model +
      "}\n    published: -1.5\n    source: s\n"
      "  - name: throughput\n    kind: training\n    device: ascend-910b\n    " +
      model +
      ", coc: serial}\n    flops: tokens_per_second_per_device\n    published: 256\n    "
      "source: s\n";
  const Validation v = validate(yaml, "gains.yaml");
  ASSERT_EQ(v.rows.size(), 4u);
  const double serial = v.rows[0].iteration_ms, fused = v.rows[1].iteration_ms;
  EXPECT_NE(serial, fused);
  EXPECT_NEAR(v.rows[2].modeled, 100 * (serial / fused - 1), 1e-9);
  EXPECT_NEAR(v.rows[2].delta_pct, v.rows[2].modeled + 1.5, 1e-9);  // points, not relative
  EXPECT_EQ(v.rows[2].iteration_ms, serial);
  // 8 sequences of 256 tokens at 256 tokens/s on each of 16 devices: 0.5 s per iteration.
  EXPECT_NEAR(v.rows[3].published, v.rows[0].published, 1e-9 * v.rows[0].published);
  EXPECT_NEAR(v.rows[3].iteration_ms, serial, 1e-9);
  testing::expect_error(
      [&] {
        std::string bad = yaml;
        bad.replace(bad.find("stage_layers: [1, 3]"), 20, "stage_layers: [1, x]");
        validate(bad, "stages.yaml");
      },
      Errc::parse_error, {"stages.yaml", "stage_layers", "'x'"});
  testing::expect_error(
      [&] {
        validate("references:\n  - name: gain\n    kind: coc_gain\n    device: ascend-910b\n    " +
                     model + ", coc: fused}\n    published: 1\n    source: s\n",
                 "gain.yaml");
      },
      Errc::parse_error, {"gain.yaml", "coc_gain", "must not set coc"});
  testing::expect_error(
      [&] {
        validate(
            "references:\n  - {name: x, kind: gemm, device: h100-sxm, m: 1, n: 1, k: 1, "
            "dtype: bf16, published: -1, source: s}\n",
            "neg.yaml");
      },
      Errc::parse_error, {"published -1", "must be positive"});
}

// validate names, for each fitted parameter, what it was fitted on and what tests it: the other
// references of its profile and kind that fit nothing, those naming it under `tests:`, and, for
// the network's parameters, only references that span nodes. `--markdown` prints both tables.
TEST(Validate, CalibrationListsFittedOnAndTestedBy) {
  const std::string yaml = R"(references:
  - {name: fit, kind: gemm, device: h100-sxm, m: 4096, n: 4096, k: 4096, dtype: bf16, published: 780, source: s, fitted: [compute.gemm.max_efficiency]}
  - {name: test, kind: gemm, device: h100-sxm, m: 2048, n: 2048, k: 2048, dtype: bf16, published: 630, source: s}
  - {name: other fit, kind: gemm, device: h100-sxm, m: 1024, n: 1024, k: 1024, dtype: bf16, published: 236, source: s, fitted: [compute.gemm.half_efficiency_flops]}
  - {name: other device, kind: gemm, device: a100-sxm, m: 2048, n: 2048, k: 2048, dtype: bf16, published: 250, source: s}
  - {name: named, kind: memory, device: h100-sxm, bytes: 1000000000, counted: moved, published: 2800, source: s, tests: [compute.gemm.max_efficiency]}
  - {name: nic fit, kind: collective, device: h100-sxm, op: reduce_scatter, ranks: 32, bytes: 4294967296, metric: busbw, published: 360, source: s, fitted: [topology.inter_node.bandwidth_efficiency]}
  - {name: in node, kind: collective, device: h100-sxm, op: all_gather, ranks: 8, bytes: 17179869184, metric: busbw, published: 361, source: s}
  - {name: across nodes, kind: collective, device: h100-sxm, op: all_reduce, ranks: 32, bytes: 4294967296, metric: busbw, published: 365, source: s}
)";
  const Validation v = validate(yaml, "cal.yaml");
  auto find = [&](const std::string& key) {
    for (const Calibration& c : v.calibration)
      if (c.key == key) return c;
    ADD_FAILURE() << key;
    return Calibration{};
  };
  const Calibration gemm = find("compute.gemm.max_efficiency");
  EXPECT_EQ(gemm.device, "h100-sxm");
  EXPECT_DOUBLE_EQ(gemm.value, load_named_profile("h100-sxm").gemm.max_efficiency);
  EXPECT_EQ(gemm.fitted_on, (std::vector<std::size_t>{0}));
  EXPECT_EQ(gemm.tested_by, (std::vector<std::size_t>{1, 4}));
  const Calibration nic = find("topology.inter_node.bandwidth_efficiency");
  EXPECT_EQ(nic.tested_by, (std::vector<std::size_t>{7}));
  const std::string md = format_markdown(v);
  EXPECT_NE(md.find("| profile | parameter | value | rows: fitted on / same as fit / tested by | "
                    "fitted on | same as fit | tested by |"),
            std::string::npos);
  EXPECT_NE(md.find("| h100-sxm | `compute.gemm.max_efficiency` | 0.8433 | 1 / 0 / 2 | #1 fit (+"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 2 | test | h100-sxm | TFLOPS |"), std::string::npos) << md;
  EXPECT_NE(md.find("| h100-sxm | `compute.gemm.half_efficiency_flops` | 5.6e+09 | 1 / 0 / 1 | "
                    "#3 other fit (-2.0%) | — | #2 test (-0.1%) |"),
            std::string::npos)
      << md;
  const std::string text = format_validation(v);
  EXPECT_NE(text.find("    tested by (2): [2] "), std::string::npos) << text;
  EXPECT_NE(text.find("3 fitted parameters, 0 untested"), std::string::npos) << text;
  EXPECT_EQ(text.find("UNTESTED"), std::string::npos) << text;
  testing::expect_error(
      [] {
        validate(
            "references:\n  - {name: x, kind: gemm, device: h100-sxm, m: 1, n: 1, k: 1, "
            "dtype: bf16, published: 1, source: s, tests: [warp.drive]}\n",
            "tests.yaml");
      },
      Errc::parse_error, {"tests.yaml", "tested parameter 'warp.drive'", "h100-sxm"});
}

// The same-as-fit rule (issue 44 item 4): a row that would test a parameter but repeats the
// model and layout of one of its fitted-on rows is that fit again. The rule is the run's
// signature — model shape, parallel degrees, micro-batch, recompute, sequence parallelism — not
// the global batch, the overlap switches or the CoC mode; a parameter left with only such rows
// is untested, and a row that only repeats fits leaves the mean over tests.
TEST(Validate, ARowRepeatingAFittedRunIsSameAsFitNotATest) {
  const std::string model =
      "    model: {hidden: 1024, heads: 8, layers: 4, vocab: 4096, seq: 1024}\n    gpus: 8\n";
  const std::string base =
      "tp: 8, pp: 1, recompute: none, sequence_parallel: false, distributed_optimizer: false, "
      "coc: serial";
  auto row = [&](const std::string& name, const std::string& kind, const std::string& extra,
                 const std::string& layout) {
    return "  - name: " + name + "\n    kind: " + kind + "\n    device: a100-sxm-cuda11\n" + extra +
           model + "    layout: {" + base + ", " + layout + "}\n" +
           (kind == "training" ? "    flops: model\n    published: 100\n"
                               : "    pass: forward\n    published: 1\n") +
           "    source: s\n";
  };
  const std::string fit =
      row("layer fit", "layer", "    fitted: [compute.gemm.max_efficiency]\n",
          "micro_batch_size: 2, global_batch_size: 2, overlap_grad_reduce: false");
  const std::string tests = "    tests: [compute.gemm.max_efficiency]\n";
  // The fit's run with another global batch and overlap: the same run.
  const std::string same =
      row("same run", "training", tests,
          "micro_batch_size: 2, global_batch_size: 8, overlap_grad_reduce: true");
  const std::string other = row("other micro-batch", "training", tests,
                                "micro_batch_size: 1, global_batch_size: 8, "
                                "overlap_grad_reduce: false");
  const Validation v = validate("references:\n" + fit + same + other, "same.yaml");
  ASSERT_EQ(v.calibration.size(), 1u);
  const Calibration& c = v.calibration[0];
  EXPECT_EQ(c.fitted_on, (std::vector<std::size_t>{0}));
  EXPECT_EQ(c.same_as_fit, (std::vector<std::size_t>{1}));
  EXPECT_EQ(c.tested_by, (std::vector<std::size_t>{2}));
  EXPECT_FALSE(c.untested());
  EXPECT_FALSE(v.rows[1].run_signature.empty());
  EXPECT_EQ(v.rows[1].run_signature, v.rows[0].run_signature);
  EXPECT_NE(v.rows[2].run_signature, v.rows[0].run_signature);
  EXPECT_EQ(v.rows[1].repeats_fit, (std::vector<std::size_t>{0}));
  EXPECT_TRUE(v.rows[2].repeats_fit.empty());
  EXPECT_FALSE(v.is_test_row(0));
  EXPECT_FALSE(v.is_test_row(1));
  EXPECT_TRUE(v.is_test_row(2));
  EXPECT_DOUBLE_EQ(v.mean_abs_delta_tests_pct, std::fabs(v.rows[2].delta_pct));
  EXPECT_NE(format_validation(v).find("[same as fit: the run of [1]]"), std::string::npos);
  const std::string md = format_markdown(v);
  EXPECT_NE(md.find("| same as fit #1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1 / 1 / 1 |"), std::string::npos) << md;
  const nlohmann::json j = nlohmann::json::parse(validation_json(v));
  EXPECT_EQ(j["calibration"][0]["same_as_fit"], nlohmann::json::array({2}));
  EXPECT_EQ(j["calibration"][0]["tested_by"], nlohmann::json::array({3}));
  EXPECT_EQ(j["references"][1]["same_as_fit"], nlohmann::json::array({1}));

  // With only repeats of the fit left, the parameter is untested, in every output.
  const Validation only = validate("references:\n" + fit + same, "only.yaml");
  ASSERT_EQ(only.calibration.size(), 1u);
  EXPECT_TRUE(only.calibration[0].tested_by.empty());
  EXPECT_TRUE(only.calibration[0].untested());
  EXPECT_NE(format_validation(only).find("UNTESTED"), std::string::npos);
  EXPECT_NE(format_validation(only).find("1 fitted parameters, 1 untested: a100-sxm-cuda11 "
                                         "compute.gemm.max_efficiency"),
            std::string::npos);
  EXPECT_NE(format_markdown(only).find("| **untested** |"), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(validation_json(only))["calibration"][0]["untested"]);
}

// A layout no source states is an `assumption:` with its reason, shown in every output; a
// coc_gain with an assumed layout reports its modeled gain over `plausible_layouts:` (fields
// over the row's layout; the row's own first), and those need the assumption.
TEST(Validate, AssumedLayoutsAndTheGainsRangeOverPlausibleLayouts) {
  const std::string head =
      "references:\n  - name: gain\n    kind: coc_gain\n    device: ascend-910b\n"
      "    model: {hidden: 1024, heads: 8, layers: 4, vocab: 4096, seq: 1024}\n    gpus: 16\n"
      "    layout: {tp: 8, pp: 2, micro_batch_size: 1, global_batch_size: 8, recompute: none, "
      "sequence_parallel: true, distributed_optimizer: false, overlap_grad_reduce: false}\n"
      "    published: 3\n    source: s\n";
  const std::string why = "    assumption: the source gives the gain and TP 8 only\n";
  const std::string alts =
      "    plausible_layouts:\n      - {micro_batch_size: 1}\n"
      "      - {sequence_parallel: false}\n      - {micro_batch_size: 2}\n";
  const Validation v = validate(head + why + alts, "assumed.yaml");
  const Reference& r = v.rows.at(0);
  EXPECT_EQ(r.assumption, "the source gives the gain and TP 8 only");
  ASSERT_EQ(r.plausible_gains.size(), 4u);
  EXPECT_EQ(r.plausible_gains[0], r.modeled);
  EXPECT_EQ(r.plausible_gains[1], r.modeled);  // the row's own layout again: the same gain
  EXPECT_NE(r.plausible_gains[2], r.modeled);  // without sequence parallelism: another run
  const auto [lo, hi] = std::minmax_element(r.plausible_gains.begin(), r.plausible_gains.end());
  const std::string range = fmt::format("{:+.2f} to {:+.2f}%", *lo, *hi);
  const std::string md = format_markdown(v);
  EXPECT_NE(md.find("| 1 | gain | +3.00% | " + fmt::format("{:+.2f}%", r.modeled) + " | " + range +
                    " | 4 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("; *layout assumed* |"), std::string::npos) << md;
  EXPECT_NE(md.find("## Assumed layouts"), std::string::npos) << md;
  EXPECT_NE(md.find("- #1 gain: the source gives the gain and TP 8 only"), std::string::npos) << md;
  const std::string text = format_validation(v);
  EXPECT_NE(text.find("[layout assumed]"), std::string::npos) << text;
  EXPECT_NE(text.find(range + " over 4 plausible layouts"), std::string::npos) << text;
  EXPECT_NE(text.find("[1] the source gives the gain and TP 8 only"), std::string::npos) << text;
  const nlohmann::json j = nlohmann::json::parse(validation_json(v));
  EXPECT_EQ(j["references"][0]["assumption"], r.assumption);
  EXPECT_EQ(j["references"][0]["plausible_gains"].size(), 4u);
  // No assumption: no section, no marker.
  const Validation plain = validate(head, "plain.yaml");
  EXPECT_TRUE(plain.rows[0].plausible_gains.empty());
  EXPECT_EQ(format_markdown(plain).find("Assumed layouts"), std::string::npos);
  EXPECT_EQ(format_validation(plain).find("[layout assumed]"), std::string::npos);
  testing::expect_error([&] { validate(head + why + "    plausible_layouts: []\n", "none.yaml"); },
                        Errc::parse_error, {"none.yaml", "plausible_layouts is empty"});
  testing::expect_error(
      [&] { validate(head + why + "    plausible_layouts:\n      - {tp: 3}\n", "tp.yaml"); },
      Errc::parse_error, {"tp.yaml", "plausible_layouts[0]", "divisible by tp·pp·cp = 6"});
  testing::expect_error([&] { validate(head + alts, "noreason.yaml"); }, Errc::parse_error,
                        {"noreason.yaml", "plausible_layouts needs `assumption:`"});
  testing::expect_error([&] { validate(head + "    assumption: ''\n", "empty.yaml"); },
                        Errc::parse_error, {"empty.yaml", "assumption is empty"});
  testing::expect_error(
      [&] { validate(head + why + "    plausible_layouts:\n      - {coc: fused}\n", "coc.yaml"); },
      Errc::parse_error, {"coc.yaml", "plausible_layouts[0]", "must not set coc"});
  testing::expect_error(
      [&] { validate(head + why + "    plausible_layouts:\n      - {warp: 9}\n", "key.yaml"); },
      Errc::parse_error, {"key.yaml", "warp"});
}

// The shipped references' accounting, exactly (issue 44 item 4): the parameters fitted on
// several rows, the three untested 910B parameters, Korthikanti et al.'s Table 5 22B runs as
// repeats of the Table 4 layer fit, and the assumed layouts (the fused CoC gains, Korthikanti
// et al.'s pipelines). Every parameter's three lists are disjoint and cover only its profile.
TEST(Validate, ShippedCalibrationAccountingIsExact) {
  const Validation v = validate_shipped();
  std::map<std::string, const Calibration*> cal;
  for (const Calibration& c : v.calibration) {
    cal[c.device + " " + c.key] = &c;
    std::vector<std::size_t> all = c.fitted_on;
    all.insert(all.end(), c.same_as_fit.begin(), c.same_as_fit.end());
    all.insert(all.end(), c.tested_by.begin(), c.tested_by.end());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << c.key;
    for (std::size_t i : all)
      EXPECT_EQ(v.rows.at(i).device, c.device) << c.key;
    EXPECT_EQ(c.untested(), c.tested_by.empty());
  }
  auto counts = [&](const std::string& key) {
    const auto it = cal.find(key);
    if (it == cal.end()) {
      ADD_FAILURE() << key;
      return std::array<std::size_t, 3>{};
    }
    return std::array<std::size_t, 3>{it->second->fitted_on.size(), it->second->same_as_fit.size(),
                                      it->second->tested_by.size()};
  };
  using C = std::array<std::size_t, 3>;
  EXPECT_EQ(counts("h100-sxm topology.inter_node.bandwidth_efficiency"), (C{2, 0, 1}));
  EXPECT_EQ(counts("a100-sxm-cuda11 compute.gemm.max_efficiency"), (C{10, 2, 16}));
  EXPECT_EQ(counts("a100-sxm-cuda11 memory.in_training_efficiency"), (C{4, 1, 17}));
  EXPECT_EQ(counts("h100-sxm compute.gemm.half_efficiency_flops"), (C{6, 0, 1}));
  EXPECT_EQ(counts("ascend-910b fused.step_overhead_ns"), (C{1, 0, 2}));
  std::vector<std::string> untested;
  for (const Calibration& c : v.calibration)
    if (c.untested()) untested.push_back(c.device + " " + c.key);
  std::sort(untested.begin(), untested.end());
  EXPECT_EQ(untested, (std::vector<std::string>{"ascend-910b compute.gemm.max_efficiency",
                                                "ascend-910b compute.peak_flops.f32",
                                                "ascend-910b memory.bandwidth_bytes_per_s"}));
  // The same-as-fit rows are Table 5's 22B runs, each repeating Table 4 rows of its layout.
  for (std::size_t s : cal.at("a100-sxm-cuda11 compute.gemm.max_efficiency")->same_as_fit) {
    EXPECT_TRUE(v.rows[s].name.starts_with("GPT 22B, 8x A100")) << v.rows[s].name;
    EXPECT_EQ(v.rows[s].kind, "training");
    ASSERT_FALSE(v.rows[s].repeats_fit.empty());
    for (std::size_t f : v.rows[s].repeats_fit)
      EXPECT_EQ(v.rows[f].kind, "layer") << v.rows[f].name;
  }
  // Assumed layouts: every fused gain (with its range over plausible layouts, which holds the
  // row's own gain) and every Korthikanti et al. run with a pipeline.
  int gains = 0, pipelines = 0;
  for (const Reference& r : v.rows) {
    if (r.kind == "coc_gain") {
      ++gains;
      EXPECT_FALSE(r.assumption.empty()) << r.name;
      ASSERT_GE(r.plausible_gains.size(), 2u) << r.name;
      EXPECT_EQ(r.plausible_gains.front(), r.modeled) << r.name;
    }
    if (r.training && r.source.find("Korthikanti") != std::string::npos &&
        r.training->options.layout.pp > 1) {
      ++pipelines;
      EXPECT_FALSE(r.assumption.empty()) << r.name;
    }
  }
  EXPECT_EQ(gains, 3);
  EXPECT_EQ(pipelines, 6);
  // The Megatron-LM README's H100 table states no micro-batch, recompute or SP.
  int h100 = 0;
  for (const Reference& r : v.rows)
    if (r.source.find("Megatron-LM README, Performance Benchmarking") != std::string::npos) {
      ++h100;
      EXPECT_FALSE(r.assumption.empty()) << r.name;
    }
  EXPECT_EQ(h100, 9);
  const std::string md = format_markdown(v);
  std::size_t marked = 0;
  for (std::size_t at = md.find("**untested**"); at != std::string::npos;
       at = md.find("**untested**", at + 1))
    ++marked;
  EXPECT_EQ(marked, untested.size() + 1) << md;  // each row, and the prose above the table
  EXPECT_NE(md.find("## Fused CoC gains over plausible layouts"), std::string::npos);
  EXPECT_NE(md.find("3 are **untested**"), std::string::npos);
}

// validate --plan: for each published run, plan on the same cluster and batch; the published
// layout's MFU beside the best's (both priced as plan prices candidates, so the best is never
// below it), and the best's TP overlap is its platform's (no Ascend kernel on an NVIDIA profile).
TEST(Validate, PlanReportsThePublishedLayoutsMfuBesideItsBest) {
  const std::string run =
      "model: {hidden: 1024, heads: 8, layers: 4, vocab: 4096, seq: 1024}\n"
      "    layout: {tp: 2, pp: 1, micro_batch_size: 1, global_batch_size: 16, recompute: none, "
      "sequence_parallel: true, distributed_optimizer: false, overlap_grad_reduce: true, coc: "
      "fused}\n    flops: model\n    published: 100\n    source: s\n";
  Validation v = validate(
      "references:\n"
      "  - name: nvidia\n    kind: training\n    device: h100-sxm\n    gpus: "
      "16\n    " +
          run +
          "  - name: ascend\n    kind: training\n    device: ascend-910b\n    "
          "gpus: 8\n    " +
          run,
      "plan.yaml");
  plan_training(v, 1);
  for (const Reference& r : v.rows) {
    EXPECT_FALSE(std::isnan(r.plan_published_mfu)) << r.name;
    EXPECT_GT(r.plan_published_mfu, 0) << r.name;
    EXPECT_GE(r.plan_best_mfu, r.plan_published_mfu * (1 - 1e-9)) << r.name;
    EXPECT_FALSE(r.plan_best_overlap.empty()) << r.name;
  }
  EXPECT_TRUE(v.rows[0].plan_best_overlap == "none" ||
              v.rows[0].plan_best_overlap == "te_userbuffers")
      << v.rows[0].plan_best_overlap;
  EXPECT_EQ(v.rows[1].plan_best_overlap.find("te_userbuffers"), std::string::npos)
      << v.rows[1].plan_best_overlap;
  const std::string table = format_plan_check(v);
  EXPECT_NE(table.find("its MFU"), std::string::npos) << table;
  EXPECT_NE(table.find(fmt::format("{:.1f}%", 100 * v.rows[0].plan_best_mfu)), std::string::npos)
      << table;
  const nlohmann::json j = nlohmann::json::parse(validation_json(v));
  EXPECT_NEAR(j["references"][1]["plan_published_mfu"].get<double>(), v.rows[1].plan_published_mfu,
              1e-12);
}

// A published uneven partition (MindSpeed-LLM's --num-layer-list, Bloom-176B's 70 layers on
// pp 12) where no even split is valid: validate --plan searches balanced partitions rather than
// failing with every candidate pruned.
TEST(Validate, PlanSearchesUnevenPartitionsForAnUnevenPublishedLayout) {
  Validation v = validate(
      "references:\n"
      "  - name: uneven\n    kind: training\n    device: ascend-910b\n    gpus: 16\n"
      "    model: {hidden: 1024, heads: 8, layers: 7, vocab: 4096, seq: 1025}\n"
      "    layout: {tp: 8, pp: 2, stage_layers: [3, 4], micro_batch_size: 1, "
      "global_batch_size: 3, recompute: none, sequence_parallel: false, "
      "distributed_optimizer: false, overlap_grad_reduce: true, coc: serial}\n"
      "    flops: model\n    published: 100\n    source: s\n",
      "uneven.yaml");
  plan_training(v, 1);
  EXPECT_FALSE(std::isnan(v.rows[0].plan_published_mfu)) << v.rows[0].plan_best;
  EXPECT_GE(v.rows[0].plan_best_mfu, v.rows[0].plan_published_mfu * (1 - 1e-9));
}

}  // namespace
}  // namespace cocemu::bench
