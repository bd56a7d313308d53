#pragma once
/// `cocemu validate`: the cost model against published measurements (configs/validation.yaml):
/// collective bandwidth by size, card count and nodes, GEMM throughput by shape, flash-attention
/// throughput and memory bandwidth, each modeled on its device profile and compared as
/// `published | modeled | delta %`, with the parameters each reference was fitted on.
#include <string>
#include <vector>

namespace cocemu::bench {

struct Reference {
  std::string name, kind, device, source, unit;
  int nodes = 1;
  double published = 0;              ///< the published figure (GB/s or TFLOPS)
  double modeled = 0;                ///< the cost model's figure for the same thing
  double delta_pct = 0;              ///< 100 · (modeled − published) / published
  std::vector<std::string> fitted;   ///< profile parameters fitted on this reference
};

struct Validation {
  std::vector<Reference> rows;
  double mean_abs_delta_pct = 0, max_abs_delta_pct = 0;
  double mean_abs_delta_tests_pct = 0;  ///< over the references no parameter was fitted on
};

/// Parses the references (strictly: unknown or missing keys are errors with file:line) and
/// models each one.
Validation validate(const std::string& yaml_text, const std::string& origin);
/// configs/validation.yaml.
Validation validate_shipped();
std::string format_validation(const Validation& v);
/// `references[]` (name, kind, device, nodes, source, published, modeled, delta, fitted),
/// `mean_abs_delta` and `max_abs_delta`, as JSON text.
std::string validation_json(const Validation& v);

}  // namespace cocemu::bench
