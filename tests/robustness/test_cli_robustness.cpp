// Robustness of the command line (issue "Robustness"): every numeric option of every subcommand
// with 0, -1, 2^40, 2^64, text, nan and inf; every environment variable the README names with
// empty, negative, huge, spaced and non-numeric values; unwritable output paths. Each case must
// end in exit status 0 (a valid request, done) or 2 with one error line naming the option,
// variable or file — never a crash, a hang or a silent acceptance of a bad value.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "testing.h"

namespace cocemu {
namespace {

struct Outcome {
  int exit = -1;  ///< exit status, or 128 + signal
  std::string out;
};

Outcome run_cli(const std::string& args, const std::string& env = "") {
  int status = 0;
  // `timeout` turns a hang into exit 124; stdout is dropped (only errors matter here).
  const std::string out = testing::run_command(
      "( " + env + " timeout 60 " + std::string(COCEMU_BINARY) + " " + args + " 2>&1 >/dev/null )",
      &status);
  Outcome o;
  o.out = out;
  o.exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

struct Tally {
  int clear_errors = 0, accepted = 0, bad = 0;
};

/// Exit 2 with one "cocemu: error:" line mentioning `name`, or exit 0 when `valid`.
void expect_clear(const std::string& args, const std::string& name, bool valid, Tally& t,
                  const std::string& env = "") {
  const Outcome o = run_cli(args, env);
  const bool one_line = o.out.find('\n') == o.out.size() - 1;
  if (o.exit == 2 && o.out.rfind("cocemu: error: ", 0) == 0 && one_line &&
      o.out.find(name) != std::string::npos) {
    ++t.clear_errors;
    EXPECT_FALSE(valid) << env << " cocemu " << args << " was refused: " << o.out;
    return;
  }
  if (o.exit == 0 && valid) {
    ++t.accepted;
    return;
  }
  ++t.bad;
  ADD_FAILURE() << env << " cocemu " << args << " -> exit " << o.exit
                << (o.exit == 124  ? " (hang)"
                    : o.exit > 128 ? " (crash)"
                                   : "")
                << ", expected " << (valid ? "0" : "2 naming '" + name + "'") << "; output:\n"
                << o.out;
}

/// `command` with its base options, the one under test left out (so it is given once).
std::string with_base(const std::string& command,
                      const std::vector<std::pair<std::string, std::string>>& base,
                      const std::string& option) {
  std::string out = command;
  for (const auto& [o, v] : base)
    if (o != option) out += " " + o + (v.empty() ? "" : " " + v);
  return out;
}

TEST(CliRobustness, EveryNumericOptionRejectsBadValues) {
  const std::string tmp = ::testing::TempDir() + "/cocemu_cli";
  std::filesystem::create_directories(tmp);
  // Cheap base options per subcommand (dry runs where there are any).
  const std::vector<std::pair<std::string, std::string>> attn = {
      {"--dry-run", ""}, {"--seq", "64"}, {"--heads", "2"}, {"--head-dim", "16"}, {"--cp", "2"}};
  const std::vector<std::pair<std::string, std::string>> coll = {
      {"--dry-run", ""}, {"-n", "2"}, {"-b", "4096"}, {"-e", "4096"}, {"--ops", "all_reduce"}};
  const std::vector<std::pair<std::string, std::string>> bench = {
      {"--dry-run", ""}, {"--no-progress", ""}, {"--out-dir", tmp}};
  const std::vector<std::pair<std::string, std::string>> train = {{"--dry-run", ""},
                                                                  {"--out-dir", tmp}};
  const std::vector<std::pair<std::string, std::string>> plan = {{"--model", "llama2-7b"},
                                                                 {"--global-batch", "8"},
                                                                 {"--no-heuristic-compare", ""},
                                                                 {"--out-dir", tmp}};
  struct Opt {
    std::string command;
    const std::vector<std::pair<std::string, std::string>>* base;
    std::string option, name;        ///< the option, and how its error message names it
    std::vector<std::string> valid;  ///< the probes it accepts
  };
  const std::vector<std::pair<std::string, std::string>> none;
  const std::vector<Opt> opts = {
      {"attention", &attn, "--cp", "cp", {}},
      {"attention", &attn, "--window", "window", {}},
      {"attention", &attn, "--ulysses-degree", "ulysses-degree", {"0"}},
      {"attention", &attn, "--tp", "tp", {}},
      {"attention", &attn, "--batch", "batch", {}},
      {"attention", &attn, "--heads", "heads", {}},
      {"attention", &attn, "--kv-heads", "kv-heads", {"0"}},  // 0 = as many as heads
      {"attention", &attn, "--seq", "seq", {}},
      {"attention", &attn, "--head-dim", "head-dim", {}},
      {"attention", &attn, "--seed", "seed", {"0", "1099511627776"}},
      {"collbench", &coll, "-n", "ranks", {}},
      {"collbench", &coll, "-b", "min-bytes", {}},
      {"collbench", &coll, "-e", "max-bytes", {"1099511627776"}},  // a dry run up to 1 TiB
      {"collbench", &coll, "-f", "factor", {}},
      {"collbench", &coll, "--samples", "samples", {"0"}},
      {"collbench", &coll, "-w", "warmup", {}},
      {"collbench", &coll, "--check", "check", {"0"}},
      {"plan", &plan, "--nodes", "nodes", {}},
      {"plan", &plan, "--global-batch", "global-batch", {}},
      {"plan", &plan, "--seq", "seq", {"0"}},          // 0: the model config's
      {"plan", &plan, "--threads", "threads", {"0"}},  // 0: all cores
      {"plan", &plan, "--top", "top", {}},
      {"plan", &plan, "--max-cp", "max-cp", {}},
      {"plan", &plan, "--max-vpp", "max-vpp", {}},
      {"mlpbench", &none, "-n", "ranks", {}},
      {"mlpbench", &none, "--m", "m", {}},
      {"mlpbench", &none, "--hidden", "hidden", {}},
      {"mlpbench", &none, "--ffn", "ffn", {}},
      {"mlpbench", &none, "--repeats", "repeats", {}},
      {"mlpbench", &none, "--tile-rows", "tile-rows", {}},
      {"mlpbench", &none, "--tiles-per-step", "tiles-per-step", {}},
      {"bench", &bench, "--repeats", "repeats", {}},
      {"train", &train, "--nodes", "nodes", {}},
      {"train", &train, "--tensor-model-parallel-size", "tensor-model-parallel-size", {}},
      {"train", &train, "--context-parallel-size", "context-parallel-size", {}},
      {"train", &train, "--pipeline-model-parallel-size", "pipeline-model-parallel-size", {}},
      {"train", &train, "--data-parallel-size", "data-parallel-size", {}},
      {"train",
       &train,
       "--num-layers-per-virtual-pipeline-stage",
       "num-layers-per-virtual-pipeline-stage",
       {}},
      {"train", &train, "--micro-batch-size", "micro-batch-size", {}},
      {"train", &train, "--global-batch-size", "global-batch-size", {}},
      {"train", &train, "--gradient-aggregation-group", "gradient-aggregation-group", {}},
      {"train", &train, "--bucket-mb", "bucket-mb", {}},
      {"train", &train, "--iterations", "iterations", {}},
      {"train", &train, "--cp-window-size", "cp-window-size", {}},
      {"train", &train, "--ulysses-degree-in-cp", "ulysses-degree-in-cp", {}},
      {"train", &train, "--micro-batch-interleave-num", "micro-batch-interleave-num", {}},
  };
  const std::vector<std::string> probes = {
      "0", "-1", "1099511627776", "18446744073709551616", "abc", "nan", "inf"};
  Tally t;
  int cases = 0;
  for (const Opt& o : opts)
    for (const std::string& v : probes) {
      ++cases;
      const bool valid = std::find(o.valid.begin(), o.valid.end(), v) != o.valid.end();
      expect_clear(with_base(o.command, *o.base, o.option) + " " + o.option + " " + v, o.name,
                   valid, t);
    }
  std::printf("[ numeric options ] %d cases: %d clear errors, %d valid and accepted, %d bad\n",
              cases, t.clear_errors, t.accepted, t.bad);
  EXPECT_EQ(t.bad, 0);
  // Options that take names and paths get the same probes: none of them is a valid name.
  const std::vector<Opt> names = {
      {"attention", &attn, "--algo", "algo", {}},
      {"attention", &attn, "--mask", "mask", {}},
      {"attention", &attn, "--layout", "layout", {}},
      {"attention", &attn, "--dtype", "dtype", {}},
      {"attention", &attn, "--profile", "profile", {}},
      {"attention", &attn, "--q", "--q", {}},
      {"attention --mask general", &attn, "--mask-file", "--mask-file", {}},
      {"collbench", &coll, "--ops", "op", {}},
      {"collbench", &coll, "-d", "dtype", {}},
      {"collbench", &coll, "-a", "algorithm", {}},
      {"collbench", &coll, "-p", "profile", {}},
      {"bench", &bench, "--model", "model", {}},
      {"bench", &bench, "--profile", "profile", {}},
      {"bench", &bench, "--coc-config", "CoC config", {}},
      {"tune", &none, "--model", "model", {}},
      {"tune", &none, "--profile", "profile", {}},
      {"validate", &none, "--references", "--references", {}},
      {"train", &train, "--model", "model", {}},
      {"train", &train, "--profile", "profile", {}},
      {"train", &train, "--schedule", "schedule", {}},
      {"train", &train, "--recompute-granularity", "recompute", {}},
      {"train", &train, "--dtype", "dtype", {}},
      {"train", &train, "--coc", "CoC strategy", {}},
      {"train", &train, "--coc-config", "CoC config", {}},
      {"train", &train, "--config", "--config", {}},
      {"train", &train, "--context-parallel-algo", "context_parallel_algo", {}},
      {"train", &train, "--engine", "engine", {}},
      {"plan", &plan, "--model", "model", {}},
      {"plan", &plan, "--profile", "profile", {}},
      {"plan", &plan, "--search-mode", "search mode", {}},
      {"plan", &plan, "--dtype", "dtype", {}},
  };
  Tally n;
  int name_cases = 0;
  for (const Opt& o : names)
    for (const std::string& v : probes) {
      ++name_cases;
      expect_clear(with_base(o.command, *o.base, o.option) + " " + o.option + " " + v, o.name,
                   false, n);
    }
  std::printf("[ name and path options ] %d cases: %d clear errors, %d bad\n", name_cases,
              n.clear_errors, n.bad);
  EXPECT_EQ(n.bad, 0);
}

TEST(CliRobustness, EnvironmentVariablesAreParsedStrictly) {
  const std::string run = "collbench -n 2 -b 4096 -e 4096 --ops all_reduce --samples 1";
  const std::string coc = ::testing::TempDir() + "/cocemu_env_coc.yaml";
  std::ofstream(coc) << "customized_coc: {}\n";
  const std::string bench = "bench --dry-run --model llama2-7b --no-progress --coc-config " + coc +
                            " --out-dir " + ::testing::TempDir() + "/cocemu_env";
  const std::string mlp = "mlpbench -n 2 --m 8 --hidden 8 --ffn 8 --repeats 1";
  struct Var {
    std::string name, command;
    std::vector<std::string> valid;
  };
  const std::vector<Var> vars = {
      {"COCEMU_TIMEOUT_MS", run, {}},      {"COCEMU_SCHEDULE_SEED", run, {"4294967298"}},
      {"COCEMU_WAIT_YIELDS", run, {}},     {"COC_PARALLEL_NUM", bench, {}},
      {"USE_COC_FUSED_KERNEL", bench, {}}, {"CC_MODE", bench, {"-1"}},
      {"COCEMU_POISON_EMPTY", mlp, {}}};
  const std::vector<std::string> probes = {"''",  "-1",   "4294967298", "18446744073709551616",
                                           "abc", "' 5'", "1e3"};
  Tally t;
  int cases = 0;
  for (const Var& v : vars)
    for (const std::string& p : probes) {
      ++cases;
      const std::string bare = p.size() > 1 && p.front() == '\'' ? p.substr(1, p.size() - 2) : p;
      const bool valid = std::find(v.valid.begin(), v.valid.end(), bare) != v.valid.end();
      expect_clear(v.command, v.name, valid, t, v.name + "=" + p);
    }
  std::printf("[ environment ] %d cases: %d clear errors, %d valid and accepted, %d bad\n", cases,
              t.clear_errors, t.accepted, t.bad);
  EXPECT_EQ(t.bad, 0);
}

TEST(CliRobustness, UnwritableOutputsFailBeforeTheRun) {
  const std::string tmp = ::testing::TempDir() + "/cocemu_unwritable";
  std::filesystem::create_directories(tmp);
  const std::string file = tmp + "/a_file";
  std::ofstream(file) << "x";
  Tally t;
  int cases = 0;
  const std::string attn = "attention --dry-run --seq 64 --heads 2 --head-dim 16 --cp 2";
  for (const std::string& bad :
       {tmp + "/missing/x.json", tmp, file + "/x.json", std::string("/dev/full")}) {
    for (const std::string& cmd :
         {attn + " --json ", std::string("collbench --dry-run -n 2 -b 4096 -e 4096 --json "),
          std::string("validate --json "), std::string("tune --model llama2-7b -o "),
          std::string("bench --dry-run --no-progress --out-dir " + tmp + "/b --json ")}) {
      ++cases;
      expect_clear(cmd + bad, bad.substr(0, bad.find("/x.json")), false, t);
    }
  }
  for (const std::string& dir : {file, file + "/sub", std::string("/dev/null")}) {
    ++cases;
    expect_clear("bench --dry-run --no-progress --out-dir " + dir, dir, false, t);
  }
  std::printf("[ outputs ] %d cases: %d clear errors, %d bad\n", cases, t.clear_errors, t.bad);
  EXPECT_EQ(t.bad, 0);
}

TEST(CliRobustness, UnknownSubcommandsAndEnormousRequests) {
  Tally t;
  expect_clear("frobnicate", "unknown subcommand 'frobnicate'", false, t);
  expect_clear("attention --seq 16777216 --heads 8 --head-dim 64", "needs about", false, t);
  expect_clear("attention --batch 1048576 --seq 16777216 --heads 65536 --head-dim 4096 --dry-run",
               "exceeds", false, t);
  expect_clear("collbench -n 8 -e 1099511627776", "needs about", false, t);
  expect_clear("attention --bench --seq 16777216 --heads 65536 --head-dim 64", "needs about", false,
               t);
  EXPECT_EQ(t.bad, 0);
}

}  // namespace
}  // namespace cocemu

#include "cocemu/runtime/npy.h"

namespace cocemu {
namespace {

/// Writes an .npy of `shape` in `dtype` filled with `value` and returns its path.
std::string npy_file(const std::string& name, const Shape& shape, DType dtype, double value) {
  const std::string path = ::testing::TempDir() + "/" + name;
  Tensor t = Tensor::zeros(shape, dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      t.data<T>()[i] = store_as<T>(acc_t<T>(value));
    });
  write_npy(path, t);
  return path;
}

// Inputs the attention command used to reinterpret or pass on silently.
TEST(CliRobustness, AttentionInputsAreCheckedNotReinterpreted) {
  const std::string base = "attention --seq 64 --heads 2 --head-dim 16 --cp 2";
  Tally t;
  // [64, 1, 4, 8] has the right element count for 2 heads x 16 but is not [S, B, H, D].
  const std::string q48 = npy_file("q_4x8.npy", {64, 1, 4, 8}, DType::f64, 0.5);
  expect_clear(base + " --q " + q48, "must be floating [S=64, B=1, H=2, D=16]", false, t);
  // A float mask with 0.5 was reinterpreted as a boolean one.
  const std::string mask = npy_file("mask_half.npy", {64, 64}, DType::f32, 0.5);
  expect_clear(base + " --mask general --mask-file " + mask, "must be bool or uint8", false, t);
  const std::string mask2 = npy_file("mask_two.npy", {64, 64}, DType::i8, 2);
  expect_clear(base + " --mask general --mask-file " + mask2, "allowed 0 (hidden) or 1", false, t);
  EXPECT_EQ(t.bad, 0);
  // All-NaN q: reported with the file and the count (the run itself goes on).
  const std::string nan = npy_file("q_nan.npy", {64, 1, 2, 16}, DType::f64, std::nan(""));
  int status = 0;
  const std::string out =
      testing::run_command(std::string(COCEMU_BINARY) + " " + base + " --q " + nan, &status);
  EXPECT_NE(out.find("warning: --q " + nan + " holds 2048 NaN or Inf values of 2048"),
            std::string::npos)
      << out;
}

// A dry run allowed by the model limits stays fast; beyond them it is refused.
TEST(CliRobustness, DryRunsAtTheModelLimits) {
  std::ifstream f(std::string(COCEMU_SOURCE_DIR) + "/configs/models/llama2-7b.yaml");
  std::string yaml((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto set = [&](std::string text, const std::string& key, const std::string& value) {
    const std::size_t at = text.find(key + ":");
    text.replace(at, text.find('\n', at) - at, key + ": " + value);
    return text;
  };
  const std::string big = ::testing::TempDir() + "/big_model.yaml",
                    huge = ::testing::TempDir() + "/huge_model.yaml";
  std::ofstream(big) << set(set(yaml, "seq_length", "16777216"), "micro_batch_size", "256");
  std::ofstream(huge) << set(set(yaml, "seq_length", "16777216"), "micro_batch_size", "65536");
  Tally t;
  expect_clear(
      "bench --dry-run --no-progress --out-dir " + ::testing::TempDir() + "/bigrun --model " + big,
      "", true, t);
  expect_clear("bench --dry-run --no-progress --model " + huge, "exceeds 4294967296", false, t);
  expect_clear("tune --model " + huge + " -o " + ::testing::TempDir() + "/t.yaml",
               "exceeds 4294967296", false, t);
  EXPECT_EQ(t.bad, 0);
}

}  // namespace
}  // namespace cocemu
