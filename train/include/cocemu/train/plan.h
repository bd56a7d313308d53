#pragma once
/// `cocemu plan` (R-PL-1..3): searches a whole-cluster training layout for a model, a cluster
/// (profile × nodes), a global batch and a sequence length — tp, cp (ring or Ulysses), pp, vpp,
/// dp, micro-batch size and count, recompute, the distributed optimizer, sequence parallelism,
/// multi-copy, and the CoC strategy of every GEMM shape (as `tune` decides it).
///
/// Candidates break Megatron's and MindFormers' rules or do not fit device memory are pruned,
/// counted by reason. The others are evaluated by the step model on parts priced from the cost
/// model (part_model.h): no rank thread starts. Evaluation runs in a oneTBB task_arena of
/// `threads` threads; priced parts and DP collectives are memoized in concurrent maps shared by
/// all candidates.
///
/// Search modes (MindSpore's names where they fit):
///  - exhaustive: every candidate with Megatron's even layer split;
///  - dynamic_programming: as exhaustive, and for every 1F1B candidate the layer-to-stage
///    partition that minimises the slowest stage (the embedding and the LM head make the first
///    and last stages heavier), by dynamic programming over layers and stages;
///  - recursive_programming: a fast heuristic — from a start layout, moves one dimension at a
///    time to the best neighbour until none improves (a few dozen evaluations).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cocemu/layers/coc_config.h"
#include "cocemu/train/report.h"

namespace cocemu::bench {

enum class SearchMode { exhaustive, dynamic_programming, recursive_programming };
const char* to_string(SearchMode m);
SearchMode parse_search_mode(const std::string& name);

struct PlanQuery {
  layers::train::DecoderShape model;  ///< seq is the training sequence length
  std::string model_name;             ///< as given (configs/models/NAME or a path)
  std::shared_ptr<const DeviceProfile> profile;
  std::string profile_name;
  int nodes = 1;
  std::int64_t global_batch = 0;
  DType dtype = DType::bf16;
  SearchMode mode = SearchMode::exhaustive;
  int threads = 0;  ///< 0: all cores
  int top_k = 5;
  /// The space (defaults: every value the rules allow up to these bounds).
  std::vector<std::int64_t> micro_batch_sizes{1, 2, 4, 8};
  int max_cp = 8;
  int max_vpp = 4;
  /// Also run the heuristic and report how its best compares (exhaustive modes).
  bool compare_heuristic = true;
  /// Price rank-ordered collectives (cocemu's deterministic mode) instead of NCCL/HCCL's
  /// algorithms, which a cluster runs by default.
  bool deterministic = false;
  /// Every candidate with Megatron's --cross-entropy-loss-fusion (off: its default).
  bool cross_entropy_fusion = false;
};

/// One evaluated candidate.
struct PlanCandidate {
  layers::train::TrainLayout layout;
  std::map<std::string, int> customized_coc;  ///< "[m, k, n]" -> -1 fused, 1 off, 2/4/8
  /// Megatron-LM's --tp-comm-overlap for every TP linear (platforms with te_userbuffers).
  bool tp_comm_overlap = false;
  TrainReport report;            ///< modeled (step model on priced parts)
  std::string describe() const;  ///< layout and CoC in one line
};

struct PlanResult {
  PlanQuery request;
  int world = 0;
  std::int64_t enumerated = 0, evaluated = 0;
  std::map<std::string, std::int64_t> pruned;  ///< reason -> candidates
  std::vector<PlanCandidate> top;              ///< best first
  double seconds = 0;                          ///< the whole search
  double evaluation_seconds = 0;  ///< its parallel part: pruning and evaluating candidates
  double candidates_per_s = 0;    ///< candidates ÷ evaluation_seconds
  int threads = 0;
  std::string explanation;  ///< why the winner wins over the runner-up
  /// The heuristic's best (recursive_programming) when compared, and its evaluations.
  std::optional<PlanCandidate> heuristic;
  std::int64_t heuristic_evaluated = 0;
  /// What the explanation compares (ms per iteration and device, runner-up minus winner):
  /// pipeline bubble, exposed TP/CP/DP/PP communication, device compute, and the rest
  /// (optimizer step and stage imbalance); they sum to the gap.
  std::vector<std::pair<std::string, double>> explanation_terms;
  /// When the winner uses multi-copy (MindSpore only): the best candidate in one copy, which
  /// the Megatron/MindSpeed flags describe.
  std::optional<PlanCandidate> flags_winner;
  std::string threads_note;  ///< --threads above the cores oneTBB can use: capped
};

/// The search. Throws Errc::invalid_argument for a request that cannot be searched (a global
/// batch not divisible as required, a cluster too small, every candidate pruned — naming the
/// constraints that pruned them).
PlanResult plan(const PlanQuery& request);

/// The space as plan enumerates it, before pruning (for tests that enumerate independently).
std::vector<layers::train::TrainLayout> enumerate_layouts(const PlanQuery& request);
/// The same space, one layout at a time, without holding it (what estimate_plan counts).
void for_each_layout(const PlanQuery& request,
                     const std::function<void(const layers::train::TrainLayout&)>& visit);
/// Why plan prunes a layout ("" = it is evaluated), and its evaluation.
/// `memo` (optional): the search's shared schedules, for the memory estimate.
std::string prune_reason(const PlanQuery& request, const layers::train::TrainLayout& layout,
                         StepMemo* memo = nullptr);
PlanCandidate evaluate_candidate(const PlanQuery& request,
                                 const layers::train::TrainLayout& layout);

/// The CoC settings candidates are priced with (the fused kernels' tiling, as `cocemu train` and
/// `bench` use it); each candidate's customized_coc adds its per-shape choices.
layers::CocConfig plan_coc_config();

std::string format_plan(const PlanResult& result);
nlohmann::json to_json(const PlanResult& result);
/// The winner as a MindFormers YAML (its parallel, parallel_config, recompute_config,
/// runner_config and model.model_config keys with MindFormers' meaning, plus cocemu's `train:`
/// section, so `cocemu train --config FILE --dry-run --engine priced` reproduces it; its CoC
/// file, plan.coc.yaml, is named relative to it).
std::string winner_yaml(const PlanResult& result);
/// The candidate the flags describe: the winner, or flags_winner when the winner needs
/// multi-copy.
const PlanCandidate& flags_candidate(const PlanResult& result);
/// Megatron-LM flags, with MindSpeed's (--use-ascend-coc, --context-parallel-algo …) on a
/// MindSpeed platform and Megatron-LM's (--tp-comm-overlap, --cp-comm-type) elsewhere, and the
/// collectives as priced (--deterministic-mode, or cocemu's --nondeterministic) and a dtype other
/// than bf16 (cocemu's --dtype): one line, nothing but flags, so `$(cat FILE)` pastes it and
/// `cocemu train` reproduces the candidate from it alone.
std::string winner_flags(const PlanResult& result);
/// customized_coc of `candidate` as a CoC config file ("" when it overlaps nothing).
std::string winner_coc_yaml(const PlanResult& result, const PlanCandidate& candidate);
/// The CoC file the flags' candidate goes with (in the output directory).
std::string flags_coc_file(const PlanResult& result);
/// `cocemu train` on the flags file in `out_dir`, reproducing the flags' candidate.
std::string winner_train_command(const PlanResult& result, const std::string& out_dir);
/// What TP overlap the profile's platform has, in words (the plan's header says it).
std::string tp_overlap_summary(const DeviceProfile& profile);

}  // namespace cocemu::bench
