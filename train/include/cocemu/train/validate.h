#pragma once
/// `cocemu validate`: the cost model against published measurements (configs/validation.yaml):
/// collective bandwidth by size, card count and nodes, GEMM throughput by shape, flash-attention
/// throughput, memory bandwidth and model TFLOP/s per device of published training runs, each
/// modeled on its device profile and compared as `published | modeled | delta %`, with the
/// parameters each reference was fitted on.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/train/report.h"

namespace cocemu::bench {

struct Reference {
  std::string name, kind, device, source, unit;
  int nodes = 1;
  double published = 0;  ///< the published figure (GB/s or TFLOPS)
  double modeled = 0;    ///< the cost model's figure for the same thing
  /// 100 · (modeled − published) / published; for a gain (kind coc_gain, in percent) the
  /// difference in points, modeled − published.
  double delta_pct = 0;
  bool gain_row = false;
  std::vector<std::string> fitted;  ///< profile parameters fitted on this reference
  /// Parameters this reference tests besides those fitted on references of its own kind on its
  /// profile (`tests:`; e.g. a training run testing a rate fitted on per-layer times).
  std::vector<std::string> tests;
  /// `assumption:` in the file — why part of the run's layout is not the source's (empty: every
  /// setting is stated by a source). Shown beside the row in every output.
  std::string assumption;
  /// The model and layout the row was modeled on (model shape; tp, cp, pp, vpp, dp,
  /// micro-batch, recompute, sequence parallelism), for rows that model a run (training, layer,
  /// coc_gain); empty for kernel and collective rows. Two rows with the same signature measure
  /// the same run: one cannot test a parameter fitted on the other.
  std::string run_signature;
  /// The rows (indices) whose run this row repeats (the same run_signature), over the fitted
  /// parameters it is counted same-as-fit for (Calibration).
  std::vector<std::size_t> repeats_fit;
  /// kind: coc_gain with `plausible_layouts:` — the modeled gain at the row's layout and at each
  /// plausible layout (the row's first), in percent.
  std::vector<double> plausible_gains;
  /// kind: training — the run as `cocemu train` sets it up, the figure as the source states it
  /// (before conversion to model FLOPs) and how it was converted.
  std::shared_ptr<const TrainSetup> training;
  double published_as_stated = 0;
  std::string conversion;
  /// The modeled iteration: its time, its pipeline bubble and its exposed communication by kind
  /// (what the step model's TrainReport says), so a row's delta can be read against its parts.
  double iteration_ms = 0, bubble_fraction = 0;
  std::map<std::string, double> exposed_comm_ms;
  /// `cocemu plan` on the same cluster and batch (plan_training): its best, whether it is the
  /// published layout, and how much faster it models (both priced by the plan's evaluator).
  std::string plan_best;
  bool plan_matches = false;
  double plan_gain_pct = 0;
  /// Both priced as plan prices candidates: the published layout's MFU (NaN when plan prunes
  /// it) and the best's, and the TP overlap the best uses (none, te_userbuffers for
  /// Megatron-LM's --tp-comm-overlap, mindspeed_coc / lcoc_fused for MindSpeed's per-shape
  /// choices), which is always one of its profile's tp_overlap mechanisms.
  double plan_published_mfu = 0, plan_best_mfu = 0;
  std::string plan_best_overlap;
};

/// One fitted profile parameter: its value, the references it was fitted on and those that test
/// it, as row indices. A candidate test is a reference on its profile that fits nothing and is of
/// a kind it was fitted on (for the network's parameters: spanning nodes), or that names it under
/// `tests:`; a candidate with the run_signature of one of its fitted-on rows repeats that fit
/// and goes to same_as_fit, not tested_by. No tested_by: the parameter is untested.
struct Calibration {
  std::string device, key;
  double value = 0;
  std::vector<std::size_t> fitted_on, same_as_fit, tested_by;
  bool untested() const { return tested_by.empty(); }
};

struct Validation {
  std::vector<Reference> rows;
  std::vector<Calibration> calibration;
  double mean_abs_delta_pct = 0, max_abs_delta_pct = 0;
  /// Over the references that test the model: those that fit nothing, except a row that only
  /// repeats fitted runs (same-as-fit, and tested_by of no parameter).
  double mean_abs_delta_tests_pct = 0;
  bool is_test_row(std::size_t i) const;
};

/// Parses the references (strictly: unknown or missing keys are errors with file:line) and
/// models each one.
Validation validate(const std::string& yaml_text, const std::string& origin);
/// configs/validation.yaml.
Validation validate_shipped();
std::string format_validation(const Validation& v);
/// The references, the fused gains over their plausible layouts, the calibration (each fitted
/// parameter, its value, the counts and lists of fitted on, same as fit and tested by, with the
/// deltas; untested ones marked) and the assumed layouts as Markdown: the docs' calibration page.
std::string format_markdown(const Validation& v);
/// Runs `cocemu plan` for every `training` reference on its cluster and global batch (`threads`
/// as plan's --threads) and fills plan_best, plan_matches and plan_gain_pct.
void plan_training(Validation& v, int threads = 0);
/// The training rows against plan's best, as a table.
std::string format_plan_check(const Validation& v);
/// `references[]` (name, kind, device, nodes, source, published, modeled, delta, fitted,
/// same_as_fit, assumption, plausible_gains, ...), `calibration[]` (device, parameter, value,
/// fitted_on, same_as_fit, tested_by as 1-based row numbers, untested), `mean_abs_delta`,
/// `mean_abs_delta_of_tests` and `max_abs_delta`, as JSON text.
std::string validation_json(const Validation& v);

}  // namespace cocemu::bench
