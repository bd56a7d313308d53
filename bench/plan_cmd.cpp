// `cocemu plan`: automatic search of a whole-cluster training layout (plan.h).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "cocemu/bench/plan/plan.h"
#include "cocemu/bench/train/train_config.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/error.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

struct PlanOpts {
  std::string model, profile = "ascend-910b", mode = "exhaustive", out_dir = "cocemu-plan-out",
                     json, dtype = "bf16";
  int nodes = 1, threads = 0, top = 5, max_cp = 8, max_vpp = 4;
  std::int64_t global_batch = 0, seq = 0;
  bool no_compare = false, deterministic = false, ce_fusion = false;
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
  const bench::PlanResult res = bench::plan(r);
  std::fputs(bench::format_plan(res).c_str(), stdout);
  std::filesystem::create_directories(o.out_dir);
  const std::string coc = o.out_dir + "/plan.coc.yaml", yaml = o.out_dir + "/plan.winner.yaml",
                    flags = o.out_dir + "/plan.winner.flags";
  // The fused kernels' tiling the plan priced them with, then the choices.
  const layers::CocConfig tiling = bench::plan_coc_config();
  std::string coc_text = fmt::format(
      "# customized_coc per GEMM shape, chosen by cocemu plan (-1 fused, 1 off, 2/4/8 split)\n"
      "tile_rows: {}\ntiles_per_step: {}\ncustomized_coc:\n",
      tiling.tile_rows, tiling.tiles_per_step);
  for (const auto& [key, v] : res.top.front().customized_coc)
    coc_text += fmt::format("  \"{}\": {}\n", key, v);
  if (res.top.front().customized_coc.empty()) coc_text += "  {}\n";
  std::string winner = bench::winner_yaml(res);
  const std::string marker = "coc_config: plan.coc.yaml";
  if (const auto at = winner.find(marker); at != std::string::npos)
    winner.replace(at, marker.size(), "coc_config: " + coc);
  write_file("--out-dir", coc, coc_text);
  write_file("--out-dir", yaml, winner);
  write_file("--out-dir", flags, bench::winner_flags(res) + "\n");
  std::printf(
      "\nwinner as MindFormers YAML (cocemu train --config): %s\n"
      "winner as Megatron/MindSpeed flags: %s\n  %s\n",
      yaml.c_str(), flags.c_str(), bench::winner_flags(res).c_str());
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
      "recompute, distributed optimizer, SP, multi-copy, CoC per GEMM shape); modeled, no "
      "numerics");
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
  sub->add_option("--dtype", o->dtype, "bf16 (default) or f32")->capture_default_str();
  number(sub, "--threads", o->threads, "search threads (0: all cores)", 0, 1024);
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
  sub->callback([o] { run(*o); });
}

}  // namespace cocemu::cli
