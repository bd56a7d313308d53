#pragma once
/// Fused compute-communication kernels in the style of Ascend's LCOC, each one launch on the
/// compute stream. A compute role produces output tiles into a double-buffered symmetric buffer;
/// a comm role waits on flags in peer memory, reduces (or gathers) peers' tiles and frees the
/// buffer slot with flags again. Tiles of `tile_rows` rows, `tiles_per_step` tiles per
/// communication step. Deterministic variants reduce in rank order (bitwise equal to the serial
/// path); the non-deterministic ones start at each segment's owner.
///
/// The modeled time of a kernel is its two-stage pipeline: step s's communication overlaps step
/// s+1's compute; each step's comm is priced with the direct collective plan of its size.
#include <chrono>
#include <cstdint>

#include "cocemu/collectives/group.h"
#include "cocemu/runtime/tensor.h"

namespace cocemu::layers {

/// Test-only: breaks the protocol on purpose so tests can show the checked mode catches it.
struct FusedTestHook {
  int rank = -1;                 ///< the misbehaving rank (-1: none)
  bool skip_ready_wait = false;  ///< read peers' slots without waiting for their flags
  bool overwrite_early = false;  ///< after step 0, write step 2's tiles into slot 0 at once
  std::chrono::milliseconds delay_others{0};  ///< the other ranks stall this long before
                                              ///< publishing and before freeing a slot
};

struct FusedOptions {
  std::int64_t tile_rows = 128;
  int tiles_per_step = 2;
  bool deterministic = true;
  std::string label;
  /// Checked mode: every slot write verifies that each peer consumed the slot's previous contents
  /// and every read verifies that the owner raised its flag for this step; violations are errors
  /// naming rank, peer, slot and step.
  bool checked = false;
  FusedTestHook test_hook;
};

/// out[m, n] = all_reduce(x[m, k] · wᵀ) (+ bias once). w: [n, k].
void matmul_all_reduce(Group& g, const Tensor& x, const Tensor& w, const Tensor& bias,
                       const Tensor& out, const FusedOptions& o);
/// out[m/ws, n] = reduce_scatter(x[m, k] · op(w)) (+ bias once); w is [n, k] (trans_w) or [k, n].
void matmul_reduce_scatter(Group& g, const Tensor& x, const Tensor& w, bool trans_w,
                           const Tensor& bias, const Tensor& out, const FusedOptions& o);
/// out[m, n] = all_gather(x[m/ws, k]) · op(w) (+ bias); w is [n, k] (trans_w) or [k, n].
/// If `gathered` is defined ([m, k]) it receives the gathered input (ALL_GATHER_MATMUL_V2).
void all_gather_matmul(Group& g, const Tensor& x, const Tensor& w, bool trans_w, const Tensor& bias,
                       const Tensor& out, const Tensor& gathered, const FusedOptions& o);

enum class QuantGranularity : std::uint8_t { per_tensor, per_channel, per_group };

/// An int8 weight [k, n] with f32 scales (and optional offsets): [1] per tensor, [n] per
/// channel, [ceil(k/g), n] per group of g rows along k (the last group may be ragged).
struct W8A16Weight {
  Tensor weight;  ///< i8 [k, n]
  Tensor scale;   ///< f32
  Tensor offset;  ///< f32, same shape as scale, or undefined
  QuantGranularity granularity = QuantGranularity::per_channel;
  std::int64_t group_size = 0;
};

/// The three kernels by what they fuse.
enum class FusedKind { matmul_all_reduce, matmul_reduce_scatter, all_gather_matmul };
/// The modeled time of a fused kernel of an [m, k]·[k, n] product over `ranks` ranks (m counts
/// the gathered rows for ALL_GATHER_MATMUL and the unscattered rows for MATMUL_REDUCE_SCATTER),
/// exactly as the kernel is priced when it launches — without running it (for planners).
/// `trans_w`: the weight is stored [n, k].
double fused_kernel_ns(const DeviceProfile& profile, FusedKind kind, std::int64_t m, std::int64_t k,
                       std::int64_t n, int ranks, DType dtype, const FusedOptions& o, bool trans_w);

/// (weight + offset) · scale, computed in f32 and rounded once to `to`.
Tensor dequantize(const W8A16Weight& q, DType to);

/// w8A16 MATMUL_ALL_REDUCE: out = all_reduce(x · ((W + offset) · scale)) (+ bias once), with x
/// f16 or bf16 [m, k]; the weight is dequantised inside the kernel.
void w8a16_matmul_all_reduce(Group& g, const Tensor& x, const W8A16Weight& q, const Tensor& bias,
                             const Tensor& out, const FusedOptions& o);

}  // namespace cocemu::layers
