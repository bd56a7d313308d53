// `cocemu train`'s settings: MindFormers YAML, Megatron flags, and how they combine.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"
#include "cocemu/train/config.h"
#include "cocemu/train/part_model.h"

namespace cocemu::bench {

using detail::YamlReader;
using layers::train::DecoderShape;

layers::train::DecoderShape tiny_model() {
  DecoderShape m;
  m.name = "tiny (built-in)";
  m.hidden = 128;
  m.heads = 8;
  m.kv_heads = 4;
  m.ffn = 256;
  m.num_layers = 4;
  m.vocab = 1024;
  m.seq = 64;
  m.swiglu = true;
  return m;
}

namespace {

constexpr std::int64_t kMax = 1 << 20;

}  // namespace

namespace {

template <class T>
void take(Setting<T>& out, const Setting<T>& flag, const Setting<T>& file) {
  if (flag.value && file.value && *flag.value != *file.value)
    COCEMU_FAIL(Errc::invalid_argument, "{} = {} disagrees with {} = {}", flag.where,
                fmt::format("{}", *flag.value), file.where, fmt::format("{}", *file.value));
  out = flag.value ? flag : file;
}

}  // namespace

TrainSettings merge_settings(const TrainSettings& f, const TrainSettings& y) {
  TrainSettings s;
  take(s.model, f.model, y.model);
  take(s.profile, f.profile, y.profile);
  take(s.schedule, f.schedule, y.schedule);
  take(s.recompute, f.recompute, y.recompute);
  take(s.dtype, f.dtype, y.dtype);
  take(s.coc, f.coc, y.coc);
  take(s.coc_config, f.coc_config, y.coc_config);
  take(s.seq_length, f.seq_length, y.seq_length);
  take(s.stage_layers, f.stage_layers, y.stage_layers);
  take(s.stage_offset, f.stage_offset, y.stage_offset);
  take(s.first_stage_layers, f.first_stage_layers, y.first_stage_layers);
  take(s.last_stage_layers, f.last_stage_layers, y.last_stage_layers);
  take(s.cp_algo, f.cp_algo, y.cp_algo);
  take(s.cp_window_size, f.cp_window_size, y.cp_window_size);
  take(s.ulysses_degree_in_cp, f.ulysses_degree_in_cp, y.ulysses_degree_in_cp);
  take(s.cp_send_recv_overlap, f.cp_send_recv_overlap, y.cp_send_recv_overlap);
  take(s.tp, f.tp, y.tp);
  take(s.cp, f.cp, y.cp);
  take(s.dp, f.dp, y.dp);
  take(s.pp, f.pp, y.pp);
  take(s.layers_per_virtual_stage, f.layers_per_virtual_stage, y.layers_per_virtual_stage);
  take(s.vpp, f.vpp, y.vpp);
  take(s.nodes, f.nodes, y.nodes);
  take(s.iterations, f.iterations, y.iterations);
  take(s.micro_batch_size, f.micro_batch_size, y.micro_batch_size);
  take(s.copy_batch_size, f.copy_batch_size, y.copy_batch_size);
  take(s.global_batch_size, f.global_batch_size, y.global_batch_size);
  take(s.micro_batch_num, f.micro_batch_num, y.micro_batch_num);
  take(s.gradient_accumulation_steps, f.gradient_accumulation_steps, y.gradient_accumulation_steps);
  take(s.micro_batch_interleave, f.micro_batch_interleave, y.micro_batch_interleave);
  take(s.aggregation_groups, f.aggregation_groups, y.aggregation_groups);
  take(s.bucket_mb, f.bucket_mb, y.bucket_mb);
  take(s.sequence_parallel, f.sequence_parallel, y.sequence_parallel);
  take(s.distributed_optimizer, f.distributed_optimizer, y.distributed_optimizer);
  take(s.gradients_mean, f.gradients_mean, y.gradients_mean);
  take(s.deterministic, f.deterministic, y.deterministic);
  take(s.overlap_grad_reduce, f.overlap_grad_reduce, y.overlap_grad_reduce);
  take(s.overlap_p2p_comm, f.overlap_p2p_comm, y.overlap_p2p_comm);
  take(s.overlap_param_gather, f.overlap_param_gather, y.overlap_param_gather);
  take(s.grad_reduce_in_fp32, f.grad_reduce_in_fp32, y.grad_reduce_in_fp32);
  take(s.cross_entropy_loss_fusion, f.cross_entropy_loss_fusion, y.cross_entropy_loss_fusion);
  take(s.scatter_gather_tensors_in_pipeline, f.scatter_gather_tensors_in_pipeline,
       y.scatter_gather_tensors_in_pipeline);
  take(s.flash_attention, f.flash_attention, y.flash_attention);
  take(s.recompute_method, f.recompute_method, y.recompute_method);
  take(s.recompute_num_layers, f.recompute_num_layers, y.recompute_num_layers);
  take(s.use_ascend_coc, f.use_ascend_coc, y.use_ascend_coc);
  take(s.coc_fused_kernel, f.coc_fused_kernel, y.coc_fused_kernel);
  take(s.coc_parallel_num, f.coc_parallel_num, y.coc_parallel_num);
  take(s.tp_comm_overlap, f.tp_comm_overlap, y.tp_comm_overlap);
  s.coc_overrides_config = f.coc_overrides_config || y.coc_overrides_config;
  s.model_checks = y.model_checks;
  s.model_checks.insert(s.model_checks.end(), f.model_checks.begin(), f.model_checks.end());
  s.notes = f.notes;
  s.notes.insert(s.notes.end(), y.notes.begin(), y.notes.end());
  return s;
}

namespace {

DType parse_train_dtype(const Setting<std::string>& s) {
  const std::string v = s.value.value_or("bf16");
  if (v == "bf16") return DType::bf16;
  if (v == "f32") return DType::f32;
  if (v == "f64") return DType::f64;
  COCEMU_FAIL(Errc::invalid_argument, "{}: dtype '{}' is not allowed; allowed: bf16, f32, f64",
              s.where.empty() ? "--dtype" : s.where, v);
}

/// "serial", "fused", "script-p4" (MindSpeed's COC_PARALLEL_NUM 4).
std::pair<layers::Strategy, int> parse_coc(const Setting<std::string>& s) {
  const std::string v = s.value.value_or("serial");
  if (v == "serial") return {layers::Strategy::serial, 1};
  if (v == "fused") return {layers::Strategy::fused, 1};
  for (const int p : {2, 4, 8})
    if (v == fmt::format("script-p{}", p)) return {layers::Strategy::script, p};
  COCEMU_FAIL(Errc::invalid_argument,
              "{}: CoC strategy '{}' is not allowed; allowed: serial, script-p2, script-p4, "
              "script-p8, fused (or --coc-config FILE for a tuned config)",
              s.where.empty() ? "--coc" : s.where, v);
}

/// The first of `settings` that is given, for an error naming the conflict.
template <class... S>
std::string first_given(const S&... settings) {
  std::string out;
  auto one = [&](const auto& s) {
    if (out.empty() && s.value) out = s.where;
  };
  (one(settings), ...);
  return out;
}

/// Layers per stage from MindFormers' offset (num_layers / pp + offset[s]; one integer applies
/// to every stage, as MindFormers broadcasts it).
std::vector<std::int64_t> layers_from_offset(const Setting<std::vector<std::int64_t>>& offset,
                                             std::int64_t layers, int pp) {
  std::vector<std::int64_t> off = *offset.value;
  if (off.size() == 1) off.assign(std::size_t(pp), off[0]);
  COCEMU_CHECK_ARG(std::int64_t(off.size()) == pp,
                   "{}: offset has {} entries for pipeline_stage {} (MindFormers needs one per "
                   "stage)",
                   offset.where, off.size(), pp);
  std::int64_t sum = 0;
  for (const auto o : off)
    sum += o;
  COCEMU_CHECK_ARG(sum == layers % pp,
                   "{}: offset sums to {}; MindFormers needs num_layers {} % pipeline_stage {} = "
                   "{}",
                   offset.where, sum, layers, pp, layers % pp);
  std::vector<std::int64_t> out;
  for (const auto o : off)
    out.push_back(layers / pp + o);
  return out;
}

/// Layers per stage from Megatron's first and last stage counts (the middle stages split the
/// rest evenly, as Megatron requires).
std::vector<std::int64_t> layers_from_first_last(const TrainSettings& s, std::int64_t layers,
                                                 int pp) {
  const std::string where = first_given(s.first_stage_layers, s.last_stage_layers);
  COCEMU_CHECK_ARG(pp >= 2, "{} needs pipeline parallelism (pipeline_model_parallel_size {})",
                   where, pp);
  const std::int64_t middle = pp - 2;
  const std::int64_t first = s.first_stage_layers.value.value_or(-1),
                     last = s.last_stage_layers.value.value_or(-1);
  // Megatron: a stage not given takes an even share of what the others leave.
  std::int64_t f = first, l = last;
  if (f < 0 && l < 0) f = l = layers / pp;
  const std::int64_t given = (f >= 0 ? f : 0) + (l >= 0 ? l : 0);
  const std::int64_t rest_stages = middle + (f < 0 ? 1 : 0) + (l < 0 ? 1 : 0);
  const std::int64_t rest = layers - given;
  COCEMU_CHECK_ARG(rest >= 0 && (rest_stages == 0 ? rest == 0 : rest % rest_stages == 0),
                   "{}: {} layers left for the other {} stage(s) of {} (num_layers {}); Megatron "
                   "needs them to split evenly",
                   where, rest, rest_stages, pp, layers);
  const std::int64_t each = rest_stages ? rest / rest_stages : 0;
  std::vector<std::int64_t> out(std::size_t(pp), each);
  out.front() = f >= 0 ? f : each;
  out.back() = l >= 0 ? l : each;
  return out;
}

void check_model(const TrainSettings& s, const DecoderShape& m, const std::string& source) {
  for (const auto& c : s.model_checks) {
    const std::int64_t ours = c.key == "hidden_size"  ? m.hidden
                              : c.key == "num_layers" ? m.num_layers
                              : c.key == "num_heads"  ? m.heads
                              : c.key == "n_kv_heads" ? m.kv()
                                                      : m.vocab;
    COCEMU_CHECK_ARG(ours == c.value, "{} = {} disagrees with the model {} ({}): {}", c.where,
                     c.value, m.name, source, ours);
  }
}

}  // namespace

layers::train::DecoderShape load_decoder(const std::string& name_or_path, std::string* source) {
  const auto mc = layers::load_model_config(name_or_path);
  COCEMU_CHECK_ARG(mc.vocab_size > 0,
                   "model config {} has no vocab_size; the training step needs it (add "
                   "`vocab_size:` with its source)",
                   mc.source);
  if (source) *source = mc.source;
  return {.name = mc.name,
          .hidden = mc.hidden_size,
          .heads = mc.num_attention_heads,
          .kv_heads = mc.num_query_groups,
          .ffn = mc.ffn_hidden_size,
          .num_layers = mc.num_layers,
          .vocab = mc.vocab_size,
          .seq = mc.seq_length,
          .swiglu = mc.swiglu,
          .flash_attention = mc.flash_attention,
          .masked_softmax_fusion = mc.masked_softmax_fusion};
}

TrainSetup resolve_settings(const TrainSettings& s, bool dry_run) {
  const bool tiny = !s.model.value || *s.model.value == "tiny";
  std::string source = "built-in";
  const DecoderShape model = tiny ? tiny_model() : load_decoder(*s.model.value, &source);
  return resolve_settings(s, dry_run, model, source,
                          std::make_shared<const DeviceProfile>(
                              load_named_profile(s.profile.value.value_or("ascend-910b"))));
}

TrainSetup resolve_settings(const TrainSettings& s, bool dry_run, const DecoderShape& model,
                            std::string model_source,
                            std::shared_ptr<const DeviceProfile> profile) {
  TrainSetup setup;
  setup.dry_run = dry_run;
  setup.notes = s.notes;
  auto& o = setup.options;
  auto& l = o.layout;
  const bool tiny = model_source == "built-in";
  o.model = model;
  setup.model_source = std::move(model_source);
  check_model(s, o.model, setup.model_source);
  if (s.seq_length.value) o.model.seq = *s.seq_length.value;
  if (s.flash_attention.value) o.model.flash_attention = *s.flash_attention.value;
  setup.profile = std::move(profile);
  const DeviceProfile& prof = *setup.profile;
  setup.nodes = int(s.nodes.value.value_or(1));
  const std::int64_t world = std::int64_t(setup.nodes) * prof.topology.devices_per_node;
  l.tp = int(s.tp.value.value_or(2));
  l.cp = int(s.cp.value.value_or(1));
  l.pp = int(s.pp.value.value_or(tiny ? 2 : 1));
  const std::int64_t inner = std::int64_t(l.tp) * l.cp * l.pp;
  COCEMU_CHECK_ARG(world % inner == 0,
                   "{} node(s) × {} devices = {} devices are not divisible by tp {} × cp {} × pp "
                   "{} = {}",
                   setup.nodes, prof.topology.devices_per_node, world, l.tp, l.cp, l.pp, inner);
  l.dp = int(s.dp.value.value_or(world / inner));

  // Batch: Megatron's micro-batch counts every copy; MindFormers' batch_size one copy.
  l.micro_batch_interleave = int(s.micro_batch_interleave.value.value_or(1));
  if (s.copy_batch_size.value) {
    const std::int64_t whole = *s.copy_batch_size.value * l.micro_batch_interleave;
    COCEMU_CHECK_ARG(!s.micro_batch_size.value || *s.micro_batch_size.value == whole,
                     "{} = {} disagrees with {} = {} (one copy) × micro_batch_interleave_num {} "
                     "= {} sequences per micro-batch",
                     s.micro_batch_size.where, s.micro_batch_size.value.value_or(0),
                     s.copy_batch_size.where, *s.copy_batch_size.value, l.micro_batch_interleave,
                     whole);
    l.micro_batch_size = whole;
  } else {
    l.micro_batch_size = s.micro_batch_size.value.value_or(tiny ? 2 : 1);
  }
  // Micro-batches: MindFormers counts them with micro_batch_num when the pipeline has stages,
  // else with gradient_accumulation_steps (it resets micro_batch_num to 1 there).
  const Setting<std::int64_t>& count = l.pp > 1 ? s.micro_batch_num : s.gradient_accumulation_steps;
  const Setting<std::int64_t>& unused =
      l.pp > 1 ? s.gradient_accumulation_steps : s.micro_batch_num;
  if (unused.value && *unused.value > 1)
    setup.notes.push_back(fmt::format(
        "{} = {} ignored: with pipeline_stage {} MindFormers counts micro-batches with {}",
        unused.where, *unused.value, l.pp,
        l.pp > 1 ? "micro_batch_num" : "gradient_accumulation_steps"));
  if (s.global_batch_size.value && count.value)
    COCEMU_CHECK_ARG(*s.global_batch_size.value == *count.value * l.micro_batch_size * l.dp,
                     "{} = {} disagrees with {} = {} (× micro batch {} × dp {} = {})",
                     s.global_batch_size.where, *s.global_batch_size.value, count.where,
                     *count.value, l.micro_batch_size, l.dp,
                     *count.value * l.micro_batch_size * l.dp);
  const std::int64_t default_m = std::max<std::int64_t>(4, 2 * std::int64_t(l.pp));
  l.global_batch_size = s.global_batch_size.value.value_or(count.value.value_or(default_m) *
                                                           l.micro_batch_size * l.dp);

  l.sequence_parallel = s.sequence_parallel.value.value_or(l.tp > 1);
  if (l.sequence_parallel && l.tp == 1) {
    if (s.sequence_parallel.value)
      setup.notes.push_back(fmt::format(
          "{}: sequence parallelism has no effect with tensor parallel size 1 (off, as Megatron "
          "disables it)",
          s.sequence_parallel.where));
    l.sequence_parallel = false;
  }
  l.distributed_optimizer = s.distributed_optimizer.value.value_or(false);
  l.overlap_grad_reduce = s.overlap_grad_reduce.value.value_or(true);
  l.overlap_p2p_comm = s.overlap_p2p_comm.value.value_or(true);
  l.overlap_param_gather = s.overlap_param_gather.value.value_or(false);
  l.grad_reduce_in_fp32 = s.grad_reduce_in_fp32.value.value_or(true);
  l.cross_entropy_fusion = s.cross_entropy_loss_fusion.value.value_or(false);
  l.scatter_gather_tensors_in_pipeline = s.scatter_gather_tensors_in_pipeline.value.value_or(false);
  l.gradients_mean = s.gradients_mean.value.value_or(true);
  if (s.aggregation_groups.value) {
    COCEMU_CHECK_ARG(!s.bucket_mb.value,
                     "{} and {} both size the gradient buckets; give one (MindFormers' fusion "
                     "groups or Megatron's bucket size)",
                     s.aggregation_groups.where, s.bucket_mb.where);
    // MindFormers' LayerSetting (train/src/buckets.cpp): G fusion groups over the layers,
    // one group when there are pipeline stages.
    l.gradient_aggregation_group = int(*s.aggregation_groups.value);
  }
  if (s.bucket_mb.value) l.bucket_mb = *s.bucket_mb.value;
  l.dtype = parse_train_dtype(s.dtype);
  if (s.grad_reduce_in_fp32.value && !*s.grad_reduce_in_fp32.value)
    COCEMU_CHECK_ARG(l.dtype == DType::bf16,
                     "{}: gradients reduced in 16 bits need the bf16 dtype (Megatron's "
                     "--grad-reduce-in-bf16); the dtype is {}",
                     s.grad_reduce_in_fp32.where, name_of(l.dtype));

  // Context parallelism (MindSpeed's options and rules).
  l.cp_algo = s.cp_algo.value.value_or("megatron_cp_algo");
  COCEMU_CHECK_ARG(l.cp_algo == "megatron_cp_algo" || l.cp_algo == "ulysses_cp_algo" ||
                       l.cp_algo == "hybrid_cp_algo",
                   "{}: context_parallel_algo '{}' is not allowed; allowed: megatron_cp_algo, "
                   "ulysses_cp_algo, hybrid_cp_algo",
                   s.cp_algo.where, l.cp_algo);
  l.cp_window_size = int(s.cp_window_size.value.value_or(1));
  if (l.cp_window_size > 1) {
    COCEMU_CHECK_ARG(l.cp > 1,
                     "{} = {}: the double ring needs context parallelism; context_parallel_size "
                     "is 1",
                     s.cp_window_size.where, l.cp_window_size);
    COCEMU_CHECK_ARG(l.cp_algo != "ulysses_cp_algo",
                     "{} = {}: the double ring's window belongs to megatron_cp_algo or "
                     "hybrid_cp_algo, not {}",
                     s.cp_window_size.where, l.cp_window_size, l.cp_algo);
  }
  l.ulysses_degree_in_cp = int(s.ulysses_degree_in_cp.value.value_or(0));
  if (s.ulysses_degree_in_cp.value)
    COCEMU_CHECK_ARG(l.cp_algo == "hybrid_cp_algo",
                     "{} = {}: the Ulysses degree belongs to hybrid_cp_algo; the algorithm is {} "
                     "({})",
                     s.ulysses_degree_in_cp.where, l.ulysses_degree_in_cp, l.cp_algo,
                     s.cp_algo.value ? s.cp_algo.where : "the default");
  l.use_cp_send_recv_overlap = s.cp_send_recv_overlap.value.value_or(false);

  // Recompute (Megatron's granularity; its method and layer count as cocemu models them).
  l.recompute = layers::train::parse_recompute(s.recompute.value.value_or("none"));
  if (s.recompute_method.value) {
    COCEMU_CHECK_ARG(*s.recompute_method.value == "uniform",
                     "{} = {} is not modeled; cocemu's full recompute is uniform, one layer at a "
                     "time",
                     s.recompute_method.where, *s.recompute_method.value);
    COCEMU_CHECK_ARG(l.recompute == layers::train::Recompute::full,
                     "{} goes with full recompute (Megatron: --recompute-granularity full); the "
                     "recompute is {}",
                     s.recompute_method.where, layers::train::to_string(l.recompute));
  }
  if (s.recompute_num_layers.value)
    COCEMU_CHECK_ARG(
        *s.recompute_num_layers.value == 1 && l.recompute == layers::train::Recompute::full,
        "{} = {}: cocemu models full recompute of one layer at a time "
        "(--recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1)",
        s.recompute_num_layers.where, *s.recompute_num_layers.value);

  // Pipeline: virtual stages and explicit layer splits.
  if (s.layers_per_virtual_stage.value) {
    const std::int64_t per = *s.layers_per_virtual_stage.value;
    COCEMU_CHECK_ARG(per >= 1 && o.model.num_layers % (std::int64_t(l.pp) * per) == 0,
                     "{} = {}: num_layers {} must be divisible by pp {} × it",
                     s.layers_per_virtual_stage.where, per, o.model.num_layers, l.pp);
    l.vpp = int(o.model.num_layers / (std::int64_t(l.pp) * per));
  }
  if (s.vpp.value) {
    COCEMU_CHECK_ARG(!s.layers_per_virtual_stage.value || *s.vpp.value == l.vpp,
                     "{} = {} disagrees with {} (vpp {})", s.vpp.where, *s.vpp.value,
                     s.layers_per_virtual_stage.where, l.vpp);
    l.vpp = int(*s.vpp.value);
  }
  {
    std::vector<std::pair<std::vector<std::int64_t>, std::string>> splits;
    if (s.stage_layers.value) splits.push_back({*s.stage_layers.value, s.stage_layers.where});
    if (s.stage_offset.value)
      splits.push_back(
          {layers_from_offset(s.stage_offset, o.model.num_layers, l.pp), s.stage_offset.where});
    if (s.first_stage_layers.value || s.last_stage_layers.value)
      splits.push_back({layers_from_first_last(s, o.model.num_layers, l.pp),
                        first_given(s.first_stage_layers, s.last_stage_layers)});
    for (std::size_t i = 1; i < splits.size(); ++i)
      COCEMU_CHECK_ARG(splits[i].first == splits[0].first,
                       "{} gives layers per stage {} but {} gives {}", splits[i].second,
                       fmt::join(splits[i].first, "/"), splits[0].second,
                       fmt::join(splits[0].first, "/"));
    if (!splits.empty()) l.stage_layers = splits[0].first;
  }
  l.schedule =
      layers::train::parse_schedule(s.schedule.value.value_or(l.vpp > 1 ? "interleaved" : "1f1b"));

  // CoC: cocemu's --coc shorthand (every TP linear runs one strategy), a per-shape config
  // (cocemu's file standing in for MindSpeed's customized_coc), the platform's own switches.
  const std::string mindspeed =
      first_given(s.use_ascend_coc, s.coc_parallel_num, s.coc_fused_kernel);
  const bool ascend_coc = s.use_ascend_coc.value.value_or(false);
  const bool tp_comm_overlap = s.tp_comm_overlap.value.value_or(false);
  if (s.coc.value && !s.coc_overrides_config) {
    const std::string other = first_given(s.coc_config, s.use_ascend_coc, s.coc_parallel_num,
                                          s.coc_fused_kernel, s.tp_comm_overlap);
    COCEMU_CHECK_ARG(other.empty(),
                     "{} = {} runs every TP linear with one strategy, and {} configures the CoC "
                     "too; give one of them (--coc is cocemu's shorthand; a config or the "
                     "platform's flags choose per shape)",
                     s.coc.where, *s.coc.value, other);
  }
  COCEMU_CHECK_ARG(!(tp_comm_overlap && !mindspeed.empty()),
                   "{} (Megatron-LM with Transformer Engine) and {} (MindSpeed on Ascend) are "
                   "two platforms' TP overlap; give the one of the profile's platform ({})",
                   s.tp_comm_overlap.where, mindspeed, prof.name);
  COCEMU_CHECK_ARG(!(tp_comm_overlap && s.coc_config.value),
                   "{} overlaps every TP linear (Megatron-LM has no per-shape choice) and {} "
                   "chooses per shape; give one",
                   s.tp_comm_overlap.where, s.coc_config.where);
  COCEMU_CHECK_ARG(ascend_coc || (!s.coc_parallel_num.value && !s.coc_fused_kernel.value),
                   "{} takes effect only with --use-ascend-coc (MindSpeed's CoC switch)",
                   first_given(s.coc_parallel_num, s.coc_fused_kernel));
  auto platform = [&](const char* mechanism, const std::string& where) {
    COCEMU_CHECK_ARG(prof.has_tp_overlap(mechanism),
                     "{}: the profile {} ({}) has no {} (its tp_overlap: [{}]); {}", where,
                     prof.name, prof.source, mechanism, fmt::join(prof.tp_overlap, ", "),
                     prof.has_tp_overlap("te_userbuffers")
                         ? "on this platform Megatron-LM's --tp-comm-overlap overlaps TP "
                           "communication"
                     : prof.tp_overlap.empty()
                         ? "its software overlaps no TP communication (--coc is cocemu's "
                           "what-if shorthand)"
                         : "on this platform MindSpeed's --use-ascend-coc overlaps TP "
                           "communication");
  };
  if (ascend_coc) platform("mindspeed_coc", s.use_ascend_coc.where);
  if (ascend_coc && s.coc_fused_kernel.value.value_or(false)) {
    platform("lcoc_fused", s.coc_fused_kernel.where);
    COCEMU_CHECK_ARG(l.tp == kLcocFusedTp,
                     "{}: MindSpeed's LCOC fused kernels support tensor parallel size {} only "
                     "(its feature doc); tp {} (--coc fused is cocemu's what-if at any tp)",
                     s.coc_fused_kernel.where, kLcocFusedTp, l.tp);
  }
  if (tp_comm_overlap) {
    platform("te_userbuffers", s.tp_comm_overlap.where);
    COCEMU_CHECK_ARG(l.tp > 1 && l.sequence_parallel,
                     "{}: Megatron-LM's TP communication overlap needs tensor parallelism with "
                     "sequence parallelism (arguments.py asserts --sequence-parallel); tp {}, "
                     "sequence parallel {}",
                     s.tp_comm_overlap.where, l.tp, l.sequence_parallel);
    COCEMU_CHECK_ARG(l.tp <= prof.topology.devices_per_node,
                     "{}: Transformer Engine's userbuffers need the TP ranks inside one NVLink "
                     "node; tp {} > {} devices per node",
                     s.tp_comm_overlap.where, l.tp, prof.topology.devices_per_node);
    setup.notes.push_back(fmt::format(
        "{}: Transformer Engine's userbuffers overlap is priced by the fused-kernel pipeline with "
        "the profile's fused: steps (TE's split GEMMs)",
        s.tp_comm_overlap.where));
  }
  if (s.coc_parallel_num.value)
    COCEMU_CHECK_ARG(*s.coc_parallel_num.value == 1 || *s.coc_parallel_num.value == 2 ||
                         *s.coc_parallel_num.value == 4 || *s.coc_parallel_num.value == 8,
                     "{} = {}; allowed: 1, 2, 4, 8 (MindSpeed's choices)", s.coc_parallel_num.where,
                     *s.coc_parallel_num.value);
  const auto [strategy, p] = parse_coc(s.coc);
  // Script CoC splits a TP GEMM into chunks to overlap them with its TP collective: at tp 1
  // there is none, and the run would be serial under another name. (fused stays allowed: the
  // shipped references set it at tp 1 as MindSpeed's --use-mc2, which MindSpeed accepts there.)
  COCEMU_CHECK_ARG(!s.coc.value || strategy != layers::Strategy::script || l.tp > 1,
                   "{}: CoC strategy '{}' splits a GEMM to overlap its tensor-parallel "
                   "collective, and tensor parallel size is 1 (no TP collective); allowed at tp "
                   "1: serial, fused",
                   s.coc.where.empty() ? "--coc" : s.coc.where, *s.coc.value);
  layers::CocConfig coc;
  coc.tile_rows = 32;  // several pipeline steps even for small layers (as `cocemu bench`)
  if (s.coc_config.value) coc = layers::load_coc_config(*s.coc_config.value);
  if (ascend_coc) {
    // MindSpeed's switches: --coc-parallel-num is the split of shapes customized_coc does not
    // list, --coc-fused-kernel makes that the fused kernel (get_parallel_num's -1).
    coc.parallel_num = int(s.coc_parallel_num.value.value_or(1));
    coc.fused = s.coc_fused_kernel.value.value_or(false);
  }
  if (s.coc.value) {
    l.coc = strategy;
    l.coc_parallel_num = p;
    coc.customized_coc.clear();  // --compare-coc: the strategy replaces the per-shape choices
    o.linear = layers::options_for(coc, strategy, p);
    setup.coc_name = *s.coc.value;
  } else if (tp_comm_overlap) {
    l.coc = layers::Strategy::fused;
    o.linear = layers::options_for(coc, layers::Strategy::fused, 1);
    setup.coc_name = "tp-comm-overlap";
  } else if (s.coc_config.value || ascend_coc) {
    o.linear = layers::options_for(coc, layers::Strategy::serial, 1);
    o.linear.per_shape = std::make_shared<const layers::CocConfig>(coc);
    setup.coc_name = s.coc_config.value ? "tuned" : "mindspeed";
  } else {
    o.linear = layers::options_for(coc, layers::Strategy::serial, 1);
    setup.coc_name = "serial";
  }
  o.iterations = int(s.iterations.value.value_or(3));
  setup.deterministic = s.deterministic.value.value_or(true);
  (void)layers::train::check_layout(o.model, l, int(world));
  return setup;
}

std::vector<std::string> run_gemm_keys(const TrainSetup& setup) {
  const auto& l = setup.options.layout;
  if (l.tp == 1) return {};
  // The TP GEMMs' shapes do not depend on how context parallelism splits attention: price the
  // ring (which the part model covers) with tuning on, which records every key looked up.
  TrainSetup probe = setup;
  auto& pl = probe.options.layout;
  pl.cp_algo = "megatron_cp_algo";
  pl.cp_window_size = 1;
  pl.ulysses_degree_in_cp = 0;
  std::map<std::string, int> seen;
  (void)price_parts(probe, &seen);
  std::vector<std::string> keys;
  for (const auto& [key, value] : seen)
    keys.push_back(key);
  return keys;
}

std::string unmatched_coc_warning(const std::string& file,
                                  const std::map<std::string, int>& customized_coc,
                                  const std::vector<std::string>& keys) {
  if (customized_coc.empty()) return "";
  for (const std::string& k : keys)
    if (customized_coc.count(k)) return "";
  return fmt::format(
      "warning: {}: customized_coc matches none of this run's GEMM shapes, so every shape runs "
      "the default (its {} entries are keyed for another layout); the run's shapes [m, k, n]: "
      "{}",
      file, customized_coc.size(),
      keys.empty() ? "none (tp 1: no TP communication)" : fmt::format("{}", fmt::join(keys, " ")));
}

}  // namespace cocemu::bench
