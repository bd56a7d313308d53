// `cocemu train`'s settings from YAML: a MindFormers config with MindFormers' meaning, cocemu's
// own train: section, and the layout fields a validation reference shares with it
// (config.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"
#include "cocemu/train/config.h"

namespace cocemu::bench {

using detail::YamlReader;

namespace {

constexpr std::int64_t kMax = 1 << 20;

/// "file:line key" for a key of `r` (its value's line).
std::string at(const YamlReader& r, const std::string& key) {
  return fmt::format("{} {}{}", r.where(r.node()[key]), r.path().empty() ? "" : r.path() + ".",
                     key);
}

template <class T>
std::string shown(const T& v) {
  return fmt::format("{}", v);
}

/// Sets `s` from a file; a value already set by another section of the same file must agree.
template <class T>
void put(Setting<T>& s, T v, std::string where) {
  if (s.value && !(*s.value == v))
    COCEMU_FAIL(Errc::parse_error, "{} = {} disagrees with {} = {}", where, shown(v), s.where,
                shown(*s.value));
  s.set(std::move(v), std::move(where));
}

template <class T, class Read>
void read(YamlReader& r, const std::string& key, Setting<T>& s, Read&& get) {
  if (!r.has(key)) return;
  std::string where = at(r, key);
  put(s, T(get()), std::move(where));
}

/// A list of positive integers (stage_layers, offset entries are read elsewhere).
std::vector<std::int64_t> integer_list(YamlReader& r, const std::string& key, std::int64_t min,
                                       std::int64_t max) {
  std::vector<std::int64_t> out;
  for (const auto& [text, line] : r.strings(key)) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    COCEMU_CHECK(end != text.c_str() && *end == '\0' && v >= min && v <= max, Errc::parse_error,
                 "{}: {} entry '{}' must be an integer in [{}, {}]", line, key, text, min, max);
    out.push_back(v);
  }
  return out;
}

bool is_path(const std::string& name_or_path) {
  return name_or_path.find('/') != std::string::npos ||
         (name_or_path.size() > 5 &&
          name_or_path.compare(name_or_path.size() - 5, 5, ".yaml") == 0);
}

/// A path written inside a file is relative to that file's directory.
std::string relative_to_file(const std::string& path, const std::string& file) {
  const std::filesystem::path p(path), dir = std::filesystem::path(file).parent_path();
  if (p.is_absolute() || dir.empty()) return path;
  return (dir / p).lexically_normal().string();
}

/// MindFormers' keys that describe what cocemu does not model (data, optimizer hyperparameters,
/// checkpoints, callbacks, the device context): accepted and listed as ignored.
const std::vector<std::string>& ignored_top_keys() {
  static const std::vector<std::string> keys{"seed",
                                             "output_dir",
                                             "load_checkpoint",
                                             "load_ckpt_format",
                                             "src_strategy_path_or_dir",
                                             "auto_trans_ckpt",
                                             "only_save_strategy",
                                             "resume_training",
                                             "ignore_data_skip",
                                             "data_skip_steps",
                                             "run_mode",
                                             "trainer",
                                             "optimizer",
                                             "lr_schedule",
                                             "lr_scale",
                                             "lr_scale_factor",
                                             "layer_scale",
                                             "layer_decay",
                                             "train_dataset",
                                             "train_dataset_task",
                                             "eval_dataset",
                                             "eval_dataset_task",
                                             "do_eval",
                                             "eval_step_interval",
                                             "eval_epoch_interval",
                                             "callbacks",
                                             "eval_callbacks",
                                             "context",
                                             "use_parallel",
                                             "processor",
                                             "metric",
                                             "runner_wrapper",
                                             "profile",
                                             "profile_start_step",
                                             "profile_stop_step",
                                             "init_start_profile",
                                             "profile_communication",
                                             "profile_memory",
                                             "moe_config",
                                             "swap_config",
                                             "monitor_config",
                                             "tensorboard",
                                             "use_legacy",
                                             "print_separate_loss",
                                             "remote_save_url",
                                             "auto_tune",
                                             "filepath_prefix",
                                             "autotune_per_step"};
  return keys;
}

/// Marks every listed key of `r` that is present as read, and records it.
void ignore(YamlReader& r, const std::vector<std::string>& keys, std::vector<std::string>& out) {
  for (const std::string& k : keys)
    if (r.has(k)) {
      r.skip(k);
      out.push_back(r.path().empty() ? k : r.path() + "." + k);
    }
}

/// MindSpeed's context_parallel_algo for MindFormers' name (ContextParallelAlgo in
/// mindformers/modules/transformer/transformer.py).
std::string mindspeed_cp_algo(const std::string& mindformers_name) {
  if (mindformers_name == "colossalai_cp") return "megatron_cp_algo";
  if (mindformers_name == "ulysses_cp") return "ulysses_cp_algo";
  if (mindformers_name == "hybrid_cp") return "hybrid_cp_algo";
  return "";
}

}  // namespace

void read_layout_fields(YamlReader& t, TrainSettings& s) {
  read(t, "tp", s.tp, [&] { return t.integer("tp", 1, kMax); });
  read(t, "cp", s.cp, [&] { return t.integer("cp", 1, kMax); });
  read(t, "dp", s.dp, [&] { return t.integer("dp", 1, kMax); });
  read(t, "pp", s.pp, [&] { return t.integer("pp", 1, kMax); });
  read(t, "vpp", s.vpp, [&] { return t.integer("vpp", 1, 64); });
  read(t, "micro_batch_size", s.micro_batch_size,
       [&] { return t.integer("micro_batch_size", 1, kMax); });
  read(t, "global_batch_size", s.global_batch_size,
       [&] { return t.integer("global_batch_size", 1, std::int64_t(1) << 30); });
  read(t, "schedule", s.schedule, [&] { return t.string("schedule"); });
  read(t, "recompute", s.recompute, [&] { return t.string("recompute"); });
  read(t, "dtype", s.dtype, [&] { return t.string("dtype"); });
  read(t, "coc", s.coc, [&] { return t.string("coc"); });
  read(t, "sequence_parallel", s.sequence_parallel, [&] { return t.boolean("sequence_parallel"); });
  read(t, "distributed_optimizer", s.distributed_optimizer,
       [&] { return t.boolean("distributed_optimizer"); });
  read(t, "overlap_grad_reduce", s.overlap_grad_reduce,
       [&] { return t.boolean("overlap_grad_reduce"); });
  read(t, "overlap_p2p_comm", s.overlap_p2p_comm, [&] { return t.boolean("overlap_p2p_comm"); });
  read(t, "overlap_param_gather", s.overlap_param_gather,
       [&] { return t.boolean("overlap_param_gather"); });
  read(t, "grad_reduce_in_fp32", s.grad_reduce_in_fp32,
       [&] { return t.boolean("grad_reduce_in_fp32"); });
  read(t, "bucket_mb", s.bucket_mb, [&] { return t.number("bucket_mb", 1e-3, 1e6); });
  read(t, "cross_entropy_loss_fusion", s.cross_entropy_loss_fusion,
       [&] { return t.boolean("cross_entropy_loss_fusion"); });
  read(t, "scatter_gather_tensors_in_pipeline", s.scatter_gather_tensors_in_pipeline,
       [&] { return t.boolean("scatter_gather_tensors_in_pipeline"); });
  if (t.has("attention")) {
    const std::string where = at(t, "attention"), v = t.string("attention");
    COCEMU_CHECK(v == "flash" || v == "unfused", Errc::parse_error,
                 "{}: attention '{}' is not allowed; allowed: flash, unfused", where, v);
    put(s.flash_attention, v == "flash", where);
  }
  if (t.has("stage_layers")) {
    const std::string where = at(t, "stage_layers");
    std::vector<std::int64_t> layers = integer_list(t, "stage_layers", 1, kMax);
    COCEMU_CHECK(!layers.empty(), Errc::parse_error,
                 "{}: stage_layers is empty; list the layers of every pipeline stage (one entry "
                 "per stage), or leave it out for an even split",
                 where);
    put(s.stage_layers, std::move(layers), where);
  }
  read(t, "tp_comm_overlap", s.tp_comm_overlap, [&] { return t.boolean("tp_comm_overlap"); });
  read(t, "use_ascend_coc", s.use_ascend_coc, [&] { return t.boolean("use_ascend_coc"); });
  read(t, "coc_fused_kernel", s.coc_fused_kernel, [&] { return t.boolean("coc_fused_kernel"); });
  read(t, "coc_parallel_num", s.coc_parallel_num,
       [&] { return t.integer("coc_parallel_num", 1, 8); });
  if (t.has("context_parallel_algo")) {
    const std::string where = at(t, "context_parallel_algo"), v = t.string("context_parallel_algo");
    COCEMU_CHECK(mindspeed_cp_algo(v).empty(), Errc::parse_error,
                 "{}: '{}' is MindFormers' name; here (cocemu's own section, as MindSpeed's "
                 "--context-parallel-algo) write '{}', or give it as parallel_config."
                 "context_parallel_algo",
                 where, v, mindspeed_cp_algo(v));
    put(s.cp_algo, v, where);
  }
  read(t, "cp_window_size", s.cp_window_size, [&] { return t.integer("cp_window_size", 1, kMax); });
  read(t, "ulysses_degree_in_cp", s.ulysses_degree_in_cp,
       [&] { return t.integer("ulysses_degree_in_cp", 1, kMax); });
  read(t, "use_cp_send_recv_overlap", s.cp_send_recv_overlap,
       [&] { return t.boolean("use_cp_send_recv_overlap"); });
}

TrainSettings parse_train_config(const std::string& text, const std::string& origin) {
  auto top = YamlReader::parse(text, origin, "training config");
  TrainSettings s;
  std::vector<std::string> ignored, refused_hint;
  bool interleave = false;
  std::string interleave_where;
  if (top.has("parallel")) {
    auto p = top.map("parallel");
    int mode = 1;  // semi-auto: what a parallel_config describes
    std::string mode_where = "parallel_mode absent: semi-auto";
    if (p.has("parallel_mode")) {
      mode_where = at(p, "parallel_mode");
      mode = int(p.integer("parallel_mode", 0, 3));
      COCEMU_CHECK(mode != 3, Errc::parse_error,
                   "{}: parallel_mode 3 (hybrid parallel, operators split by hand) is not "
                   "modeled; allowed: 0 (data parallel), 1 (semi-auto), 2 (auto)",
                   mode_where);
    }
    if (p.has("gradients_mean")) {
      const std::string where = at(p, "gradients_mean");
      const bool mean = p.boolean("gradients_mean");
      if (mode == 0) {
        // Data parallel: each device's loss is its own batch's mean; gradients_mean divides the
        // reduced gradients by the device count.
        put(s.gradients_mean, mean, where + " (data parallel)");
      } else {
        // Semi-auto and auto parallel: the loss is already the mean over the global batch, so
        // the reduced gradients are the mean with gradients_mean False (MindFormers' configs
        // set False; shared/reference/parallel-semantics.md).
        COCEMU_CHECK(!mean, Errc::parse_error,
                     "{}: gradients_mean true with {} (semi-auto/auto parallel) divides the "
                     "gradients, already averaged over the global batch, by data_parallel again; "
                     "cocemu does not model that scale. MindFormers' semi-auto configs use false "
                     "(averaged gradients); true belongs to parallel_mode 0 (data parallel)",
                     where, mode_where);
        put(s.gradients_mean, true, where + " false (semi-auto: the loss is the global mean)");
      }
    }
    if (mode == 0) s.notes.push_back(fmt::format("{}: data parallel mode", mode_where));
    read(p, "enable_parallel_optimizer", s.distributed_optimizer,
         [&] { return p.boolean("enable_parallel_optimizer"); });
    if (p.has("pipeline_config")) {
      auto pc = p.map("pipeline_config");
      if (pc.has("pipeline_interleave")) {
        interleave_where = at(pc, "pipeline_interleave");
        interleave = pc.boolean("pipeline_interleave");
      }
      if (pc.has("pipeline_scheduler")) {
        const std::string where = at(pc, "pipeline_scheduler"), v = pc.string("pipeline_scheduler");
        COCEMU_CHECK(v == "1f1b" || v == "gpipe", Errc::parse_error,
                     "{}: pipeline_scheduler '{}' is not modeled; allowed: 1f1b (interleaved with "
                     "pipeline_interleave), gpipe",
                     where, v);
        if (v == "gpipe") put(s.schedule, std::string("gpipe"), where);
      }
      pc.finish();
    }
    ignore(p,
           {"full_batch", "enable_alltoall", "search_mode", "strategy_ckpt_save_file",
            "strategy_ckpt_load_file", "strategy_ckpt_config", "parallel_optimizer_config",
            "dataset_strategy", "loss_repeated_mean", "device_num", "auto_pipeline"},
           ignored);
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
    read(p, "gradient_aggregation_group", s.aggregation_groups,
         [&] { return p.integer("gradient_aggregation_group", 1, kMax); });
    if (p.has("context_parallel_algo")) {
      const std::string where = at(p, "context_parallel_algo"),
                        v = p.string("context_parallel_algo"), ms = mindspeed_cp_algo(v);
      COCEMU_CHECK(!ms.empty(), Errc::parse_error,
                   "{}: context_parallel_algo '{}' is not MindFormers' (its ContextParallelAlgo "
                   "has colossalai_cp, ulysses_cp, hybrid_cp); MindSpeed's names "
                   "(megatron_cp_algo, ...) go in the train: section or --context-parallel-algo",
                   where, v);
      put(s.cp_algo, ms, where + " " + v);
    }
    read(p, "ulysses_degree_in_cp", s.ulysses_degree_in_cp,
         [&] { return p.integer("ulysses_degree_in_cp", 1, kMax); });
    for (const char* key : {"pp_interleave_num", "cp_window_size", "use_cp_send_recv_overlap"})
      COCEMU_CHECK(!p.has(key), Errc::parse_error,
                   "{}: '{}' is not a MindFormers parallel_config key (TransformerOpParallelConfig "
                   "rejects it); {}",
                   at(p, key), key,
                   std::string(key) == "pp_interleave_num"
                       ? "interleaving is parallel.pipeline_config.pipeline_interleave: true with "
                         "model.model_config.pp_interleave_num"
                       : "MindSpeed's option goes in cocemu's train: section");
    if (p.has("expert_parallel"))
      COCEMU_CHECK(p.integer("expert_parallel", 1, kMax) == 1, Errc::parse_error,
                   "{}: expert_parallel > 1 (MoE) is not modeled; cocemu's decoder is dense",
                   at(p, "expert_parallel"));
    if (p.has("seq_split_num"))
      COCEMU_CHECK(p.integer("seq_split_num", 1, kMax) == 1, Errc::parse_error,
                   "{}: seq_split_num > 1 (the seqpipe schedule) is not modeled",
                   at(p, "seq_split_num"));
    if (p.has("vocab_emb_dp"))
      COCEMU_CHECK(!p.boolean("vocab_emb_dp"), Errc::parse_error,
                   "{}: vocab_emb_dp true (a data-parallel embedding table) is not modeled; "
                   "cocemu's embedding and LM head are vocab-parallel over model_parallel "
                   "(vocab_emb_dp false)",
                   at(p, "vocab_emb_dp"));
    ignore(p, {"mem_coeff", "optimizer_shard", "recompute", "swap", "gradient_accumulation_shard"},
           ignored);
    p.finish();
  }
  read(top, "micro_batch_interleave_num", s.micro_batch_interleave,
       [&] { return top.integer("micro_batch_interleave_num", 1, 2); });
  if (top.has("recompute_config")) {
    auto r = top.map("recompute_config");
    const std::string where = r.where(top.node()["recompute_config"]);
    bool full = false, selective = false;
    for (const char* key : {"recompute", "select_recompute"})
      if (r.has(key)) {
        COCEMU_CHECK(r.node()[key].IsScalar(), Errc::parse_error,
                     "{}: a per-layer or per-operator {} list is not modeled; give true or false",
                     at(r, key), key);
        (std::string(key) == "recompute" ? full : selective) = r.boolean(key);
      }
    ignore(
        r,
        {"select_comm_recompute", "parallel_optimizer_comm_recompute", "mp_comm_recompute",
         "recompute_slice_activation", "select_recompute_exclude", "select_comm_recompute_exclude"},
        ignored);
    r.finish();
    COCEMU_CHECK(!(full && selective), Errc::parse_error,
                 "{}: recompute and select_recompute cannot both be true", where);
    put(s.recompute,
        std::string(full        ? "full"
                    : selective ? "selective"
                                : "none"),
        where + " recompute_config");
  }
  if (top.has("runner_config")) {
    auto r = top.map("runner_config");
    read(r, "batch_size", s.copy_batch_size, [&] { return r.integer("batch_size", 1, kMax); });
    read(r, "gradient_accumulation_steps", s.gradient_accumulation_steps,
         [&] { return r.integer("gradient_accumulation_steps", 1, kMax); });
    ignore(r, {"epochs", "sink_mode", "sink_size", "initial_epoch", "stop_step"}, ignored);
    r.finish();
  }
  if (top.has("model")) {
    auto m = top.map("model");
    if (m.has("model_config")) {
      auto mc = m.map("model_config");
      read(mc, "seq_length", s.seq_length,
           [&] { return mc.integer("seq_length", 1, std::int64_t(1) << 24); });
      if (mc.has("pp_interleave_num")) {
        const std::string where = at(mc, "pp_interleave_num");
        const std::int64_t v = mc.integer("pp_interleave_num", 1, 64);
        // MindFormers sets pp_interleave_num to 1 unless the pipeline interleaves (LayerSetting).
        if (interleave)
          put(s.vpp, v, where);
        else if (v > 1)
          s.notes.push_back(fmt::format(
              "{} = {} ignored: parallel.pipeline_config.pipeline_interleave is not true (as "
              "MindFormers)",
              where, v));
      }
      if (mc.has("offset")) {
        const std::string where = at(mc, "offset");
        const YAML::Node n = mc.node()["offset"];
        std::vector<std::int64_t> offset;
        if (n.IsScalar()) {
          offset.push_back(mc.integer("offset", -kMax, kMax));
        } else {
          COCEMU_CHECK(n.IsSequence(), Errc::parse_error,
                       "{}: offset must be an integer or a list of integers (one per stage)",
                       where);
          for (std::size_t i = 0; i < n.size(); ++i)
            COCEMU_CHECK(n[i].IsScalar(), Errc::parse_error,
                         "{}: a per-chunk (2-D) offset is not modeled; give one integer per "
                         "pipeline stage",
                         where);
          offset = integer_list(mc, "offset", -kMax, kMax);
        }
        s.stage_offset.set(std::move(offset), where);
      }
      for (const char* key : {"hidden_size", "num_layers", "num_heads", "n_kv_heads", "vocab_size"})
        if (mc.has(key)) {
          const std::string where = at(mc, key);
          s.model_checks.push_back({key, mc.integer(key, 1, std::int64_t(1) << 40), where});
        }
      for (const std::string& key : mc.keys())  // the rest: names, norms, token ids, dtypes …
        if (key != "seq_length" && key != "pp_interleave_num" && key != "offset" &&
            key != "hidden_size" && key != "num_layers" && key != "num_heads" &&
            key != "n_kv_heads" && key != "vocab_size")
          ignored.push_back("model.model_config." + key);
    }
    for (const std::string& key : m.keys())
      if (key != "model_config") ignored.push_back("model." + key);
  }
  if (interleave && !s.vpp.value)
    COCEMU_FAIL(Errc::parse_error,
                "{}: pipeline_interleave true needs model.model_config.pp_interleave_num (model "
                "chunks per stage)",
                interleave_where);
  if (top.has("train")) {
    auto t = top.map("train");
    auto path_or_name = [&](const std::string& key, Setting<std::string>& out, bool always_path) {
      if (!t.has(key)) return;
      const std::string where = at(t, key), v = t.string(key);
      put(out, always_path || is_path(v) ? relative_to_file(v, origin) : v, where);
    };
    path_or_name("model", s.model, false);
    path_or_name("profile", s.profile, false);
    path_or_name("coc_config", s.coc_config, true);
    read(t, "nodes", s.nodes, [&] { return t.integer("nodes", 1, 4096); });
    read(t, "seq_length", s.seq_length,
         [&] { return t.integer("seq_length", 1, std::int64_t(1) << 24); });
    read(t, "deterministic", s.deterministic, [&] { return t.boolean("deterministic"); });
    read(t, "iterations", s.iterations, [&] { return t.integer("iterations", 1, 1000); });
    read_layout_fields(t, s);
    t.finish();
  }
  ignore(top, ignored_top_keys(), ignored);
  top.finish();
  if (!ignored.empty())
    s.notes.push_back(
        fmt::format("{}: ignored, not modeled: {}", origin, fmt::join(ignored, ", ")));
  return s;
}

}  // namespace cocemu::bench
