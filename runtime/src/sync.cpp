#include "cocemu/runtime/sync.h"

#include <limits>

#include "cocemu/runtime/checked.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <random>
#include <thread>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/world.h"

namespace cocemu {

namespace {
const WaitScope& fallback_scope() {
  static const WaitScope scope{nullptr, -1, "host", 0, default_timeout(), 0};
  return scope;
}
thread_local const WaitScope* tls_scope = nullptr;

std::mt19937_64& jitter_rng() {
  thread_local std::mt19937_64 rng{0};
  thread_local std::uint64_t seeded_with = 0;
  const WaitScope& s = current_wait_scope();
  if (seeded_with != s.jitter_seed) {
    std::seed_seq seq{s.jitter_seed, std::uint64_t(s.rank + 1),
                      std::uint64_t(std::hash<std::string>{}(s.lane))};
    rng.seed(seq);
    seeded_with = s.jitter_seed;
  }
  return rng;
}

void futex_wait(const std::atomic<std::uint32_t>* addr, std::uint32_t expected, long ns) {
  timespec ts{0, ns};
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}
void futex_wake_all(const std::atomic<std::uint32_t>* addr) {
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}
}  // namespace

ScopedWaitScope::ScopedWaitScope(const WaitScope& scope) : previous_(tls_scope) {
  tls_scope = &scope;
}
ScopedWaitScope::~ScopedWaitScope() {
  tls_scope = previous_;
}

namespace {
thread_local HostBlockingHook tls_hook;
}  // namespace

ScopedHostBlockingHook::ScopedHostBlockingHook(HostBlockingHook hook) : previous_(tls_hook) {
  tls_hook = hook;
}
ScopedHostBlockingHook::~ScopedHostBlockingHook() {
  tls_hook = previous_;
}

BlockingSection::BlockingSection() {
  if (!tls_hook.release) return;
  token_ = tls_hook.release();
  reacquire_ = tls_hook.reacquire;
}
BlockingSection::~BlockingSection() {
  if (reacquire_) reacquire_(token_);
}

const WaitScope& current_wait_scope() {
  return tls_scope ? *tls_scope : fallback_scope();
}

std::chrono::milliseconds default_timeout() {
  if (const char* v = std::getenv("COCEMU_TIMEOUT_MS"))  // up to a day: deadlines never wrap
    return std::chrono::milliseconds(parse_integer("COCEMU_TIMEOUT_MS", v, 1, kMaxTimeout.count()));
  return std::chrono::milliseconds(60000);
}

namespace {
std::atomic<int> interrupt_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "request_interrupt must be signal-safe");
}  // namespace

void request_interrupt(int signal) noexcept {
  interrupt_signal.store(signal, std::memory_order_relaxed);
}

int interrupt_requested() noexcept {
  return interrupt_signal.load(std::memory_order_relaxed);
}

std::uint64_t default_schedule_seed() {
  if (const char* v = std::getenv("COCEMU_SCHEDULE_SEED"))
    return std::uint64_t(
        parse_integer("COCEMU_SCHEDULE_SEED", v, 0, std::numeric_limits<std::int64_t>::max()));
  return 0;
}

void schedule_jitter() {
  if (current_wait_scope().jitter_seed == 0) return;
  auto& rng = jitter_rng();
  const std::uint64_t r = rng();
  switch (r % 8) {
    case 0:
    case 1:
      sched_yield();
      break;
    case 2:
      std::this_thread::sleep_for(std::chrono::microseconds((r >> 8) % 200));
      break;
    default:
      break;
  }
}

std::uint32_t Counter::add(std::uint32_t n) {
  const std::uint32_t v = value_.fetch_add(n, std::memory_order_seq_cst) + n;
  if (sleepers_.load(std::memory_order_seq_cst) != 0 &&
      v >= wake_at_.load(std::memory_order_seq_cst)) {
    wake_at_.store(~0u, std::memory_order_seq_cst);
    futex_wake_all(&value_);
  }
  return v;
}

void Counter::notify_all() {
  wake_at_.store(~0u, std::memory_order_seq_cst);
  futex_wake_all(&value_);
}

void Counter::sleep_until(std::uint32_t target, long slice_ns) const {
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  std::uint32_t cur = wake_at_.load(std::memory_order_seq_cst);
  while (target < cur && !wake_at_.compare_exchange_weak(cur, target, std::memory_order_seq_cst)) {
  }
  const std::uint32_t v = value_.load(std::memory_order_seq_cst);
  if (std::int32_t(v - target) < 0) futex_wait(&value_, v, slice_ns);
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
}

void Counter::wait_geq(std::uint32_t target, const std::function<std::string()>& what) const {
  if (reached(target)) return;
  const WaitScope& scope = current_wait_scope();
  schedule_jitter();
  // The deadline runs from the last time the counter moved: a wait behind a long queue that is
  // draining (a stream waiting for work enqueued a whole iteration ahead) is progress, not a
  // hang; a counter that stands still for the timeout is.
  auto deadline = std::chrono::steady_clock::now() + scope.timeout;
  std::uint32_t seen = load();
  // Sleeps in the kernel until the counter reaches the target or is woken; time slices bound the
  // abort latency.
  const auto sleep_phase = [&] {
    long slice_ns = 100'000;
    for (;;) {
      if (reached(target)) return;
      sleep_until(target, slice_ns);
      if (reached(target)) return;
      slice_ns = std::min<long>(slice_ns * 2, 5'000'000);
      if (scope.world && scope.world->aborted())
        scope.world->throw_remote_failure(scope.rank, what());
      const auto now = std::chrono::steady_clock::now();
      if (const std::uint32_t v = load(); v != seen) {
        seen = v;
        deadline = now + scope.timeout;
      }
      if (now >= deadline) {
        std::string msg = fmt::format(
            "rank {} ({}) timed out: no progress for {} ms waiting for {} (counter at {}, needed "
            "{})",
            scope.rank, scope.lane, scope.timeout.count(), what(), load(), target);
        if (scope.world) {
          msg += '\n';
          msg += scope.world->status_report();
        }
        throw Error(Errc::timeout, msg);
      }
    }
  };
  // A short spin only: with more rank and stream threads than cores the signal usually comes
  // from a thread that is not running, and every PAUSE delays the yield that would let it run
  // (4 KiB all_reduce, 8 ranks: 64 spins 38 us, 8 spins 25 us; 512 spins 80 us).
  for (int i = 0; i < 8; ++i) {
    if (reached(target)) return;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  // Yield for a while (COCEMU_WAIT_YIELDS times, default 2000): with more runnable threads than
  // cores the peer we wait for usually needs our core, and a busy core answers faster than a
  // halted virtual CPU woken by an interrupt. Then sleep until woken. A host draining a stream's
  // queue waits the same way: sleeping until its last op was near cost every rank a futex wake
  // per drain, and measured slower (4 KiB all_reduce, 8 alternated runs, medians: 64 ranks
  // 52.2 -> 36.6 us, 8 ranks 5.1 -> 4.7 us; mlpbench and the 4 MiB rows unchanged).
  static const int yields = [] {
    const char* v = std::getenv("COCEMU_WAIT_YIELDS");
    if (!v) return 2000;
    return int(parse_integer("COCEMU_WAIT_YIELDS", v, 0, 1000000));
  }();
  // The yields are bounded in time too: on a loaded machine one yield can take a millisecond,
  // and 2000 of them would outlast the timeout, which only the sleep phase checks.
  const auto yield_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  for (int i = 0; i < yields; ++i) {
    if (reached(target)) return;
    sched_yield();
    if (i % 16 == 15 && std::chrono::steady_clock::now() >= yield_until) break;
  }
  sleep_phase();
}

/// An idle stream worker wakes once per slice to look at its stop flag (every push and the stop
/// wake it sooner). 5 ms slices woke each of a 64-rank world's 128 idle workers 200 times a
/// second; 100 ms slices cut a 64-rank 4 KiB all_reduce run's context switches by 5-15% and its
/// CPU time by 4-12% (4 alternated runs).
constexpr long kIdleSliceNs = 100'000'000;

bool Counter::wait_idle(std::uint32_t target, const std::atomic<bool>& stop) const {
  for (int i = 0; i < 100; ++i) {
    if (reached(target)) return true;
    if (stop.load(std::memory_order_acquire)) return false;
    sched_yield();
  }
  for (;;) {
    if (reached(target)) return true;
    if (stop.load(std::memory_order_acquire)) return reached(target);
    sleep_until(target, kIdleSliceNs);
  }
}

}  // namespace cocemu
