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
/// The kernel family OpenBLAS runs on this CPU (openblas_get_corename(): "Haswell", "Zen",
/// "SkylakeX", or an old generic one such as "Prescott" when it does not know the CPU model).
std::string core_name();

/// The x86 vector extensions of a CPU that OpenBLAS's kernel families are written for.
struct CpuVectors {
  bool avx2 = false;
  bool avx512 = false;  ///< AVX-512F (what OpenBLAS's SkylakeX kernels need)
};
/// This CPU's (with the OS's support for their registers).
CpuVectors cpu_vectors();
/// When OpenBLAS runs kernels older than the CPU supports — a pre-AVX2 family such as Prescott,
/// Core2, Nehalem or Sandybridge on a CPU with AVX2 or AVX-512, which a DYNAMIC_ARCH build picks
/// for a CPU model it does not know — the advice to set OPENBLAS_CORETYPE (Haswell for AVX2,
/// SkylakeX for AVX-512; OpenBLAS README, "Setting OPENBLAS_CORETYPE" for DYNAMIC_ARCH builds)
/// and what it costs; empty when the family fits the CPU. `coretype_env` is the value of
/// OPENBLAS_CORETYPE (null if unset): the advice then says the user chose it. Nothing is changed:
/// the environment is the user's.
std::string generic_core_advice(const std::string& core, CpuVectors cpu, const char* coretype_env);
/// generic_core_advice() for this process's OpenBLAS and CPU.
std::string core_advice();

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
