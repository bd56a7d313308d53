#pragma once
/// Collectives and point-to-point transfers with PyTorch ProcessGroup semantics. A call made from a
/// rank's host thread is enqueued on the rank's comm stream after a wait on an event recorded on
/// the current stream (the producer has written the input), and returns a `Work`:
/// `work.wait()` makes the current stream wait for the collective (the host does not block),
/// `work.synchronize()` blocks the host. With `async_op = false` (the default, as in PyTorch) the
/// call does `work.wait()` itself before returning.
///
/// Ranks passed as root/src/dst are group ranks. Every call carries a sequence number and a
/// signature (op, dtype, count, root, reduce op, algorithm); ranks that disagree get an
/// `Errc::mismatch` error naming both calls. Every wait is bounded by the world's timeout.
///
/// Determinism: in deterministic mode (the default) every reduction sums contributions in rank
/// order 0..n-1 with an f32 (f64 for f64) accumulator and one rounding per element, so results are
/// bitwise identical across runs, algorithms and chunkings. Otherwise each segment is summed
/// starting from its owner (rotated order), as fused kernels with atomics do; the result then
/// differs from the rank-order sum by at most (n-1)·ε·Σ|x_i| per element for f32 accumulation
/// (ε = 2^-24), plus one final rounding to the storage dtype.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cocemu/collectives/group.h"
#include "cocemu/collectives/plan.h"
#include "cocemu/runtime/tensor.h"
#include "cocemu/runtime/world.h"

namespace cocemu {

struct CollectiveOptions {
  ReduceOp op = ReduceOp::sum;
  Algorithm algo = Algorithm::automatic;  ///< automatic: the device profile's table by size
  bool async_op = false;
  std::optional<bool> deterministic;  ///< default: the world's setting
  std::string label;                  ///< appended to the trace name, e.g. "[2/4]"
  /// An emulator convenience the emulated system does not run (e.g. handing Ulysses attention's
  /// LSE back in the caller's layout): the numerics are done, the op costs nothing and launches
  /// nothing in the modeled timeline, and its trace name says so.
  bool emulator_only = false;
};

/// Handle on an enqueued collective (torch.distributed.Work).
class Work {
 public:
  Work() = default;
  Work(Rank* rank, Event end) : rank_(rank), end_(end) {}
  /// The issuing rank's current stream waits for the collective; the host does not block.
  void wait() const;
  /// Blocks the host until the collective has finished; rethrows its error.
  void synchronize() const;
  bool is_completed() const { return end_.query(); }
  const Event& event() const { return end_; }

 private:
  Rank* rank_ = nullptr;
  Event end_;
};

/// In place: every rank's `tensor` becomes the reduction of all ranks' tensors.
Work all_reduce(Group& g, const Tensor& tensor, const CollectiveOptions& o = {});
/// Out of place (output may equal input).
Work all_reduce(Group& g, const Tensor& input, const Tensor& output,
                const CollectiveOptions& o = {});
/// input has n·k elements, output k: rank r gets the reduction of block r of every input.
/// In place when output is block r of input.
Work reduce_scatter(Group& g, const Tensor& output, const Tensor& input,
                    const CollectiveOptions& o = {});
/// input has k elements, output n·k: block r of every output is rank r's input. In place when
/// input is block r of output.
Work all_gather(Group& g, const Tensor& output, const Tensor& input,
                const CollectiveOptions& o = {});
/// In place: every rank's tensor becomes the root's.
Work broadcast(Group& g, const Tensor& tensor, int root, const CollectiveOptions& o = {});
/// In place: the root's tensor becomes the reduction; other ranks' tensors are left unchanged.
Work reduce(Group& g, const Tensor& tensor, int root, const CollectiveOptions& o = {});
/// output (root only, n·k elements; ignored elsewhere) gets every rank's input (k elements).
Work gather(Group& g, const Tensor& output, const Tensor& input, int root,
            const CollectiveOptions& o = {});
/// Rank r's output (k elements) gets block r of the root's input (n·k; ignored elsewhere).
Work scatter(Group& g, const Tensor& output, const Tensor& input, int root,
             const CollectiveOptions& o = {});
/// Equal splits: input and output have n·k elements; block p of input goes to rank p, block r of
/// rank p's output comes from rank r.
Work all_to_all(Group& g, const Tensor& output, const Tensor& input,
                const CollectiveOptions& o = {});
/// Explicit split sizes in rows of dimension 0 (torch all_to_all_single): rank r sends
/// input_splits[p] rows to rank p and receives output_splits[p] rows from rank p.
Work all_to_all(Group& g, const Tensor& output, const Tensor& input,
                const std::vector<std::int64_t>& output_splits,
                const std::vector<std::int64_t>& input_splits, const CollectiveOptions& o = {});
/// Synchronizes the group. Without `async_op` the host blocks until every member has entered
/// (torch.distributed.barrier); with it, like any async collective.
Work barrier(Group& g, const CollectiveOptions& o = {});

/// Point to point. In the numerics sends are eager (buffered), so a send never waits for its
/// receive and a receive waits (bounded) for the matching send. The modeled schedule is NCCL's
/// and HCCL's: a send and its receive are one transfer that starts when both sides are ready. A
/// program whose unbatched isend/irecv wait on each other in a cycle (each rank sending before
/// receiving around a ring) would hang there: `run` reports the cycle and points to
/// `batch_isend_irecv` or parity ordering.
struct P2POp {
  enum Kind : std::uint8_t { send, recv } kind = send;
  Tensor tensor;
  int peer = 0;  ///< group rank
  int tag = 0;
};
Work isend(Group& g, const Tensor& tensor, int dst, int tag = 0);
Work irecv(Group& g, const Tensor& tensor, int src, int tag = 0);
/// isend/irecv followed by work.wait() (stream-side, as with NCCL).
void send(Group& g, const Tensor& tensor, int dst, int tag = 0);
void recv(Group& g, const Tensor& tensor, int src, int tag = 0);
/// All ops of the batch run as one comm-stream op: sends first, then receives.
Work batch_isend_irecv(Group& g, const std::vector<P2POp>& ops);

}  // namespace cocemu
