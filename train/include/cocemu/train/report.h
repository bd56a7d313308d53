#pragma once
/// `cocemu train`'s figures (R-TR-7, R-TR-10): iteration time, tokens/s, model TFLOP/s per
/// device and MFU, the pipeline bubble, exposed communication by kind, and per-device memory —
/// from an emulated run's modeled timeline, or from the step model (step_model.h) for worlds
/// too large to run.
#include <nlohmann/json.hpp>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/runtime/profile.h"
#include "cocemu/train/trainer.h"

namespace cocemu::bench {

/// What `cocemu train` runs: the step's options, the device profile and the cluster.
struct TrainSetup {
  layers::train::TrainOptions options;
  std::shared_ptr<const DeviceProfile> profile;
  int nodes = 1;
  bool dry_run = false;
  std::string model_source;  ///< the model config's path, or "built-in tiny"
  std::string coc_name = "serial";
  /// Collectives sum in rank order (R-CO-5) and are priced with the algorithms that do (direct,
  /// chain); false: NCCL's and HCCL's algorithms (multi-channel rings, hierarchical all_reduce),
  /// as a cluster runs them by default.
  bool deterministic = true;
  /// What the settings gave that takes no effect or is approximated (printed on stderr).
  std::vector<std::string> notes;
};

struct MemoryTerm {
  std::string name;
  double bytes = 0;
};

/// Per-device memory of the pipeline stage that needs the most.
struct MemoryEstimate {
  int stage = 0;
  std::vector<MemoryTerm> terms;  ///< parameters, gradients, optimizer state, activations, …
  double peak_bytes = 0;
  double capacity_bytes = 0;  ///< the profile's device memory (0: not given)
  bool oom = false;
  std::string verdict;  ///< "fits: 41.2 of 64.0 GB" or the OOM verdict with the largest terms
};

/// How a layer keeps its activations: Megatron's GPT layer as Korthikanti et al. (2022) count
/// it (dropout masks, softmax kept unless recomputed), or the emulated layer (flash attention,
/// no dropout, RMSNorm statistics).
struct ActivationStyle {
  bool flash_attention = true;
  bool dropout = false;
  bool norm_statistics = true;
};
ActivationStyle emulated_layer_style();
ActivationStyle megatron_gpt_style();

/// What one transformer layer keeps per micro-batch on one device, tensor by tensor (bytes), for
/// the layout's tp, sequence parallelism and recompute.
std::vector<MemoryTerm> layer_activations(const layers::train::DecoderShape& model,
                                          const layers::train::TrainLayout& layout,
                                          const ActivationStyle& style);
/// Micro-batches whose activations a stage holds at once under the layout's schedule (counted
/// from the schedule's order, in units of model chunks).
int peak_chunks_in_flight(const layers::train::TrainLayout& layout, int stage);
/// The same, counted from a stage's action list; with `chunk` ≥ 0, only that model chunk's
/// micro-batches.
int peak_chunks_in_flight(const std::vector<layers::train::PipelineAction>& actions,
                          int chunk = -1);
/// Micro-batches whose logits the last stage holds at once: those of its last chunk (the one
/// that computes the loss) in flight, from the same action list the schedule runs.
int peak_loss_in_flight(const layers::train::TrainLayout& layout);
class StepMemo;
/// Per-device memory of the layout's fullest stage. `memo` (optional) supplies the schedules'
/// in-flight counts when many layouts are estimated (a search).
MemoryEstimate estimate_memory(const layers::train::DecoderShape& model,
                               const layers::train::TrainLayout& layout,
                               const DeviceProfile& profile, StepMemo* memo = nullptr);

/// "41.2 GB", "3.1 MB", "12.0 kB" (decimal units, as device memory is quoted).
std::string decimal_bytes(double bytes);

/// Parameters of one layer's four linears, in the order the backward finalizes them: MLP down,
/// MLP up, attention out, QKV (full, before TP).
std::array<double, 4> linear_parameters(const layers::train::DecoderShape& model);
/// The kind of communication a lane of a rank carries, by its stream's name: "TP" (the comm
/// stream), "DP", "PP", "CP"; nullptr for other lanes.
const char* comm_kind(const std::string& lane);

/// Parameters of one stage's ranks (per device, after TP).
double stage_parameters(const layers::train::DecoderShape& model,
                        const layers::train::TrainLayout& layout, int stage);
/// Model FLOPs of one iteration (Narayanan et al. 2021: forward + 2 × backward, attention
/// counted as full s², recompute not counted; the LM head over Megatron's padded vocabulary).
double model_flops_per_iteration(const layers::train::DecoderShape& model,
                                 const layers::train::TrainLayout& layout);

/// One block of the pipeline picture.
struct PipelineBlockTime {
  int stage = 0;
  std::string label;  ///< "F3", "B3.1"
  bool forward = true;
  std::int64_t start_ns = 0, end_ns = 0;
};

struct TrainReport {
  std::string model, layout, profile, source;  ///< source: "emulated" or "step model"
  /// What the layout string names, as keys of their own: MindSpeed's context_parallel_algo
  /// (cp > 1) and MindSpore's micro_batch_interleave_num.
  std::string cp_algo;
  int micro_batch_interleave = 1;
  bool dry_run = false;
  bool deterministic = true;  ///< the collectives' mode (TrainSetup::deterministic)
  int world = 0, nodes = 1;
  std::int64_t iteration_ns = 0;
  double tokens_per_s = 0, tflops_per_device = 0, mfu = 0;
  double bubble_fraction = 0, ideal_bubble_fraction = 0;
  /// The pipeline's span (first action's start to last action's end) the bubble is a fraction
  /// of (step model; 0 when not known).
  double pipeline_span_ns = 0;
  std::map<std::string, double> exposed_comm_ns;  ///< TP, CP, DP, PP
  MemoryEstimate memory;
  std::vector<double> loss, grad_norm;  ///< empty in a dry run
  std::vector<std::string> warnings;
  std::vector<PipelineBlockTime> pipeline;  ///< the last iteration, one rank per stage
};

/// The figures of an emulated run (its last iteration).
TrainReport report_from_run(const TrainSetup& setup, const layers::train::TrainResult& result);

nlohmann::json to_json(const TrainReport& report);
std::string format_report(const TrainReport& report);
/// The classic pipeline picture: one row per stage, time to the right, forward and backward
/// blocks with their micro-batch numbers.
std::string pipeline_svg(const TrainReport& report);

}  // namespace cocemu::bench
