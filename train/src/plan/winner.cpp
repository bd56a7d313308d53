// `cocemu plan`'s winner in the forms other tools read (plan.h): a MindFormers YAML with
// cocemu's train: section, Megatron-LM / MindSpeed flags for the profile's platform, the CoC file
// they name, and the `cocemu train` command that checks them.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "cocemu/runtime/error.h"
#include "cocemu/train/plan.h"

namespace cocemu::bench {

using layers::train::Recompute;
using layers::train::TrainLayout;

namespace {

/// A name stays a name; a path is written absolute, so the YAML works from any directory.
std::string portable(const std::string& name_or_path) {
  const bool path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".yaml") == 0);
  return path ? std::filesystem::absolute(name_or_path).lexically_normal().string() : name_or_path;
}

/// Whether the profile's platform runs MindSpeed (Ascend) rather than Megatron-LM alone.
bool mindspeed_platform(const DeviceProfile& p) {
  return p.has_tp_overlap("mindspeed_coc") || p.has_tp_overlap("lcoc_fused");
}

/// Whether a candidate's per-shape CoC choices overlap anything (some value other than 1).
bool uses_coc(const PlanCandidate& c) {
  if (c.layout.tp == 1) return false;
  return std::any_of(c.customized_coc.begin(), c.customized_coc.end(),
                     [](const auto& kv) { return kv.second != 1; });
}

std::string join_layers(const std::vector<std::int64_t>& v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i)
    s += fmt::format("{}{}", i ? sep : "", v[i]);
  return s;
}

}  // namespace

std::string tp_overlap_summary(const DeviceProfile& p) {
  if (p.has_tp_overlap("te_userbuffers"))
    return "Megatron-LM's --tp-comm-overlap (Transformer Engine userbuffers) for every TP linear, "
           "or none; priced by the fused-kernel pipeline with the profile's fused: steps "
           "(Transformer Engine's split GEMMs)";
  std::vector<std::string> m;
  if (p.has_tp_overlap("mindspeed_coc")) m.push_back("MindSpeed's script CoC P = 2/4/8");
  if (p.has_tp_overlap("lcoc_fused")) m.push_back("the LCOC fused kernels");
  if (m.empty()) return "none (the profile's tp_overlap is empty)";
  return fmt::format("per GEMM shape, off or {} (customized_coc)", fmt::join(m, " or "));
}

std::string flags_coc_file(const PlanResult& r) {
  return r.flags_winner ? "plan.flags.coc.yaml" : "plan.coc.yaml";
}

const PlanCandidate& flags_candidate(const PlanResult& r) {
  COCEMU_CHECK_ARG(!r.top.empty(), "plan: no winner to write");
  return r.flags_winner ? *r.flags_winner : r.top[0];
}

std::string winner_coc_yaml(const PlanResult& r, const PlanCandidate& c) {
  if (!uses_coc(c)) return "";
  const layers::CocConfig tiling = plan_coc_config();
  std::string s = fmt::format(
      "# customized_coc per GEMM shape \"[m, k, n]\" (m: tokens, gathered under SP), chosen by "
      "cocemu plan for\n# {} on {}: -1 fused, 1 off, 2/4/8 script split.\n"
      "# MindSpeed reads customized_coc from the coc_cfgs of its CoC user config\n"
      "# (mindspeed/core/tensor_parallel/lcal_coc/user_config.py): copy the entries there and run\n"
      "# with the flags in plan.winner.flags. tile_rows and tiles_per_step are cocemu's "
      "fused-kernel\n"
      "# tiling, as priced.\n"
      "tile_rows: {}\ntiles_per_step: {}\ncustomized_coc:\n",
      c.describe(), r.request.profile->name, tiling.tile_rows, tiling.tiles_per_step);
  for (const auto& [key, v] : c.customized_coc)
    s += fmt::format("  \"{}\": {}\n", key, v);
  return s;
}

std::string winner_yaml(const PlanResult& r) {
  COCEMU_CHECK_ARG(!r.top.empty(), "plan: no winner to write");
  const PlanCandidate& c = r.top[0];
  const TrainLayout& l = c.layout;
  const std::int64_t m = l.micro_batches();
  std::string s = fmt::format(
      "# cocemu plan's winner: {}\n"
      "# modeled {:.1f} ms per iteration, {:.1f}% MFU on {} × {} {}.\n"
      "# Reproduce: cocemu train --config THIS_FILE --dry-run --engine priced (paths in it are\n"
      "# relative to this file; --engine priced prices the step as plan did).\n"
      "# The sections before train: are MindFormers' (semi-auto parallel), with its names and\n"
      "# meaning: runner_config.batch_size is one copy of a micro-batch; with pipeline_stage 1 "
      "the\n"
      "# micro-batches are gradient_accumulation_steps; gradients_mean false because the loss is\n"
      "# already the mean over the global batch. Merge them into the model's MindFormers config.\n"
      "# train: is cocemu's own.\n",
      c.describe(), double(c.report.iteration_ns) / 1e6, 100 * c.report.mfu, r.request.nodes,
      r.request.profile->topology.devices_per_node, r.request.profile->name);
  s += fmt::format(
      "parallel:\n  parallel_mode: 1  # semi-auto\n"
      "  gradients_mean: false  # semi-auto: the loss is the global batch's mean already\n"
      "  enable_parallel_optimizer: {}\n",
      l.distributed_optimizer);
  if (l.vpp > 1)
    s += "  pipeline_config:\n    pipeline_interleave: true\n    pipeline_scheduler: 1f1b\n";
  s += fmt::format(
      "parallel_config:\n  data_parallel: {}\n  model_parallel: {}\n  context_parallel: {}\n"
      "  pipeline_stage: {}\n  use_seq_parallel: {}\n",
      l.dp, l.tp, l.cp, l.pp, l.sequence_parallel);
  if (l.pp > 1) s += fmt::format("  micro_batch_num: {}\n", m);
  if (l.cp > 1)
    s += fmt::format("  context_parallel_algo: {}\n",
                     l.cp_algo == "ulysses_cp_algo" ? "ulysses_cp" : "colossalai_cp");
  s += fmt::format("micro_batch_interleave_num: {}\n", l.micro_batch_interleave);
  s += fmt::format("recompute_config:\n  recompute: {}\n  select_recompute: {}\n",
                   l.recompute == Recompute::full, l.recompute == Recompute::selective);
  s += fmt::format("runner_config:\n  batch_size: {}  # one copy\n",
                   l.micro_batch_size / l.micro_batch_interleave);
  if (l.pp == 1) s += fmt::format("  gradient_accumulation_steps: {}\n", m);
  s += fmt::format("model:\n  model_config:\n    seq_length: {}\n", r.request.model.seq);
  if (l.vpp > 1) s += fmt::format("    pp_interleave_num: {}\n", l.vpp);
  if (!l.stage_layers.empty()) {
    std::vector<std::int64_t> offset;
    for (const auto n : l.stage_layers)
      offset.push_back(n - r.request.model.num_layers / l.pp);
    s += fmt::format(
        "    offset: [{}]  # layers per stage {} (num_layers / pipeline_stage + offset)\n",
        join_layers(offset, ", "), join_layers(l.stage_layers, "/"));
  }
  s += fmt::format("train:\n  model: {}\n  profile: {}\n  nodes: {}\n  dtype: {}\n",
                   portable(r.request.model_name), portable(r.request.profile_name),
                   r.request.nodes, name_of(l.dtype));
  if (l.overlap_param_gather) s += "  overlap_param_gather: true\n";
  if (l.cross_entropy_fusion) s += "  cross_entropy_loss_fusion: true\n";
  s += fmt::format("  deterministic: {}  # {}\n", r.request.deterministic,
                   r.request.deterministic ? "rank-ordered collectives"
                                           : "NCCL/HCCL's collective algorithms, as priced");
  if (uses_coc(c)) s += "  coc_config: plan.coc.yaml  # customized_coc per GEMM shape\n";
  if (c.tp_comm_overlap)
    s += "  tp_comm_overlap: true  # Megatron-LM --tp-comm-overlap, priced as TE userbuffers run\n";
  return s;
}

std::string winner_flags(const PlanResult& r) {
  const PlanCandidate& c = flags_candidate(r);
  const TrainLayout& l = c.layout;
  const DeviceProfile& p = *r.request.profile;
  std::string s = fmt::format(
      "--tensor-model-parallel-size {} --pipeline-model-parallel-size {} "
      "--context-parallel-size {} --micro-batch-size {} --global-batch-size {} --seq-length {}",
      l.tp, l.pp, l.cp, l.micro_batch_size, l.global_batch_size, r.request.model.seq);
  if (l.vpp > 1)
    s += fmt::format(" --num-layers-per-virtual-pipeline-stage {}",
                     r.request.model.num_layers / (l.pp * l.vpp));
  if (!l.stage_layers.empty())
    s +=
        fmt::format(" --decoder-first-pipeline-num-layers {} --decoder-last-pipeline-num-layers {}",
                    l.stage_layers.front(), l.stage_layers.back());
  if (l.sequence_parallel) s += " --sequence-parallel";
  s += " --overlap-grad-reduce";
  if (l.distributed_optimizer) s += " --use-distributed-optimizer --overlap-param-gather";
  if (l.cross_entropy_fusion) s += " --cross-entropy-loss-fusion";
  if (l.recompute == Recompute::selective) s += " --recompute-activations";
  if (l.recompute == Recompute::full)
    s += " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  if (l.cp > 1) {
    if (mindspeed_platform(p))
      s += " --context-parallel-algo " + l.cp_algo;
    else
      s += l.cp_algo == "ulysses_cp_algo" ? " --cp-comm-type a2a" : " --cp-comm-type p2p";
  }
  if (uses_coc(c)) {
    // MindSpeed: --coc-fused-kernel when some shape takes the fused kernel (its fused classes
    // route customized 2/4/8 to the script path); else the script path needs a parallel_num
    // above 1 to be on (coc_mode auto), the most common split.
    bool fused = false;
    std::map<int, int> splits;
    for (const auto& [key, v] : c.customized_coc) {
      if (v == -1) fused = true;
      if (v > 1) ++splits[v];
    }
    s += " --use-ascend-coc";
    if (fused) {
      s += " --coc-fused-kernel";
    } else {
      int most = 0, count = 0;
      for (const auto& [v, n] : splits)
        if (n > count) {
          most = v;
          count = n;
        }
      s += fmt::format(" --coc-parallel-num {}", most);
    }
  }
  if (c.tp_comm_overlap) s += " --tp-comm-overlap";
  // The collectives as priced. Megatron-LM runs NCCL's algorithms unless --deterministic-mode;
  // cocemu train sums in rank order unless --nondeterministic (its own flag, which Megatron does
  // not take): the file says which, so that train reproduces the plan from the file alone.
  s += r.request.deterministic ? " --deterministic-mode" : " --nondeterministic";
  if (r.request.dtype != DType::bf16) s += fmt::format(" --dtype {}", name_of(r.request.dtype));
  return s;
}

std::string winner_train_command(const PlanResult& r, const std::string& out_dir) {
  const PlanCandidate& c = flags_candidate(r);
  std::string s = fmt::format(
      "cocemu train --dry-run --engine priced --model {} --profile {} --nodes {}",
      portable(r.request.model_name), portable(r.request.profile_name), r.request.nodes);
  if (uses_coc(c)) s += " --coc-config " + out_dir + "/" + flags_coc_file(r);
  return s + " $(cat " + out_dir + "/plan.winner.flags)";
}

}  // namespace cocemu::bench
