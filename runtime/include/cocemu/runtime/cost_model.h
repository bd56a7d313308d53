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

/// How a GEMM's operands lie in memory: A is [m, k] row-major unless `trans_a` (stored [k, m]);
/// B is [k, n] row-major unless `trans_b` (stored [n, k], i.e. column-major, as a Megatron
/// weight used as x·Wᵀ or one made column-major by MindSpeed's matmul_soc_friendly).
struct GemmLayout {
  bool trans_a = false;
  bool trans_b = false;
};

/// Efficiency of an m×k·k×n GEMM in `dtype`: max · F/(F + F_half) · in_training_efficiency,
/// times the unaligned factor when
/// the contiguous rows of either operand as stored (A: k, or m if transposed; B: n, or k if
/// transposed) are not a multiple of the alignment in bytes. This is the premise of MindSpeed's
/// matmul_soc_friendly, which fixes an unaligned n by making the weight column-major.
double gemm_efficiency(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k,
                       DType dtype, GemmLayout layout = {});
/// Modeled time of a GEMM: the larger of its compute time and its memory time, at least the
/// shortest kernel.
double gemm_ns(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
               GemmLayout layout = {});
/// A flash-attention kernel of `flops` FLOPs over heads of dimension `head_dim`, whose query rows
/// each visit `keys_per_row` keys on average, against the memory time of its Q, K, V and O
/// (`bytes`, the forward's traffic; a backward kernel moves twice as much). Flash attention runs
/// as fused GEMM tiles over every (batch, head, query block) at once, so its efficiency saturates
/// with the whole kernel's work, as a GEMM's does (max · F/(F + F_half), unaligned rows of a head
/// slower), times the profile's attention efficiency, times L/(L + attention_row_overhead_keys)
/// for rows of L keys, times attention_backward_efficiency for a `backward` kernel. The local and
/// the context-parallel kernels are priced by it.
double flash_attention_ns(const DeviceProfile& p, double flops, std::int64_t head_dim, DType dtype,
                          double bytes, double keys_per_row, bool backward);
/// A flash-attention pass over `heads` heads (QKᵀ and PV fused in one kernel, scores never
/// written to memory): 4·s_q·s_k·d·visible FLOPs per head forward, 2.5 times that backward
/// (FlashAttention's count), priced by flash_attention_ns with rows of s_k·visible keys.
/// `visible` is the fraction of (query, key) pairs computed (0.5 for a causal mask).
double attention_ns(const DeviceProfile& p, std::int64_t heads, std::int64_t s_q, std::int64_t s_k,
                    std::int64_t d, DType dtype, double visible, bool backward);
/// Core attention unfused, as Megatron ran it before FlashAttention (forward): QKᵀ as a batched
/// GEMM writing the [heads, s_q, s_k] scores, the fused scale-mask-softmax (reads the scores,
/// writes the probabilities), dropout (reads them, writes them and a one-byte mask), then P·V.
/// The backward (`backward`) runs the two products' four gradient GEMMs, the dropout and the
/// softmax backward passes. `heads` counts batch × heads. Without `fused_softmax`
/// (--no-masked-softmax-fusion), the softmax runs as Megatron's torch fallback in f32: a cast,
/// the scale, the mask and the softmax as separate passes over the scores, and a cast back
/// (five passes each way instead of one).
double unfused_attention_ns(const DeviceProfile& p, std::int64_t heads, std::int64_t s_q,
                            std::int64_t s_k, std::int64_t d, DType dtype, bool backward,
                            bool fused_softmax = true);
/// Device-memory traffic of an m×k·k×n GEMM: its operands read once and its result written
/// once (the traffic gemm_ns's memory time counts), for the schedule's memory contention.
double gemm_memory_bytes(std::int64_t m, std::int64_t n, std::int64_t k, DType dtype);
/// A flash-attention pass's traffic as attention_ns counts it: Q, K, V and O forward, twice that
/// backward.
double attention_memory_bytes(std::int64_t heads, std::int64_t s_q, std::int64_t s_k,
                              std::int64_t d, DType dtype, bool backward);
/// Modeled time of a memory-bound kernel moving `bytes` (reads plus writes), at the profile's
/// memory bandwidth times its memory in_training_efficiency, plus its kernel_overhead_ns (the
/// start-up a GEMM's or attention kernel's efficiency curve already holds).
double memory_ns(const DeviceProfile& p, std::uint64_t bytes);
double launch_ns(const DeviceProfile& p, LaunchKind kind);

}  // namespace cocemu
