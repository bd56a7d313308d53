// OpenBLAS: the pthread variant is linked and every worker runs GEMMs single-threaded.
#include <gtest/gtest.h>

#include <random>

#include "cocemu/runtime/blas.h"
#include "testing.h"

namespace cocemu {
namespace {

TEST(Blas, PthreadVariantIsLinked) {
  EXPECT_EQ(blas::parallel_mode(), 1)
      << "OpenBLAS config: " << blas::config() << " (0 = sequential, 1 = pthreads, 2 = OpenMP)";
}

TEST(Blas, GemmMatchesNaiveProductInEveryDtype) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(-4, 4);
  const int m = 7, n = 5, k = 9;
  std::vector<double> a(m * k), b(k * n), bt(n * k);
  for (auto& x : a)
    x = d(rng);
  for (auto& x : b)
    x = d(rng);
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < n; ++j)
      bt[std::size_t(j * k + i)] = b[std::size_t(i * n + j)];
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor A = Tensor::from<double>({m, k}, a, t), B = Tensor::from<double>({k, n}, b, t);
    Tensor BT = Tensor::from<double>({n, k}, bt, t);
    Tensor C = Tensor::zeros({m, n}, t), CT = Tensor::zeros({m, n}, t);
    blas::gemm(A, B, C);
    blas::gemm(A, BT, CT, true);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double want = 0;
        for (int p = 0; p < k; ++p)
          want += a[std::size_t(i * k + p)] * b[std::size_t(p * n + j)];
        EXPECT_EQ(C.item(i * n + j), want) << name_of(t);
        EXPECT_EQ(CT.item(i * n + j), want) << name_of(t);
      }
  }
  testing::expect_error(
      [&] {
        blas::gemm(Tensor::zeros({2, 3}, DType::f32), Tensor::zeros({4, 2}, DType::f32),
                   Tensor::zeros({2, 2}, DType::f32));
      },
      Errc::invalid_argument, {"gemm shapes disagree", "f32[2, 3]", "f32[4, 2]"});
}

TEST(Blas, WorkersRunGemmsSingleThreaded) {
  // Every stream worker called openblas_set_num_threads(1): a GEMM on a worker reports 1 thread.
  testing::run_ranks(2, [](Rank& rank) {
    int threads = 0;
    rank.compute_stream().launch({.name = "probe"}, [&] { threads = blas::threads(); });
    rank.synchronize();
    EXPECT_EQ(threads, 1);
  });
}

}  // namespace
}  // namespace cocemu
