#pragma once
// Shared helpers for cocemu's tests: a world runner that rethrows the first rank's error, a
// profile with round numbers for hand-worked modeled times, and exact-value input patterns.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/world.h"

namespace cocemu::testing {

/// Runs `fn(link)` once per host of `hosts` in-process hosts (LoopbackHosts), each on a thread of
/// its own as a host's process would, and returns each host's result; after all have ended it
/// rethrows the first host's failure.
template <class R>
std::vector<R> on_loopback_hosts(int hosts, const std::function<R(std::shared_ptr<HostLink>)>& fn) {
  LoopbackHosts link(hosts);
  std::vector<R> results(static_cast<std::size_t>(hosts));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(hosts));
  std::vector<std::thread> threads;
  for (int h = 0; h < hosts; ++h)
    threads.emplace_back([&, h] {
      try {
        results[std::size_t(h)] = fn(link.link(h));
      } catch (...) {
        errors[std::size_t(h)] = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

/// A short wait timeout for a test that expects one: `ms`, or 10 × `ms` under ThreadSanitizer,
/// where starting a world's threads on a loaded 2-core machine can take longer than `ms` itself
/// (a rank that has not started yet is "no progress").
std::chrono::milliseconds short_timeout(std::chrono::milliseconds ms);

/// Runs `fn` on n ranks with a short wait timeout (10 s unless COCEMU_TIMEOUT_MS is set).
RunResult run_ranks(int n, const std::function<void(Rank&)>& fn, WorldOptions options = {});

/// A device profile with round numbers: 1 TFLOP/s for every dtype, GEMMs at full efficiency,
/// links at 1 byte/ns, no step latency, no launch overhead, no contention, auto = direct.
/// `overrides` is YAML text merged over those defaults at top level sections (e.g.
/// "host: {launch_overhead_ns: 100, fused_launch_overhead_ns: 100}").
std::shared_ptr<const DeviceProfile> round_profile(const std::string& overrides = "");
std::string round_profile_yaml(const std::string& overrides = "");

/// Asserts that `fn` throws cocemu::Error with `code` and a message containing every fragment.
/// Runs a shell command; returns its stdout and stderr and sets `*status` (pclose's).
std::string run_command(const std::string& cmd, int* status);
void expect_error(const std::function<void()>& fn, Errc code,
                  const std::vector<std::string>& fragments);

/// A scratch folder of this test binary, `TempDir()/NAME`, created on first use.
std::string scratch_dir(const std::string& name);
/// Writes `text` to `dir/name` and returns the path.
std::string write_file(const std::string& dir, const std::string& name, const std::string& text);

}  // namespace cocemu::testing
