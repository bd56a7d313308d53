#pragma once
/// `cocemu attention --compare`: one context-parallel attention request modeled under every
/// algorithm and window MindSpeed accepts for it — the ring, each double-ring window, Ulysses,
/// and hybrid (Ulysses of each degree that fits inside a node, ring or double ring across) — with
/// the forward and backward time of each, the best marked, and (with a sensitivity analysis)
/// whether the best stays the best when the profile's assumptions move.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/attention/context_parallel.h"
#include "cocemu/bench/sensitivity.h"
#include "cocemu/runtime/world.h"

namespace cocemu::bench {

/// Modeled times of one forward and one backward of CP attention. Each pass is reported from the
/// rank that ends it (a causal ring's ranks run different blocks): its time, and its compute.
struct CpPassTimes {
  std::int64_t forward_ns = 0, backward_ns = 0;
  std::int64_t forward_compute_ns = 0, backward_compute_ns = 0;
  int forward_rank = 0, backward_rank = 0;  ///< the rank that ends each pass
  std::int64_t total_ns() const { return forward_ns + backward_ns; }
};

/// From a run of forward then backward, where `first_backward_op[r]` is the index of rank r's
/// first backward op.
CpPassTimes cp_pass_times(const RunResult& run,
                          const std::vector<std::uint32_t>& first_backward_op);

/// One forward and backward of `config` on `problem` as a dry run (shapes only) on `profile`.
CpPassTimes model_cp_attention(const attn::CpConfig& config, const attn::AttentionProblem& problem,
                               std::shared_ptr<const DeviceProfile> profile);

/// A person's name for a configuration: "ring", "double ring, window 4", "Ulysses 16",
/// "hybrid: Ulysses 8 x ring 2".
std::string cp_label(const attn::CpConfig& config);

/// MindSpeed's head rules for Ulysses and hybrid (arguments.py, _validate_cp_args) in the model's
/// terms: the model's num_attention_heads = `problem.heads` (per TP rank) × `tp` must be divisible
/// by tp × the Ulysses degree. An error names the model's head count and the degrees.
void check_cp_heads(const attn::CpConfig& config, const attn::AttentionProblem& problem, int tp);

/// One way to run the request: its algorithm, window and Ulysses degree.
struct CpOption {
  attn::CpConfig config;
  std::string label;   ///< "double ring, window 4", "hybrid: Ulysses 8 x ring 2"
  std::string family;  ///< options differing only in the window: "ring", "hybrid Ulysses 8"
  bool requested = false;
  CpPassTimes times;
  /// MindSpeed's flags for it ("--context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 8").
  std::string mindspeed_flags() const;
  /// cocemu attention's flags for it ("--algo hybrid_cp_algo --ulysses-degree 8").
  std::string cocemu_flags() const;
};

struct CpComparison {
  int cp = 1, devices_per_node = 1;
  std::string profile;
  std::vector<CpOption> options;
  /// Options MindSpeed's rules refuse for this request: (label, why).
  std::vector<std::pair<std::string, std::string>> skipped;
  std::size_t best = 0;  ///< index into options (after model_options)
  const CpOption* requested() const;
};

/// Every option for `request` (its cp size, mask, send/recv overlap and layout kept; algorithm,
/// window and Ulysses degree varied): the ring and each window MindSpeed accepts, Ulysses, and
/// hybrid with each Ulysses degree that divides `devices_per_node` (so its all-to-all stays inside
/// a node) and leaves a ring, with each window of that ring. The request itself is always one of
/// them. Invalid ones go to `skipped` with MindSpeed's reason. Times are not modeled yet.
/// `problem` holds the heads of one TP rank and `request.tensor_model_parallel_size` is 1; `tp`
/// is the tensor-parallel size they came from (for MindSpeed's head rules, check_cp_heads).
CpComparison cp_options(const attn::CpConfig& request, const attn::AttentionProblem& problem,
                        int devices_per_node, int tp = 1);

/// Models every option on `profile` and marks the fastest (forward + backward).
void model_options(CpComparison& comparison, const attn::AttentionProblem& problem,
                   std::shared_ptr<const DeviceProfile> profile);

/// "best configuration" and, per family with more than one window, "best window: <family>".
Conclusions cp_conclusions(const CpComparison& comparison);

/// The table (forward, backward and total per option, the best and the request marked), the
/// best's flags and, with `sensitivity`, how robust the choice is. `heading` describes the
/// request (shapes, mask, profile).
std::string format_cp_comparison(const CpComparison& comparison, const std::string& heading,
                                 const Sensitivity* sensitivity = nullptr);
nlohmann::json to_json(const CpComparison& comparison);

}  // namespace cocemu::bench
