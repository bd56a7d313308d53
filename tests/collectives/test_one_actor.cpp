// Small calls run by one actor (merge_for_one_actor): every member's steps of every round, one
// after another, must give bit for bit what the members give running their own steps in
// parallel with a barrier between rounds — for every algorithm, op and reduction order.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <random>
#include <thread>

#include "executor.h"

namespace cocemu {
namespace {

using detail::MemberBuffers;

/// Each member's in, out and scratch storage, sized from what the plan's steps touch.
struct Storage {
  std::vector<std::vector<std::byte>> in, out, scratch;

  Storage(const Plan& plan, int n, DType t) : in(n), out(n), scratch(n) {
    std::vector<std::int64_t> in_elems(n, 0), out_elems(n, 0);
    for (const auto& round : plan.rounds)
      for (const Step& st : round)
        for (const auto* refs : {&st.srcs, &st.dsts})
          for (const BufRef& b : *refs) {
            auto& size = b.buf == Buf::in ? in_elems : out_elems;
            if (b.buf != Buf::scratch)
              size[std::size_t(b.rank)] = std::max(size[std::size_t(b.rank)], b.offset + st.count);
          }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> value(-1000.f, 1000.f);
    const auto fill = [&](std::vector<std::byte>& v, std::int64_t elems) {
      v.resize(std::size_t(elems) * size_of(t));
      for (std::int64_t i = 0; i < elems; ++i) {
        const float f = value(rng);
        if (t == DType::f32)
          std::memcpy(v.data() + 4 * i, &f, 4);
        else {
          const bf16 h = to_bf16(f);
          std::memcpy(v.data() + 2 * i, &h, 2);
        }
      }
    };
    for (int m = 0; m < n; ++m) {
      fill(in[std::size_t(m)], in_elems[std::size_t(m)]);
      fill(out[std::size_t(m)], out_elems[std::size_t(m)]);
      scratch[std::size_t(m)].assign(std::size_t(plan.scratch_elems) * 4,
                                     std::byte{0});  // f32 partials
    }
  }
  std::vector<MemberBuffers> buffers() {
    std::vector<MemberBuffers> b;
    for (std::size_t m = 0; m < in.size(); ++m)
      b.push_back({in[m].data(), out[m].data(), scratch[m].data()});
    return b;
  }
};

struct Case {
  CollOp op;
  Algorithm algo;
  bool deterministic;
};

TEST(OneActor, RunsEveryRoundOfEveryPlanToTheSameBits) {
  // 2 nodes of 4: the hierarchical and tree plans apply, and the non-deterministic reduce_scatter
  // and all_gather rings use 2 channels at count 9000 (at least 4096 elements per channel; the
  // all_reduce's reduce-scatter half is the same ring code).
  const int n = 8;
  std::vector<Case> cases;
  for (CollOp op :
       {CollOp::all_reduce, CollOp::reduce_scatter, CollOp::all_gather, CollOp::broadcast,
        CollOp::reduce, CollOp::gather, CollOp::scatter, CollOp::all_to_all})
    for (Algorithm a :
         {Algorithm::direct, Algorithm::ring, Algorithm::hierarchical, Algorithm::tree})
      for (bool det : {true, false})
        cases.push_back({op, a, det});
  int multi_round = 0;
  for (const Case& c : cases)
    for (std::int64_t count : {std::int64_t(1001), std::int64_t(9000)})
      for (DType t : {DType::f32, DType::bf16}) {
        PlanRequest req{c.op, c.algo, n, count, 3, c.deterministic, {}};
        req.nodes = {0, 0, 0, 0, 1, 1, 1, 1};
        const Plan plan = build_plan(req);
        multi_round += plan.rounds.size() > 1;
        SCOPED_TRACE(::testing::Message() << to_string(c.op) << " " << to_string(plan.algorithm)
                                          << " det " << c.deterministic << " count " << count << " "
                                          << name_of(t) << ", " << plan.rounds.size() << " rounds");
        Storage parallel(plan, n, t), one(plan, n, t);
        {
          std::barrier<> round_end(n);
          const auto bufs = parallel.buffers();
          std::vector<std::thread> members;
          for (int me = 0; me < n; ++me)
            members.emplace_back([&, me] {
              detail::execute_plan(plan, me, n, bufs, t, ReduceOp::sum,
                                   [&](int) { round_end.arrive_and_wait(); });
            });
          for (auto& m : members)
            m.join();
        }
        detail::execute_plan(
            detail::merge_for_one_actor(plan), 0, n, one.buffers(), t, ReduceOp::sum, [](int) {},
            /*may_stream=*/false);
        for (int m = 0; m < n; ++m) {
          EXPECT_EQ(parallel.out[std::size_t(m)], one.out[std::size_t(m)]) << "member " << m;
          EXPECT_EQ(parallel.in[std::size_t(m)], one.in[std::size_t(m)]) << "member " << m;
        }
      }
  EXPECT_GT(multi_round, 50);  // the ring and hierarchical plans have many rounds
}

}  // namespace
}  // namespace cocemu
