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
/// Modeled time of a memory-bound kernel moving `bytes` (reads plus writes).
double memory_ns(const DeviceProfile& p, std::uint64_t bytes);
double launch_ns(const DeviceProfile& p, LaunchKind kind);

}  // namespace cocemu
