#pragma once
// Helpers for the attention tests: random full-sequence inputs, scatter/gather by token
// positions, and a runner that executes CpAttention on cp ranks and reassembles the results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>

#include "cocemu/attention/context_parallel.h"
#include "testing.h"

namespace cocemu::attn::testing {

struct Full {
  Tensor q, k, v, dout;  // SBH [S, B, H·D]
};

inline Tensor random_sbh(std::int64_t S, std::int64_t B, std::int64_t H, std::int64_t D, DType t,
                         std::uint64_t seed, double amplitude = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-amplitude, amplitude);
  std::vector<double> v(std::size_t(S * B * H * D));
  for (auto& x : v)
    x = u(rng);
  return Tensor::from<double>({S, B, H * D}, v, t);
}

inline Full random_inputs(const AttentionProblem& p, std::uint64_t seed, double amplitude = 1.0) {
  return {random_sbh(p.seq, p.batch, p.heads, p.head_dim, p.dtype, seed, amplitude),
          random_sbh(p.seq, p.batch, p.kv_heads, p.head_dim, p.dtype, seed + 1, amplitude),
          random_sbh(p.seq, p.batch, p.kv_heads, p.head_dim, p.dtype, seed + 2),
          random_sbh(p.seq, p.batch, p.heads, p.head_dim, p.dtype, seed + 3)};
}

/// Rows (tokens) `pos` of an SBH tensor.
inline Tensor gather_rows(const Tensor& t, const std::vector<std::int64_t>& pos) {
  Tensor out = Tensor::zeros(t.shape().with_dim0(std::int64_t(pos.size())), t.dtype());
  for (std::size_t i = 0; i < pos.size(); ++i)
    out.rows(std::int64_t(i), std::int64_t(i) + 1).copy_from(t.rows(pos[i], pos[i] + 1));
  return out;
}

inline void scatter_rows(const Tensor& full, const Tensor& local,
                         const std::vector<std::int64_t>& pos) {
  for (std::size_t i = 0; i < pos.size(); ++i)
    full.rows(pos[i], pos[i] + 1).copy_from(local.rows(std::int64_t(i), std::int64_t(i) + 1));
}

struct Result {
  Tensor out, lse, dq, dk, dv;  // full sequence; lse [B, H, S]
  std::vector<std::vector<TransferRecord>> fwd_transfers, bwd_transfers;
  RunResult run;
};

inline Result run_cp(const CpConfig& c, const AttentionProblem& p, const Full& in,
                     WorldOptions options = {}, bool backward = true) {
  Result r;
  r.out = Tensor::zeros(in.q.shape(), p.dtype);
  r.dq = Tensor::zeros(in.q.shape(), p.dtype);
  r.dk = Tensor::zeros(in.k.shape(), p.dtype);
  r.dv = Tensor::zeros(in.v.shape(), p.dtype);
  r.lse = Tensor::zeros({p.batch, p.heads, p.seq}, p.dtype);
  r.fwd_transfers.resize(std::size_t(c.context_parallel_size));
  r.bwd_transfers.resize(std::size_t(c.context_parallel_size));
  std::mutex mu;
  r.run = cocemu::testing::run_ranks(
      c.context_parallel_size,
      [&](Rank& rank) {
        Group world = Group::world(rank);
        CpAttention attn(world, c, p);
        const auto& pos = attn.positions();
        auto o =
            attn.forward(gather_rows(in.q, pos), gather_rows(in.k, pos), gather_rows(in.v, pos));
        const std::vector<TransferRecord> fwd = attn.transfers();
        CpAttention::Grads g;
        if (backward) g = attn.backward(gather_rows(in.dout, pos));
        std::lock_guard lock(mu);
        scatter_rows(r.out, o.out, pos);
        const std::size_t e = size_of(p.dtype), Sl = pos.size();
        for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh)
          for (std::size_t i = 0; i < Sl; ++i)
            std::memcpy(static_cast<std::byte*>(r.lse.raw()) +
                            (std::size_t(bh * p.seq) + std::size_t(pos[i])) * e,
                        static_cast<const std::byte*>(o.lse.raw()) + (std::size_t(bh) * Sl + i) * e,
                        e);
        r.fwd_transfers[std::size_t(rank.id())] = fwd;
        if (backward) {
          scatter_rows(r.dq, g.dq, pos);
          scatter_rows(r.dk, g.dk, pos);
          scatter_rows(r.dv, g.dv, pos);
          r.bwd_transfers[std::size_t(rank.id())] = attn.transfers();
        }
      },
      options);
  return r;
}

/// max |a - b| / max |b| (LSE: -inf must match exactly and is skipped).
inline double rel_error(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.item(i), y = b.item(i);
    if (std::isinf(y)) {
      if (x != y) return INFINITY;
      continue;
    }
    if (std::isnan(x)) return INFINITY;
    diff = std::max(diff, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace cocemu::attn::testing
