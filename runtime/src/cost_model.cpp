#include "cocemu/runtime/cost_model.h"

#include <algorithm>

namespace cocemu {

double gemm_efficiency(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k,
                       DType dtype, GemmLayout layout) {
  const double flops = 2.0 * double(m) * double(n) * double(k);
  double eff = p.gemm.max_efficiency;
  if (p.gemm.half_efficiency_flops > 0) eff *= flops / (flops + p.gemm.half_efficiency_flops);
  const std::uint64_t e = size_of(dtype), a = p.gemm.alignment_bytes;
  const std::uint64_t a_row = std::uint64_t(layout.trans_a ? m : k);
  const std::uint64_t b_row = std::uint64_t(layout.trans_b ? k : n);
  if ((a_row * e) % a != 0 || (b_row * e) % a != 0) eff *= p.gemm.unaligned_efficiency;
  return eff;
}

double gemm_ns(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
               GemmLayout layout) {
  if (m == 0 || n == 0) return p.kernel_min_ns;
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const double compute = flops / (p.peak(dtype) * gemm_efficiency(p, m, n, k, dtype, layout)) * 1e9;
  const double bytes = double(size_of(dtype)) * double(m * k + k * n + m * n);
  const double memory = bytes / p.memory_bandwidth * 1e9;
  return std::max({compute, memory, p.kernel_min_ns});
}

double attention_ns(const DeviceProfile& p, std::int64_t heads, std::int64_t s_q, std::int64_t s_k,
                    std::int64_t d, DType dtype, double visible) {
  if (heads == 0 || s_q == 0 || s_k == 0) return p.kernel_min_ns;
  const double flops = 4.0 * double(heads) * double(s_q) * double(s_k) * double(d) * visible;
  const double compute =
      flops / (p.peak(dtype) * gemm_efficiency(p, s_q, s_k, d, dtype) * p.attention_efficiency) *
      1e9;
  const double bytes = double(size_of(dtype)) * double(heads) * double(2 * s_q * d + 2 * s_k * d);
  return std::max({compute, bytes / p.memory_bandwidth * 1e9, p.kernel_min_ns});
}

double memory_ns(const DeviceProfile& p, std::uint64_t bytes) {
  return std::max(double(bytes) / p.memory_bandwidth * 1e9, p.kernel_min_ns);
}

double launch_ns(const DeviceProfile& p, LaunchKind kind) {
  switch (kind) {
    case LaunchKind::none:
      return 0;
    case LaunchKind::kernel:
      return p.launch_overhead_ns;
    case LaunchKind::fused:
      return p.fused_launch_overhead_ns;
  }
  return 0;
}

}  // namespace cocemu
