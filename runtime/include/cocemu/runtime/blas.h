#pragma once
/// OpenBLAS, used single-threaded from every thread that runs GEMMs (rank threads and stream
/// workers): with 8 ranks on few cores, parallelism comes from the ranks, and the openmp variant
/// of OpenBLAS would otherwise start a team per caller (≈7× slower on 2 cores).
#include <string>

#include "cocemu/runtime/tensor.h"

namespace cocemu::blas {

/// OpenBLAS's pthread build starts (cores − 1) server threads as it loads, and each spins on
/// sched_yield for about 0.1 s before it sleeps; cocemu never gives them work (init_thread), so
/// they only take cores from the ranks (a 2-thread `plan` search: 15% slower). OpenBLAS sizes the
/// pool from OPENBLAS_NUM_THREADS when it loads, before main. Call first thing in main(): when
/// the variable is unset, sets it to 1 and executes the program again (/proc/self/exe, same
/// arguments), so that OpenBLAS loads without the pool. Returns when the variable was set (the
/// user's value is kept) or the exec failed (the program then runs with the pool).
void restart_without_server_threads(char** argv);
/// OpenBLAS's thread count as the program loaded (before any init_thread): the server pool is
/// this minus one.
int threads_at_load();
/// Makes OpenBLAS calls from the current thread single-threaded. Called by every worker.
void init_thread();
/// Threads OpenBLAS would use for a call from the current thread.
int threads();
/// 0 = sequential, 1 = pthreads, 2 = OpenMP (OpenBLAS's openblas_get_parallel()).
int parallel_mode();
/// OpenBLAS's configuration string (version, kernel family).
std::string config();

/// C = alpha·A·op(B) + beta·C, row-major. A is [m,k]; B is [k,n] or, with `transpose_b`, [n,k];
/// C is [m,n]. f32 and f64 use OpenBLAS; f16/bf16 operands are converted to f32 and the result
/// rounded once.
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, bool transpose_b = false,
          double alpha = 1.0, double beta = 0.0);

/// Raw row-major GEMM on f32/f64 pointers with leading dimensions (C = α·op(A)·op(B) + β·C).
template <class T>
void gemm_raw(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
              const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
              std::int64_t ldc);

}  // namespace cocemu::blas
