// `cocemu plan`: automatic search of a whole-cluster training layout (plan.h).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "cocemu/bench/limits/estimate.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/error.h"
#include "cocemu/train/config.h"
#include "cocemu/train/plan.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

struct PlanOpts {
  std::string model, profile = "ascend-910b", mode = "exhaustive", out_dir = "cocemu-plan-out",
                     json, dtype = "bf16";
  int nodes = 1, threads = 0, top = 5, max_cp = 8, max_vpp = 4;
  std::int64_t global_batch = 0, seq = 0;
  bool no_compare = false, deterministic = false, ce_fusion = false;
  double max_seconds = 0;
};

void run(const PlanOpts& o) {
  COCEMU_CHECK_ARG(!o.model.empty(),
                   "plan: --model is required (a name under configs/models/ or "
                   "a path)");
  check_output_dir("--out-dir", o.out_dir);
  if (!o.json.empty()) check_output_file("--json", o.json);
  bench::PlanQuery r;
  r.model = bench::load_decoder(o.model);
  if (o.seq > 0) r.model.seq = o.seq;
  r.model_name = o.model;
  r.profile = std::make_shared<const DeviceProfile>(load_named_profile(o.profile));
  r.profile_name = o.profile;
  r.nodes = o.nodes;
  r.global_batch = o.global_batch;
  r.dtype = parse_dtype(o.dtype);
  r.mode = bench::parse_search_mode(o.mode);
  r.threads = o.threads;
  r.top_k = o.top;
  r.max_cp = o.max_cp;
  r.max_vpp = o.max_vpp;
  r.compare_heuristic = !o.no_compare;
  r.deterministic = o.deterministic;
  r.cross_entropy_fusion = o.ce_fusion;
  check_estimate(
      bench::estimate_plan(r, fmt::format("plan --model {} --nodes {}", o.model, o.nodes)),
      time_budget(o.max_seconds));
  const bench::PlanResult res = bench::plan(r);
  std::fputs(bench::format_plan(res).c_str(), stdout);
  if (!res.threads_note.empty())
    std::fprintf(stderr, "cocemu plan: note: %s\n", res.threads_note.c_str());
  std::filesystem::create_directories(o.out_dir);
  const std::string yaml = o.out_dir + "/plan.winner.yaml",
                    flags = o.out_dir + "/plan.winner.flags";
  // Each CoC file sits beside what names it; none is written (and a stale one is removed) when
  // the layout overlaps nothing.
  auto coc_file = [&](const std::string& name, const bench::PlanCandidate& c) {
    const std::string path = o.out_dir + "/" + name, text = bench::winner_coc_yaml(res, c);
    if (!text.empty())
      write_file("--out-dir", path, text);
    else
      std::filesystem::remove(path);
  };
  coc_file("plan.coc.yaml", res.top.front());
  if (res.flags_winner) coc_file("plan.flags.coc.yaml", *res.flags_winner);
  write_file("--out-dir", yaml, bench::winner_yaml(res));
  const std::string line = bench::winner_flags(res);
  write_file("--out-dir", flags, line + "\n");
  std::printf(
      "\nwinner as MindFormers YAML (with cocemu's train: section): %s\n"
      "  check: cocemu train --config %s --dry-run --engine priced\n"
      "winner as %s flags: %s\n  %s\n"
      "  check: %s\n",
      yaml.c_str(), yaml.c_str(),
      r.profile->has_tp_overlap("mindspeed_coc") || r.profile->has_tp_overlap("lcoc_fused")
          ? "Megatron-LM + MindSpeed"
          : "Megatron-LM",
      flags.c_str(), line.c_str(), bench::winner_train_command(res, o.out_dir).c_str());
  if (!o.json.empty()) {
    write_file("--json", o.json, bench::to_json(res).dump(2) + "\n");
    std::printf("json: %s\n", o.json.c_str());
  }
}

}  // namespace

void add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "search a training layout for a whole cluster (tp, cp, pp, vpp, dp, micro-batch, "
      "recompute, distributed optimizer, SP, multi-copy, and the TP overlap the profile's platform "
      "has); modeled, no numerics. Writes the winner as a MindFormers YAML (semi-auto "
      "parallel: gradients_mean false, runner_config.batch_size one copy) and as Megatron-LM / "
      "MindSpeed flags");
  sub->add_option("--model", o->model, "model (name under configs/models/ or path)")->required();
  sub->add_option("--profile", o->profile, "device profile (name under configs/devices/ or path)")
      ->capture_default_str();
  number(sub, "--nodes", o->nodes, "nodes (× the profile's devices per node)", 1, 4096);
  number(sub, "--global-batch", o->global_batch, "global batch (sequences per iteration)",
         std::int64_t(1), std::int64_t(1) << 30)
      ->required();
  number(sub, "--seq", o->seq, "sequence length (default: the model config's)", std::int64_t(0),
         std::int64_t(1) << 24);
  sub->add_option("--search-mode", o->mode,
                  "exhaustive (default), dynamic_programming (balanced layer-to-stage partition), "
                  "recursive_programming (fast heuristic)")
      ->capture_default_str();
  sub->add_option("--dtype", o->dtype, "bf16 (default) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  number(sub, "--threads", o->threads,
         "search threads (0: all cores; more than the cores oneTBB can use are capped, and the "
         "report says so)",
         0, 1024);
  number(sub, "--top", o->top, "candidates in the table", 1, 1000);
  number(sub, "--max-cp", o->max_cp, "largest context-parallel size searched", 1, 1024);
  number(sub, "--max-vpp", o->max_vpp, "largest virtual pipeline size searched", 1, 64);
  sub->add_flag("--no-heuristic-compare", o->no_compare,
                "skip the recursive_programming comparison");
  sub->add_flag("--deterministic", o->deterministic,
                "price rank-ordered collectives (cocemu's deterministic mode) instead of "
                "NCCL/HCCL's algorithms");
  sub->add_flag("--cross-entropy-loss-fusion", o->ce_fusion,
                "price every candidate with Megatron's fused cross-entropy (its default is "
                "unfused)");
  sub->add_option("--out-dir", o->out_dir, "where the winner's files go")->capture_default_str();
  sub->add_option("--json", o->json, "write candidates[], pruned, best as JSON");
  max_seconds_option(sub, o->max_seconds);
  sub->callback([o] { run(*o); });
}

}  // namespace cocemu::cli
