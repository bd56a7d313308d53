// Point-to-point transfers: send/recv, isend/irecv and batches, with matching checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cocemu/collectives/ops.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;
using testing::run_ranks;

TEST(P2P, RingExchangeWithBatches) {
  for (int n : {1, 2, 3, 7}) {
    const RunResult r = run_ranks(n, [n](Rank& rank) {
      Group g = Group::world(rank);
      const int me = rank.id();
      Tensor send_buf = Tensor::zeros({100}, DType::f64),
             recv_buf = Tensor::zeros({100}, DType::f64);
      for (int step = 0; step < 5; ++step) {
        for (int i = 0; i < 100; ++i)
          send_buf.data<double>()[i] = me * 1e4 + step * 100 + i;
        Work w = batch_isend_irecv(
            g, {{P2POp::send, send_buf, (me + 1) % n}, {P2POp::recv, recv_buf, (me + n - 1) % n}});
        w.synchronize();
        const int left = (me + n - 1) % n;
        for (int i = 0; i < 100; ++i)
          ASSERT_EQ(recv_buf.item(i), left * 1e4 + step * 100 + i);
      }
    });
    // Each batch is one modeled transfer per rank, matched around the ring.
    int batches = 0;
    for (const auto& op : r.graph.ranks[0].ops)
      batches += op.name.rfind("batch_isend_irecv", 0) == 0;
    EXPECT_EQ(batches, 5);
  }
}

TEST(P2P, SendRecvPairsInOrderWithTags) {
  run_ranks(2, [](Rank& rank) {
    Group g = Group::world(rank);
    Tensor a = Tensor::zeros({3}, DType::i32), b = Tensor::zeros({4}, DType::i32);
    if (rank.id() == 0) {
      for (int i = 0; i < 3; ++i)
        a.data<std::int32_t>()[i] = 10 + i;
      for (int i = 0; i < 4; ++i)
        b.data<std::int32_t>()[i] = 20 + i;
      send(g, a, 1, 5);
      isend(g, b, 1, 6);
    } else {
      recv(g, a, 0, 5);
      irecv(g, b, 0, 6).synchronize();
      rank.synchronize();
      EXPECT_EQ(a.data<std::int32_t>()[2], 12);
      EXPECT_EQ(b.data<std::int32_t>()[3], 23);
    }
  });
}

TEST(P2P, MismatchedRecvIsAClearError) {
  expect_error(
      [] {
        run_ranks(2, [](Rank& rank) {
          Group g = Group::world(rank);
          if (rank.id() == 0)
            send(g, Tensor::zeros({8}, DType::f32), 1, 0);
          else
            irecv(g, Tensor::zeros({4}, DType::f32), 0, 0).synchronize();
        });
      },
      Errc::mismatch, {"p2p mismatch", "f32[4]", "8 elements of f32"});
}

// A send whose receive is already waiting copies into it; one that comes first is copied out
// and queued. Either way the receive gets what the tensor held when the send ran, and the
// sender may overwrite its tensor once the send has run.
TEST(P2P, SameBytesWhetherTheReceiveOrTheSendComesFirst) {
  for (const bool receive_first : {true, false}) {
    SCOPED_TRACE(receive_first ? "receive first" : "send first");
    run_ranks(2, [receive_first](Rank& rank) {
      Group g = Group::world(rank);
      constexpr int kElements = 1 << 18;  // 1 MiB: a cached message buffer when queued
      Tensor t = Tensor::zeros({kElements}, DType::f32);
      for (int m = 0; m < 3; ++m) {
        if (rank.id() == 0) {
          if (receive_first) std::this_thread::sleep_for(std::chrono::milliseconds(30));
          for (int i = 0; i < kElements; ++i)
            t.data<float>()[i] = float(m * kElements + i);
          send(g, t, 1, m);
          rank.synchronize();
          std::fill_n(t.data<float>(), kElements, -1.0f);  // the send has run: its message is out
        } else {
          if (!receive_first) std::this_thread::sleep_for(std::chrono::milliseconds(30));
          recv(g, t, 0, m);
          rank.synchronize();
          for (int i = 0; i < kElements; i += 4099)
            ASSERT_EQ(t.data<float>()[i], float(m * kElements + i)) << "message " << m;
          ASSERT_EQ(t.data<float>()[kElements - 1], float(m * kElements + kElements - 1));
        }
      }
    });
  }
}

TEST(P2P, AMismatchedSendIsAnErrorWhenItsReceiveWaitsFirst) {
  expect_error(
      [] {
        run_ranks(2, [](Rank& rank) {
          Group g = Group::world(rank);
          if (rank.id() == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            send(g, Tensor::zeros({8}, DType::f32), 1, 0);
          } else {
            Tensor got = Tensor::zeros({4}, DType::f32);
            irecv(g, got, 0, 0).synchronize();
          }
        });
      },
      Errc::mismatch, {"p2p mismatch", "f32[4]", "8 elements of f32"});
}

TEST(P2P, UnmatchedRecvTimesOutNamingTheSend) {
  WorldOptions o;
  o.timeout = testing::short_timeout(std::chrono::milliseconds(500));
  expect_error(
      [&] {
        run_ranks(
            2,
            [](Rank& rank) {
              Group g = Group::world(rank);
              if (rank.id() == 1) irecv(g, Tensor::zeros({4}, DType::f32), 0, 3).synchronize();
            },
            o);
      },
      Errc::timeout, {"send #0 from group rank 0", "to group rank 1", "tag 3"});
}

TEST(P2P, BadPeerIsRejected) {
  run_ranks(2, [](Rank& rank) {
    Group g = Group::world(rank);
    expect_error([&] { isend(g, Tensor::zeros({1}, DType::f32), 2); }, Errc::invalid_argument,
                 {"peer 2 out of range", "0..1"});
  });
}

}  // namespace
}  // namespace cocemu
