#pragma once
/// Prices ops from a device profile, in nanoseconds at full speed (contention is applied later by
/// the schedule). The same functions price script-side ops, collective plans and fused kernels, so
/// every strategy is measured with one ruler.
#include <cstdint>

#include "cocemu/runtime/dtype.h"
#include "cocemu/runtime/profile.h"

namespace cocemu {

enum class LaunchKind : std::uint8_t {
  none,    ///< no host launch (device-side waits)
  kernel,  ///< a script-side op: kernel or collective call
  fused,   ///< one fused compute-communication kernel
};

/// Efficiency of an m×k·k×n GEMM in `dtype`: max · F/(F + F_half), times the unaligned factor when
/// a row of either operand (k or n elements) is not a multiple of the alignment in bytes.
double gemm_efficiency(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k,
                       DType dtype);
/// Modeled time of a GEMM: the larger of its compute time and its memory time, at least the
/// shortest kernel.
double gemm_ns(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype);
/// A flash-attention pass over `heads` heads (QKᵀ and PV fused in one kernel, scores never
/// written to memory): 4·s_q·s_k·d·visible FLOPs per head at the efficiency of one [s_q, d]·[d,
/// s_k] GEMM, against the memory time of Q, K, V and O. `visible` is the fraction of (query, key)
/// pairs computed (0.5 for a causal mask).
double attention_ns(const DeviceProfile& p, std::int64_t heads, std::int64_t s_q, std::int64_t s_k,
                    std::int64_t d, DType dtype, double visible = 1.0);
/// Modeled time of a memory-bound kernel moving `bytes` (reads plus writes).
double memory_ns(const DeviceProfile& p, std::uint64_t bytes);
double launch_ns(const DeviceProfile& p, LaunchKind kind);

}  // namespace cocemu
