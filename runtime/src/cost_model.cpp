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
  return eff * p.in_training_efficiency;
}

double gemm_ns(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
               GemmLayout layout) {
  if (m == 0 || n == 0) return p.kernel_min_ns;
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const double compute = flops / (p.peak(dtype) * gemm_efficiency(p, m, n, k, dtype, layout)) * 1e9;
  const double bytes = double(size_of(dtype)) * double(m * k + k * n + m * n);
  const double memory = bytes / (p.memory_bandwidth * p.memory_in_training_efficiency) * 1e9;
  return std::max({compute, memory, p.kernel_min_ns});
}

double flash_attention_ns(const DeviceProfile& p, double flops, std::int64_t head_dim, DType dtype,
                          double bytes, double keys_per_row, bool backward) {
  if (flops <= 0) return p.kernel_min_ns;
  double eff = p.gemm.max_efficiency;
  if (p.gemm.half_efficiency_flops > 0) eff *= flops / (flops + p.gemm.half_efficiency_flops);
  if ((std::uint64_t(head_dim) * size_of(dtype)) % p.gemm.alignment_bytes != 0)
    eff *= p.gemm.unaligned_efficiency;
  eff *= p.attention_efficiency;
  if (p.attention_row_overhead_keys > 0 && keys_per_row > 0)
    eff *= keys_per_row / (keys_per_row + p.attention_row_overhead_keys);
  if (backward) eff *= p.attention_backward_efficiency;
  eff *= p.in_training_efficiency;
  const double compute = flops / (p.peak(dtype) * eff) * 1e9;
  // The backward reads Q, K, V, O and dO and writes dQ, dK and dV: twice the forward's traffic.
  const double traffic = backward ? 2 * bytes : bytes;
  return std::max({compute, traffic / (p.memory_bandwidth * p.memory_in_training_efficiency) * 1e9,
                   p.kernel_min_ns});
}

double attention_ns(const DeviceProfile& p, std::int64_t heads, std::int64_t s_q, std::int64_t s_k,
                    std::int64_t d, DType dtype, double visible, bool backward) {
  if (heads == 0 || s_q == 0 || s_k == 0) return p.kernel_min_ns;
  const double flops = 4.0 * double(heads) * double(s_q) * double(s_k) * double(d) * visible *
                       (backward ? 2.5 : 1.0);
  const double bytes = double(size_of(dtype)) * double(heads) * double(2 * s_q * d + 2 * s_k * d);
  return flash_attention_ns(p, flops, d, dtype, bytes, double(s_k) * visible, backward);
}

double unfused_attention_ns(const DeviceProfile& p, std::int64_t heads, std::int64_t s_q,
                            std::int64_t s_k, std::int64_t d, DType dtype, bool backward,
                            bool fused_softmax) {
  if (heads == 0 || s_q == 0 || s_k == 0) return p.kernel_min_ns;
  // A batched product of `heads` [r, c]·[c, n] GEMMs, priced as one GEMM of heads·r rows.
  const auto batched = [&](std::int64_t r, std::int64_t n, std::int64_t c) {
    return gemm_ns(p, heads * r, n, c, dtype);
  };
  const double e = double(size_of(dtype)), scores = double(heads) * double(s_q) * double(s_k);
  const auto pass = [&](double bytes) { return memory_ns(p, std::uint64_t(bytes)); };
  // Megatron's FusedScaleMaskSoftmax without its fused kernel (forward_torch_softmax, with
  // attention_softmax_in_fp32), bytes per score: the scores cast to f32 (reads e, writes 4),
  // scaled (4 + 4), masked in place (4 + a 1-byte mask + 4), softmax (4 + 4), cast back
  // (4 + e). Its backward, in reverse: the gradient cast up (e + 4), the softmax backward
  // (reads P and dP, writes dS: 12), the mask (4 + 1 + 4), the scale (4 + 4), the cast down
  // (4 + e).
  const auto torch_softmax = [&](bool bwd) {
    return bwd ? pass((e + 4) * scores) + pass(12 * scores) + pass(9 * scores) + pass(8 * scores) +
                     pass((4 + e) * scores)
               : pass((e + 4) * scores) + pass(8 * scores) + pass(9 * scores) + pass(8 * scores) +
                     pass((4 + e) * scores);
  };
  if (!backward)
    return batched(s_q, s_k, d) + (fused_softmax ? pass(2 * e * scores) : torch_softmax(false)) +
           pass((2 * e + 1) * scores) + batched(s_q, d, s_k);
  // dP = dO·Vᵀ, dV = Pᵀ·dO; dropout backward (mask, grad in, grad out); softmax backward (P,
  // dP in, dS out); dQ = dS·K, dK = dSᵀ·Q.
  return batched(s_q, s_k, d) + batched(s_k, d, s_q) + pass((2 * e + 1) * scores) +
         (fused_softmax ? pass(3 * e * scores) : torch_softmax(true)) + batched(s_q, d, s_k) +
         batched(s_k, d, s_q);
}

double gemm_memory_bytes(std::int64_t m, std::int64_t n, std::int64_t k, DType dtype) {
  return double(size_of(dtype)) *
         (double(m) * double(k) + double(k) * double(n) + double(m) * double(n));
}

double attention_memory_bytes(std::int64_t heads, std::int64_t s_q, std::int64_t s_k,
                              std::int64_t d, DType dtype, bool backward) {
  const double forward = double(size_of(dtype)) * double(heads) * double(2 * s_q * d + 2 * s_k * d);
  return backward ? 2 * forward : forward;
}

double memory_ns(const DeviceProfile& p, std::uint64_t bytes) {
  return std::max(double(bytes) / (p.memory_bandwidth * p.memory_in_training_efficiency) * 1e9,
                  p.kernel_min_ns) +
         p.kernel_overhead_ns;
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
