// A small program that runs a world under whatever limits its parent set (prlimit --as,
// --nproc), for test_resource_limits.cpp: its exit status and stderr show how cocemu's runtime
// reports a resource that runs out.
//
//   limits_child MODE RANKS [MIB]
//     streams  every rank starts two more streams and runs an all_reduce on each of them
//     alloc    every rank's compute stream op allocates and touches MIB (default 64), then
//              all_reduce
//     host     every rank meets the others in an all_reduce (so every stream thread has started
//              and the failure is the allocation's, whatever the schedule), then its host thread
//              allocates and touches MIB, then all_reduce
//     gemm     every rank's compute stream runs f32 GEMMs (OpenBLAS), then all_reduce
//     full     no world: a tensor is freed while every allocation fails (the address space is
//              taken up to the limit), then the hoard is released; RANKS is ignored
//
// Exit 0: the run finished; 2: a cocemu::Error (its message on stderr, one line); 3: anything
// else that escaped (a bug).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/world.h"

namespace {

using namespace cocemu;

/// Allocates and touches `bytes` (so that the pages are really taken), returning a checksum.
std::size_t touch(std::size_t bytes) {
  std::vector<char> v(bytes);
  for (std::size_t i = 0; i < bytes; i += 4096)
    v[i] = char(i);
  return std::size_t(v[bytes / 2]);
}

/// Frees a tensor at a moment when no allocation succeeds: its deleter must not throw.
int free_when_full() {
  Tensor t = Tensor::zeros({1 << 20}, DType::f32);
  std::vector<void*> hoard;
  hoard.reserve(1 << 20);
  const auto take = [&](std::size_t size) {
    while (hoard.size() < hoard.capacity()) {
      void* p = std::malloc(size);
      if (!p) break;
      hoard.push_back(p);
    }
  };
  for (std::size_t size = std::size_t(1) << 26; size > 256; size /= 2)
    take(size);
  for (std::size_t size = 256; size >= 8; size -= 8)  // every small size class, cached ones too
    take(size);
  t = Tensor();
  for (void* p : hoard)
    std::free(p);
  std::fprintf(stderr, "limits_child: freed a tensor with %zu blocks hoarded\n", hoard.size());
  return 0;
}

void finish(Rank& rank) {
  Group world = Group::world(rank);
  Tensor t = Tensor::zeros({64}, DType::f32);
  all_reduce(world, t).synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: limits_child streams|alloc|host|gemm|full RANKS [MIB]\n");
    return 3;
  }
  const std::string mode = argv[1];
  const int ranks = std::atoi(argv[2]);
  const std::size_t bytes = std::size_t(argc == 4 ? std::atoi(argv[3]) : 64) << 20;
  if (mode == "full") return free_when_full();
  try {
    WorldOptions o;
    o.n_ranks = ranks;
    o.timeout = std::chrono::milliseconds(30000);
    run(o, [&](Rank& rank) {
      if (mode == "streams") {
        Group g = Group::world(rank);
        for (int s = 0; s < 2; ++s) {
          g.set_stream(rank.new_stream("extra " + std::to_string(s)));
          Tensor t = Tensor::zeros({64}, DType::f32);
          all_reduce(g, t).synchronize();
        }
      } else if (mode == "alloc") {
        rank.compute_stream().launch({.name = "touch"}, [bytes] { (void)touch(bytes); });
      } else if (mode == "host") {
        finish(rank);
        (void)touch(bytes);
      } else if (mode == "gemm") {
        for (int i = 0; i < 4; ++i) {
          Tensor a = Tensor::zeros({256, 256}, DType::f32),
                 b = Tensor::zeros({256, 256}, DType::f32),
                 c = Tensor::zeros({256, 256}, DType::f32);
          rank.compute_stream().launch({.name = "sgemm 256"}, [a, b, c] { blas::gemm(a, b, c); });
        }
      } else {
        COCEMU_FAIL(Errc::invalid_argument, "unknown mode '{}'", mode);
      }
      finish(rank);
    });
  } catch (const Error& e) {
    std::fprintf(stderr, "limits_child: error: %s\n", user_message(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "limits_child: escaped: %s\n", e.what());
    return 3;
  }
  return 0;
}
