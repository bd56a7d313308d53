// A unit test of an overlap scheme of one's own, written against cocemu's C++ API: a row-parallel
// matmul whose all_reduce is split into P chunks, so that chunk i's all_reduce runs on the comm
// stream while chunk i+1's matmul runs on the compute stream. One test checks the numerics (the
// same bits as the serial version), the other the modeled time at a full-size shape (dry run).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/cost_model.h"

using namespace cocemu;

// ANCHOR: scheme
// y = x·w on this rank's shards, then summed over the group, in `chunks` row blocks.
void matmul_all_reduce(Rank& rank, Group& tp, Tensor x, Tensor w, Tensor y, int chunks) {
  const std::int64_t m = x.size(0), k = x.size(1), n = w.size(1), rows = m / chunks;
  std::vector<Work> pending;
  for (int c = 0; c < chunks; ++c) {
    Tensor xc = x.rows(c * rows, (c + 1) * rows), yc = y.rows(c * rows, (c + 1) * rows);
    OpSpec spec{.name = "matmul", .work_ns = gemm_ns(rank.profile(), rows, n, k, x.dtype())};
    rank.compute_stream().launch(spec, [xc, w, yc, rows, k, n] {  // skipped in a dry run
      const float *a = xc.data<float>(), *b = w.data<float>();
      float* out = yc.data<float>();
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          float s = 0;
          for (std::int64_t l = 0; l < k; ++l)
            s += a[i * k + l] * b[l * n + j];
          out[i * n + j] = s;
        }
    });
    // Enqueued on the comm stream after the matmul above; returns at once.
    pending.push_back(all_reduce(tp, yc, {.async_op = true}));
  }
  for (Work& work : pending)
    work.wait();  // the compute stream waits, the host does not
  rank.synchronize();
}
// ANCHOR_END: scheme

// Small integers: every sum is exact, so any correct schedule gives the same bits.
Tensor pattern(std::int64_t rows, std::int64_t cols, int seed) {
  std::vector<float> v(std::size_t(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = float((i * 7 + std::size_t(seed)) % 5) - 2;
  return Tensor::from<float>({rows, cols}, v);
}

std::vector<float> run_numerics(int chunks) {
  std::vector<float> rank0;
  run(8, [&](Rank& rank) {
    Group tp = Group::world(rank);
    Tensor y = Tensor::zeros({64, 32}, DType::f32);
    matmul_all_reduce(rank, tp, pattern(64, 16, rank.id()), pattern(16, 32, 1), y, chunks);
    if (rank.id() == 0) rank0.assign(y.data<float>(), y.data<float>() + y.numel());
  });
  return rank0;
}

TEST(ChunkedMatmulAllReduce, SameBitsAsSerial) {
  EXPECT_EQ(run_numerics(4), run_numerics(1));
}

// ANCHOR: modeled
std::int64_t modeled_ns(int chunks) {
  WorldOptions options{.n_ranks = 8, .numerics = false};  // dry run: shapes only
  RunResult result = run(options, [&](Rank& rank) {
    Group tp = Group::world(rank);
    auto shape = [](std::int64_t r, std::int64_t c) {
      return Tensor::shape_only({r, c}, DType::bf16);
    };
    matmul_all_reduce(rank, tp, shape(4096, 1024), shape(1024, 8192), shape(4096, 8192), chunks);
  });
  return result.timeline.makespan_ns();
}

TEST(ChunkedMatmulAllReduce, FourChunksHideCommunication) {
  std::int64_t serial = modeled_ns(1), chunked = modeled_ns(4);
  std::printf("modeled: serial %.1f us, 4 chunks %.1f us\n", serial / 1e3, chunked / 1e3);
  EXPECT_LT(chunked, serial);
}
// ANCHOR_END: modeled
