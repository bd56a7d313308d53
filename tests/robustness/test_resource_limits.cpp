// Resource failures are errors, at once (issue #34): a world run under an address-space limit
// (prlimit --as) or a thread limit (prlimit --nproc) ends with exit status 2 and the real cause —
// the thread that could not start, the allocation that failed, OpenBLAS's work buffer that could
// not be mapped — naming the rank, the stream and the op; never an abort, never a hang, never a
// timeout that blames a bystander. One case per path here (each once, to stay well under a
// minute); `tests/robustness/campaign.py BUILD --resources` runs every case at 8, 64 and 256 ranks
// 20 times.
//
// The limits apply to the child only. RLIMIT_NPROC counts the threads of the child's user, and
// does not bind root: as root the child runs as `nobody` (setpriv), whose limit is set relative
// to the threads nobody already runs, so no other session is starved.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "child_process.h"

namespace cocemu {
namespace {

using testing::ChildOutcome;
using testing::run_child;

constexpr std::int64_t kGiB = std::int64_t(1) << 30;

/// Threads that processes of user `uid` run now (RLIMIT_NPROC counts them).
std::int64_t threads_of_user(uid_t uid) {
  std::int64_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(entry.path() / "status");
    std::string line;
    long file_uid = -1, threads = 0;
    while (std::getline(f, line)) {
      if (line.rfind("Uid:", 0) == 0) file_uid = std::atol(line.c_str() + 4);
      if (line.rfind("Threads:", 0) == 0) threads = std::atol(line.c_str() + 8);
    }
    if (file_uid == long(uid)) n += threads;
  }
  return n;
}

/// `limits_child args` under an address-space limit of `as_bytes`.
ChildOutcome under_as(std::int64_t as_bytes, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"prlimit", "--as=" + std::to_string(as_bytes),
                                   COCEMU_LIMITS_CHILD};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_child(argv, 60, {"OPENBLAS_NUM_THREADS=1", "COCEMU_TIMEOUT_MS=30000"});
}

/// `limits_child args` allowed `extra` more threads than its user runs now.
ChildOutcome under_nproc(std::int64_t extra, const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  uid_t uid = getuid();
  if (uid == 0) {  // root ignores RLIMIT_NPROC: run as nobody
    uid = 65534;
    argv = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  }
  argv.push_back("prlimit");
  argv.push_back("--nproc=" + std::to_string(threads_of_user(uid) + extra));
  argv.push_back(COCEMU_LIMITS_CHILD);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_child(argv, 60, {"OPENBLAS_NUM_THREADS=1", "COCEMU_TIMEOUT_MS=30000"});
}

/// Exit 2, promptly, with one error line carrying every fragment.
void expect_clear(const ChildOutcome& o, const std::vector<std::string>& fragments,
                  const std::string& what) {
  EXPECT_EQ(o.exit, 2) << what
                       << (o.exit == 124  ? " (hang)"
                           : o.exit > 128 ? " (crash)"
                                          : "")
                       << "\n"
                       << o.err;
  EXPECT_LT(o.seconds, 20.0) << what;
  EXPECT_EQ(o.err.rfind("limits_child: error: ", 0), 0u) << what << "\n" << o.err;
  for (const std::string& f : fragments)
    EXPECT_NE(o.err.find(f), std::string::npos) << what << ": no '" << f << "' in\n" << o.err;
  // The cause, not a timeout naming whoever waited for the rank that failed.
  EXPECT_EQ(o.err.find("timed out"), std::string::npos) << what << "\n" << o.err;
}

TEST(ResourceLimits, AThreadThatCannotStartUnderRlimitAsIsTheError) {
  // 256 ranks start 5 threads each (host, compute, comm, two extra streams): 10 GiB of stacks.
  expect_clear(under_as(2 * kGiB, {"streams", "256"}),
               {"failed", "cannot start", "thread", "RLIMIT_AS"}, "streams 256 under 2 GiB");
}

TEST(ResourceLimits, AThreadThatCannotStartUnderRlimitNprocIsTheError) {
  // 64 ranks need 320 threads; the child may start 100.
  expect_clear(under_nproc(100, {"streams", "64"}),
               {"failed", "cannot start", "thread", "RLIMIT_NPROC"}, "streams 64 under nproc");
}

TEST(ResourceLimits, AnAllocationThatFailsInAStreamOpIsTheError) {
  expect_clear(under_as(3 * kGiB, {"alloc", "8", "1024"}),
               {"failed: stream 'compute' op 'touch'", "out of memory", "RLIMIT_AS"},
               "alloc 8 x 1 GiB under 3 GiB");
}

TEST(ResourceLimits, AnAllocationThatFailsOnAHostThreadIsTheError) {
  expect_clear(under_as(4 * kGiB, {"host", "64", "256"}),
               {"failed: host thread: out of memory", "RLIMIT_AS"},
               "host 64 x 256 MiB under 4 GiB");
}

TEST(ResourceLimits, OpenBlasWithoutRoomForItsWorkBufferIsAnErrorNotAHang) {
  // 64 ranks: 192 threads' stacks (1.5 GiB) and the program fit, OpenBLAS's 128 MiB buffers for
  // GEMMs running at once do not: OpenBLAS itself would retry its mapping forever.
  // Which allocation meets the limit first depends on the threads' schedule: OpenBLAS's buffer,
  // a thread's stack, a rank's tensor or another allocation; each is named as what failed.
  const ChildOutcome o = under_as(kGiB * 3 / 2, {"gemm", "64"});
  expect_clear(o, {"failed", "RLIMIT_AS"}, "gemm 64 under 1.5 GiB");
  EXPECT_TRUE(o.err.find("OpenBLAS") != std::string::npos ||
              o.err.find("cannot start") != std::string::npos ||
              o.err.find("out of memory") != std::string::npos ||
              o.err.find("allocation failed") != std::string::npos)
      << o.err;
}

TEST(ResourceLimits, ATensorFreedWhenNothingCanBeAllocatedIsFreed) {
  // The allocator's cache keeps freed blocks in a map whose node is allocated in the tensor's
  // deleter; with the address space full that allocation fails, and a deleter must not throw
  // (the campaign saw `gemm 256` under 1 GiB abort with "terminate called").
  const ChildOutcome o = under_as(kGiB, {"full", "1"});
  EXPECT_EQ(o.exit, 0) << o.err;
  EXPECT_NE(o.err.find("freed a tensor"), std::string::npos) << o.err;
}

TEST(ResourceLimits, WithoutLimitsTheSameRunsFinish) {
  for (const char* mode : {"streams", "gemm"}) {
    const ChildOutcome o =
        run_child({COCEMU_LIMITS_CHILD, mode, "8"}, 60, {"OPENBLAS_NUM_THREADS=1"});
    EXPECT_EQ(o.exit, 0) << mode << "\n" << o.err;
  }
}

}  // namespace
}  // namespace cocemu
