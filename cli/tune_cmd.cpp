// `cocemu tune`: per-shape CoC choices for a model, written as a customized_coc YAML.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "cocemu/bench/sensitivity.h"
#include "cocemu/bench/tune.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/config.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

/// The --config file's text: a regular file of at most 4 MiB (input_file.h).
std::string read_config(const std::string& path) {
  return read_input_file(path, "--config");
}

/// customized_coc values for `--strategies` names (serial is always a candidate).
std::vector<int> strategy_values(const std::vector<std::string>& names) {
  std::vector<int> values;
  for (const std::string& n : names) {
    if (n == "serial") continue;
    if (n == "fused") {
      values.push_back(-1);
      continue;
    }
    bool ok = false;
    for (const int p : {2, 4, 8})
      if (n == fmt::format("script-p{}", p)) {
        values.push_back(p);
        ok = true;
      }
    COCEMU_CHECK_ARG(ok,
                     "--strategies: '{}' is not allowed; allowed: serial, script-p2, "
                     "script-p4, script-p8, fused",
                     n);
  }
  return values;
}

/// How to use the file: MindSpeed's flags for what it chose, and cocemu's checks.
std::string apply_hint(const bench::TuneResult& t, const std::string& out, const std::string& model,
                       const DeviceProfile& profile, bool at_layout) {
  bool fused = false;
  std::map<int, int> splits;
  for (const auto& ch : t.choices) {
    if (ch.value == -1) fused = true;
    if (ch.value > 1) ++splits[ch.value];
  }
  std::string flags = "--use-ascend-coc";
  if (fused) {
    flags += " --coc-fused-kernel";
  } else if (!splits.empty()) {
    int most = 0, count = 0;
    for (const auto& [v, n] : splits)
      if (n > count) {
        most = v;
        count = n;
      }
    flags += fmt::format(" --coc-parallel-num {}", most);
  }
  std::string s = fmt::format("\n# written to {}\n", out);
  if (!fused && splits.empty())
    s += "# every shape is best off (1): MindSpeed's CoC would not help this layer; leave "
         "--use-ascend-coc out\n";
  else
    s += fmt::format(
        "# apply in MindSpeed: copy customized_coc into the coc_cfgs of its CoC user config\n"
        "#   (mindspeed/core/tensor_parallel/lcal_coc/user_config.py) and launch with {}\n",
        flags);
  if (!profile.has_tp_overlap("mindspeed_coc") && !profile.has_tp_overlap("lcoc_fused"))
    s += fmt::format(
        "# note: the profile {} has no MindSpeed CoC (tp_overlap: [{}]); customized_coc is "
        "MindSpeed's (Ascend) setting, tuned here as a what-if\n",
        profile.name, fmt::join(profile.tp_overlap, ", "));
  if (at_layout)
    s += fmt::format(
        "# check in cocemu: cocemu train --dry-run with the run's layout and {} --coc-config {} "
        "(train warns when no GEMM shape of the run matches)\n",
        flags, out);
  else
    s += fmt::format("# check in cocemu: cocemu bench{} --dry-run --coc-config {}\n",
                     model.empty() ? "" : " --model " + model, out);
  return s;
}

}  // namespace

void add_tune(CLI::App& app) {
  struct Opts {
    std::string model, profile = "ascend-910b", base, out = "tuned_coc.yaml", config;
    bool sensitivity = false, no_fused = false, sp = false, no_sp = false;
    std::int64_t mbs = 0, seq = 0, tp = 0, cp = 0, copies = 0;
    std::vector<std::string> strategies;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand(
      "tune",
      "model P = 1/2/4/8 and fused for every CoC GEMM shape of a layer and write the fastest as "
      "a customized_coc YAML (with the reasons); shapes are keyed by the run's layout "
      "(micro-batch, "
      "sequence, tp, sequence parallelism), so tune at the layout the run uses");
  sub->add_option("--model", o->model,
                  "model config (name under configs/models/ or a path); default: bench's layer");
  sub->add_option("--profile", o->profile, "device profile")->capture_default_str();
  sub->add_option("--coc-config", o->base, "base CoC config (its other keys and fused tiling)");
  sub->add_option("--config", o->config,
                  "a `cocemu train` YAML (e.g. plan.winner.yaml): tune at its model and layout");
  number<std::int64_t>(sub, "--micro-batch-size", o->mbs,
                       "the run's micro-batch (sequences, both copies together)", 1, 1 << 20);
  number<std::int64_t>(sub, "--seq-length", o->seq, "the run's sequence length", 1,
                       std::int64_t(1) << 24);
  number<std::int64_t>(sub, "--tensor-model-parallel-size", o->tp, "the run's tp", 1, 1 << 16);
  number<std::int64_t>(sub, "--context-parallel-size", o->cp,
                       "the run's cp (each rank holds seq / cp tokens)", 1, 1 << 16);
  number<std::int64_t>(sub, "--micro-batch-interleave-num", o->copies,
                       "the run's multi-copy (each copy is half the micro-batch)", 1, 2);
  sub->add_flag("--sequence-parallel", o->sp, "the run uses sequence parallelism");
  sub->add_flag("--no-sequence-parallel", o->no_sp, "the run does not");
  sub->add_flag("--no-fused", o->no_fused,
                "script-side splits only (P = 2/4/8), for a MindSpeed without the fused kernels");
  sub->add_option("--strategies", o->strategies,
                  "the candidates besides serial: script-p2, script-p4, script-p8, fused")
      ->delimiter(',');
  sub->add_option("-o,--out", o->out, "the YAML to write")->capture_default_str();
  sub->add_flag("--sensitivity", o->sensitivity,
                "scale each assumption of the profile x0.5 and x2 and report which shapes' "
                "choices flip (fragile ones are marked in the YAML's comments)");
  sub->callback([o, sub] {
    check_output_file("-o", o->out);
    COCEMU_CHECK_ARG(!(o->no_fused && !o->strategies.empty()),
                     "--no-fused and --strategies cannot both be given");
    COCEMU_CHECK_ARG(!(o->sp && o->no_sp),
                     "--sequence-parallel and --no-sequence-parallel cannot both be given");
    std::vector<int> values{2, 4, 8, -1};
    if (o->no_fused) values = {2, 4, 8};
    if (!o->strategies.empty()) values = strategy_values(o->strategies);
    auto given = [&](const char* name) { return sub->count(name) > 0; };
    const bool layout = !o->config.empty() || given("--micro-batch-size") ||
                        given("--seq-length") || given("--tensor-model-parallel-size") ||
                        given("--context-parallel-size") || given("--micro-batch-interleave-num") ||
                        o->sp || o->no_sp;
    bench::BenchConfig c;
    if (layout) {
      // The run's layout, read and checked as `cocemu train` reads it.
      bench::TrainSettings f;
      if (!o->model.empty()) f.model.set(o->model, "--model");
      if (given("--profile")) f.profile.set(o->profile, "--profile");
      if (given("--micro-batch-size")) f.micro_batch_size.set(o->mbs, "--micro-batch-size");
      if (given("--seq-length")) f.seq_length.set(o->seq, "--seq-length");
      if (given("--tensor-model-parallel-size")) f.tp.set(o->tp, "--tensor-model-parallel-size");
      if (given("--context-parallel-size")) f.cp.set(o->cp, "--context-parallel-size");
      if (given("--micro-batch-interleave-num"))
        f.micro_batch_interleave.set(o->copies, "--micro-batch-interleave-num");
      if (o->sp) f.sequence_parallel.set(true, "--sequence-parallel");
      if (o->no_sp) f.sequence_parallel.set(false, "--no-sequence-parallel");
      bench::TrainSettings s = f;
      if (!o->config.empty())
        s = bench::merge_settings(f, bench::parse_train_config(read_config(o->config), o->config));
      COCEMU_CHECK_ARG(s.model.value,
                       "tune at a layout needs the model: --model NAME (or train: model in "
                       "--config)");
      if (!s.tp.value) s.tp.set(8, "tune's default tp");
      // Only the TP group's shapes matter: a world of exactly tp × cp devices, pp 1, dp 1.
      s.pp = {};
      s.dp = {};
      s.stage_layers = {};
      s.stage_offset = {};
      s.first_stage_layers = {};
      s.last_stage_layers = {};
      s.vpp = {};
      s.layers_per_virtual_stage = {};
      s.schedule = {};
      s.global_batch_size = {};
      s.micro_batch_num = {};
      s.gradient_accumulation_steps = {};
      s.pp.set(1, "tune");
      s.dp.set(1, "tune");
      const auto prof = std::make_shared<const DeviceProfile>(
          load_named_profile(s.profile.value.value_or(o->profile)));
      const std::int64_t group = *s.tp.value * s.cp.value.value_or(1);
      s.nodes.set(std::max<std::int64_t>(1, group / prof->topology.devices_per_node), "tune");
      s.dp.set(std::max<std::int64_t>(1, *s.nodes.value * prof->topology.devices_per_node / group),
               "tune");
      std::string source;
      const auto model = bench::load_decoder(*s.model.value, &source);
      const bench::TrainSetup setup = bench::resolve_settings(s, true, model, source, prof);
      c = bench::bench_config_for_run(setup);
      c.model = *s.model.value;
    } else {
      c = bench::bench_config(o->model, o->profile);
    }
    const layers::CocConfig base =
        o->base.empty() ? bench::default_bench_coc() : layers::load_coc_config(o->base);
    bench::TuneResult t = bench::tune(c, base, values);
    std::optional<bench::Sensitivity> sens;
    if (o->sensitivity) {
      sens = bench::sensitivity(*c.profile, [&](std::shared_ptr<const DeviceProfile> p) {
        bench::BenchConfig scaled = c;
        scaled.profile = std::move(p);
        bench::Conclusions out;
        for (const bench::TuneChoice& ch : bench::tune(scaled, base, values).choices)
          out[ch.key + " choice"] = std::to_string(ch.value);
        return out;
      });
      for (bench::TuneChoice& ch : t.choices)
        if (const std::string why = sens->fragile(ch.key + " choice"); !why.empty())
          ch.reason += " [fragile: " + why + "]";
    }
    const std::string yaml = bench::to_yaml(t);
    std::fputs(yaml.c_str(), stdout);
    write_file("-o", o->out, yaml);
    if (sens) std::fputs(bench::format_sensitivity(*sens).c_str(), stdout);
    std::fputs(apply_hint(t, o->out, o->model, *c.profile, layout).c_str(), stdout);
  });
}

}  // namespace cocemu::cli
