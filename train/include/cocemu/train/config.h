#pragma once
/// `cocemu train`'s settings (R-TR-9), from Megatron/MindSpeed-style flags and from a MindFormers
/// YAML file; each setting remembers where it came from, so a flag and a file that disagree are
/// an error naming both.
///
/// One set of fields serves every input: the flags, a MindFormers file's sections (with
/// MindFormers' names and meaning), cocemu's own `train:` section and a validation reference's
/// `layout:` (read_layout_fields), all resolved by one function (resolve_settings).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cocemu/train/report.h"

namespace cocemu::detail {
class YamlReader;  // runtime's internal YAML reader (detail/yaml_reader.h), not installed
}

namespace cocemu::bench {

/// The tensor-parallel size MindSpeed's LCOC fused kernels support: "only TP=8" (MindSpeed's
/// feature doc for --coc-fused-kernel, features_manager/tensor_parallel/locl_coc.py).
inline constexpr int kLcocFusedTp = 8;

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
  Setting<std::string> model, profile, schedule, recompute, dtype, coc, coc_config;
  /// MindSpeed's names (megatron_cp_algo, ulysses_cp_algo, hybrid_cp_algo), whatever the input
  /// spelled (MindFormers' colossalai_cp, ulysses_cp, hybrid_cp; Megatron's --cp-comm-type).
  Setting<std::string> cp_algo;
  Setting<std::int64_t> cp_window_size, ulysses_degree_in_cp;
  Setting<bool> cp_send_recv_overlap;
  Setting<std::int64_t> tp, cp, dp, pp, layers_per_virtual_stage, vpp, nodes, iterations;
  /// Megatron's micro-batch (sequences per pipeline micro-batch, all copies together).
  Setting<std::int64_t> micro_batch_size, global_batch_size, seq_length;
  /// MindFormers' runner_config.batch_size: one copy (× micro_batch_interleave_num per
  /// micro-batch).
  Setting<std::int64_t> copy_batch_size;
  /// MindFormers: micro_batch_num counts the micro-batches with pipeline_stage > 1;
  /// gradient_accumulation_steps with pipeline_stage 1 (where micro_batch_num is reset to 1).
  Setting<std::int64_t> micro_batch_num, gradient_accumulation_steps;
  /// MindFormers' gradient_aggregation_group: the layers' gradients in this many fusion groups
  /// (one group when pipeline_stage > 1).
  Setting<std::int64_t> aggregation_groups;
  Setting<std::int64_t> micro_batch_interleave;
  Setting<double> bucket_mb;
  /// Gradient divided by dp after the reduction (cocemu's layout meaning; a MindFormers file's
  /// gradients_mean is converted by parallel_mode, see parse_train_config).
  Setting<bool> gradients_mean;
  Setting<bool> sequence_parallel, distributed_optimizer, deterministic;
  Setting<bool> overlap_grad_reduce, overlap_param_gather, grad_reduce_in_fp32;
  /// Interleaved 1F1B's p2p overlapped with compute (Megatron's default; false:
  /// --no-overlap-p2p-communication, the blocking batched calls of 2021-2022 Megatron).
  Setting<bool> overlap_p2p_comm;
  Setting<bool> cross_entropy_loss_fusion, scatter_gather_tensors_in_pipeline;
  Setting<bool> flash_attention;                    ///< false: Megatron's unfused core attention
  Setting<std::vector<std::int64_t>> stage_layers;  ///< layers per pipeline stage (uneven split)
  /// MindFormers' model_config.offset: layers of stage s = num_layers / pipeline_stage + offset[s].
  Setting<std::vector<std::int64_t>> stage_offset;
  /// Megatron's --decoder-first/last-pipeline-num-layers (the middle stages split the rest).
  Setting<std::int64_t> first_stage_layers, last_stage_layers;
  /// Megatron's --recompute-method / --recompute-num-layers (cocemu models uniform, 1).
  Setting<std::string> recompute_method;
  Setting<std::int64_t> recompute_num_layers;
  /// The platform's TP overlap switches: MindSpeed's --use-ascend-coc, --coc-parallel-num,
  /// --coc-fused-kernel; Megatron-LM's --tp-comm-overlap.
  Setting<bool> use_ascend_coc, coc_fused_kernel, tp_comm_overlap;
  Setting<std::int64_t> coc_parallel_num;
  /// `--compare-coc`: `coc` replaces the CoC config's per-shape choices (its other keys stay).
  bool coc_overrides_config = false;
  /// A MindFormers model.model_config's shapes, checked against the model: (key, value, where).
  struct ModelCheck {
    std::string key;
    std::int64_t value = 0;
    std::string where;
  };
  std::vector<ModelCheck> model_checks;
  /// What the input gave that cocemu does not model ("FILE: ignored, not modeled: a, b").
  std::vector<std::string> notes;
};

/// The layout and strategy fields cocemu spells its own way, in a YAML map: a `train:` section
/// and a validation reference's `layout:` — tp, cp, pp, vpp, micro_batch_size,
/// global_batch_size, schedule, recompute (none, selective, full), sequence_parallel,
/// distributed_optimizer, overlap_grad_reduce, overlap_param_gather, grad_reduce_in_fp32,
/// bucket_mb, cross_entropy_loss_fusion, scatter_gather_tensors_in_pipeline, stage_layers,
/// attention (flash, unfused), dtype, coc (serial, script-p2/p4/p8, fused), tp_comm_overlap,
/// use_ascend_coc, coc_parallel_num, coc_fused_kernel, context_parallel_algo (MindSpeed's names),
/// cp_window_size, ulysses_degree_in_cp, use_cp_send_recv_overlap. A field already set (by
/// another section of the same file) to a different value is an error naming both places.
void read_layout_fields(detail::YamlReader& section, TrainSettings& s);

/// A MindFormers-style file, read with MindFormers' meaning:
///  - `parallel:` parallel_mode (1 semi-auto, the default; 2 auto; 0 data parallel),
///    gradients_mean (semi-auto and auto: the loss is already the mean over the global batch, so
///    `false` is MindFormers' convention and gives the averaged gradients; `true` would divide
///    by data_parallel again and is refused; data parallel: `true` averages over dp),
///    enable_parallel_optimizer, pipeline_config {pipeline_interleave, pipeline_scheduler};
///  - `parallel_config:` data_parallel, model_parallel, context_parallel, pipeline_stage,
///    use_seq_parallel, micro_batch_num (pipeline_stage > 1), gradient_aggregation_group (fusion
///    groups over the layers, one when pipeline_stage > 1), context_parallel_algo
///    (colossalai_cp, ulysses_cp, hybrid_cp), ulysses_degree_in_cp;
///  - top-level micro_batch_interleave_num; `recompute_config:` (recompute, select_recompute);
///  - `runner_config:` batch_size (one copy), gradient_accumulation_steps (pipeline_stage 1);
///  - `model: model_config:` seq_length, pp_interleave_num (with pipeline_interleave), offset
///    (layers per stage = num_layers / pipeline_stage + offset), and shapes checked against the
///    model (hidden_size, num_layers, num_heads, n_kv_heads, vocab_size);
///  - cocemu's own `train:` (model, profile, nodes, seq_length, deterministic, iterations,
///    coc_config, and the fields of read_layout_fields).
/// MindFormers keys cocemu does not model are accepted and listed in `notes` ("ignored: not
/// modeled"), or refused by name where they would change what is modeled (expert_parallel > 1,
/// vocab_emb_dp true, seq_split_num > 1, a recompute list, 2-D offsets). Unknown keys are
/// errors with file:line. Paths inside (train: model, profile and coc_config, when they are
/// paths rather than names) are relative to the file's directory.
TrainSettings parse_train_config(const std::string& yaml_text, const std::string& origin);
/// `flags` and `file` together; a setting given by both with different values is an error.
TrainSettings merge_settings(const TrainSettings& flags, const TrainSettings& file);
/// The run: defaults filled in (the built-in tiny model on 8 devices, tp 2, pp 2, dp from the
/// world), the model and profile loaded, the layout checked.
TrainSetup resolve_settings(const TrainSettings& settings, bool dry_run);
/// The same on a given model and profile (a validation reference's published run).
TrainSetup resolve_settings(const TrainSettings& settings, bool dry_run,
                            const layers::train::DecoderShape& model, std::string model_source,
                            std::shared_ptr<const DeviceProfile> profile);
/// A model config's decoder (configs/models/NAME or a path); it must give vocab_size. `source`
/// receives the config's source.
layers::train::DecoderShape load_decoder(const std::string& name_or_path,
                                         std::string* source = nullptr);
/// The built-in model for real-numerics runs on a laptop.
layers::train::DecoderShape tiny_model();

/// The "[m, k, n]" keys the run's TP GEMMs look their CoC choice up with (MindSpeed's
/// get_parallel_num: m gathered under sequence parallelism), as the priced parts see them;
/// empty with tp 1.
std::vector<std::string> run_gemm_keys(const TrainSetup& setup);
/// One line when `coc`'s customized_coc matches none of `keys` (the run's shapes): names the
/// file and lists the run's shapes; "" when something matches or there is nothing to match.
std::string unmatched_coc_warning(const std::string& file,
                                  const std::map<std::string, int>& customized_coc,
                                  const std::vector<std::string>& keys);

}  // namespace cocemu::bench
