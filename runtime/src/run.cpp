// `run`: starts the rank threads of a world, waits for them while looking for interrupts, and
// rethrows the first failure (world.h).
#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/limits.h"
#include "cocemu/runtime/world.h"
#include "failure.h"
#include "hosts/exchange.h"

namespace cocemu {

namespace {

/// What the rank threads of one run share with its calling thread. Held by shared_ptr: a rank
/// left running after an interrupt (see `run`) keeps it alive after `run` has returned.
struct RunShared {
  RunShared(const WorldOptions& options, std::function<void(Rank&)> f)
      : world(options), fn(std::move(f)) {}
  World world;
  std::function<void(Rank&)> fn;
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;        // rank threads that have ended (under mu)
  std::vector<char> done;  // by rank (under mu)
};

/// How often `run`'s calling thread looks for an interrupt, and how long it then gives the ranks
/// to unwind before it leaves those still in their own host code behind.
constexpr auto kInterruptPoll = std::chrono::milliseconds(50);
constexpr auto kCancelGrace = std::chrono::milliseconds(500);

/// "SIGINT", or what `check` answers; empty when nothing interrupts the run.
std::string poll_interrupt(const WorldOptions& o) {
  if (const int sig = interrupt_requested()) {
    if (sig == SIGINT) return "SIGINT (Ctrl-C)";
    if (sig == SIGTERM) return "SIGTERM";
    return fmt::format("signal {}", sig);
  }
  return o.interrupt_check ? o.interrupt_check() : std::string();
}

/// "ranks 0, 3 and 5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

/// Throws the run's first failure as an Error naming the rank.
[[noreturn]] void rethrow_failure(World& world) {
  {
    const std::exception_ptr e = world.first_error();
    const int r = world.first_error_rank();
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      throw Error(err.code(), fmt::format("rank {} failed: {}", r, err.message()), err.origin(), r);
    } catch (const std::bad_alloc&) {  // kept as thrown when memory ran out describing it
      throw Error(Errc::resource_exhausted,
                  fmt::format("rank {} failed: out of memory (std::bad_alloc); {}; use smaller "
                              "sizes, fewer ranks, or --dry-run",
                              r, memory_limits_summary()),
                  std::string{}, r);
    } catch (const std::system_error& ex) {
      throw Error(Errc::resource_exhausted,
                  fmt::format("rank {} failed: {} ({}; {})", r, ex.what(), memory_limits_summary(),
                              thread_limits_summary()),
                  std::string{}, r);
    } catch (const std::exception& ex) {
      throw Error(Errc::rank_exception, fmt::format("rank {} threw: {}", r, ex.what()),
                  std::string{}, r);
    } catch (...) {
      throw Error(Errc::rank_exception, fmt::format("rank {} threw a non-standard exception", r),
                  std::string{}, r);
    }
  }
}

/// While a run on several hosts is in progress, a failure another host reports aborts this world
/// (its waits end with it).
class HostFailureHook {
 public:
  explicit HostFailureHook(World& world) : link_(world.hosts()) {
    if (!link_) return;
    link_->on_failure([&world](int host, const std::string& text) {
      const int first = host * (world.size() / world.hosts()->n_hosts());
      world.abort(first, std::make_exception_ptr(Error(Errc::remote_failure, text)));
    });
  }
  ~HostFailureHook() {
    if (link_) link_->on_failure({});
  }
  HostFailureHook(const HostFailureHook&) = delete;
  HostFailureHook& operator=(const HostFailureHook&) = delete;

 private:
  HostLink* link_;
};

}  // namespace

RunResult run(const WorldOptions& options, const std::function<void(Rank&)>& fn) {
  auto shared = std::make_shared<RunShared>(options, fn);
  World& world = shared->world;
  const std::vector<int> ranks = world.local_ranks();  // every rank unless on several hosts
  if (options.estimate_bytes_per_rank >= 0) {
    // A rank thread, its compute and comm streams and the extra streams the caller names.
    const std::int64_t n = std::int64_t(ranks.size());
    check_estimate(
        {.what = fmt::format("a run of {} ranks", n),
         .memory_bytes = checked_mul(n, options.estimate_bytes_per_rank + kRankOverheadBytes,
                                     "run: ranks x bytes per rank"),
         .threads = n * (3 + options.estimate_extra_streams),
         .way_out = "use fewer ranks or smaller sizes"});
  }
  HostFailureHook hook(world);
  shared->done.assign(std::size_t(world.size()), 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (const int r : ranks) {
    // A thread that cannot start fails the run like a rank that threw: the ranks already
    // running are woken from their waits and unwound, and joined below.
    try {
      threads.emplace_back([shared, r] {
        World& world = shared->world;
        try {
          Rank rank(world, r);
          try {
            world.set_activity(r, 0, "running");
            shared->fn(rank);
            rank.synchronize();
            world.set_activity(r, 0, "finished");
          } catch (...) {
            world.set_activity(r, 0, "failed");
            world.abort(r, detail::op_failure(std::current_exception(), "host thread"));
          }
        } catch (...) {  // the rank could not be set up (its streams' threads)
          world.abort(r, detail::op_failure(std::current_exception(), "starting the rank", false));
        }
        std::lock_guard lock(shared->mu);
        shared->done[std::size_t(r)] = 1;
        ++shared->finished;
        shared->cv.notify_all();
      });
    } catch (const std::system_error& e) {
      const std::exception_ptr cause = std::current_exception();
      try {
        world.abort(r, std::make_exception_ptr(Error(
                           Errc::resource_exhausted,
                           fmt::format("cannot start the thread of rank {} ({} of {} started): {} "
                                       "({}); use fewer ranks, or raise the limit",
                                       r, threads.size(), ranks.size(), e.what(),
                                       thread_limits_summary()))));
      } catch (const std::bad_alloc&) {  // no memory for the message: the cause as it is
        world.abort(r, cause);
      }
      break;
    }
  }
  // Wait for the ranks, looking for an interrupt every kInterruptPoll.
  const int started = int(threads.size());
  std::string interrupt;
  {
    std::unique_lock lock(shared->mu);
    while (shared->finished < started) {
      shared->cv.wait_for(lock, kInterruptPoll);
      if (shared->finished == started) break;
      lock.unlock();
      try {
        interrupt = poll_interrupt(world.options());
      } catch (...) {  // the check itself failed: treat it as an interrupt
        interrupt = "an interrupt check that failed";
      }
      lock.lock();
      if (!interrupt.empty()) break;
    }
  }
  if (!interrupt.empty()) {
    // Where each rank was, before the cancellation changes it.
    std::string report = world.status_report();
    const double after_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string why = fmt::format("run interrupted by {} after {:.1f} s", interrupt, after_s);
    world.cancel(std::make_exception_ptr(Error(Errc::cancelled, why)));
    if (HostLink* link = world.hosts()) link->report_failure(why);
    std::vector<int> left;
    {
      std::unique_lock lock(shared->mu);
      shared->cv.wait_for(lock, kCancelGrace, [&] { return shared->finished == started; });
      for (int i = 0; i < started; ++i)
        if (!shared->done[std::size_t(ranks[std::size_t(i)])])
          left.push_back(ranks[std::size_t(i)]);
    }
    for (int i = 0; i < started; ++i) {
      if (std::find(left.begin(), left.end(), ranks[std::size_t(i)]) == left.end())
        threads[std::size_t(i)].join();
      else
        threads[std::size_t(i)].detach();  // keeps `shared` alive until its code returns
    }
    std::string msg = why;
    if (!left.empty())
      msg += fmt::format(
          "; {} still running {} own host code {} s later (a sleep or a loop that calls nothing "
          "of cocemu's cannot be stopped from outside): left running detached, {} cocemu calls "
          "fail and {} memory is kept until that code returns",
          rank_list(left), left.size() == 1 ? "its" : "their",
          std::chrono::duration<double>(kCancelGrace).count(), left.size() == 1 ? "its" : "their",
          left.size() == 1 ? "its" : "their");
    msg += '\n';
    msg += report;
    throw Error(Errc::cancelled, msg);
  }
  for (auto& t : threads)
    t.join();
  if (world.first_error()) {
    try {
      rethrow_failure(world);
    } catch (const Error& err) {
      if (HostLink* link = world.hosts()) link->report_failure(err.message());
      throw;
    }
  }
  RunResult result;
  result.profile = world.options().profile;
  result.numerics = world.options().numerics;
  if (HostLink* link = world.hosts()) {
    // The other hosts' ranks recorded their ops there: one graph, one timeline on every host.
    // A host that gives up waiting for them says so to the others, whose ranks may be waiting
    // for this host's in a call it never makes.
    ScopedWaitScope scope({.timeout = world.options().timeout});
    try {
      detail::exchange_graphs(world);
    } catch (const Error& err) {
      link->report_failure(err.message());
      throw;
    }
  }
  result.wall_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  result.graph = std::move(world.graph());
  result.timeline = simulate(result.graph, result.profile->contention);
  return result;
}

RunResult run(int n_ranks, const std::function<void(Rank&)>& fn) {
  WorldOptions o;
  o.n_ranks = n_ranks;
  return run(o, fn);
}

}  // namespace cocemu
