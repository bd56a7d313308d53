#include <algorithm>
#include <ctime>
#include <vector>

#include "cocemu/bench/limits/estimate.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/det_gemm.h"
#include "cocemu/runtime/tensor.h"

namespace cocemu::bench {

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

/// The probes, timed in the thread's CPU time, so that other processes taking the cores do not
/// count, and the median of the repeats, so that a cache flushed by a neighbour does not either.
constexpr int kProbeRepeats = 9;

template <class Fn>
double median_seconds(Fn&& fn) {
  fn();  // warm-up: OpenBLAS's buffers, the pages
  std::vector<double> seconds;
  for (int i = 0; i < kProbeRepeats; ++i) {
    const double t0 = thread_cpu_seconds();
    fn();
    seconds.push_back(thread_cpu_seconds() - t0);
  }
  std::nth_element(seconds.begin(), seconds.begin() + kProbeRepeats / 2, seconds.end());
  return std::max(seconds[kProbeRepeats / 2], 1e-7);
}

/// bf16 GEMMs of the emulator's kind, 256 × 256 × 256: operands widened to f32, the product, the
/// result rounded back; the product by cocemu's tiling-invariant kernel (deterministic mode) or by
/// OpenBLAS (non-deterministic).
constexpr std::int64_t kGemmSize = 256;

double measure_gemm(bool deterministic) {
  constexpr std::int64_t n = kGemmSize;
  const Tensor a = Tensor::zeros({n, n}, DType::bf16), b = Tensor::zeros({n, n}, DType::bf16);
  const Tensor c = Tensor::zeros({n, n}, DType::bf16);
  const double seconds = median_seconds([&] {
    if (!deterministic) return blas::gemm(a, b, c);
    const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32);
    const Tensor c32 = Tensor::zeros({n, n}, DType::f32);
    blas::det_gemm(n, n, n, a32.data<float>(), n, false, b32.data<float>(), n, false,
                   c32.data<float>(), n);
    c.copy_from(c32.to(DType::bf16));
  });
  return 2.0 * double(n * n * n) / seconds;
}

/// Elementwise work of the emulator's kind: 2^18 bf16 elements to f32 and back.
double measure_elements() {
  constexpr std::int64_t n = std::int64_t(1) << 18;
  const Tensor a = Tensor::zeros({n}, DType::bf16);
  return 2.0 * double(n) / median_seconds([&] { a.copy_from(a.to(DType::f32).to(DType::bf16)); });
}

}  // namespace

HostSpeed host_speed() {
  // On the calling thread, single-threaded as every thread of cocemu's that runs GEMMs; once per
  // process (about 10 ms).
  static const HostSpeed speed = [] {
    blas::init_thread();
    HostSpeed s;
    s.det_gemm_flops_per_second = measure_gemm(true);
    s.blas_gemm_flops_per_second = measure_gemm(false);
    s.elements_per_second = measure_elements();
    s.det_gemm = std::clamp(s.det_gemm_flops_per_second / kReferenceDetGemmFlopsPerSecond,
                            kMinHostSpeed, kMaxHostSpeed);
    s.blas_gemm = std::clamp(s.blas_gemm_flops_per_second / kReferenceBlasGemmFlopsPerSecond,
                             kMinHostSpeed, kMaxHostSpeed);
    s.elements = std::clamp(s.elements_per_second / kReferenceElementsPerSecond, kMinHostSpeed,
                            kMaxHostSpeed);
    return s;
  }();
  return speed;
}

}  // namespace cocemu::bench
