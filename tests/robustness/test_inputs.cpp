// Every input is bounded (issue #34): each path option refuses what is not a regular file of a
// sane size — a missing file, a directory, a named pipe (which would block), /dev/zero (which
// never ends), a file past the limit — before reading it; YAML that would explode (an alias bomb)
// or nest too deep is refused in milliseconds naming the line; yaml-cpp's own messages are said
// plainly, with the file and what was being read; a profile's name is never empty.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "child_process.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/runtime/npy.h"
#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;

std::string scratch() {
  static const std::string dir = testing::scratch_dir("cocemu_inputs");
  return dir;
}

std::string write(const std::string& name, const std::string& text) {
  return testing::write_file(scratch(), name, text);
}

/// An alias bomb: level 0 holds nine scalars, each next level nine aliases of the one before.
std::string alias_bomb(int levels) {
  std::string s = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= levels; ++i) {
    s += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 9; ++k)
      s += (k ? ", *a" : "*a") + std::to_string(i - 1);
    s += "]\n";
  }
  return s;
}

/// The kinds of bad path an option may be given, each with a fragment its error must carry.
struct BadPath {
  std::string name, path, fragment;
};

std::vector<BadPath> bad_paths() {
  const std::string fifo = scratch() + "/pipe.yaml";
  std::filesystem::remove(fifo);
  EXPECT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string huge = scratch() + "/huge.yaml";
  {
    std::ofstream f(huge);
    f << "# padding\n";
    f.seekp((std::streamoff(5) << 20));  // a sparse 5 MiB file
    f << "\n";
  }
  return {{"missing", scratch() + "/no-such.yaml", "no-such.yaml"},
          {"directory", scratch(), "is a directory"},
          {"fifo", fifo, "named pipe"},
          {"/dev/zero", "/dev/zero", "character device"},
          {"huge", huge, "at most"},
          {"alias bomb", write("bomb.yaml", alias_bomb(8)), "aliases expand"},
          {"deep nesting",
           write("deep.yaml", "a: " + std::string(5000, '[') + std::string(5000, ']') + "\n"),
           "nested more than"}};
}

// Every path option of every subcommand, given each kind of bad path: exit 2 within 5 s, one
// error line naming the path and what is wrong. (.npy options take .npy files: the YAML cases
// are refused there by the .npy parser, still naming the file.)
TEST(Inputs, EveryPathOptionRefusesBadFilesAtOnce) {
  const std::string out = scratch() + "/out";
  std::filesystem::create_directories(out);
  const std::vector<std::pair<std::string, std::string>> options = {
      {"bench --dry-run --out-dir " + out, "--model"},
      {"bench --dry-run --out-dir " + out, "--profile"},
      {"bench --dry-run --out-dir " + out, "--coc-config"},
      {"tune -o " + out + "/t.yaml", "--model"},
      {"tune -o " + out + "/t.yaml", "--profile"},
      {"tune -o " + out + "/t.yaml", "--coc-config"},
      {"train --dry-run --out-dir " + out, "--config"},
      {"train --dry-run --out-dir " + out, "--model"},
      {"train --dry-run --out-dir " + out, "--profile"},
      {"train --dry-run --out-dir " + out, "--coc-config"},
      {"plan --model llama2-7b --global-batch 64 --out-dir " + out, "--profile"},
      {"plan --global-batch 64 --out-dir " + out, "--model"},
      {"validate", "--references"},
      {"attention --dry-run --seq 64 --heads 2 --head-dim 16 --cp 2", "--profile"},
      {"collbench --dry-run -n 2 -e 4096", "--profile"},
      {"attention --seq 64 --heads 2 --head-dim 16 --cp 2", "--q"},
      {"attention --seq 64 --heads 2 --head-dim 16 --cp 2", "--k"},
      {"attention --seq 64 --heads 2 --head-dim 16 --cp 2", "--v"},
      {"attention --seq 64 --heads 2 --head-dim 16 --cp 2", "--dout"},
      {"attention --seq 64 --heads 2 --head-dim 16 --cp 2 --mask general", "--mask-file"}};
  int cases = 0;
  for (const BadPath& bad : bad_paths())
    for (const auto& [command, option] : options) {
      // A name without '/' is looked up under configs/: give the missing file as a path.
      std::vector<std::string> argv = {COCEMU_BINARY};
      for (const std::string& a : testing::split_args(command))
        argv.push_back(a);
      argv.push_back(option);
      argv.push_back(bad.path);
      const testing::ChildOutcome o = testing::run_child(argv, 20, {"OPENBLAS_NUM_THREADS=1"});
      const bool npy = option == "--q" || option == "--k" || option == "--v" ||
                       option == "--dout" || option == "--mask-file";
      const std::string what = bad.name + " as " + command + " " + option + ": ";
      ++cases;
      EXPECT_EQ(o.exit, 2) << what << o.err;
      EXPECT_LT(o.seconds, 5.0) << what << o.err;
      EXPECT_EQ(o.err.rfind("cocemu: error: ", 0), 0u) << what << o.err;
      EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << what << o.err;
      EXPECT_EQ(o.err.find("failed at"), std::string::npos) << what << "developer tail: " << o.err;
      // The path, or for the file's own content the file's name, and what is wrong with it.
      const std::string file = std::filesystem::path(bad.path).filename().string();
      EXPECT_NE(o.err.find(file), std::string::npos) << what << o.err;
      // Given as .npy, YAML content and a 5 MiB file are refused by the .npy parser instead.
      const bool content =
          bad.name == "alias bomb" || bad.name == "deep nesting" || bad.name == "huge";
      if (!(npy && content)) {
        EXPECT_NE(o.err.find(bad.fragment), std::string::npos) << what << o.err;
      }
    }
  EXPECT_EQ(cases, 7 * 20);
}

// Outputs too: a named pipe given as an output file would block the write until something reads
// it. /dev/null stays a valid output.
TEST(Inputs, AnOutputThatIsANamedPipeIsRefused) {
  const std::string fifo = scratch() + "/out-pipe";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& args :
       {"attention --dry-run --seq 64 --heads 2 --head-dim 16 --cp 2 --trace " + fifo,
        "mlpbench --m 64 --hidden 64 --ffn 64 --repeats 1 --ranks 2 --json " + fifo,
        "validate --json " + fifo}) {
    std::vector<std::string> argv = {COCEMU_BINARY};
    for (const std::string& a : testing::split_args(args))
      argv.push_back(a);
    const testing::ChildOutcome o = testing::run_child(argv, 20, {"OPENBLAS_NUM_THREADS=1"});
    EXPECT_EQ(o.exit, 2) << args << "\n" << o.err;
    EXPECT_LT(o.seconds, 5.0) << args;
    EXPECT_NE(o.err.find("is a named pipe"), std::string::npos) << args << "\n" << o.err;
  }
  const testing::ChildOutcome o =
      testing::run_child({COCEMU_BINARY, "attention", "--dry-run", "--seq", "64", "--heads", "2",
                          "--head-dim", "16", "--cp", "2", "--json", "/dev/null"},
                         20);
  EXPECT_EQ(o.exit, 0) << o.err;
}

TEST(Inputs, AnAliasBombIsRefusedInMillisecondsNamingTheLine) {
  // 9^8 = 43 million nodes in 300 bytes: every parser refuses it before building the tree.
  const std::string bomb = alias_bomb(8);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(
      [&] { (void)detail::YamlReader::parse(bomb, "bomb.yaml", "device profile"); },
      Errc::parse_error,
      {"bomb.yaml:", "in the device profile", "aliases expand to more than 100000 nodes", "*a"});
  expect_error([&] { (void)parse_device_profile(bomb, "bomb.yaml"); }, Errc::parse_error,
               {"bomb.yaml:"});
  expect_error([&] { (void)layers::parse_model_config(bomb, "bomb.yaml"); }, Errc::parse_error,
               {"bomb.yaml:", "model config"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  // The line is the alias that crosses the limit: levels 1-4 add 74,718 nodes, level 5's first
  // alias (line 6) names 66,430 more.
  try {
    (void)detail::YamlReader::parse(bomb, "bomb.yaml");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("bomb.yaml:6:"), std::string::npos) << e.message();
  }
  // A derived profile whose base is the bomb: refused at the base's own line.
  const std::string base = write("bomb-base.yaml", "name: b\n" + bomb);
  expect_error(
      [&] { (void)load_device_profile(write("derived.yaml", "name: d\nbase: " + base + "\n")); },
      Errc::parse_error, {"bomb-base.yaml:7", "aliases expand"});
  // Ordinary aliases (the shipped validation file uses them for sources) still load.
  const std::string fine = "s: &s hello\nt: *s\nu: [*s, *s]\n";
  EXPECT_NO_THROW((void)detail::YamlReader::parse(fine, "fine.yaml"));
  // The fuzz corpus keeps the bomb (tests/fuzz/corpus/profile/alias-bomb.yaml).
  std::ifstream f(std::string(COCEMU_SOURCE_DIR) + "/tests/fuzz/corpus/profile/alias-bomb.yaml");
  const std::string corpus((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(corpus.empty());
  EXPECT_THROW((void)parse_device_profile(corpus, "alias-bomb.yaml"), Error);
}

TEST(Inputs, YamlCppErrorsAreSaidPlainlyWithFileLineAndWhat) {
  // Very deep nesting: refused on the way down, before yaml-cpp's "bad file".
  expect_error(
      [] {
        (void)detail::YamlReader::parse(
            "a: " + std::string(5000, '[') + std::string(5000, ']') + "\n", "deep.yaml",
            "training config");
      },
      Errc::parse_error, {"deep.yaml:1", "in the training config", "nested more than 32 levels"});
  std::string block;
  for (int i = 0; i < 40; ++i)
    block += std::string(std::size_t(i), ' ') + "k" + std::to_string(i) + ":\n";
  block += std::string(40, ' ') + "v\n";
  expect_error([&] { (void)detail::YamlReader::parse(block, "block.yaml"); }, Errc::parse_error,
               {"block.yaml:33", "nested more than 32 levels"});
  // A key longer than YAML's 1024 characters: yaml-cpp says "illegal map value".
  expect_error(
      [] {
        (void)detail::YamlReader::parse(std::string(2000, 'k') + ": 1\n", "long.yaml",
                                        "CoC config");
      },
      Errc::parse_error, {"long.yaml:1", "in the CoC config", "a key of 2000 characters", "1024"});
  expect_error([] { (void)detail::YamlReader::parse("a: b: c\n", "colon.yaml"); },
               Errc::parse_error, {"colon.yaml:1", "'a: b: c'", "quote"});
  // Not a mapping: says what it is.
  expect_error([] { (void)detail::YamlReader::parse("- 1\n- 2\n", "list.yaml", "model config"); },
               Errc::parse_error, {"list.yaml", "model config", "not a list"});
  for (const char* text : {"", "# only a comment\n"})
    expect_error([&] { (void)detail::YamlReader::parse(text, "empty.yaml"); }, Errc::parse_error,
                 {"empty.yaml", "not empty"});
}

TEST(Inputs, AProfileNeedsANonEmptyName) {
  const std::string base = testing::round_profile_yaml();
  for (const char* name : {"\"\"", "\"   \"", "''"}) {
    std::string text = base;
    const auto at = text.find("name:");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, text.find('\n', at) - at, std::string("name: ") + name);
    expect_error([&] { (void)parse_device_profile(text, "anon.yaml"); }, Errc::parse_error,
                 {"anon.yaml:", "'name' is empty"});
  }
  // A derived profile with an empty name: named at the deriving file's line.
  write("named-base.yaml", base);
  expect_error(
      [&] {
        (void)load_device_profile(
            write("empty-derived.yaml", "base: named-base.yaml\nname: \"\"\n"));
      },
      Errc::parse_error, {"empty-derived.yaml", ":2", "'name' is empty"});
}

TEST(Inputs, TheBoundedReaderChecksBeforeReading) {
  EXPECT_EQ(read_input_file(write("small.txt", "abc"), "x"), "abc");
  // Files of /proc report size 0 and still have text: read, up to the limit.
  EXPECT_NE(read_input_file("/proc/self/status", "status").find("Name:"), std::string::npos);
  expect_error([] { (void)read_input_file("/proc/self/status", "status", 16); },
               Errc::invalid_argument, {"more than 16 bytes"});
  expect_error(
      [] { (void)read_input_file(write("big.txt", std::string(100, 'x')), "--thing", 99); },
      Errc::invalid_argument, {"--thing", "big.txt", "has 100 bytes"});
  expect_error([] { (void)read_input_file("", "--thing"); }, Errc::invalid_argument,
               {"--thing", "empty"});
  // A named pipe with no writer would block open() and read() forever: refused at once.
  const std::string fifo = scratch() + "/reader-pipe";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { (void)read_input_file(fifo, "--references"); }, Errc::invalid_argument,
               {"--references", "named pipe", "not a regular file"});
  expect_error([&] { (void)read_npy(fifo); }, Errc::invalid_argument, {"named pipe"});
  expect_error([&] { (void)layers::load_coc_config(fifo); }, Errc::invalid_argument,
               {"CoC config", "named pipe"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

}  // namespace
}  // namespace cocemu
