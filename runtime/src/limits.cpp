#include "cocemu/runtime/limits.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"

namespace cocemu {

namespace {

/// The value after `key` in a "Key:   123 kB" file (/proc/meminfo, /proc/self/status), in bytes;
/// -1 when absent.
std::int64_t proc_kib(const char* file, const std::string& key) {
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream ss(line.substr(key.size()));
      std::int64_t kib = 0;
      if (ss >> kib && kib >= 0) return kib * 1024;
    }
  return -1;
}

/// A number from a one-line cgroup file; -1 for "max", absent or unreadable files.
std::int64_t read_number(const std::string& file) {
  std::ifstream f(file);
  std::string text;
  if (!(f >> text) || text == "max") return -1;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || *end) return -1;
  // cgroup v1 reports "no limit" as a page-rounded 2^63 - 1.
  if (v >= (1ULL << 62)) return -1;
  return std::int64_t(v);
}

/// The cgroup's limit less its usage: cgroup v2 (memory.max, memory.current) or v1
/// (memory.limit_in_bytes, memory.usage_in_bytes), at the process's own cgroup path when it is
/// visible, else at the root of the mount.
std::int64_t cgroup_headroom() {
  std::string v2_path, v1_path;
  {
    std::ifstream f("/proc/self/cgroup");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("0::", 0) == 0) v2_path = line.substr(3);
      const auto colon = line.find(':');
      const auto colon2 = line.find(':', colon + 1);
      if (colon != std::string::npos && colon2 != std::string::npos) {
        const std::string controllers = line.substr(colon + 1, colon2 - colon - 1);
        if (("," + controllers + ",").find(",memory,") != std::string::npos)
          v1_path = line.substr(colon2 + 1);
      }
    }
  }
  std::int64_t best = -1;
  auto consider = [&](std::int64_t limit, std::int64_t usage) {
    if (limit < 0) return;
    const std::int64_t room = std::max<std::int64_t>(0, limit - std::max<std::int64_t>(usage, 0));
    best = best < 0 ? room : std::min(best, room);
  };
  for (const std::string& dir : {"/sys/fs/cgroup" + v2_path, std::string("/sys/fs/cgroup")})
    consider(read_number(dir + "/memory.max"), read_number(dir + "/memory.current"));
  for (const std::string& dir :
       {"/sys/fs/cgroup/memory" + v1_path, std::string("/sys/fs/cgroup/memory")})
    consider(read_number(dir + "/memory.limit_in_bytes"),
             read_number(dir + "/memory.usage_in_bytes"));
  return best;
}

}  // namespace

std::int64_t MemoryLimits::bytes() const {
  std::int64_t b = -1;
  for (std::int64_t v : {available_bytes, cgroup_bytes, address_space_bytes})
    if (v >= 0) b = b < 0 ? v : std::min(b, v);
  return b < 0 ? std::int64_t(8) << 30 : b;
}

std::string MemoryLimits::source() const {
  const std::int64_t b = bytes();
  if (address_space_bytes >= 0 && address_space_bytes == b) return "RLIMIT_AS";
  if (cgroup_bytes >= 0 && cgroup_bytes == b) return "the cgroup's memory limit";
  if (available_bytes >= 0) return "MemAvailable";
  return "an assumed 8 GiB (MemAvailable unknown)";
}

MemoryLimits memory_limits() {
  MemoryLimits m;
  m.available_bytes = proc_kib("/proc/meminfo", "MemAvailable:");
  m.cgroup_bytes = cgroup_headroom();
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const std::int64_t mapped = std::max<std::int64_t>(0, proc_kib("/proc/self/status", "VmSize:"));
    m.address_space_bytes = std::max<std::int64_t>(0, std::int64_t(as.rlim_cur) - mapped);
  }
  return m;
}

std::string memory_limits_summary() {
  const MemoryLimits m = memory_limits();
  return fmt::format("this process may use {} more ({})", format_gib(m.bytes()), m.source());
}

std::string thread_limits_summary() {
  const std::int64_t threads = [] {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("Threads:", 0) == 0) return std::int64_t(std::atoll(line.c_str() + 8));
    return std::int64_t(-1);
  }();
  std::string out = fmt::format("this process runs {} threads", threads);
  rlimit np{};
  if (getrlimit(RLIMIT_NPROC, &np) == 0 && np.rlim_cur != RLIM_INFINITY)
    out += fmt::format("; RLIMIT_NPROC {} (threads of the user, all processes)",
                       std::int64_t(np.rlim_cur));
  std::ifstream f("/proc/sys/kernel/threads-max");
  std::int64_t max = 0;
  if (f >> max) out += fmt::format("; kernel threads-max {}", max);
  const std::int64_t stacks = std::max<std::int64_t>(threads, 0) * thread_stack_bytes();
  const MemoryLimits m = memory_limits();
  if (m.address_space_bytes >= 0)
    out += fmt::format("; {} of RLIMIT_AS left ({} of it in thread stacks of {} each)",
                       format_gib(m.address_space_bytes), format_gib(stacks),
                       format_gib(thread_stack_bytes()));
  return out;
}

int host_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

std::int64_t thread_stack_bytes() {
  rlimit st{};
  if (getrlimit(RLIMIT_STACK, &st) == 0 && st.rlim_cur != RLIM_INFINITY && st.rlim_cur > 0)
    return std::int64_t(st.rlim_cur);
  return std::int64_t(8) << 20;
}

double default_max_seconds() {
  if (const char* v = std::getenv("COCEMU_MAX_SECONDS"))
    return double(parse_integer("COCEMU_MAX_SECONDS", v, 1, 10'000'000));
  return 600;
}

std::string format_gib(std::int64_t bytes) {
  const double b = double(bytes);
  if (b >= double(1 << 30)) return fmt::format("{:.1f} GiB", b / double(1 << 30));
  if (b >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  return fmt::format("{:.1f} KiB", b / 1024);
}

void check_estimate(const Estimate& e, double max_seconds) {
  const MemoryLimits m = memory_limits();
  const MemoryLimits resident{m.available_bytes, m.cgroup_bytes, -1};
  // Every limit the request exceeds, said at once.
  std::vector<std::string> over;
  if (e.memory_bytes > resident.bytes() / 2)
    over.push_back(
        fmt::format("needs about {} of memory, more than half of the {} this process "
                    "may still use ({})",
                    format_gib(e.memory_bytes), format_gib(resident.bytes()), resident.source()));
  if (m.address_space_bytes >= 0) {
    // Each thread reserves its stack: address space, mostly untouched, so counted here only.
    const std::int64_t stacks = e.threads * thread_stack_bytes();
    const std::int64_t need = e.memory_bytes + stacks;
    if (need > m.address_space_bytes / 2)
      over.push_back(fmt::format(
          "needs about {} of address space ({} of memory and {} threads' stacks of {} each), "
          "more than half of the {} RLIMIT_AS leaves this process",
          format_gib(need), format_gib(e.memory_bytes), e.threads, format_gib(thread_stack_bytes()),
          format_gib(m.address_space_bytes)));
  }
  if (e.host_seconds > max_seconds)
    over.push_back(
        fmt::format("would take about {:.0f} s of host time on {} core(s), more than "
                    "the {:.0f} s budget (--max-seconds, or COCEMU_MAX_SECONDS)",
                    e.host_seconds, host_cores(), max_seconds));
  if (over.empty()) return;
  std::string why = over[0];
  for (std::size_t i = 1; i < over.size(); ++i)
    why += (i + 1 == over.size() ? " and " : ", ") + over[i];
  COCEMU_FAIL(Errc::too_large, "{} {}; {}", e.what, why, e.way_out);
}

}  // namespace cocemu
