// det_gemm against OpenBLAS sgemm when 8 threads share the machine's cores (#14): each thread
// runs the same GEMMs, single-threaded, once with det_gemm and once with OpenBLAS, interleaved;
// prints the median wall time of each and their ratio per shape. The shapes are mlpbench's TP=8
// MLP block (tokens 2048, hidden 2048, ffn 8192 → 1024 per rank): the forward products, the
// backward grad-input and weight-gradient products, and a script P=8 chunk (256 rows).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/det_gemm.h"

extern "C" {
#include <cblas.h>
}

namespace {

struct Shape {
  const char* what;
  std::int64_t m, n, k;
  bool trans_a, trans_b;
};

double seconds_of(int threads, int reps, const Shape& s, bool det,
                  std::vector<std::vector<float>>& a, std::vector<std::vector<float>>& b,
                  std::vector<std::vector<float>>& c) {
  std::vector<std::thread> pool;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      cocemu::blas::init_thread();  // single-threaded OpenBLAS in this thread
      const std::int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
      for (int r = 0; r < reps; ++r) {
        if (det)
          cocemu::blas::det_gemm(s.m, s.n, s.k, a[std::size_t(t)].data(), lda, s.trans_a,
                                 b[std::size_t(t)].data(), ldb, s.trans_b, c[std::size_t(t)].data(),
                                 s.n);
        else
          cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                      s.trans_b ? CblasTrans : CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0f,
                      a[std::size_t(t)].data(), int(lda), b[std::size_t(t)].data(), int(ldb), 0.0f,
                      c[std::size_t(t)].data(), int(s.n));
      }
    });
  for (auto& th : pool)
    th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  cocemu::blas::restart_without_server_threads(argv);
  const int threads = argc > 1 ? std::atoi(argv[1]) : 8;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 5;
  if (threads < 1 || threads > 64 || runs < 1 || runs > 100) {
    fmt::print(stderr, "usage: det_gemm_speed [threads 1..64] [runs 1..100]\n");
    return 2;
  }
  const Shape shapes[] = {
      {"mlp.up fwd    x·Wᵀ", 2048, 1024, 2048, false, true},
      {"mlp.down fwd  x·Wᵀ", 2048, 2048, 1024, false, true},
      {"mlp.up dgrad  dy·W", 2048, 2048, 1024, false, false},
      {"mlp.up wgrad  dyᵀ·x", 1024, 2048, 2048, true, false},
      {"P=8 chunk     x·Wᵀ", 256, 1024, 2048, false, true},
  };
  fmt::print(
      "# det_gemm vs OpenBLAS sgemm: {} threads, each running the shape single-threaded; "
      "median of {} interleaved runs\n",
      threads, runs);
  fmt::print("{:<22} {:>6} {:>6} {:>6} {:>12} {:>12} {:>8}\n", "shape", "m", "n", "k",
             "OpenBLAS ms", "det_gemm ms", "ratio");
  for (const Shape& s : shapes) {
    const std::size_t na = std::size_t(s.m * s.k), nb = std::size_t(s.k * s.n),
                      nc = std::size_t(s.m * s.n);
    std::vector<std::vector<float>> a(std::size_t(threads), std::vector<float>(na, 0.5f));
    std::vector<std::vector<float>> b(std::size_t(threads), std::vector<float>(nb, 0.25f));
    std::vector<std::vector<float>> c(std::size_t(threads), std::vector<float>(nc, 0.0f));
    const double flops = 2.0 * double(s.m * s.n) * double(s.k);
    const int reps = std::max(1, int(2e9 / flops));
    std::vector<double> blas, det;
    for (int r = 0; r < runs; ++r) {
      blas.push_back(seconds_of(threads, reps, s, false, a, b, c));
      det.push_back(seconds_of(threads, reps, s, true, a, b, c));
    }
    std::sort(blas.begin(), blas.end());
    std::sort(det.begin(), det.end());
    const double mb = blas[blas.size() / 2] / reps, md = det[det.size() / 2] / reps;
    fmt::print("{:<22} {:>6} {:>6} {:>6} {:>12.2f} {:>12.2f} {:>8.3f}\n", s.what, s.m, s.n, s.k,
               1e3 * mb, 1e3 * md, md / mb);
  }
  return 0;
}
