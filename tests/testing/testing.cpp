#include "testing.h"

#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cocemu/runtime/error.h"

namespace cocemu::testing {

namespace {
/// Every test process (and the cocemu processes the CLI tests start) fills Tensor::empty storage
/// with NaN bytes, so an output element that no kernel writes shows in the results.
const bool poison_empty = [] { return ::setenv("COCEMU_POISON_EMPTY", "1", 1) == 0; }();
}  // namespace

std::chrono::milliseconds short_timeout(std::chrono::milliseconds ms) {
#if defined(__SANITIZE_THREAD__)
  return ms * 10;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return ms * 10;
#endif
#endif
  return ms;
}

RunResult run_ranks(int n, const std::function<void(Rank&)>& fn, WorldOptions options) {
  options.n_ranks = n;
  if (!std::getenv("COCEMU_TIMEOUT_MS") && options.timeout == std::chrono::milliseconds(60000))
    options.timeout = std::chrono::milliseconds(10000);
  return run(options, fn);
}

std::string round_profile_yaml(const std::string& overrides) {
  YAML::Node base = YAML::Load(R"(
name: round-numbers
topology:
  devices_per_node: 64
  intra_node: {fabric: mesh, per_peer_bytes_per_s: 1.0e9, per_device_bytes_per_s: 1.0e9, latency_ns: 0}
compute:
  peak_flops: {f32: 1.0e12, f64: 1.0e12, f16: 1.0e12, bf16: 1.0e12, i8: 1.0e12}
  gemm: {max_efficiency: 1.0, half_efficiency_flops: 0, alignment_bytes: 1, unaligned_efficiency: 1.0}
  kernel_min_ns: 0
memory: {bandwidth_bytes_per_s: 1.0e15}
collectives:
  ring: {step_latency_ns: 0, bandwidth_efficiency: 1.0}
  direct: {step_latency_ns: 0, bandwidth_efficiency: 1.0}
  auto: [{max_bytes: .inf, algorithm: direct}]
host: {launch_overhead_ns: 0, fused_launch_overhead_ns: 0}
contention: {compute_slowdown: 1.0, comm_slowdown: 1.0}
)");
  if (!overrides.empty()) {
    YAML::Node over = YAML::Load(overrides);
    for (auto it = over.begin(); it != over.end(); ++it) {
      const std::string key = it->first.as<std::string>();
      if (it->second.IsMap())
        for (auto jt = it->second.begin(); jt != it->second.end(); ++jt)
          base[key][jt->first.as<std::string>()] = jt->second;
      else
        base[key] = it->second;
    }
  }
  YAML::Emitter out;
  out << base;
  return out.c_str();
}

std::shared_ptr<const DeviceProfile> round_profile(const std::string& overrides) {
  return std::make_shared<const DeviceProfile>(
      parse_device_profile(round_profile_yaml(overrides), "<round profile>"));
}

std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && std::fgets(buf.data(), int(buf.size()), p))
    out += buf.data();
  *status = p ? pclose(p) : -1;
  return out;
}

void expect_error(const std::function<void()>& fn, Errc code,
                  const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << "message: " << e.what();
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "expected '" << f << "' in: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected a cocemu::Error(" << to_string(code) << "), nothing was thrown";
}

std::string scratch_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace cocemu::testing
