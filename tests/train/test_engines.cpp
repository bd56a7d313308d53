// The three engines of `cocemu train` agree (issue 44): on every layout of
// tests/train/data/engines-matrix.txt — TP with SP and each CoC strategy, CP (ring, the ring with
// send/receive overlap, double ring, Ulysses, hybrid), PP with and without virtual stages, DP with
// the distributed optimizer and overlapped parameter gathers — the step model on emulated parts
// (`--engine model`) and on priced parts (`--engine priced`, what `cocemu plan` ranks with) give
// the emulation's iteration time (`--engine emulate`, rank by rank: the reference) within 2%, or
// within the bound the matrix states for a layout whose term is not composed exactly.
// bench/engines.py prints the same matrix as a table. And `cocemu plan`'s winner, re-run with
// --engine emulate, lands within 2% of the iteration plan printed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

struct Row {
  std::string name, flags;
  double bound_percent = 2;
};

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<Row> matrix() {
  const fs::path file = fs::path(COCEMU_SOURCE_DIR) / "tests/train/data/engines-matrix.txt";
  std::ifstream in(file);
  EXPECT_TRUE(in) << "cannot read " << file;
  std::vector<Row> rows;
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, '|');)
      cols.push_back(trim(c));
    EXPECT_GE(cols.size(), 2u) << "engines-matrix.txt: '" << line << "' is not 'name | flags'";
    if (cols.size() < 2) continue;
    Row r{cols[0], cols[1]};
    if (cols.size() > 2) {
      EXPECT_EQ(cols[2].rfind("bound ", 0), 0u) << "engines-matrix.txt: '" << cols[2] << "'";
      r.bound_percent = std::stod(cols[2].substr(6));
    }
    rows.push_back(r);
  }
  return rows;
}

/// The iteration time (ns) one engine reports for a row (a dry run, two iterations: the
/// emulation's second one is a steady one, with the last update's parameter gathers).
double iteration_ns(const Row& r, const std::string& engine) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocemu-engines-" + std::to_string(::getpid()) + "-" + engine);
  fs::create_directories(dir);
  const fs::path json = dir / "train.json";
  const std::string model = std::string(COCEMU_SOURCE_DIR) + "/tests/train/data/engines-small.yaml";
  const std::string cmd = std::string(COCEMU_BINARY) + " train --dry-run --iterations 2 --engine " +
                          engine + " --model " + model + " --profile ascend-910b --nodes 1 " +
                          r.flags + " --out-dir " + dir.string() + " --json " + json.string() +
                          " > " + (dir / "out.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "out.txt");
  const std::string out((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << r.name << " --engine " << engine << ": " << cmd << "\n" << out;
  if (rc != 0) return NAN;
  std::ifstream j(json);
  const auto rep = nlohmann::json::parse(j);
  fs::remove_all(dir);
  return double(rep.at("iteration_ns").get<std::int64_t>());
}

TEST(Engines, ModelAndPricedGiveTheEmulatedIteration) {
  const auto rows = matrix();
  ASSERT_GE(rows.size(), 15u);
  for (const Row& r : rows) {
    const double emulated = iteration_ns(r, "emulate");
    ASSERT_TRUE(emulated > 0) << r.name;
    for (const char* engine : {"model", "priced"}) {
      const double t = iteration_ns(r, engine);
      const double off = 100 * (t / emulated - 1);
      EXPECT_LE(std::abs(off), r.bound_percent)
          << r.name << ": --engine " << engine << " " << t / 1e6 << " ms, emulated "
          << emulated / 1e6 << " ms (" << off << "%, bound " << r.bound_percent << "%)";
    }
  }
}

/// Runs a shell command; its output goes to `log`. The command's exit code.
int run(const std::string& cmd, const fs::path& log) {
  return std::system((cmd + " > " + log.string() + " 2>&1").c_str());
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Engines, PlansWinnerEmulatesAsPlanPrintedIt) {
  const std::string small = std::string(COCEMU_SOURCE_DIR) + "/tests/train/data/engines-small.yaml";
  for (const auto& [model, batch] : std::vector<std::pair<std::string, int>>{
           {small, 16}, {"llama2-7b", 16}, {"llama2-7b", 64}}) {
    const fs::path dir =
        fs::temp_directory_path() / ("cocemu-engines-plan-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string bin = COCEMU_BINARY;
    ASSERT_EQ(run(bin + " plan --model " + model + " --nodes 1 --global-batch " +
                      std::to_string(batch) + " --threads 1 --no-heuristic-compare --out-dir " +
                      dir.string() + " --json " + (dir / "plan.json").string(),
                  dir / "plan.txt"),
              0)
        << read(dir / "plan.txt");
    std::ifstream pj(dir / "plan.json");
    const auto plan = nlohmann::json::parse(pj);
    const double planned = double(plan.at("best").at("iteration_ns").get<std::int64_t>());
    ASSERT_EQ(run(bin + " train --config " + (dir / "plan.winner.yaml").string() +
                      " --dry-run --engine emulate --out-dir " + dir.string() + " --json " +
                      (dir / "train.json").string(),
                  dir / "train.txt"),
              0)
        << read(dir / "train.txt");
    std::ifstream tj(dir / "train.json");
    const double emulated =
        double(nlohmann::json::parse(tj).at("iteration_ns").get<std::int64_t>());
    EXPECT_LE(std::abs(planned / emulated - 1), 0.02)
        << model << " global batch " << batch << ": plan's winner "
        << plan.at("best").at("describe").get<std::string>() << " planned " << planned / 1e6
        << " ms, emulated " << emulated / 1e6 << " ms";
    fs::remove_all(dir);
  }
}

}  // namespace
