#include "cocemu/runtime/world.h"

#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/limits.h"
#include "failure.h"

namespace cocemu {

namespace detail {

/// "stream 'compute' op 'matmul 64x64x64'": where a stream op failed.
std::string op_where(const std::string& stream, const OpRecord* op) {
  return op ? fmt::format("stream '{}' op '{}'", stream, op->name)
            : fmt::format("stream '{}'", stream);
}

/// A failure as the error `run` reports: what was thrown, with `where` it happened (a stream and
/// its op, the host thread) when the error does not say it itself — an allocation or another
/// resource that ran out (`wrap_resource`: also a cocemu::Error of that kind), anything that is
/// not a cocemu::Error.
std::exception_ptr describe_failure(std::exception_ptr e, std::string_view where,
                                    bool wrap_resource) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (err.code() != Errc::resource_exhausted || !wrap_resource) return e;
    return std::make_exception_ptr(
        Error(err.code(), fmt::format("{}: {}", where, err.message()), err.origin()));
  } catch (const std::bad_alloc&) {
    return std::make_exception_ptr(
        Error(Errc::resource_exhausted,
              fmt::format("{}: out of memory (std::bad_alloc); {}; use smaller sizes, fewer "
                          "ranks, or --dry-run",
                          where, memory_limits_summary())));
  } catch (const std::system_error& err) {
    return std::make_exception_ptr(Error(
        Errc::resource_exhausted, fmt::format("{}: {} ({}; {})", where, err.what(),
                                              memory_limits_summary(), thread_limits_summary())));
  } catch (const std::exception& err) {
    return std::make_exception_ptr(
        Error(Errc::rank_exception, fmt::format("{} threw: {}", where, err.what())));
  } catch (...) {
    return std::make_exception_ptr(
        Error(Errc::rank_exception, fmt::format("{} threw a non-standard exception", where)));
  }
}

/// describe_failure, called where nothing may escape (a catch handler at the top of a stream's
/// or a rank's thread): when the description cannot be built either (the process is out of
/// memory), the original exception is kept as it is, and `run` names it once the ranks have
/// unwound and freed what they held.
std::exception_ptr op_failure(std::exception_ptr e, std::string_view where,
                              bool wrap_resource) noexcept {
  try {
    return describe_failure(e, where, wrap_resource);
  } catch (...) {
    return e;
  }
}

/// The same for a stream op (`op` null: the stream itself), naming it as op_where does.
std::exception_ptr op_failure(std::exception_ptr e, const std::string& stream,
                              const OpRecord* op) noexcept {
  try {
    return describe_failure(e, op_where(stream, op), true);
  } catch (...) {
    return e;
  }
}

/// Waits on other streams allow longer than the waits they cover, so that when a collective hangs,
/// the innermost wait (which knows the group, sequence number and missing peers) is the one
/// reported: a stream waiting on another stream's event gets 1.5x the timeout, a host waiting on
/// a stream 2x (plus a little).
struct WaitGrace {
  explicit WaitGrace(int level) : scope(extended(level)) {}
  static WaitScope extended(int level) {
    WaitScope s = current_wait_scope();
    s.timeout = s.timeout + level * (s.timeout / 2 + std::chrono::milliseconds(100));
    return s;
  }
  WaitScope scope;
  ScopedWaitScope guard{scope};
};
constexpr int kStreamWaitGrace = 1;
constexpr int kHostWaitGrace = 2;

struct Task {
  std::function<void()> fn;
  std::function<void()> finish;  // set: a split op, `fn` starts it (Stream::launch_split)
  const void* chain = nullptr;   // split ops start ahead only behind ops of the same chain
  OpRecord* record = nullptr;
  const Counter* wait_on = nullptr;  // device-side wait on another stream
  std::uint32_t wait_target = 0;
  std::string wait_what;
};

/// One stream: an in-order queue drained by a worker thread — or by the rank's host thread while it
/// waits for the stream and the worker is not running it (`help`); `exec_mu` makes them take
/// turns. Counters: `submitted` counts ops pushed by the host, `completed` ops finished (or
/// skipped after a failure).
struct StreamImpl {
  Rank* rank = nullptr;
  World* world = nullptr;
  std::string name;
  int lane = 0;
  std::mutex mu;
  std::deque<Task> queue;
  Counter submitted, completed;
  std::atomic<bool> stop{false};
  std::atomic<bool> exited{false};  // the worker has left work()
  std::mutex error_mu;
  std::exception_ptr error;
  /// Whoever holds this runs the stream's ops: its worker, or its host while it waits for the
  /// stream (`help`). The two state members below belong to the holder.
  std::mutex exec_mu;
  Counter released;                       // the host's helps that have ended
  std::atomic<std::uint32_t> fetched{0};  // tasks taken from the queue (written under exec_mu)
  std::deque<Task> started;  // split ops started, not yet finished (oldest first; under exec_mu)
  // Host-side bookkeeping (only the rank's host thread touches these).
  std::uint32_t host_submitted = 0;
  OpRef last_op;
  std::unordered_map<const StreamImpl*, std::uint32_t> waited;  // highest target waited per stream
  WaitScope scope;
  std::thread worker;

  /// Refs of the last max_queued_ops ops pushed (oldest first): the op a launch on a full
  /// stream waits for. Host-side, like host_submitted.
  std::deque<OpRef> recent;

  /// Host, before pushing: blocks while the stream holds max_queued_ops ops not finished, until
  /// the oldest is done (CUDA's launch queue). Bounded by the timeout and interruptible like
  /// every wait; a Python rank's GIL is released meanwhile (BlockingSection).
  void make_room() {
    const std::uint32_t depth = std::uint32_t(world->options().max_queued_ops);
    if (host_submitted - completed.load() < depth) return;  // unsigned: wrap-safe
    const std::uint32_t target = host_submitted + 1 - depth;
    rank->note_activity(fmt::format("launch queue of stream '{}' full ({} ops): waiting for op {}",
                                    name, depth, target));
    {
      BlockingSection unlocked;
      help(target);
      WaitGrace grace(kHostWaitGrace);
      completed.wait_geq(target, [&] {
        return fmt::format(
            "room in the launch queue of rank {} stream '{}' ({} ops queued, at "
            "most {}; op {} to finish)",
            rank->id(), name, host_submitted - completed.load(), depth, target);
      });
    }
    rank->note_activity("running");
    if (auto e = failed()) std::rethrow_exception(e);
    if (world->aborted())
      world->throw_remote_failure(rank->id(),
                                  fmt::format("room in the launch queue of stream '{}'", name));
  }

  void push(Task&& t) {
    // After a failure or an interrupt, a host that only launches (a loop without waits) stops
    // at its next launch instead of queueing ops that would be skipped.
    if (world->aborted())
      world->throw_remote_failure(rank->id(), fmt::format("a launch on stream '{}'", name));
    make_room();
    if (t.record) {
      recent.push_back(OpRef{rank->id(), t.record->index});
      if (recent.size() > std::size_t(world->options().max_queued_ops)) recent.pop_front();
    }
    {
      std::lock_guard lock(mu);
      queue.push_back(std::move(t));
    }
    ++host_submitted;
    submitted.add(1);
  }

  std::exception_ptr failed() {
    std::lock_guard lock(error_mu);
    return error;
  }

  /// Whether the next queued task is a split op of `chain` (the host pushes at the back only).
  bool next_is_split(const void* chain) {
    std::lock_guard lock(mu);
    return !queue.empty() && queue.front().finish && queue.front().chain == chain;
  }
  Task pop() {
    std::lock_guard lock(mu);
    Task t = std::move(queue.front());
    queue.pop_front();
    return t;
  }
  /// Runs one part of a task (its whole `fn`, a split op's start or its finish) unless the
  /// world has failed; a failure aborts the world. Returns whether the part ran and succeeded.
  bool run_part(Task& t, const std::function<void()>& part, bool first, bool last) {
    if (world->aborted() || failed()) return false;
    const bool wall = world->options().record_wall_times;
    try {
      if (first) schedule_jitter();
      const std::int64_t t0 = wall ? world->wall_now_ns() : -1;
      if (t.wait_on) {
        WaitGrace grace(kStreamWaitGrace);
        t.wait_on->wait_geq(t.wait_target, [&] { return t.wait_what; });
      } else if (part && world->options().numerics) {
        world->set_running(rank->id(), lane, t.record);
        part();
        world->set_running(rank->id(), lane, nullptr);
      }
      if (t.record && wall) {
        if (first) t.record->wall_start_ns = t0;
        if (last) t.record->wall_end_ns = world->wall_now_ns();
      }
      return true;
    } catch (...) {
      fail(op_failure(std::current_exception(), name, t.record));
      return false;
    }
  }

  /// Records this stream's failure and aborts the world (every wait wakes and unwinds).
  void fail(std::exception_ptr e) {
    {
      std::lock_guard lock(error_mu);
      if (!error) error = e;
    }
    world->abort(rank->id(), e);
  }

  /// With `exec_mu` held: runs the stream's next step — the next queued op when none is started,
  /// or the next split op of the started ones' chain while the window has room; else finishes
  /// the oldest started one. Returns false when there is nothing queued or started.
  bool step() {
    const std::uint32_t taken = fetched.load(std::memory_order_relaxed);
    const bool queued = std::int32_t(submitted.load() - taken) > 0;
    const bool start_ahead = started.size() < std::size_t(Stream::kSplitWindow) && queued &&
                             (started.empty() || next_is_split(started.back().chain));
    if (!start_ahead) {
      if (started.empty()) return false;
      // Ops complete in order, each when its finish returns.
      Task t = std::move(started.front());
      started.pop_front();
      if (t.finish) run_part(t, t.finish, false, true);
      t = Task{};  // what the op holds (its tensors) goes before the host sees it complete
      completed.add(1);
      return true;
    }
    Task t = pop();
    fetched.store(taken + 1, std::memory_order_relaxed);
    if (t.finish) {
      if (!run_part(t, t.fn, true, false)) t.finish = nullptr;  // failed: nothing to finish
      started.push_back(std::move(t));
      return true;
    }
    run_part(t, t.fn, true, true);
    t = Task{};  // what the op holds (its tensors) goes before the host sees it complete
    completed.add(1);
    return true;
  }

  void work() {
    ScopedWaitScope guard(scope);
    blas::init_thread();
    for (;;) {
      const std::uint32_t helps = released.load();
      std::unique_lock exec(exec_mu, std::try_to_lock);
      if (!exec.owns_lock()) {
        // The host is running this stream's ops (`help`): wait until it stops.
        if (!released.wait_idle(helps + 1, stop)) break;
        continue;
      }
      while (step()) {
      }
      const std::uint32_t taken = fetched.load(std::memory_order_relaxed);
      exec.unlock();
      if (!submitted.wait_idle(taken + 1, stop)) break;
    }
  }

  /// Host, about to wait for op `target`: runs the stream's ops up to it here if the worker is not
  /// running them. The host would only wait, and the worker, with more threads than cores, would
  /// first need a core handed to it (4 KiB all_reduce in steady state, medians of 7 alternated
  /// runs: 64 ranks 37.8 -> 29.0 us, 8 ranks 4.5 -> 4.1 us). Ops past `target` stay queued, and
  /// `released` tells a worker that waited for the host that it may run them.
  void help(std::uint32_t target) {
    if (completed.reached(target)) return;
    const WaitScope& me = current_wait_scope();  // only the stream's own host thread helps
    if (me.world != world || me.rank != rank->id() || me.lane_index != 0) return;
    {
      std::unique_lock exec(exec_mu, std::try_to_lock);
      if (!exec.owns_lock()) return;  // the worker is running them
      ScopedWaitScope lane(scope);
      while (!completed.reached(target) && step()) {
      }
    }
    released.add(1);
  }

  /// Host: waits until every op pushed so far is done; rethrows this stream's failure first.
  void drain(const char* why) {
    const std::uint32_t target = host_submitted;
    help(target);
    WaitGrace grace(kHostWaitGrace);
    completed.wait_geq(target, [&] {
      return fmt::format("{} of rank {} stream '{}' ({} of {} ops done)", why, rank->id(), name,
                         completed.load(), target);
    });
    if (auto e = failed()) std::rethrow_exception(e);
    if (world->aborted())
      world->throw_remote_failure(rank->id(), fmt::format("{} of stream '{}'", why, name));
  }
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Event

bool Event::query() const {
  return !stream_ || stream_->completed.reached(target_);
}

void Event::wait_unmodeled() const {
  if (!stream_) return;
  stream_->help(target_);
  detail::WaitGrace grace(detail::kHostWaitGrace);
  stream_->completed.wait_geq(target_, [&] {
    return fmt::format("waiting for the data of rank {} stream '{}' (op {} of {})",
                       stream_->rank->id(), stream_->name, target_, stream_->host_submitted);
  });
  if (auto e = stream_->failed()) std::rethrow_exception(e);
  if (stream_->world->aborted())
    stream_->world->throw_remote_failure(stream_->rank->id(), "a wait for a collective's data");
}

void Event::synchronize() const {
  if (!stream_) return;
  OpSpec spec{.name = "event.synchronize", .cls = OpClass::wait, .launch = LaunchKind::none};
  if (op_.valid()) spec.deps.push_back(op_);
  stream_->rank->record_host(std::move(spec));
  stream_->help(target_);
  detail::WaitGrace grace(detail::kHostWaitGrace);
  stream_->completed.wait_geq(target_, [&] {
    return fmt::format("event.synchronize on rank {} stream '{}' (op {} of {})",
                       stream_->rank->id(), stream_->name, target_, stream_->host_submitted);
  });
  if (auto e = stream_->failed()) std::rethrow_exception(e);
  if (stream_->world->aborted())
    stream_->world->throw_remote_failure(stream_->rank->id(), "event.synchronize");
}

// ---------------------------------------------------------------------------------------------
// Stream

Stream::Stream(std::unique_ptr<detail::StreamImpl> impl) : impl_(std::move(impl)) {}
Stream::Stream(Stream&&) noexcept = default;
Stream::~Stream() {
  if (!impl_) return;
  impl_->stop.store(true, std::memory_order_release);
  if (!impl_->worker.joinable()) return;
  // Wake the worker to see the stop flag. One that checked the flag just before it went to
  // sleep misses a wake-up, and an idle worker sleeps in long slices: wake it until it leaves.
  while (!impl_->exited.load(std::memory_order_acquire)) {
    impl_->submitted.notify_all();
    impl_->released.notify_all();  // a worker waiting for its host to stop helping
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  impl_->worker.join();
}

const std::string& Stream::name() const {
  return impl_->name;
}
int Stream::lane() const {
  return impl_->lane;
}
Rank& Stream::rank() const {
  return *impl_->rank;
}

namespace {
/// Stream::launch and launch_split: the host's launch op, the op's record, the queued task.
OpRef launch_task(detail::StreamImpl& impl, OpSpec spec, detail::Task task) {
  Rank& r = *impl.rank;
  if (spec.launch != LaunchKind::none) {
    OpSpec host{.name = "launch " + spec.name,
                .cls = OpClass::host,
                .work_ns = launch_ns(r.profile(), spec.launch),
                .launch = LaunchKind::none};
    // The launch queue in the model: a launch behind max_queued_ops ops starts once the oldest
    // of them has finished (the host's wait shows as idle host time before it).
    if (impl.recent.size() >= std::size_t(r.world().options().max_queued_ops))
      host.deps.push_back(impl.recent.front());
    spec.deps.push_back(r.record_host(std::move(host)));
  }
  OpRecord& rec = r.append_op(impl.lane, std::move(spec));
  const OpRef ref{r.id(), rec.index};
  impl.last_op = ref;
  task.record = &rec;
  impl.push(std::move(task));
  return ref;
}
}  // namespace

OpRef Stream::launch(OpSpec spec, std::function<void()> fn) {
  return launch_task(*impl_, std::move(spec), detail::Task{.fn = std::move(fn)});
}

OpRef Stream::launch_split(OpSpec spec, const void* chain, std::function<void()> start,
                           std::function<void()> finish) {
  COCEMU_CHECK(finish != nullptr, Errc::internal, "launch_split of '{}' without a finish",
               spec.name);
  return launch_task(
      *impl_, std::move(spec),
      detail::Task{.fn = std::move(start), .finish = std::move(finish), .chain = chain});
}

Event Stream::record() {
  Event e;
  e.stream_ = impl_.get();
  e.target_ = impl_->host_submitted;
  e.op_ = impl_->last_op;
  return e;
}

void Stream::wait(const Event& event) {
  if (!event.stream_ || event.stream_ == impl_.get()) return;  // same stream: already ordered
  // Already ordered after that point of the other stream by an earlier wait: nothing to add.
  // (find first: emplace would allocate a node before finding the key there.)
  if (auto it = impl_->waited.find(event.stream_); it != impl_->waited.end()) {
    if (std::int32_t(event.target_ - it->second) <= 0) return;
    it->second = event.target_;
  } else {
    impl_->waited.emplace(event.stream_, event.target_);
  }
  if (event.target_ == 0) return;  // the other stream had no ops yet
  Rank& r = *impl_->rank;
  OpSpec spec{.name = fmt::format("wait {}", event.stream_->name),
              .cls = OpClass::wait,
              .launch = LaunchKind::none};
  if (event.op_.valid()) spec.deps.push_back(event.op_);
  OpRecord& rec = r.append_op(impl_->lane, std::move(spec));
  impl_->last_op = {r.id(), rec.index};
  impl_->push(detail::Task{
      .record = &rec,
      .wait_on = &event.stream_->completed,
      .wait_target = event.target_,
      .wait_what = fmt::format("event on rank {} stream '{}' (op {})", event.stream_->rank->id(),
                               event.stream_->name, event.target_)});
}

void Stream::synchronize() {
  OpSpec spec{.name = fmt::format("synchronize {}", impl_->name),
              .cls = OpClass::wait,
              .launch = LaunchKind::none};
  if (impl_->last_op.valid()) spec.deps.push_back(impl_->last_op);
  impl_->rank->record_host(std::move(spec));
  impl_->drain("stream.synchronize");
}

bool Stream::query() const {
  return impl_->completed.reached(impl_->host_submitted);
}

std::uint32_t Stream::queued() const {
  return impl_->host_submitted - impl_->completed.load();
}

// ---------------------------------------------------------------------------------------------
// Rank

Rank::Rank(World& world, int id) : world_(&world), id_(id) {
  host_scope_ =
      WaitScope{&world, id, "host", 0, world.options().timeout, world.options().schedule_seed};
  host_scope_guard_ = std::make_unique<ScopedWaitScope>(host_scope_);
  blas::init_thread();
  new_stream("compute");
  new_stream("comm");
  current_ = streams_[0].get();
}

Rank::~Rank() {
  streams_.clear();  // joins the workers; they skip remaining ops if the world aborted
}

int Rank::world_size() const {
  return world_->size();
}
const DeviceProfile& Rank::profile() const {
  return world_->profile();
}
bool Rank::numerics() const {
  return world_->options().numerics;
}
bool Rank::deterministic() const {
  return world_->options().deterministic;
}
RankGraph& Rank::graph() {
  return world_->graph().ranks[id_];
}

Stream& Rank::new_stream(const std::string& name) {
  auto impl = std::make_unique<detail::StreamImpl>();
  impl->rank = this;
  impl->world = world_;
  impl->name = name;
  impl->lane = int(graph().lane_names.size());
  graph().lane_names.push_back(name);
  impl->scope = WaitScope{world_,
                          id_,
                          impl->name.c_str(),
                          impl->lane,
                          world_->options().timeout,
                          world_->options().schedule_seed};
  detail::StreamImpl* raw = impl.get();
  streams_.push_back(std::unique_ptr<Stream>(new Stream(std::move(impl))));
  try {
    raw->worker = std::thread([raw] {
      // Anything that escapes the ops' own handling (the queue's bookkeeping running out of
      // memory) fails the stream and the world instead of terminating the process.
      try {
        raw->work();
      } catch (...) {
        raw->fail(detail::op_failure(std::current_exception(), raw->name, nullptr));
      }
      raw->exited.store(true, std::memory_order_release);
    });
  } catch (const std::system_error& e) {
    streams_.pop_back();
    graph().lane_names.pop_back();
    COCEMU_FAIL(Errc::resource_exhausted,
                "rank {}: cannot start the worker thread of stream '{}': {} ({}); use fewer "
                "ranks, or raise the limit",
                id_, name, e.what(), thread_limits_summary());
  }
  return *streams_.back();
}

void Rank::synchronize() {
  for (auto& s : streams_)
    s->synchronize();
}

OpRef Rank::record_host(OpSpec spec) {
  spec.cls = spec.cls == OpClass::wait ? OpClass::wait : OpClass::host;
  OpRecord& rec = append_op(0, std::move(spec));
  return {id_, rec.index};
}

OpRecord& Rank::append_op(int lane, OpSpec&& spec) {
  RankGraph& g = graph();
  OpRecord& rec = g.ops.emplace_back();
  rec.rank = id_;
  rec.lane = lane;
  rec.index = std::uint32_t(g.ops.size() - 1);
  rec.cls = spec.cls;
  rec.name = std::move(spec.name);
  rec.work_ns = spec.work_ns;
  rec.deps = std::move(spec.deps);
  rec.rendezvous = std::move(spec.rendezvous);
  rec.bytes = spec.bytes;
  rec.hbm_bytes = spec.hbm_bytes;
  rec.flops = spec.flops;
  rec.link_use = spec.link_use;
  rec.detail = std::move(spec.detail);
  rec.seq = spec.seq;
  rec.phases = std::move(spec.phases);
  rec.inner_compute_ns = spec.inner_compute_ns;
  rec.inner_comm_ns = spec.inner_comm_ns;
  rec.segment = segment_;
  return rec;
}

void Rank::note_activity(std::string text) {
  world_->set_activity(id_, current_wait_scope().lane_index, std::move(text));
}

// ---------------------------------------------------------------------------------------------
// World

std::shared_ptr<const DeviceProfile> default_profile() {
  static std::shared_ptr<const DeviceProfile> p =
      std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
  return p;
}

World::World(const WorldOptions& options)
    : options_(options), t0_(std::chrono::steady_clock::now()) {
  COCEMU_CHECK_ARG(options_.n_ranks >= 1 && options_.n_ranks <= 256,
                   "run: n_ranks = {} is out of range; allowed 1..256", options_.n_ranks);
  COCEMU_CHECK_ARG(options_.timeout.count() > 0 && options_.timeout <= kMaxTimeout,
                   "run: timeout {} ms is out of range; allowed 1..{} ms (one day)",
                   options_.timeout.count(), kMaxTimeout.count());
  COCEMU_CHECK_ARG(options_.max_queued_ops >= 1 && options_.max_queued_ops <= (1 << 20),
                   "run: max_queued_ops = {} is out of range; allowed 1..{}",
                   options_.max_queued_ops, 1 << 20);
  if (!options_.profile) options_.profile = default_profile();
  options_.profile->check_world(options_.n_ranks);
  if (const HostLink* link = hosts()) {
    COCEMU_CHECK_ARG(options_.n_ranks % link->n_hosts() == 0,
                     "run: {} ranks do not divide evenly over {} hosts; each host runs the same "
                     "number of ranks (a whole number of nodes)",
                     options_.n_ranks, link->n_hosts());
    host_run_ = options_.hosts->next_run();
  }
  graph_.ranks.resize(std::size_t(options_.n_ranks));
  for (int r = 0; r < options_.n_ranks; ++r)
    activity_.push_back(std::make_unique<RankActivity>());
}

World::~World() = default;

int World::host_of(int rank) const {
  return hosts() ? host_of_rank(rank, size(), hosts()->n_hosts()) : 0;
}

std::vector<int> World::local_ranks() const {
  std::vector<int> out;
  for (int r = 0; r < size(); ++r)
    if (is_local(r)) out.push_back(r);
  return out;
}

std::string World::host_key(std::string_view what) const {
  return fmt::format("r{}/{}", host_run_, what);
}

namespace {
bool is_primary(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code() != Errc::remote_failure;
  } catch (...) {
    return true;
  }
}
}  // namespace

void World::abort(int rank, std::exception_ptr error) {
  {
    std::lock_guard lock(error_mu_);
    const bool primary = is_primary(error);
    if (!first_error_ || (primary && !first_error_primary_)) {
      first_error_ = error;
      first_error_rank_ = rank;
      first_error_primary_ = primary;
    }
  }
  aborted_.store(true, std::memory_order_release);
}

void World::cancel(std::exception_ptr error) {
  {
    std::lock_guard lock(error_mu_);
    first_error_ = error;
    first_error_rank_ = -1;
    first_error_primary_ = true;
  }
  aborted_.store(true, std::memory_order_release);
}

std::exception_ptr World::first_error() const {
  std::lock_guard lock(error_mu_);
  return first_error_;
}

int World::first_error_rank() const {
  std::lock_guard lock(error_mu_);
  return first_error_rank_;
}

void World::throw_remote_failure(int rank, const std::string& waiting_for) const {
  int who;
  std::string what = "unknown error";
  {
    std::lock_guard lock(error_mu_);
    who = first_error_rank_;
    if (first_error_) {
      try {
        std::rethrow_exception(first_error_);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
    }
  }
  if (who < 0)  // World::cancel
    throw Error(Errc::remote_failure,
                fmt::format("rank {} stopped waiting for {}: {}", rank, waiting_for, what));
  throw Error(Errc::remote_failure,
              fmt::format("rank {} stopped waiting for {}: rank {} failed first: {}", rank,
                          waiting_for, who, what));
}

World::LaneActivity& World::RankActivity::touch(int lane) {
  if (lanes.size() <= std::size_t(lane)) lanes.resize(std::size_t(lane) + 1);
  LaneActivity& l = lanes[std::size_t(lane)];
  l.touched = true;
  return l;
}

void World::set_activity(int rank, int lane, std::string text) {
  RankActivity& a = *activity_[std::size_t(rank)];
  std::lock_guard lock(a.mu);
  a.touch(lane).text = std::move(text);
}

void World::set_running(int rank, int lane, const OpRecord* op) {
  RankActivity& a = *activity_[std::size_t(rank)];
  std::lock_guard lock(a.mu);
  LaneActivity& l = a.touch(lane);
  l.op = op;
  l.text.clear();
}

std::string World::status_report() const {
  std::string out = "what each rank was last doing:";
  for (std::size_t r = 0; r < activity_.size(); ++r) {
    out += fmt::format("\n  rank {}:", r);
    const RankActivity& a = *activity_[r];
    std::lock_guard lock(a.mu);
    const auto& names = graph_.ranks[r].lane_names;
    bool any = false;
    for (std::size_t l = 0; l < a.lanes.size(); ++l) {
      const LaneActivity& lane = a.lanes[l];
      if (!lane.touched) continue;
      std::string what = lane.op ? lane.op->name : std::string();
      if (lane.op && lane.op->detail) what += " (" + op_detail(*lane.op) + ")";
      if (!lane.text.empty()) what += (what.empty() ? "" : ": ") + lane.text;
      out += fmt::format(" [{}] {};", l < names.size() ? names[l] : "lane",
                         what.empty() ? "idle" : what);
      any = true;
    }
    if (!any) out += " (nothing recorded)";
  }
  return out;
}

void World::keep_alive(std::shared_ptr<const void> object) {
  std::lock_guard lock(keep_mu_);
  kept_.push_back(std::move(object));
}

std::int64_t World::wall_now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              t0_)
      .count();
}

}  // namespace cocemu
