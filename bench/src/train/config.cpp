// `cocemu train`'s settings: MindFormers YAML, Megatron flags, and how they combine.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <sstream>

#include "cocemu/bench/train/train_config.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"

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

/// "file:line key" for a key of `r` (its value's line).
std::string at(const YamlReader& r, const std::string& key) {
  return fmt::format("{} {}", r.where(r.node()[key]), key);
}

template <class T, class Read>
void read(YamlReader& r, const std::string& key, Setting<T>& s, Read&& get) {
  if (!r.has(key)) return;
  std::string where = at(r, key);
  s.set(get(), std::move(where));
}

}  // namespace

TrainSettings parse_train_config(const std::string& text, const std::string& origin) {
  auto top = YamlReader::parse(text, origin);
  TrainSettings s;
  constexpr std::int64_t kMax = 1 << 20;
  if (top.has("parallel")) {
    auto p = top.map("parallel");
    read(p, "gradients_mean", s.gradients_mean, [&] { return p.boolean("gradients_mean"); });
    read(p, "enable_parallel_optimizer", s.distributed_optimizer,
         [&] { return p.boolean("enable_parallel_optimizer"); });
    p.finish();
  }
  if (top.has("parallel_config")) {
    auto p = top.map("parallel_config");
    read(p, "data_parallel", s.dp, [&] { return p.integer("data_parallel", 1, kMax); });
    read(p, "model_parallel", s.tp, [&] { return p.integer("model_parallel", 1, kMax); });
    read(p, "context_parallel", s.cp, [&] { return p.integer("context_parallel", 1, kMax); });
    read(p, "pipeline_stage", s.pp, [&] { return p.integer("pipeline_stage", 1, kMax); });
    read(p, "use_seq_parallel", s.sequence_parallel, [&] { return p.boolean("use_seq_parallel"); });
    read(p, "micro_batch_num", s.micro_batch_num,
         [&] { return p.integer("micro_batch_num", 1, kMax); });
    read(p, "gradient_aggregation_group", s.bucket_params,
         [&] { return p.integer("gradient_aggregation_group", 1, kMax); });
    read(p, "pp_interleave_num", s.vpp, [&] { return p.integer("pp_interleave_num", 1, 64); });
    read(p, "context_parallel_algo", s.cp_algo, [&] { return p.string("context_parallel_algo"); });
    read(p, "cp_window_size", s.cp_window_size,
         [&] { return p.integer("cp_window_size", 1, kMax); });
    read(p, "ulysses_degree_in_cp", s.ulysses_degree_in_cp,
         [&] { return p.integer("ulysses_degree_in_cp", 1, kMax); });
    read(p, "use_cp_send_recv_overlap", s.cp_send_recv_overlap,
         [&] { return p.boolean("use_cp_send_recv_overlap"); });
    p.finish();
  }
  read(top, "micro_batch_interleave_num", s.micro_batch_interleave,
       [&] { return top.integer("micro_batch_interleave_num", 1, 2); });
  if (top.has("recompute_config")) {
    auto r = top.map("recompute_config");
    const std::string where = r.where(top.node()["recompute_config"]);
    const bool full = r.boolean_or("recompute", false);
    const bool selective = r.boolean_or("select_recompute", false);
    r.finish();
    COCEMU_CHECK(!(full && selective), Errc::parse_error,
                 "{}: recompute and select_recompute cannot both be true", where);
    s.recompute.set(full ? "full" : selective ? "selective" : "none", where + " recompute_config");
  }
  if (top.has("runner_config")) {
    auto r = top.map("runner_config");
    read(r, "batch_size", s.micro_batch_size, [&] { return r.integer("batch_size", 1, kMax); });
    r.finish();
  }
  if (top.has("train")) {
    auto t = top.map("train");
    read(t, "model", s.model, [&] { return t.string("model"); });
    read(t, "profile", s.profile, [&] { return t.string("profile"); });
    read(t, "nodes", s.nodes, [&] { return t.integer("nodes", 1, 4096); });
    read(t, "schedule", s.schedule, [&] { return t.string("schedule"); });
    read(t, "dtype", s.dtype, [&] { return t.string("dtype"); });
    read(t, "coc", s.coc, [&] { return t.string("coc"); });
    read(t, "coc_config", s.coc_config, [&] { return t.string("coc_config"); });
    if (t.has("stage_layers")) {
      std::vector<std::int64_t> layers;
      std::string where;
      for (const auto& [text, line] : t.strings("stage_layers")) {
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        COCEMU_CHECK(end != text.c_str() && *end == '\0' && v >= 1 && v <= (1 << 20),
                     Errc::parse_error, "{}: stage_layers entry '{}' must be an integer >= 1", line,
                     text);
        layers.push_back(v);
        if (where.empty()) where = line;
      }
      s.stage_layers.set(std::move(layers), where + " stage_layers");
    }
    read(t, "seq_length", s.seq_length,
         [&] { return t.integer("seq_length", 1, std::int64_t(1) << 24); });
    read(t, "deterministic", s.deterministic, [&] { return t.boolean("deterministic"); });
    read(t, "overlap_param_gather", s.overlap_param_gather,
         [&] { return t.boolean("overlap_param_gather"); });
    read(t, "cross_entropy_loss_fusion", s.cross_entropy_loss_fusion,
         [&] { return t.boolean("cross_entropy_loss_fusion"); });
    read(t, "scatter_gather_tensors_in_pipeline", s.scatter_gather_tensors_in_pipeline,
         [&] { return t.boolean("scatter_gather_tensors_in_pipeline"); });
    read(t, "iterations", s.iterations, [&] { return t.integer("iterations", 1, 1000); });
    read(t, "global_batch_size", s.global_batch_size,
         [&] { return t.integer("global_batch_size", 1, std::int64_t(1) << 30); });
    t.finish();
  }
  top.finish();
  return s;
}

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
  take(s.global_batch_size, f.global_batch_size, y.global_batch_size);
  take(s.micro_batch_num, f.micro_batch_num, y.micro_batch_num);
  take(s.micro_batch_interleave, f.micro_batch_interleave, y.micro_batch_interleave);
  take(s.bucket_params, f.bucket_params, y.bucket_params);
  take(s.bucket_mb, f.bucket_mb, y.bucket_mb);
  take(s.sequence_parallel, f.sequence_parallel, y.sequence_parallel);
  take(s.distributed_optimizer, f.distributed_optimizer, y.distributed_optimizer);
  take(s.gradients_mean, f.gradients_mean, y.gradients_mean);
  take(s.deterministic, f.deterministic, y.deterministic);
  take(s.overlap_param_gather, f.overlap_param_gather, y.overlap_param_gather);
  take(s.cross_entropy_loss_fusion, f.cross_entropy_loss_fusion, y.cross_entropy_loss_fusion);
  take(s.scatter_gather_tensors_in_pipeline, f.scatter_gather_tensors_in_pipeline,
       y.scatter_gather_tensors_in_pipeline);
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
          .swiglu = mc.swiglu};
}

TrainSetup resolve_settings(const TrainSettings& s, bool dry_run) {
  TrainSetup setup;
  setup.dry_run = dry_run;
  auto& o = setup.options;
  auto& l = o.layout;
  const bool tiny = !s.model.value || *s.model.value == "tiny";
  if (tiny) {
    o.model = tiny_model();
    setup.model_source = "built-in";
  } else {
    o.model = load_decoder(*s.model.value, &setup.model_source);
  }
  if (s.seq_length.value) o.model.seq = *s.seq_length.value;
  if (s.stage_layers.value) l.stage_layers = *s.stage_layers.value;
  setup.profile = std::make_shared<const DeviceProfile>(
      load_named_profile(s.profile.value.value_or("ascend-910b")));
  setup.nodes = int(s.nodes.value.value_or(1));
  const std::int64_t world = std::int64_t(setup.nodes) * setup.profile->topology.devices_per_node;
  l.tp = int(s.tp.value.value_or(2));
  l.cp = int(s.cp.value.value_or(1));
  l.pp = int(s.pp.value.value_or(tiny ? 2 : 1));
  const std::int64_t inner = std::int64_t(l.tp) * l.cp * l.pp;
  COCEMU_CHECK_ARG(world % inner == 0,
                   "{} node(s) × {} devices = {} devices are not divisible by tp {} × cp {} × pp "
                   "{} = {}",
                   setup.nodes, setup.profile->topology.devices_per_node, world, l.tp, l.cp, l.pp,
                   inner);
  l.dp = int(s.dp.value.value_or(world / inner));
  l.micro_batch_size = s.micro_batch_size.value.value_or(tiny ? 2 : 1);
  if (s.global_batch_size.value && s.micro_batch_num.value)
    COCEMU_CHECK_ARG(
        *s.global_batch_size.value == *s.micro_batch_num.value * l.micro_batch_size * l.dp,
        "{} = {} disagrees with {} = {} (× micro batch {} × dp {} = {})", s.global_batch_size.where,
        *s.global_batch_size.value, s.micro_batch_num.where, *s.micro_batch_num.value,
        l.micro_batch_size, l.dp, *s.micro_batch_num.value * l.micro_batch_size * l.dp);
  const std::int64_t default_m = std::max<std::int64_t>(4, 2 * std::int64_t(l.pp));
  l.global_batch_size = s.global_batch_size.value.value_or(
      s.micro_batch_num.value.value_or(default_m) * l.micro_batch_size * l.dp);
  l.sequence_parallel = s.sequence_parallel.value.value_or(l.tp > 1);
  l.distributed_optimizer = s.distributed_optimizer.value.value_or(false);
  l.overlap_param_gather = s.overlap_param_gather.value.value_or(false);
  l.cross_entropy_fusion = s.cross_entropy_loss_fusion.value.value_or(false);
  l.scatter_gather_tensors_in_pipeline = s.scatter_gather_tensors_in_pipeline.value.value_or(false);
  l.gradients_mean = s.gradients_mean.value.value_or(true);
  l.micro_batch_interleave = int(s.micro_batch_interleave.value.value_or(1));
  l.bucket_params = int(s.bucket_params.value.value_or(0));
  if (s.bucket_mb.value) l.bucket_mb = *s.bucket_mb.value;
  l.dtype = parse_train_dtype(s.dtype);
  l.cp_algo = s.cp_algo.value.value_or("megatron_cp_algo");
  COCEMU_CHECK_ARG(l.cp_algo == "megatron_cp_algo" || l.cp_algo == "ulysses_cp_algo" ||
                       l.cp_algo == "hybrid_cp_algo",
                   "{}: context_parallel_algo '{}' is not allowed; allowed: megatron_cp_algo, "
                   "ulysses_cp_algo, hybrid_cp_algo",
                   s.cp_algo.where, l.cp_algo);
  l.cp_window_size = int(s.cp_window_size.value.value_or(1));
  l.ulysses_degree_in_cp = int(s.ulysses_degree_in_cp.value.value_or(0));
  l.use_cp_send_recv_overlap = s.cp_send_recv_overlap.value.value_or(false);
  l.recompute = layers::train::parse_recompute(s.recompute.value.value_or("none"));
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
  l.schedule =
      layers::train::parse_schedule(s.schedule.value.value_or(l.vpp > 1 ? "interleaved" : "1f1b"));
  const auto [strategy, p] = parse_coc(s.coc);
  l.coc = strategy;
  l.coc_parallel_num = p;
  layers::CocConfig coc;
  if (s.coc_config.value) {
    coc = layers::load_coc_config(*s.coc_config.value);
    o.linear = layers::options_for(coc, layers::Strategy::serial, 1);
    o.linear.per_shape = std::make_shared<const layers::CocConfig>(coc);
    setup.coc_name = "tuned";
  } else {
    coc.tile_rows = 32;  // several pipeline steps even for small layers (as `cocemu bench`)
    o.linear = layers::options_for(coc, strategy, p);
    setup.coc_name = s.coc.value.value_or("serial");
  }
  o.iterations = int(s.iterations.value.value_or(3));
  setup.deterministic = s.deterministic.value.value_or(true);
  (void)layers::train::check_layout(o.model, l, int(world));
  return setup;
}

}  // namespace cocemu::bench
