// OpenBLAS: the pthread variant is linked and every worker runs GEMMs single-threaded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>

#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/det_gemm.h"
#include "testing.h"

namespace cocemu {
namespace {

TEST(Blas, PthreadVariantIsLinked) {
  EXPECT_EQ(blas::parallel_mode(), 1)
      << "OpenBLAS config: " << blas::config() << " (0 = sequential, 1 = pthreads, 2 = OpenMP)";
}

TEST(Blas, TestsLoadOpenBlasWithoutServerThreads) {
  // ctest sets OPENBLAS_NUM_THREADS=1 for every test, as the cocemu binary does for itself
  // (restart_without_server_threads; its own test runs the binary without the variable).
  EXPECT_EQ(blas::threads_at_load(), 1);
}

// A DYNAMIC_ARCH OpenBLAS that does not know a CPU model falls back to old generic kernels
// (Debian's 0.3.21 picks Prescott on an AVX-512 Xeon): said, with the remedy, never changed.
TEST(Blas, GenericCoreOnAVectorCpuIsReportedWithItsRemedy) {
  using blas::generic_core_advice;
  const std::string on512 =
      generic_core_advice("Prescott", {.avx2 = true, .avx512 = true}, nullptr);
  EXPECT_NE(on512.find("generic Prescott kernels"), std::string::npos) << on512;
  EXPECT_NE(on512.find("AVX-512"), std::string::npos) << on512;
  EXPECT_NE(on512.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << on512;
  EXPECT_NE(on512.find("does not know the CPU model"), std::string::npos) << on512;
  const std::string on2 = generic_core_advice("Nehalem", {.avx2 = true}, nullptr);
  EXPECT_NE(on2.find("OPENBLAS_CORETYPE=Haswell"), std::string::npos) << on2;
  // Case as the user may type it in OPENBLAS_CORETYPE; the advice says the variable chose it.
  const std::string chosen = generic_core_advice("prescott", {.avx2 = true}, "prescott");
  EXPECT_NE(chosen.find("OPENBLAS_CORETYPE=prescott selects them"), std::string::npos) << chosen;
  // Kernels that fit the CPU, and old CPUs, get no advice.
  for (const char* fits : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(generic_core_advice(fits, {.avx2 = true, .avx512 = true}, nullptr), "") << fits;
  EXPECT_EQ(generic_core_advice("Prescott", {}, nullptr), "");
  EXPECT_EQ(generic_core_advice("SomeFutureCore", {.avx2 = true}, nullptr), "");
  // This process: the core OpenBLAS reports is a name, and the advice agrees with it.
  EXPECT_FALSE(blas::core_name().empty());
  EXPECT_EQ(blas::core_advice(), generic_core_advice(blas::core_name(), blas::cpu_vectors(),
                                                     std::getenv("OPENBLAS_CORETYPE")));
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

// det_gemm's contract: per-element accumulation order depends on k only, so row chunks, tiles and
// the pre-packed operand all give the bits of the whole product (and the product is right).
TEST(DetGemm, RowChunksAndPackedOperandGiveTheWholeProductsBits) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& [m, n, k] :
       {std::tuple{37, 45, 300}, std::tuple{100, 600, 257}, std::tuple{13, 1030, 31}}) {
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        std::vector<float> a(std::size_t(m * k)), b(std::size_t(k * n));
        for (auto& v : a)
          v = u(rng);
        for (auto& v : b)
          v = u(rng);
        const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
        std::vector<float> whole(std::size_t(m * n)), chunks(whole.size()), packed(whole.size());
        blas::det_gemm(m, n, k, a.data(), lda, ta, b.data(), ldb, tb, whole.data(), n);
        const blas::PackedB pb(b.data(), ldb, tb, k, n);
        for (std::int64_t r0 = 0; r0 < m; r0 += 7) {  // odd chunk sizes cross the register tile
          const std::int64_t h = std::min<std::int64_t>(7, m - r0);
          const float* ar = ta ? a.data() + r0 : a.data() + r0 * k;
          blas::det_gemm(h, n, k, ar, lda, ta, b.data(), ldb, tb, chunks.data() + r0 * n, n);
          blas::det_gemm(h, ar, lda, ta, pb, packed.data() + r0 * n, n);
        }
        EXPECT_EQ(0, std::memcmp(whole.data(), chunks.data(), whole.size() * sizeof(float)))
            << m << "x" << n << "x" << k << " ta=" << ta << " tb=" << tb;
        EXPECT_EQ(0, std::memcmp(whole.data(), packed.data(), whole.size() * sizeof(float)))
            << m << "x" << n << "x" << k << " ta=" << ta << " tb=" << tb;
        // The definition, whatever kernel this machine runs (AVX-512, AVX2 or scalar): each
        // element is one chain of fused multiply-adds over p in order, from zero.
        std::vector<float> chain(whole.size());
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (std::int64_t p = 0; p < k; ++p)
              acc = std::fma(ta ? a[std::size_t(p * m + i)] : a[std::size_t(i * k + p)],
                             tb ? b[std::size_t(j * k + p)] : b[std::size_t(p * n + j)], acc);
            chain[std::size_t(i * n + j)] = acc;
          }
        EXPECT_EQ(0, std::memcmp(whole.data(), chain.data(), whole.size() * sizeof(float)))
            << m << "x" << n << "x" << k << " ta=" << ta << " tb=" << tb;
        // Spot-check the value against a double-precision dot product.
        for (const auto& [i, j] : {std::pair{0, 0}, std::pair{m - 1, n - 1}, std::pair{m / 2, 3}}) {
          double ref = 0;
          for (std::int64_t p = 0; p < k; ++p)
            ref += double(ta ? a[std::size_t(p * m + i)] : a[std::size_t(i * k + p)]) *
                   double(tb ? b[std::size_t(j * k + p)] : b[std::size_t(p * n + j)]);
          EXPECT_NEAR(whole[std::size_t(i * n + j)], ref, 1e-4 * k);
        }
      }
  }
}

}  // namespace
}  // namespace cocemu
