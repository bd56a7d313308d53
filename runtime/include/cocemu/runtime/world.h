#pragma once
/// The emulated node: `run(n, fn)` starts n rank threads, each with a compute and a comm stream
/// (in-order queues executed by worker threads, asynchronous to the host thread and ordered
/// against each other only by events — CUDA/CANN semantics; a host that waits for its stream runs
/// the queued ops itself when the worker is not running them). Every op is recorded into a model
/// graph whose schedule gives the modeled device timeline (see graph.h).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/graph.h"
#include "cocemu/runtime/hosts.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/runtime/sync.h"

namespace cocemu {

class Rank;
class Stream;
class World;
namespace detail {
struct StreamImpl;
}

/// What the cost model and the trace need to know about one op.
struct OpSpec {
  std::string name;  ///< shown in the trace: "matmul[2/4] 4096x1024x1280"
  OpClass cls = OpClass::compute;
  double work_ns = 0;  ///< duration at full speed
  LaunchKind launch = LaunchKind::kernel;
  std::uint64_t bytes = 0;
  std::uint64_t flops = 0;
  std::uint64_t hbm_bytes = 0;                ///< device-memory traffic (see OpRecord)
  std::uint8_t link_use = kLinkAll;           ///< comm ops: the links used (LinkUse bits)
  std::shared_ptr<const std::string> detail;  ///< see OpRecord::detail
  std::int64_t seq = -1;                      ///< collectives: sequence number in the group
  std::vector<Rendezvous> rendezvous;         ///< collectives: one key shared by all participants
  std::vector<OpRef> deps;                    ///< extra modeled dependencies
  std::shared_ptr<const Phases> phases;       ///< null: none
  /// Fused ops: the compute and the comm work inside (their pipeline overlaps them).
  double inner_compute_ns = 0, inner_comm_ns = 0;
};

/// A point in a stream's sequence of ops (CUDA's cudaEvent_t after cudaEventRecord).
class Event {
 public:
  Event() = default;
  /// True when every op enqueued on the stream before `record` has finished.
  bool query() const;
  /// Blocks the host until then (bounded by the wait timeout). Modeled as a host-side wait.
  void synchronize() const;
  /// Blocks the calling thread until `query()` is true, recording nothing: the ops' data is
  /// there, the modeled host clock does not move (a host reading a tensor the model already
  /// orders after the ops, or a rank process's hub waiting on its behalf).
  void wait_unmodeled() const;
  bool valid() const { return stream_ != nullptr; }
  /// The recorded op this event completes with (invalid if the stream was empty).
  OpRef op() const { return op_; }

 private:
  friend class Stream;
  detail::StreamImpl* stream_ = nullptr;
  std::uint32_t target_ = 0;
  OpRef op_;
};

class Stream {
 public:
  const std::string& name() const;
  int lane() const;
  Rank& rank() const;

  /// Enqueues `fn` to run after everything enqueued before it. The op is priced by `spec`; its
  /// host launch advances the rank's modeled host clock. In dry-run mode `fn` is not called.
  OpRef launch(OpSpec spec, std::function<void()> fn);
  /// Enqueues an op in two parts, as a small collective runs: `start` must not wait for other
  /// threads (it joins the call); `finish` waits for the op to be done. The worker may start the
  /// next split ops already queued on the same `chain` (a collective's group: its calls run in
  /// order, so a call's start never sees the previous call's buffers unwritten) before it
  /// finishes this one, kSplitWindow in all; an op of another kind or chain ends the run. Back-
  /// to-back small calls then cost one hand-off per kSplitWindow calls. Ops still complete
  /// (events, synchronize) in order, each when its `finish` returns.
  OpRef launch_split(OpSpec spec, const void* chain, std::function<void()> start,
                     std::function<void()> finish);
  /// Split ops a stream keeps started but unfinished, at most.
  static constexpr int kSplitWindow = 32;
  /// Records an event after all ops enqueued so far.
  Event record();
  /// Device-side wait: ops enqueued later on this stream start after `event` (host not blocked).
  void wait(const Event& event);
  /// Blocks the host until every op enqueued so far has finished; rethrows a failed op's error.
  void synchronize();
  /// True if every op enqueued so far has finished.
  bool query() const;
  /// Ops enqueued and not finished yet: at most WorldOptions::max_queued_ops (a launch on a full
  /// stream blocks the host). The host's view; call from the rank's host thread.
  std::uint32_t queued() const;

 private:
  friend class Rank;
  explicit Stream(std::unique_ptr<detail::StreamImpl> impl);
  std::unique_ptr<detail::StreamImpl> impl_;

 public:
  ~Stream();
  Stream(Stream&&) noexcept;
};

struct WorldOptions {
  int n_ranks = 8;
  /// Device profile; empty means `configs/devices/ascend-910b.yaml`.
  std::shared_ptr<const DeviceProfile> profile;
  bool numerics = true;       ///< false: dry-run (shapes only, numerics skipped)
  bool deterministic = true;  ///< reductions sum in rank order (see collectives)
  std::chrono::milliseconds timeout = default_timeout();
  std::uint64_t schedule_seed = default_schedule_seed();
  bool record_wall_times = true;
  /// When >= 0, `run` first checks (limits.h check_estimate) that n_ranks × (this many bytes +
  /// kRankOverheadBytes), and under RLIMIT_AS the threads' stacks, fit in half of the memory the
  /// process may still use, and refuses with Errc::too_large before starting any thread if not.
  /// A caller that knows its per-rank footprint sets it; -1 (default): no estimate.
  std::int64_t estimate_bytes_per_rank = -1;
  /// Streams per rank beyond compute and comm that the caller creates, for that estimate.
  int estimate_extra_streams = 0;
  /// Polled by `run`'s calling thread every ~50 ms while the ranks run, as is the process-wide
  /// interrupt_requested() (sync.h). A non-empty answer (what happened: "SIGINT") interrupts the
  /// run: see `run`. Python's binding checks its signals here.
  std::function<std::string()> interrupt_check;
  /// Ops each stream holds launched but not finished, at most (CUDA blocks the host at about
  /// 1,024 pending launches). A launch on a full stream blocks the host thread until the oldest
  /// op finishes; the wait is bounded by the timeout, interruptible, and recorded as a host wait
  /// ("launch queue full"). 1..2^20.
  int max_queued_ops = kDefaultMaxQueuedOps;
  static constexpr int kDefaultMaxQueuedOps = 1024;
  /// A world on several hosts (hosts.h): this process runs the ranks of `hosts->host()` only, and
  /// what crosses to the others goes through the link. Null: every rank is here.
  std::shared_ptr<HostLink> hosts;
};

/// Host memory a rank takes beyond the caller's tensors: its streams, queues and op records
/// (assumption: a few hundred op records of ~200 bytes plus the threads' touched stack pages).
inline constexpr std::int64_t kRankOverheadBytes = std::int64_t(1) << 20;

/// Everything a finished run leaves behind: the recorded graph and its modeled schedule.
struct RunResult {
  std::shared_ptr<const DeviceProfile> profile;
  ModelGraph graph;
  Timeline timeline;
  bool numerics = true;
  std::int64_t wall_ns = 0;
};

class Rank {
 public:
  int id() const { return id_; }
  int world_size() const;
  World& world() const { return *world_; }
  const DeviceProfile& profile() const;
  bool numerics() const;
  bool deterministic() const;

  Stream& compute_stream() { return *streams_[0]; }
  Stream& comm_stream() { return *streams_[1]; }
  /// Creates another stream (its own worker and lane).
  Stream& new_stream(const std::string& name);
  /// The stream that ops of the current phase go to (PyTorch's current stream); compute by default.
  Stream& current_stream() { return *current_; }
  void set_current_stream(Stream& s) { current_ = &s; }
  /// Blocks until every stream of this rank is idle.
  void synchronize();

  /// Records a host-side op (used for launches and host waits); returns its ref.
  OpRef record_host(OpSpec spec);
  /// Names the program region that the ops recorded from now on belong to (e.g. a CoC segment,
  /// "fwd mlp.down"); empty for none. Reports group modeled times by it.
  void set_segment(std::string name) { segment_ = std::move(name); }
  const std::string& segment() const { return segment_; }
  /// Appends an op record on a lane; used by streams. Not for general use.
  OpRecord& append_op(int lane, OpSpec&& spec);
  RankGraph& graph();
  /// Per-rank counter under `key`, starting at 0: matches the n-th collective setup call of every
  /// rank (group creation, symmetric allocation) without any communication.
  std::uint64_t next_sequence(const std::string& key) { return sequences_[key]++; }
  /// Sets what this thread is doing, for timeout reports ("all_reduce seq 4 on group 0 …").
  void note_activity(std::string text);

  ~Rank();
  Rank(World& world, int id);

 private:
  World* world_;
  int id_;
  std::vector<std::unique_ptr<Stream>> streams_;
  Stream* current_ = nullptr;
  WaitScope host_scope_;
  std::unordered_map<std::string, std::uint64_t> sequences_;
  std::unique_ptr<ScopedWaitScope> host_scope_guard_;
  std::string segment_;
};

/// Shared state of one run. Ranks reach each other only through it.
class World {
 public:
  explicit World(const WorldOptions& options);
  ~World();

  int size() const { return options_.n_ranks; }
  const WorldOptions& options() const { return options_; }
  const DeviceProfile& profile() const { return *options_.profile; }

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  /// Records a rank's failure (the first primary failure wins) and wakes every wait.
  void abort(int rank, std::exception_ptr error);
  /// Ends the run from outside (an interrupt): `error` (Errc::cancelled) becomes the failure
  /// every wait reports, whatever the ranks throw while they unwind.
  void cancel(std::exception_ptr error);
  [[noreturn]] void throw_remote_failure(int rank, const std::string& waiting_for) const;
  /// One line per rank and lane: what each was last doing.
  std::string status_report() const;
  void set_activity(int rank, int lane, std::string text);
  /// A stream worker starts `op` (null: it is idle); the report names the op, lazily.
  void set_running(int rank, int lane, const OpRecord* op);

  /// Get-or-create a shared object under `key`; all ranks asking for one key get one object.
  template <class T, class Make>
  std::shared_ptr<T> shared(const std::string& key, Make&& make) {
    std::lock_guard lock(shared_mu_);
    auto& slot = shared_[key];
    if (!slot) slot = std::static_pointer_cast<void>(std::shared_ptr<T>(make()));
    return std::static_pointer_cast<T>(slot);
  }

  /// Keeps `object` alive until the run ends: buffers of a failed collective, which peers may
  /// still be reading or writing while the failure propagates.
  void keep_alive(std::shared_ptr<const void> object);

  std::int64_t wall_now_ns() const;
  ModelGraph& graph() { return graph_; }

  /// Several hosts (WorldOptions::hosts): the link, or null when every rank is in this process.
  HostLink* hosts() const { return options_.hosts.get(); }
  /// The host that runs world rank `rank` (0 on one host).
  int host_of(int rank) const;
  /// Whether this process runs world rank `rank`.
  bool is_local(int rank) const { return !hosts() || host_of(rank) == hosts()->host(); }
  /// The world ranks this process runs, in order.
  std::vector<int> local_ranks() const;
  /// `what` made unique to this run among the runs on the link ("r3/what"): every host numbers
  /// its runs alike, so both ends of a message derive one key.
  std::string host_key(std::string_view what) const;
  std::exception_ptr first_error() const;
  int first_error_rank() const;

 private:
  WorldOptions options_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex error_mu_;
  std::exception_ptr first_error_;
  int first_error_rank_ = -1;
  bool first_error_primary_ = false;
  struct LaneActivity {
    bool touched = false;
    const OpRecord* op = nullptr;  ///< the op a stream worker runs
    std::string text;              ///< a note: what the op or the host thread waits for
  };
  /// One lock per rank: the lanes of one rank update it, the timeout report reads it.
  struct RankActivity {
    mutable std::mutex mu;
    std::vector<LaneActivity> lanes;
    LaneActivity& touch(int lane);  ///< the lane's entry, created if new (caller holds mu)
  };
  std::vector<std::unique_ptr<RankActivity>> activity_;
  std::mutex shared_mu_;
  std::unordered_map<std::string, std::shared_ptr<void>> shared_;
  ModelGraph graph_;
  std::uint64_t host_run_ = 0;  // this run's number on the link (hosts())
  std::chrono::steady_clock::time_point t0_;
  std::mutex keep_mu_;
  std::vector<std::shared_ptr<const void>> kept_;
};

/// Runs `fn` on n rank threads and returns when all have finished (their streams drained). If a
/// rank throws, every other rank is woken from its waits and unwound, and `run` rethrows the
/// first failure as an `Error` naming the rank. The result holds the modeled timeline.
///
/// Interrupts (`WorldOptions::interrupt_check`, `request_interrupt`): the calling thread cancels
/// the world (every wait of every rank throws within a few ms), gives the ranks 1 s to unwind,
/// and throws Errc::cancelled with what each rank was doing when the interrupt came (the
/// timeout report). A rank still in its own host code after that second (a sleep, a loop that
/// calls nothing of cocemu's) cannot be stopped from outside: the error names it, its thread is
/// detached, and what it uses (the world, `fn`) stays alive until it returns; its later cocemu
/// calls fail, since the world is aborted.
RunResult run(const WorldOptions& options, const std::function<void(Rank&)>& fn);
RunResult run(int n_ranks, const std::function<void(Rank&)>& fn);

/// The default device profile (ascend-910b), loaded once.
std::shared_ptr<const DeviceProfile> default_profile();

}  // namespace cocemu
