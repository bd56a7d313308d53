#include "cocemu/train/layout.h"

#include <fmt/format.h>

#include <numeric>

#include "cocemu/runtime/error.h"

namespace cocemu::layers::train {

const char* to_string(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::gpipe:
      return "gpipe";
    case PipelineSchedule::one_f_one_b:
      return "1f1b";
    case PipelineSchedule::interleaved:
      return "interleaved";
  }
  return "?";
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

PipelineSchedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  if (name == "interleaved") return PipelineSchedule::interleaved;
  COCEMU_FAIL(Errc::invalid_argument,
              "unknown pipeline schedule '{}'; allowed: gpipe, 1f1b, interleaved", name);
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "selective") return Recompute::selective;
  if (name == "full") return Recompute::full;
  COCEMU_FAIL(Errc::invalid_argument, "unknown recompute '{}'; allowed: none, selective, full",
              name);
}

std::string TrainLayout::describe() const {
  std::string s = fmt::format(
      "tp{} cp{} dp{} pp{}{} mbs{} gbs{} {}{}{}{}{}{}{}", tp, cp, dp, pp,
      vpp > 1 ? fmt::format(" vpp{}", vpp) : "", micro_batch_size, global_batch_size,
      to_string(schedule), sequence_parallel && tp > 1 ? " sp" : "",
      distributed_optimizer ? " dist-opt" : "", overlap_param_gather ? " overlap-param-gather" : "",
      recompute != Recompute::none ? fmt::format(" recompute-{}", to_string(recompute)) : "",
      cross_entropy_fusion ? " ce-fusion" : "",
      pipeline_scatter_gather() ? " pp-scatter-gather" : "");
  if (cp > 1) {  // the CP algorithm, as MindSpeed's context_parallel_algo names it
    if (cp_algo == "ulysses_cp_algo")
      s += " ulysses";
    else if (cp_algo == "hybrid_cp_algo")
      s += fmt::format(" hybrid-u{}", ulysses_degree_in_cp);
    else
      s += " ring";
    if (cp_window_size > 1 && cp_algo != "ulysses_cp_algo")
      s += fmt::format(" window{}", cp_window_size);
    if (use_cp_send_recv_overlap) s += " cp-send-recv-overlap";
  }
  if (!stage_layers.empty()) {
    s += " layers";
    for (std::size_t i = 0; i < stage_layers.size(); ++i)
      s += fmt::format("{}{}", i ? "/" : " ", stage_layers[i]);
  }
  if (micro_batch_interleave > 1) s += fmt::format(" {}-copy", micro_batch_interleave);
  if (gradient_aggregation_group > 0)
    s += fmt::format(" fusion-groups{}", gradient_aggregation_group);
  if (!overlap_grad_reduce) s += " no-overlap-grad-reduce";
  if (!overlap_p2p_comm && schedule == PipelineSchedule::interleaved) s += " no-overlap-p2p";
  if (!grad_reduce_in_fp32 && dtype != DType::f32 && dtype != DType::f64)
    s += fmt::format(" grad-reduce-{}", name_of(dtype));
  return s;
}

LayoutCheck check_layout(const DecoderShape& m, const TrainLayout& l, int world_size) {
  LayoutCheck out;
  auto dims_ok = [](int v) { return v >= 1 && v <= 1 << 20; };
  COCEMU_CHECK_ARG(
      dims_ok(l.tp) && dims_ok(l.cp) && dims_ok(l.dp) && dims_ok(l.pp) && dims_ok(l.vpp),
      "parallel sizes must be ≥ 1: tp {}, cp {}, dp {}, pp {}, vpp {}", l.tp, l.cp, l.dp, l.pp,
      l.vpp);
  COCEMU_CHECK_ARG(std::int64_t(l.tp) * l.cp * l.dp * l.pp == world_size,
                   "data_parallel {} × model_parallel {} × context_parallel {} × pipeline_stage "
                   "{} = {} must equal the number of devices, {}",
                   l.dp, l.tp, l.cp, l.pp, std::int64_t(l.tp) * l.cp * l.dp * l.pp, world_size);
  COCEMU_CHECK_ARG(!l.overlap_param_gather || l.distributed_optimizer,
                   "overlap_param_gather needs the distributed optimizer (Megatron: "
                   "--overlap-param-gather only with --use-distributed-optimizer)");
  COCEMU_CHECK_ARG(l.micro_batch_size >= 1 && l.global_batch_size >= 1,
                   "micro batch size {} and global batch size {} must be ≥ 1", l.micro_batch_size,
                   l.global_batch_size);
  COCEMU_CHECK_ARG(l.global_batch_size % (l.micro_batch_size * l.dp) == 0,
                   "global batch size {} must be divisible by micro batch size {} × data "
                   "parallel {} = {}",
                   l.global_batch_size, l.micro_batch_size, l.dp, l.micro_batch_size * l.dp);
  const std::int64_t mb = l.micro_batches();
  COCEMU_CHECK_ARG(mb >= l.pp,
                   "micro_batch_num {} (global batch {} / (micro batch {} × dp {})) must be ≥ "
                   "pipeline_stage {}",
                   mb, l.global_batch_size, l.micro_batch_size, l.dp, l.pp);
  COCEMU_CHECK_ARG(mb <= 1 << 20, "micro_batch_num {} is too large (at most 2^20)", mb);
  // Tensor parallel: Megatron's divisibility assertions.
  COCEMU_CHECK_ARG(m.hidden % m.heads == 0 && m.heads % m.kv() == 0,
                   "hidden {} must be divisible by heads {}, and heads by KV groups {}", m.hidden,
                   m.heads, m.kv());
  COCEMU_CHECK_ARG(m.hidden % l.tp == 0,
                   "hidden_size {} is not divisible by model_parallel {}: the weights cannot be "
                   "split evenly (MindFormers would insert rearrangement operators)",
                   m.hidden, l.tp);
  COCEMU_CHECK_ARG(m.heads % l.tp == 0 && m.kv() % l.tp == 0 && m.ffn % l.tp == 0,
                   "attention heads {}, KV groups {} and ffn_hidden_size {} must be divisible by "
                   "model_parallel {}",
                   m.heads, m.kv(), m.ffn, l.tp);
  if (m.vocab % l.tp != 0)
    out.warnings.push_back(fmt::format(
        "vocab_size {} is not divisible by model_parallel {}: padded (Megatron pads the "
        "vocabulary to a multiple of 128 × tp)",
        m.vocab, l.tp));
  if (l.sequence_parallel && l.tp == 1)
    out.warnings.push_back("sequence parallel has no effect with model_parallel 1 (off)");
  // Megatron scatters [s, b, h] along s only (_split_along_first_dim asserts s % tp == 0).
  if (l.sequence_parallel && l.tp > 1)
    COCEMU_CHECK_ARG((m.seq / l.cp) % l.tp == 0,
                     "with sequence parallel, seq_length / context_parallel = {} / {} = {} must "
                     "be divisible by model_parallel {} (the sequence is split over TP)",
                     m.seq, l.cp, m.seq / l.cp, l.tp);
  COCEMU_CHECK_ARG(m.seq % (2 * l.cp) == 0 || l.cp == 1,
                   "seq_length {} must be divisible by 2 × context_parallel = {} (load-balanced "
                   "causal split)",
                   m.seq, 2 * l.cp);
  // Pipeline.
  COCEMU_CHECK_ARG(l.vpp == 1 || (l.schedule == PipelineSchedule::interleaved && l.pp >= 2),
                   "virtual pipeline stages ({}) need the interleaved schedule and at least 2 "
                   "pipeline stages (schedule {}, pp {})",
                   l.vpp, to_string(l.schedule), l.pp);
  COCEMU_CHECK_ARG(l.schedule != PipelineSchedule::interleaved || l.vpp >= 2,
                   "the interleaved schedule needs ≥ 2 model chunks per stage "
                   "(--num-layers-per-virtual-pipeline-stage); vpp is {}",
                   l.vpp);
  if (l.schedule == PipelineSchedule::interleaved && !l.overlap_p2p_comm)
    COCEMU_CHECK_ARG(l.pp > 2,
                     "the interleaved schedule without overlap_p2p_comm needs pipeline_stage > 2, "
                     "not {} (Megatron asserts it: a batched p2p call would pair two sends and "
                     "receives between the same two ranks)",
                     l.pp);
  if (l.schedule == PipelineSchedule::interleaved)
    COCEMU_CHECK_ARG(mb % l.pp == 0,
                     "the interleaved schedule needs micro_batch_num {} to be a multiple of "
                     "pipeline_stage {}",
                     mb, l.pp);
  if (!l.stage_layers.empty()) {
    COCEMU_CHECK_ARG(l.vpp == 1, "an explicit layer split cannot be combined with vpp {}", l.vpp);
    COCEMU_CHECK_ARG(std::int64_t(l.stage_layers.size()) == l.pp,
                     "the explicit layer split has {} entries for {} pipeline stages",
                     l.stage_layers.size(), l.pp);
    std::int64_t sum = 0;
    for (const auto n : l.stage_layers) {
      COCEMU_CHECK_ARG(n >= 1, "every pipeline stage needs ≥ 1 layer; the split gives {}", n);
      sum += n;
    }
    COCEMU_CHECK_ARG(sum == m.num_layers, "the explicit layer split sums to {} layers, not {}", sum,
                     m.num_layers);
    if (m.num_layers % l.pp != 0)
      out.warnings.push_back(fmt::format(
          "num_layers {} is not divisible by pipeline_stage {}: uneven stages (MindFormers "
          "advises divisible)",
          m.num_layers, l.pp));
  } else {
    COCEMU_CHECK_ARG(m.num_layers % (std::int64_t(l.pp) * l.vpp) == 0,
                     "num_layers {} must be divisible by pipeline_stage {} × virtual stages {} = "
                     "{}, or give an explicit split per stage",
                     m.num_layers, l.pp, l.vpp, std::int64_t(l.pp) * l.vpp);
  }
  COCEMU_CHECK_ARG(l.micro_batch_interleave == 1 || l.micro_batch_interleave == 2,
                   "micro_batch_interleave_num must be 1 or 2, not {}", l.micro_batch_interleave);
  if (l.micro_batch_interleave == 2)
    COCEMU_CHECK_ARG(l.micro_batch_size % 2 == 0,
                     "micro_batch_interleave_num 2 splits each micro-batch in two along the "
                     "batch: micro batch size {} must be even",
                     l.micro_batch_size);
  COCEMU_CHECK_ARG(l.bucket_params >= 0 && l.bucket_mb >= 0 && l.gradient_aggregation_group >= 0,
                   "gradient buckets: parameters per bucket {}, bucket MB {} and "
                   "gradient_aggregation_group {} must be >= 0 (0: Megatron's DDP buckets)",
                   l.bucket_params, l.bucket_mb, l.gradient_aggregation_group);
  COCEMU_CHECK_ARG(l.coc_parallel_num >= 1 && l.coc_parallel_num <= 64,
                   "CoC parallel_num {} must be in [1, 64]", l.coc_parallel_num);
  return out;
}

LayerRange layers_of(const DecoderShape& m, const TrainLayout& l, int stage, int chunk) {
  if (!l.stage_layers.empty()) {
    const auto first =
        std::accumulate(l.stage_layers.begin(), l.stage_layers.begin() + stage, std::int64_t(0));
    return {first, l.stage_layers[std::size_t(stage)]};
  }
  const std::int64_t per = m.num_layers / (std::int64_t(l.pp) * l.vpp);
  return {(std::int64_t(chunk) * l.pp + stage) * per, per};
}

}  // namespace cocemu::layers::train
