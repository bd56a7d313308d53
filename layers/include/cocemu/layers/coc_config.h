#pragma once
/// MindSpeed-compatible CoC configuration: `configs/coc.yaml` (matmul_soc_friendly,
/// customized_coc, recompute_all_gather, enable_coc_in_column_backward, k_min, k_max, and the
/// fused kernels' tiling) plus the environment variables COC_PARALLEL_NUM (1/2/4/8),
/// USE_COC_FUSED_KERNEL (0/1, wins over COC_PARALLEL_NUM) and CC_MODE (-1 auto, 0 original
/// Megatron, 1 rewrite, 2 CoC). Parsing is strict; invalid values are clear errors.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace cocemu::layers {

enum class Strategy : std::uint8_t {
  serial,  ///< plain Megatron order: compute, then communicate (or the reverse)
  script,  ///< MindSpeed's script-side CoC: P chunks over the compute and comm streams
  fused,   ///< one tile-pipelined fused kernel
};
const char* to_string(Strategy s);

struct CocConfig {
  bool matmul_soc_friendly = true;
  std::map<std::string, int> customized_coc;  ///< "[m, k, n]" -> -1 fused, 1 off, 2/4/8 split
  bool recompute_all_gather = true;
  bool enable_coc_in_column_backward = false;
  std::int64_t k_min = 1024, k_max = 4096;
  int parallel_num = 1;                         ///< COC_PARALLEL_NUM
  bool fused = false;                           ///< USE_COC_FUSED_KERNEL
  int cc_mode = -1;                             ///< CC_MODE
  int optimize_recomp_communication_level = 0;  ///< Megatron's TP recompute-comm optimisation
  std::int64_t tile_rows = 128;                 ///< fused kernels: rows per tile
  int tiles_per_step = 2;                       ///< fused kernels: tiles per communication step
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
/// The process environment.
std::optional<std::string> process_env(const std::string& name);

/// Parses YAML text (`origin` names it in errors), then applies the environment.
CocConfig parse_coc_config(const std::string& yaml_text, const std::string& origin,
                           const EnvLookup& env = process_env);
CocConfig load_coc_config(const std::string& path, const EnvLookup& env = process_env);

/// What one op of shape [m, k, n] (m as MindSpeed counts it) runs with.
struct CocChoice {
  Strategy strategy = Strategy::serial;
  int parallel_num = 1;  ///< chunks for script (1 = the rewrite debug mode)
};
CocChoice choose(const CocConfig& config, std::int64_t m, std::int64_t k, std::int64_t n);

/// MindSpeed's matmul_soc_friendly decision for one script op split into `parallel_num` chunks
/// (512-byte packages; m as get_aligned_mm_inputs sees it, i.e. with its sp_coef applied). It
/// applies only to script ops with P > 1. A weight that is already column-major (Megatron's
/// x·Wᵀ) is not copied again; k is padded only when m/P and n are aligned and k is in
/// [k_min, k_max] and not 32-byte aligned.
struct SocFriendly {
  bool transpose_weight = false;  ///< weight copied to column-major
  std::int64_t padded_k = 0;      ///< k after zero-padding (= k when not padded)
};
SocFriendly soc_friendly(const CocConfig& config, std::int64_t m, std::int64_t k, std::int64_t n,
                         int parallel_num, std::size_t element_bytes,
                         bool weight_col_major = false);

}  // namespace cocemu::layers
