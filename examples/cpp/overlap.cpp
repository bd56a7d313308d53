// A hand-written overlap scheme: sequence-parallel all_gather → matmul, serial against P chunks
// (chunk c's matmul computes while the later chunks' all_gathers run on the comm stream).
// First with real numerics at a small size (the chunked result must equal the serial one bit for
// bit), then shapes only at a layer's size for the modeled times.
#include <cstdio>
#include <string>
#include <vector>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/trace.h"

using namespace cocemu;

constexpr int kRanks = 8, kChunks = 4;

// "[c/chunks]" after `base` when split.
std::string chunk_name(std::string base, int c, int chunks) {
  if (chunks == 1) return base;
  base += '[';
  base += std::to_string(c + 1);
  base += '/';
  base += std::to_string(chunks);
  base += ']';
  return base;
}

// y[kRanks·rows, n] = all_gather(x[rows, k]) · w[k, n] on every rank, in `chunks` pieces.
RunResult gather_matmul(int chunks, std::int64_t rows, std::int64_t k, std::int64_t n, DType dtype,
                        bool dry_run, std::vector<Tensor>& results) {
  return run({.n_ranks = kRanks, .numerics = !dry_run}, [&](Rank& rank) {
    const auto zeros = [&](Shape s) {
      return rank.numerics() ? Tensor::zeros(s, dtype) : Tensor::shape_only(s, dtype);
    };
    Group world = Group::world(rank);
    const Tensor x = zeros({rows, k}), w = zeros({k, n}), y = zeros({kRanks * rows, n});
    if (rank.numerics()) {  // small integers: every sum is exact
      for (std::int64_t i = 0; i < x.numel(); ++i)
        x.data<float>()[i] = float((rank.id() * 7 + i * 3) % 5 - 2);
      for (std::int64_t i = 0; i < w.numel(); ++i)
        w.data<float>()[i] = float(i % 3 - 1);
    }
    const std::int64_t part = rows / chunks;  // rows of each rank's x per chunk
    std::vector<Tensor> gathered;
    std::vector<Work> works;
    for (int c = 0; c < chunks; ++c) {  // post every chunk's transfer first
      gathered.push_back(zeros({kRanks * part, k}));
      works.push_back(all_gather(world, gathered.back(), x.rows(c * part, (c + 1) * part),
                                 {.async_op = true, .label = chunk_name("", c, chunks)}));
    }
    for (int c = 0; c < chunks; ++c) {
      works[std::size_t(c)].wait();  // the compute stream waits for chunk c only
      const std::int64_t m = kRanks * part;
      rank.compute_stream().launch(
          {.name = chunk_name("matmul", c, chunks),
           .work_ns = gemm_ns(rank.profile(), m, n, k, dtype),
           .flops = std::uint64_t(2 * m * n * k)},
          [g = gathered[std::size_t(c)], w, y, c, part, rows] {
            for (int r = 0; r < kRanks; ++r)  // rank r's rows of chunk c go to its block of y
              blas::gemm(g.rows(r * part, (r + 1) * part), w,
                         y.rows(r * rows + c * part, r * rows + (c + 1) * part));
          });
    }
    rank.synchronize();
    if (rank.id() == 0) results.push_back(y);
  });
}

int main() {
  std::vector<Tensor> small;
  gather_matmul(1, 64, 256, 128, DType::f32, false, small);
  gather_matmul(kChunks, 64, 256, 128, DType::f32, false, small);
  std::printf("numerics, x [64, 256] per rank: chunked result equal to serial: %s\n",
              small[0].bitwise_equal(small[1]) ? "yes" : "NO");
  std::vector<Tensor> shapes;
  const RunResult serial = gather_matmul(1, 512, 4096, 1536, DType::bf16, true, shapes);
  const RunResult chunked = gather_matmul(kChunks, 512, 4096, 1536, DType::bf16, true, shapes);
  std::printf(
      "modeled, bf16 x [512, 4096] per rank, w [4096, 1536]: serial %.3f us, chunked (P = %d) "
      "%.3f us\n",
      double(serial.timeline.makespan_ns()) / 1e3, kChunks,
      double(chunked.timeline.makespan_ns()) / 1e3);
  write_chrome_trace(chunked, "overlap.json");
  return 0;
}
