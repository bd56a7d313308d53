#pragma once
/// `cocemu validate`: the cost model against published measurements (configs/validation.yaml):
/// collective bus bandwidth, GEMM throughput by shape and attention-kernel throughput, each
/// modeled on its device profile and compared as `reference | modeled | delta %`.
#include <string>
#include <vector>

namespace cocemu::bench {

struct Reference {
  std::string name, kind, profile, source, unit;
  double value = 0;      ///< published figure (GB/s or TFLOPS)
  double modeled = 0;    ///< the cost model's figure for the same thing
  double delta_pct = 0;  ///< 100 · (modeled − value) / value
};

struct Validation {
  std::vector<Reference> rows;
  double mean_abs_delta_pct = 0, max_abs_delta_pct = 0;
};

/// Parses the references (strictly: unknown or missing keys are errors with file:line) and
/// models each one.
Validation validate(const std::string& yaml_text, const std::string& origin);
/// configs/validation.yaml.
Validation validate_shipped();
std::string format_validation(const Validation& v);

}  // namespace cocemu::bench
