#pragma once
/// Bounded waiting on monotonic counters, the one synchronisation primitive of cocemu.
///
/// Wake-ups: a sleeper registers its target in `wake_at_` (minimum over sleepers); `add` wakes
/// all sleepers once the value reaches it and clears it, and woken sleepers whose target is not
/// reached register again. A registration that races with a clear can be lost; the sleeper then
/// wakes at the end of its time slice (at most 5 ms), so the race costs latency, never progress.
///
/// A `Counter` only grows. `add` is a sequentially consistent read-modify-write (so it releases
/// everything the signalling thread wrote before it); `wait_geq` returns after an acquire load that
/// saw the target, so the waiter sees those writes. Waiting spins briefly, then yields, then sleeps
/// in the kernel (futex) in short slices; between slices it checks the world's abort flag and its
/// deadline. No wait is unbounded: when the counter has not moved for the timeout it throws
/// `Errc::timeout` naming what it waited for (a counter that keeps moving is a queue draining,
/// however long — a stream may wait for work enqueued a whole training iteration ahead).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace cocemu {

class World;

/// What bounds the waits of the calling thread: its world (abort flag, status report), rank, lane
/// name and deadline. Rank threads and stream workers install one; other threads use defaults.
struct WaitScope {
  World* world = nullptr;
  int rank = -1;
  const char* lane = "host";
  int lane_index = 0;
  std::chrono::milliseconds timeout{60000};
  std::uint64_t jitter_seed = 0;  ///< nonzero: inject random yields/sleeps (schedule seed)
};

/// Installs `scope` for the current thread until destruction.
class ScopedWaitScope {
 public:
  explicit ScopedWaitScope(const WaitScope& scope);
  ~ScopedWaitScope();
  ScopedWaitScope(const ScopedWaitScope&) = delete;
  ScopedWaitScope& operator=(const ScopedWaitScope&) = delete;

 private:
  const WaitScope* previous_;
};

const WaitScope& current_wait_scope();

/// The longest wait timeout anywhere (`COCEMU_TIMEOUT_MS`, `WorldOptions::timeout`, Python's
/// `timeout_s`): one day. Deadlines (steady_clock in ns, plus the grace of outer waits) then never
/// overflow; larger values are refused, not saturated.
inline constexpr std::chrono::milliseconds kMaxTimeout{86'400'000};

/// Default wait timeout: `COCEMU_TIMEOUT_MS` from the environment (1..kMaxTimeout), else 60 s.
std::chrono::milliseconds default_timeout();

/// Process-wide interrupt, for a program's signal handler (the `cocemu` CLI's SIGINT/SIGTERM):
/// every `run` in progress polls it and stops (Errc::cancelled), as do runs started later.
/// Async-signal-safe (a lock-free atomic store); `signal` is what `interrupt_requested` returns;
/// 0 clears it (for tests and programs that carry on).
void request_interrupt(int signal) noexcept;
/// The signal passed to request_interrupt, or 0 when none was requested.
int interrupt_requested() noexcept;
/// Default schedule seed: `COCEMU_SCHEDULE_SEED` from the environment, else 0 (no jitter).
std::uint64_t default_schedule_seed();

/// A lock the calling thread holds that the work it is about to wait for may need (Python's
/// GIL, held by a rank thread while it launches): `release` before such a wait returns a token
/// that `reacquire` takes after it. Installed per thread (HostBlockingHook); calls that only
/// enqueue yet may block (a launch on a full stream) run their wait inside a BlockingSection.
struct HostBlockingHook {
  void* (*release)() = nullptr;
  void (*reacquire)(void*) = nullptr;
};
/// Installs `hook` for the current thread until destruction.
class ScopedHostBlockingHook {
 public:
  explicit ScopedHostBlockingHook(HostBlockingHook hook);
  ~ScopedHostBlockingHook();
  ScopedHostBlockingHook(const ScopedHostBlockingHook&) = delete;
  ScopedHostBlockingHook& operator=(const ScopedHostBlockingHook&) = delete;

 private:
  HostBlockingHook previous_;
};
/// Releases the current thread's hooked lock for its lifetime (no-op without a hook).
class BlockingSection {
 public:
  BlockingSection();
  ~BlockingSection();
  BlockingSection(const BlockingSection&) = delete;
  BlockingSection& operator=(const BlockingSection&) = delete;

 private:
  void* token_ = nullptr;
  void (*reacquire_)(void*) = nullptr;
};

/// With a nonzero schedule seed in the current scope, sometimes yields or sleeps a little, so
/// tests see many thread interleavings. A no-op otherwise.
void schedule_jitter();

class Counter {
 public:
  std::uint32_t load() const { return value_.load(std::memory_order_acquire); }
  bool reached(std::uint32_t target) const {
    return std::int32_t(load() - target) >= 0;  // wrap-safe comparison
  }
  /// Adds `n` (seq_cst) and wakes sleeping waiters; returns the new value.
  std::uint32_t add(std::uint32_t n = 1);
  /// Wakes every sleeping waiter so it re-checks its condition (e.g. a stop flag).
  void notify_all();
  /// Blocks until the value is >= target (acquire). `what` describes the wait for error messages;
  /// it is only called on failure.
  void wait_geq(std::uint32_t target, const std::function<std::string()>& what) const;
  /// Waits without a deadline until the value is >= target or `stop` is set; for idle workers
  /// waiting for work. Returns whether the target was reached.
  bool wait_idle(std::uint32_t target, const std::atomic<bool>& stop) const;

 private:
  void sleep_until(std::uint32_t target, long slice_ns) const;
  alignas(64) std::atomic<std::uint32_t> value_{0};
  mutable std::atomic<std::uint32_t> sleepers_{0};
  /// Smallest target among sleeping waiters: `add` only makes the wake-up system call once the
  /// value reaches it, so a host thread waiting for the 50th op is not woken by each of the first
  /// 49. (Counters are treated as non-wrapping here: 4e9 signals per counter are out of reach.)
  mutable std::atomic<std::uint32_t> wake_at_{~0u};
};

}  // namespace cocemu
