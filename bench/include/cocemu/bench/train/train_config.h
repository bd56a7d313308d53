#pragma once
/// `cocemu train`'s settings (R-TR-9), from Megatron/MindSpeed-style flags and from a MindFormers
/// `parallel_config` YAML file; each setting remembers where it came from, so a flag and a file
/// that disagree are an error naming both.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cocemu/bench/train/train_report.h"

namespace cocemu::bench {

template <class T>
struct Setting {
  std::optional<T> value;
  std::string where;  ///< "--tensor-model-parallel-size" or "parallel.yaml:4 model_parallel"
  void set(T v, std::string from) {
    value = std::move(v);
    where = std::move(from);
  }
};

struct TrainSettings {
  Setting<std::string> model, profile, schedule, recompute, dtype, coc, coc_config, cp_algo;
  Setting<std::int64_t> cp_window_size, ulysses_degree_in_cp;
  Setting<bool> cp_send_recv_overlap;
  Setting<std::int64_t> tp, cp, dp, pp, layers_per_virtual_stage, vpp, nodes, iterations;
  Setting<std::int64_t> micro_batch_size, global_batch_size, micro_batch_num, seq_length;
  Setting<std::int64_t> micro_batch_interleave, bucket_params;
  Setting<double> bucket_mb;
  Setting<bool> sequence_parallel, distributed_optimizer, gradients_mean, deterministic;
  Setting<bool> overlap_param_gather, cross_entropy_loss_fusion, scatter_gather_tensors_in_pipeline;
  Setting<std::vector<std::int64_t>> stage_layers;  ///< layers per pipeline stage (uneven split)
};

/// A MindFormers-style file: `parallel:` (gradients_mean, enable_parallel_optimizer),
/// `parallel_config:` (data_parallel, model_parallel, context_parallel, pipeline_stage,
/// use_seq_parallel, micro_batch_num, gradient_aggregation_group, pp_interleave_num, and
/// MindSpeed's context_parallel_algo, cp_window_size, ulysses_degree_in_cp,
/// use_cp_send_recv_overlap),
/// top-level micro_batch_interleave_num, `recompute_config:` (recompute, select_recompute),
/// `runner_config:` (batch_size = the micro-batch size), and cocemu's own `train:` (model,
/// profile, nodes, schedule, dtype, coc, coc_config, stage_layers, seq_length, deterministic,
/// overlap_param_gather, cross_entropy_loss_fusion, scatter_gather_tensors_in_pipeline,
/// iterations, global_batch_size). Unknown keys
/// are errors with file:line.
TrainSettings parse_train_config(const std::string& yaml_text, const std::string& origin);
/// `flags` and `file` together; a setting given by both with different values is an error.
TrainSettings merge_settings(const TrainSettings& flags, const TrainSettings& file);
/// The run: defaults filled in (the built-in tiny model on 8 devices, tp 2, pp 2, dp from the
/// world), the model and profile loaded, the layout checked.
TrainSetup resolve_settings(const TrainSettings& settings, bool dry_run);
/// A model config's decoder (configs/models/NAME or a path); it must give vocab_size. `source`
/// receives the config's source.
layers::train::DecoderShape load_decoder(const std::string& name_or_path,
                                         std::string* source = nullptr);
/// The built-in model for real-numerics runs on a laptop.
layers::train::DecoderShape tiny_model();

}  // namespace cocemu::bench
