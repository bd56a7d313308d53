#pragma once
/// Symmetric memory: one allocation of the same size on every rank of a team, which any member
/// can read and write in a peer's copy (`put`/`get`) and signal through per-slot flags that live in
/// the peer's memory. This is the emulated remote memory access (Ascend MTE, NVSHMEM) that fused
/// compute-communication kernels are built on.
///
/// Memory ordering: `signal` is a release (seq_cst) add on the peer's flag; `wait` returns after an
/// acquire load that saw the value. So every put a rank made before signalling is visible to the
/// peer once its wait returns. Flags are monotonic counters (never reset during a kernel), so one
/// flag can order many steps: step s waits for `s+1` signals, for example.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/runtime/sync.h"
#include "cocemu/runtime/world.h"

namespace cocemu {

namespace detail {
struct SymmetricState;
}

class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  /// Collective over `team` (world ranks; every member passes the same list, in the same order of
  /// calls): returns this rank's handle on `bytes` bytes per member plus `n_flags` flag slots per
  /// member, zero-initialised. Without numerics (dry runs) the memory has no storage: local()
  /// and peer() return nullptr, and only op bodies, which dry runs skip, may use them.
  static SymmetricBuffer allocate(Rank& rank, const std::vector<int>& team, std::size_t bytes,
                                  int n_flags);

  int team_rank() const { return me_; }
  int team_size() const;
  std::size_t bytes() const;
  int n_flags() const;
  std::byte* local() const { return peer(me_); }
  std::byte* peer(int team_rank) const;

  /// Copies `n` bytes from `src` into peer's copy at `offset`.
  void put(int peer, std::size_t offset, const void* src, std::size_t n) const;
  /// Copies `n` bytes from peer's copy at `offset` into `dst`.
  void get(int peer, std::size_t offset, void* dst, std::size_t n) const;
  /// Adds `n` to flag `slot` in peer's memory (release).
  void signal(int peer, int slot, std::uint32_t n = 1) const;
  /// Waits until this rank's own flag `slot` is >= value (acquire), bounded by the wait timeout.
  void wait(int slot, std::uint32_t value, const std::string& what) const;
  std::uint32_t flag(int peer, int slot) const;

 private:
  void check_range(const char* call, int peer, std::size_t offset, std::size_t n) const;
  std::shared_ptr<detail::SymmetricState> state_;
  int me_ = -1;
  int rank_ = -1;
};

}  // namespace cocemu
