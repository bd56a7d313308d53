#pragma once
/// What this process may spend, and the check that a request fits before any work starts.
///
/// A request (a benchmark, a training step, a search) estimates its peak memory and host time
/// first; `check_estimate` refuses it with `Errc::too_large` when it needs more than half of the
/// memory the process may still use, or more than the time budget, naming the estimate, the limit
/// and the way out. Memory the process may still use is the least of MemAvailable, the cgroup's
/// limit less its usage, and RLIMIT_AS less the address space already mapped.
#include <cstdint>
#include <string>

namespace cocemu {

/// Memory this process may still use, by source (-1: that source sets no limit).
struct MemoryLimits {
  std::int64_t available_bytes = -1;      ///< /proc/meminfo MemAvailable
  std::int64_t cgroup_bytes = -1;         ///< the cgroup's memory limit less its usage
  std::int64_t address_space_bytes = -1;  ///< RLIMIT_AS less the address space mapped
  /// The least of the three (8 GiB when none is known).
  std::int64_t bytes() const;
  /// Which source sets bytes(): "MemAvailable", "the cgroup's memory limit" or "RLIMIT_AS".
  std::string source() const;
};
MemoryLimits memory_limits();

/// "3.1 GiB more may be used (RLIMIT_AS)": for errors of a run that ran out of memory.
std::string memory_limits_summary();
/// "this process runs 770 threads; RLIMIT_NPROC 800 (threads of the user); threads-max 192730":
/// for errors of a thread that could not start.
std::string thread_limits_summary();

/// Cores this process may run on (its CPU affinity; at least 1).
int host_cores();

/// Bytes of address space each thread reserves for its stack (RLIMIT_STACK, glibc's default for
/// new threads; 8 MiB when unlimited). Counts against RLIMIT_AS, not against resident memory.
std::int64_t thread_stack_bytes();

/// The time budget of a request, in seconds: COCEMU_MAX_SECONDS from the environment (1..10^7),
/// else 600 (ten minutes of work without a line of output). Commands take `--max-seconds` over
/// it.
double default_max_seconds();

/// One request's cost, estimated before anything is allocated or any thread starts.
struct Estimate {
  std::string what;               ///< the request, as the user gave it ("bench --model llama2-7b")
  std::int64_t memory_bytes = 0;  ///< peak resident memory
  std::int64_t threads = 0;       ///< threads it starts (each reserves a stack, see above)
  double host_seconds = 0;        ///< host time on this machine's cores
  std::string way_out;            ///< what to change: "use --dry-run, or fewer ranks"
};

/// Throws Errc::too_large when `e` needs more than half of the memory this process may still use
/// (its threads' stacks counted against RLIMIT_AS only), or more than `max_seconds` of host time;
/// the message gives every estimate that is over, its limit and source, and the way out.
void check_estimate(const Estimate& e, double max_seconds = default_max_seconds());

/// "1.5 GiB", "820.0 MiB": bytes for messages.
std::string format_gib(std::int64_t bytes);

// Host speeds the time estimates assume, per core. GEMM FLOPs: fitted on the default `cocemu
// bench` (real numerics, 2048 tokens, hidden 1024, TP 8: five strategies × three repeats of
// 1.7·10¹¹ FLOPs of GEMMs and causal attention in 66 s of CPU on a 2-core x86-64 VM);
// tests/robustness/test_limits.cpp holds it against another layer.
inline constexpr double kHostFlopsPerCore = 3.9e10;
/// Elementwise work (an exp, a copy, a conversion) per core and second: assumption (a few
/// cycles per element at ~3 GHz).
inline constexpr double kHostElementsPerCore = 1e9;

}  // namespace cocemu
