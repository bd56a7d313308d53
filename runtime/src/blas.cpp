#include "cocemu/runtime/blas.h"

#include <cblas.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <iterator>
#include <mutex>

#include "cocemu/runtime/limits.h"

namespace cocemu::blas {

namespace {
// A static initializer of the runtime runs after the shared libraries' (OpenBLAS's included) and
// before main.
const int openblas_threads_at_load = openblas_get_num_threads();
}  // namespace

namespace {
/// OpenBLAS (0.3.21, Debian 12's build) maps a 128 MiB work buffer for each call that runs while
/// all its buffers are taken, and keeps it; when the mapping fails (RLIMIT_AS) it retries forever
/// (blas_memory_alloc), which hung a 64-rank training step under a 6 GiB limit. So calls run at
/// most 2 per core at a time (more would not run faster), and a call that would
/// raise the number running past its highest so far, where OpenBLAS may map a new buffer, first
/// maps and unmaps that much address space itself: if that fails, the call is an error naming
/// the limit instead of a hang. (Another thread may take the room between the probe and
/// OpenBLAS's own mapping; the window is short, and the bound keeps the buffers few.)
class Slots {
 public:
  Slots() : max_running_(std::max(2, 2 * host_cores())) {}
  void acquire() {
    std::unique_lock lock(mu_);
    freed_.wait(lock, [&] { return running_ < max_running_; });
    if (running_ + 1 > high_water_) {
      probe(running_ + 1);
      high_water_ = running_ + 1;
    }
    ++running_;
  }
  void release() {
    {
      std::lock_guard lock(mu_);
      --running_;
    }
    freed_.notify_one();
  }

 private:
  static void probe(int running) {
    constexpr std::size_t kBuffer = std::size_t(128) << 20, kSlack = std::size_t(32) << 20;
    void* p = mmap(nullptr, kBuffer + kSlack, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    COCEMU_CHECK(p != MAP_FAILED, Errc::resource_exhausted,
                 "a GEMM needs OpenBLAS's 128 MiB work buffer (the {} running at once) and the "
                 "address space for it cannot be mapped; {}; use smaller sizes or fewer ranks",
                 running, memory_limits_summary());
    munmap(p, kBuffer + kSlack);
  }
  const int max_running_;
  std::mutex mu_;
  std::condition_variable freed_;
  int running_ = 0, high_water_ = 0;
};

Slots& slots() {
  static Slots s;
  return s;
}

/// Holds one of the slots for an OpenBLAS call.
struct Slot {
  Slot() { slots().acquire(); }
  ~Slot() { slots().release(); }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
};
}  // namespace

void restart_without_server_threads(char** argv) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  execv("/proc/self/exe", argv);  // returns only on failure: run on, with the pool
}

int threads_at_load() {
  return openblas_threads_at_load;
}

void init_thread() {
  openblas_set_num_threads(1);
}
int threads() {
  return openblas_get_num_threads();
}
int parallel_mode() {
  return openblas_get_parallel();
}
std::string config() {
  return openblas_get_config();
}
std::string core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

CpuVectors cpu_vectors() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return {__builtin_cpu_supports("avx2") != 0, __builtin_cpu_supports("avx512f") != 0};
#else
  return {};
#endif
}

std::string generic_core_advice(const std::string& core, CpuVectors cpu, const char* coretype_env) {
  if (!cpu.avx2 && !cpu.avx512) return {};
  // OpenBLAS's x86 kernel families without AVX2 kernels (driver/others/dynamic.c's core names).
  static const char* const kOld[] = {
      "katmai", "coppermine",  "northwood", "prescott",  "banias",     "atom",         "core2",
      "penryn", "dunnington",  "nehalem",   "athlon",    "opteron",    "opteron_sse3", "barcelona",
      "nano",   "sandybridge", "bobcat",    "bulldozer", "piledriver", "steamroller"};
  std::string lower;
  for (char c : core)
    lower += char(std::tolower(static_cast<unsigned char>(c)));
  if (std::find(std::begin(kOld), std::end(kOld), lower) == std::end(kOld)) return {};
  const char* fit = cpu.avx512 ? "SkylakeX" : "Haswell";
  const std::string why =
      coretype_env ? fmt::format("OPENBLAS_CORETYPE={} selects them", coretype_env)
                   : std::string("this OpenBLAS does not know the CPU model and fell back to them");
  return fmt::format(
      "OpenBLAS runs its generic {} kernels on a CPU with {} ({}): OpenBLAS GEMMs (the "
      "--nondeterministic path and mlpbench's floor) run several times slower than they could. "
      "Remedy: run with OPENBLAS_CORETYPE={} (OpenBLAS's documented override for DYNAMIC_ARCH "
      "builds); cocemu does not change your environment.",
      core, cpu.avx512 ? "AVX-512" : "AVX2", why, fit);
}

std::string core_advice() {
  return generic_core_advice(core_name(), cpu_vectors(), std::getenv("OPENBLAS_CORETYPE"));
}

namespace {
void check_shapes(const Tensor& a, const Tensor& b, const Tensor& c, bool tb, std::int64_t& m,
                  std::int64_t& n, std::int64_t& k) {
  COCEMU_CHECK_ARG(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2,
                   "gemm needs 2-D operands, got A {}, B {}, C {}", a.describe(), b.describe(),
                   c.describe());
  m = a.size(0);
  k = a.size(1);
  n = tb ? b.size(0) : b.size(1);
  const std::int64_t kb = tb ? b.size(1) : b.size(0);
  COCEMU_CHECK_ARG(kb == k && c.size(0) == m && c.size(1) == n,
                   "gemm shapes disagree: A {} B {}{} C {} (expected C [{}, {}] and B's k = {})",
                   a.describe(), b.describe(), tb ? " (transposed)" : "", c.describe(), m, n, k);
  COCEMU_CHECK_ARG(a.dtype() == b.dtype() && a.dtype() == c.dtype(),
                   "gemm dtypes disagree: A {}, B {}, C {}", a.describe(), b.describe(),
                   c.describe());
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, bool tb, double alpha, double beta) {
  std::int64_t m, n, k;
  check_shapes(a, b, c, tb, m, n, k);
  if (!a.has_data() || m == 0 || n == 0) return;
  const auto trans = tb ? CblasTrans : CblasNoTrans;
  const int ldb = int(tb ? k : n);
  switch (a.dtype()) {
    case DType::f32: {
      Slot slot;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, trans, int(m), int(n), int(k), float(alpha),
                  a.data<float>(), int(k), b.data<float>(), ldb, float(beta), c.data<float>(),
                  int(n));
      return;
    }
    case DType::f64: {
      Slot slot;
      cblas_dgemm(CblasRowMajor, CblasNoTrans, trans, int(m), int(n), int(k), alpha,
                  a.data<double>(), int(k), b.data<double>(), ldb, beta, c.data<double>(), int(n));
      return;
    }
    case DType::f16:
    case DType::bf16: {
      Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32), c32 = c.to(DType::f32);
      gemm(a32, b32, c32, tb, alpha, beta);
      c.copy_from(c32.to(c.dtype()));
      return;
    }
    default:
      COCEMU_FAIL(Errc::invalid_argument,
                  "gemm does not support dtype {}; allowed: f32, f64, f16, "
                  "bf16",
                  name_of(a.dtype()));
  }
}

template <>
void gemm_raw<float>(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                     float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  Slot slot;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

template <>
void gemm_raw<double>(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                      double alpha, const double* a, std::int64_t lda, const double* b,
                      std::int64_t ldb, double beta, double* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  Slot slot;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

}  // namespace cocemu::blas
