// The C++ API in small, tested pieces (docs/library.md shows each piece between its ANCHOR
// comments): streams and events, collectives and Work, groups and the Megatron mesh, symmetric
// memory, a tensor-parallel linear with a CoC strategy, modeled times and traces, errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/collectives/ops.h"
#include "cocemu/layers/linear.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/symmetric.h"
#include "cocemu/runtime/trace.h"

using namespace cocemu;

TEST(LibraryTour, StreamsAndEvents) {
  // ANCHOR: streams
  std::vector<OpRef> produce(2), consume(2);
  RunResult r = run(2, [&](Rank& rank) {
    Tensor x = Tensor::zeros({1024}, DType::f32);
    // Ops run in order on their stream, asynchronously to the host thread.
    produce[rank.id()] = rank.compute_stream().launch({.name = "produce", .work_ns = 5000},
                                                      [x] { x.data<float>()[0] = 1; });
    Event ready = rank.compute_stream().record();
    rank.comm_stream().wait(ready);  // device-side: the host does not block
    consume[rank.id()] = rank.comm_stream().launch(
        {.name = "consume", .cls = OpClass::comm, .work_ns = 2000}, [x] { (void)x.item(0); });
    rank.synchronize();  // the host waits for every stream of this rank
  });
  // The modeled schedule follows the event, whatever the host threads did.
  EXPECT_GE(r.timeline.at(consume[0]).start_ns, r.timeline.at(produce[0]).end_ns);
  // ANCHOR_END: streams
}

TEST(LibraryTour, CollectivesAndWork) {
  // ANCHOR: collectives
  run(8, [](Rank& rank) {
    Group world = Group::world(rank);
    Tensor x = Tensor::zeros({4}, DType::f32);
    rank.compute_stream().launch({.name = "fill", .work_ns = 1000},
                                 [x, id = rank.id()] { x.data<float>()[0] = float(id + 1); });
    // After the fill (an event on the current stream), on the comm stream; returns at once.
    Work w = all_reduce(world, x, {.async_op = true});
    w.wait();                    // the compute stream waits for the all_reduce, the host does not
    w.synchronize();             // now the host waits too
    EXPECT_EQ(x.item(0), 36.0);  // 1 + 2 + ... + 8 on every rank
  });
  // ANCHOR_END: collectives
}

TEST(LibraryTour, GroupsAndMesh) {
  // ANCHOR: groups
  run(8, [](Rank& rank) {
    // Megatron's order: tp fastest, then cp, dp, pp. World rank 5 is tp rank 1 of dp rank 2.
    Mesh mesh = make_mesh(rank, {.tp = 2, .dp = 4});
    EXPECT_EQ(mesh.tp_rank, rank.id() % 2);
    EXPECT_EQ(mesh.dp_rank, rank.id() / 2);
    Tensor g = Tensor::zeros({8}, DType::f32);
    all_reduce(mesh.dp, g);  // over the 4 ranks with the same tp rank
    Group evens = split(mesh.dp, rank.id() % 4 == 0 ? 0 : -1, 0);  // -1: not a member
    EXPECT_EQ(evens.is_member(), rank.id() % 4 == 0);
  });
  // ANCHOR_END: groups
}

TEST(LibraryTour, SymmetricMemory) {
  // ANCHOR: symmetric
  run(4, [](Rank& rank) {
    std::vector<int> team = {0, 1, 2, 3};
    SymmetricBuffer buf = SymmetricBuffer::allocate(rank, team, sizeof(int), /*n_flags=*/1);
    int me = buf.team_rank(), right = (me + 1) % 4, left = (me + 3) % 4;
    buf.put(right, 0, &me, sizeof me);       // write into the right neighbour's copy
    buf.signal(right, 0);                    // then raise its flag (release)
    buf.wait(0, 1, "left neighbour's put");  // my flag, raised by my left neighbour (acquire)
    int got = 0;
    buf.get(me, 0, &got, sizeof got);
    EXPECT_EQ(got, left);
  });
  // ANCHOR_END: symmetric
}

TEST(LibraryTour, ParallelLinearWithCoc) {
  // ANCHOR: layers
  auto output = [](layers::LinearOptions options) {
    std::vector<float> rank0;
    run(4, [&](Rank& rank) {
      Group tp = Group::world(rank);
      std::vector<float> w(64 * 32), x(16 * 32);  // weight shard [n/tp, k], input [m/tp, k]
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = float(i % 7) - 3;
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = float((i + rank.id()) % 5) - 2;
      layers::ColumnParallelLinear up(tp, Tensor::from<float>({64, 32}, w), Tensor(),
                                      /*sequence_parallel=*/true);
      Tensor y = up.forward(Tensor::from<float>({16, 32}, x), options);  // all_gather + matmul
      rank.synchronize();
      if (rank.id() == 0) rank0.assign(y.data<float>(), y.data<float>() + y.numel());
    });
    return rank0;
  };
  auto serial = output({.strategy = layers::Strategy::serial});
  auto script = output({.strategy = layers::Strategy::script, .parallel_num = 4});
  auto fused = output({.strategy = layers::Strategy::fused, .tile_rows = 8});
  EXPECT_EQ(script, serial);  // deterministic mode: every strategy gives the same bits
  EXPECT_EQ(fused, serial);
  // ANCHOR_END: layers
}

TEST(LibraryTour, ModeledTimesAndTraces) {
  // ANCHOR: modeled
  auto h100 = std::make_shared<const DeviceProfile>(load_named_profile("h100-sxm"));
  WorldOptions options{.n_ranks = 8, .profile = h100, .numerics = false};  // dry run
  RunResult r = run(options, [](Rank& rank) {
    Group world = Group::world(rank);
    Tensor grads = Tensor::shape_only({16 << 20}, DType::bf16);  // 32 MiB, no storage
    all_reduce(world, grads);
    rank.synchronize();
  });
  std::printf("modeled %.1f us; a 4096^3 bf16 GEMM on %s: %.1f us\n",
              r.timeline.makespan_ns() / 1e3, h100->name.c_str(),
              gemm_ns(*h100, 4096, 4096, 4096, DType::bf16) / 1e3);
  for (std::uint32_t i = 0; i < r.graph.ranks[0].ops.size(); ++i) {
    const OpRecord& op = r.graph.op({0, i});
    const ScheduledOp& t = r.timeline.at({0, i});
    std::printf("  rank 0 %-8s %-40s %10lld ns\n", to_string(op.cls), op.name.c_str(),
                static_cast<long long>(t.end_ns - t.start_ns));
  }
  auto dir = std::filesystem::temp_directory_path();
  write_chrome_trace(r, (dir / "all_reduce.trace.json").string());  // Perfetto, chrome://tracing
  write_svg_timeline(r, (dir / "all_reduce.svg").string(), "all_reduce 32 MiB");
  // ANCHOR_END: modeled
  EXPECT_GT(r.timeline.makespan_ns(), 0);
}

TEST(LibraryTour, ErrorsNameTheCall) {
  // ANCHOR: errors
  try {
    run(2, [](Rank& rank) {
      Group world = Group::world(rank);
      Tensor x = Tensor::zeros({rank.id() == 0 ? 4 : 8}, DType::f32);  // ranks disagree
      all_reduce(world, x);
      rank.synchronize();
    });
    FAIL() << "the mismatch was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::mismatch);
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
  }
  // ANCHOR_END: errors
}
