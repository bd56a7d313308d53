// Collective correctness (R-CO-2, R-CO-4): every op, for world sizes 1..16, element counts
// 0, 1, 7, 4096 and 2^20, ring and direct, f32/f64/bf16/f16/i32, in place and out of place.
// Inputs are small integers so the exact answer exists in every dtype; every algorithm must
// produce it bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cocemu/collectives/ops.h"
#include "testing.h"

namespace cocemu {
namespace {

// Exact inputs: sums over 16 ranks stay <= 64, products <= 16 in magnitude.
double value(ReduceOp op, int r, std::int64_t i) {
  switch (op) {
    case ReduceOp::max:
    case ReduceOp::min:
      return double((r * 7 + i * 3) % 11) - 5;
    case ReduceOp::prod:
      return (i + r) % 5 == 0 ? 2.0 : ((i + 2 * r) % 7 == 0 ? -1.0 : 1.0);
    default:
      return double(r % 3 + i % 3);
  }
}

/// The exact reduction of element i over n ranks, computed the way the spec defines it: combine
/// in f32 (f64 for f64, i32 for i32) in rank order, divide once for avg, round once.
template <class T>
T expected_reduction(ReduceOp op, int n, std::int64_t i) {
  using A = acc_t<T>;
  A acc = A(value(op, 0, i));
  for (int r = 1; r < n; ++r) {
    const A v = A(value(op, r, i));
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc = acc + v;
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::prod:
        acc = acc * v;
        break;
    }
  }
  if (op == ReduceOp::avg) acc = acc / A(n);
  return store_as<T>(acc);
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
void fill(const Tensor& t, ReduceOp op, int r, std::int64_t offset = 0) {
  T* p = t.data<T>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = store_as<T>(acc_t<T>(value(op, r, offset + i)));
}

struct Failure {
  std::int64_t index = -1;
  double got = 0, want = 0;
};

template <class T, class Want>
Failure first_mismatch(const Tensor& t, Want want) {
  const T* p = t.data<T>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const T w = want(i);
    if (!same_bits(p[i], w)) return {i, load_as<double>(p[i]), load_as<double>(w)};
  }
  return {};
}

std::int64_t test_scale_max_count() {
#if defined(COCEMU_SANITIZED)
  return 1 << 14;  // sanitizers are 5-20x slower: keep the sweep within the time budget
#else
  return 1 << 20;
#endif
}

class Collectives : public ::testing::TestWithParam<int> {};

template <class T>
void sweep_dtype(Rank& rank, Group& g, DType dtype, std::int64_t c, Algorithm algo) {
  const int n = g.size(), r = g.rank();
  CollectiveOptions o;
  o.algo = algo;
  auto report = [&](const char* what, const Failure& f, bool in_place, ReduceOp op) {
    if (f.index < 0) return;
    ADD_FAILURE() << what << " n=" << n << " rank=" << r << " dtype=" << name_of(dtype)
                  << " count=" << c << " algo=" << to_string(algo)
                  << (in_place ? " in-place" : " out-of-place") << " op=" << to_string(op)
                  << ": element " << f.index << " is " << f.got << ", expected " << f.want;
  };
  // all_reduce, every reduce op.
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
    if (op == ReduceOp::avg && !is_floating(dtype)) continue;
    o.op = op;
    for (bool in_place : {false, true}) {
      Tensor in = Tensor::zeros({c}, dtype);
      Tensor out = in_place ? in : Tensor::zeros({c}, dtype);
      fill<T>(in, op, r);
      all_reduce(g, in, out, o);
      rank.synchronize();
      report(
          "all_reduce",
          first_mismatch<T>(out, [&](std::int64_t i) { return expected_reduction<T>(op, n, i); }),
          in_place, op);
    }
  }
  // reduce_scatter: sum and max.
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    o.op = op;
    for (bool in_place : {false, true}) {
      Tensor in = Tensor::zeros({n * c}, dtype);
      Tensor out = in_place ? in.flat(r * c, (r + 1) * c) : Tensor::zeros({c}, dtype);
      fill<T>(in, op, r);
      reduce_scatter(g, out, in, o);
      rank.synchronize();
      report("reduce_scatter",
             first_mismatch<T>(
                 out, [&](std::int64_t i) { return expected_reduction<T>(op, n, r * c + i); }),
             in_place, op);
    }
  }
  o.op = ReduceOp::sum;
  // all_gather.
  for (bool in_place : {false, true}) {
    Tensor out = Tensor::zeros({n * c}, dtype);
    Tensor in = in_place ? out.flat(r * c, (r + 1) * c) : Tensor::zeros({c}, dtype);
    fill<T>(in, ReduceOp::sum, r);
    all_gather(g, out, in, o);
    rank.synchronize();
    report("all_gather",
           first_mismatch<T>(out,
                             [&](std::int64_t i) {
                               return store_as<T>(acc_t<T>(
                                   value(ReduceOp::sum, int(i / std::max<std::int64_t>(c, 1)),
                                         i % std::max<std::int64_t>(c, 1))));
                             }),
           in_place, ReduceOp::sum);
  }
  // broadcast from the last rank, reduce to the middle rank (both in place).
  {
    const int root = n - 1;
    Tensor t = Tensor::zeros({c}, dtype);
    fill<T>(t, ReduceOp::sum, r);
    broadcast(g, t, root, o);
    rank.synchronize();
    report("broadcast",
           first_mismatch<T>(t,
                             [&](std::int64_t i) {
                               return store_as<T>(acc_t<T>(value(ReduceOp::sum, root, i)));
                             }),
           true, ReduceOp::sum);
  }
  {
    const int root = n / 2;
    Tensor t = Tensor::zeros({c}, dtype);
    fill<T>(t, ReduceOp::sum, r);
    reduce(g, t, root, o);
    rank.synchronize();
    report("reduce",
           first_mismatch<T>(t,
                             [&](std::int64_t i) {
                               return r == root ? expected_reduction<T>(ReduceOp::sum, n, i)
                                                : store_as<T>(acc_t<T>(value(ReduceOp::sum, r, i)));
                             }),
           true, ReduceOp::sum);
  }
  // gather to and scatter from the last rank.
  {
    const int root = n - 1;
    Tensor in = Tensor::zeros({c}, dtype);
    Tensor out = r == root ? Tensor::zeros({n * c}, dtype) : Tensor();
    fill<T>(in, ReduceOp::sum, r);
    gather(g, out, in, root, o);
    rank.synchronize();
    if (r == root)
      report(
          "gather",
          first_mismatch<T>(out,
                            [&](std::int64_t i) {
                              return store_as<T>(acc_t<T>(value(ReduceOp::sum, int(i / c), i % c)));
                            }),
          false, ReduceOp::sum);
    Tensor src = r == root ? Tensor::zeros({n * c}, dtype) : Tensor();
    if (r == root) fill<T>(src, ReduceOp::sum, 100);
    Tensor dst = Tensor::zeros({c}, dtype);
    scatter(g, dst, src, root, o);
    rank.synchronize();
    report("scatter",
           first_mismatch<T>(dst,
                             [&](std::int64_t i) {
                               return store_as<T>(acc_t<T>(value(ReduceOp::sum, 100, r * c + i)));
                             }),
           false, ReduceOp::sum);
  }
  // all_to_all with equal splits: rank r's block p goes to rank p.
  {
    Tensor in = Tensor::zeros({n * c}, dtype), out = Tensor::zeros({n * c}, dtype);
    fill<T>(in, ReduceOp::sum, r);
    all_to_all(g, out, in, o);
    rank.synchronize();
    report("all_to_all",
           first_mismatch<T>(out,
                             [&](std::int64_t i) {
                               const std::int64_t p = i / c;
                               return store_as<T>(
                                   acc_t<T>(value(ReduceOp::sum, int(p), r * c + i % c)));
                             }),
           false, ReduceOp::sum);
  }
  barrier(g, o);
}

TEST_P(Collectives, EveryOpDtypeCountAndAlgorithmIsExact) {
  const int n = GetParam();
  const std::int64_t big = test_scale_max_count();
  testing::run_ranks(n, [&](Rank& rank) {
    Group g = Group::world(rank);
    for (Algorithm algo : {Algorithm::direct, Algorithm::ring})
      for (std::int64_t c :
           {std::int64_t(0), std::int64_t(1), std::int64_t(7), std::int64_t(4096), big}) {
        // Counts up to 4096 run for every world size and dtype. The 2^20 rows (the time budget)
        // run for f32 and bf16 at n = 2, 3, 8 and 16, and for every dtype at n = 8.
        for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32}) {
          const bool big_world = n == 2 || n == 3 || n == 8 || n == 16;
          const bool big_dtype = dtype == DType::f32 || dtype == DType::bf16 || n == 8;
          if (c == big && !(big_world && big_dtype)) continue;
          visit_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (!std::is_same_v<T, std::int8_t>) sweep_dtype<T>(rank, g, dtype, c, algo);
          });
        }
      }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSize, Collectives, ::testing::Range(1, 17),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string("n").append(std::to_string(info.param));
                         });

TEST(Collectives, AlgorithmsAgreeBitForBitOnInexactData) {
  // Random f32 data (sums round): in deterministic mode ring and direct give the same bits, and so
  // does a chunked all_reduce (chunks summed separately), because every element is summed in rank
  // order with one f32 accumulator: the sum computed here, rank by rank (11 ranks: the executor
  // combines sources four at a time, with a remainder).
  const std::int64_t c = 10007;
  const auto data = [c](int r) {
    std::vector<float> x(std::size_t(c), 0.0f);
    std::uint64_t s = 0x9e3779b97f4a7c15ull * std::uint64_t(r + 1);
    for (float& v : x) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      v = float(std::int64_t(s % 2000001) - 1000000) * 1.37e-3f;
    }
    return x;
  };
  for (int n : {3, 8, 11}) {
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < n; ++r)
      inputs.push_back(data(r));
    std::vector<float> in_rank_order = inputs[0];
    for (int r = 1; r < n; ++r)
      for (std::size_t i = 0; i < in_rank_order.size(); ++i)
        in_rank_order[i] += inputs[std::size_t(r)][i];
    // Non-deterministic direct: segment s summed from its owner on, s, s+1, ..., s+n-1 (mod n).
    std::vector<float> owner_first(std::size_t(c), 0.0f);
    for (int seg = 0; seg < n; ++seg)
      for (std::int64_t i = segment_offset(c, n, seg);
           i < segment_offset(c, n, seg) + segment_length(c, n, seg); ++i) {
        float acc = inputs[std::size_t(seg)][std::size_t(i)];
        for (int k = 1; k < n; ++k)
          acc += inputs[std::size_t((seg + k) % n)][std::size_t(i)];
        owner_first[std::size_t(i)] = acc;
      }
    testing::run_ranks(n, [&](Rank& rank) {
      Group g = Group::world(rank);
      Tensor x = Tensor::zeros({c}, DType::f32);
      const std::vector<float>& mine = inputs[std::size_t(rank.id())];
      std::copy(mine.begin(), mine.end(), x.data<float>());
      Tensor ring = x.clone(), direct = x.clone(), chunked = x.clone();
      all_reduce(g, ring, {.algo = Algorithm::ring});
      all_reduce(g, direct, {.algo = Algorithm::direct});
      for (int k = 0; k < 4; ++k)
        all_reduce(g, chunked.flat(k * c / 4, (k + 1) * c / 4), {.algo = Algorithm::ring});
      rank.synchronize();
      EXPECT_TRUE(ring.bitwise_equal(direct));
      EXPECT_TRUE(ring.bitwise_equal(chunked));
      EXPECT_EQ(std::memcmp(direct.data<float>(), in_rank_order.data(), std::size_t(c) * 4), 0);
      // Non-deterministic mode sums from each segment's owner: a different order, within the bound
      // (n-1)·2^-24·Σ|x| per element, and visibly different in the last bits somewhere.
      Tensor nd = x.clone(), absum = x.clone();
      for (std::int64_t i = 0; i < c; ++i)
        absum.data<float>()[i] = std::fabs(absum.data<float>()[i]);
      all_reduce(g, nd, {.algo = Algorithm::direct, .deterministic = false});
      all_reduce(g, absum, CollectiveOptions{});
      rank.synchronize();
      EXPECT_EQ(std::memcmp(nd.data<float>(), owner_first.data(), std::size_t(c) * 4), 0);
      int differ = 0;
      for (std::int64_t i = 0; i < c; ++i) {
        const double bound = (n - 1) * std::ldexp(1.0, -24) * absum.item(i) * 2;
        EXPECT_LE(std::fabs(nd.item(i) - direct.item(i)), bound) << i;
        differ += nd.item(i) != direct.item(i);
      }
      EXPECT_GT(differ, 0) << "non-deterministic mode should change some last bits";
    });
  }
}

TEST(Collectives, AllToAllWithExplicitSplits) {
  testing::run_ranks(4, [](Rank& rank) {
    Group g = Group::world(rank);
    const int n = 4, r = rank.id();
    // Rank r sends (r + p) % 3 rows of width 2 to rank p.
    auto rows = [](int from, int to) { return std::int64_t((from + to) % 3); };
    std::vector<std::int64_t> in_splits, out_splits;
    std::int64_t in_rows = 0, out_rows = 0;
    for (int p = 0; p < n; ++p) {
      in_splits.push_back(rows(r, p));
      out_splits.push_back(rows(p, r));
      in_rows += rows(r, p);
      out_rows += rows(p, r);
    }
    Tensor in = Tensor::zeros({in_rows, 2}, DType::i32),
           out = Tensor::zeros({out_rows, 2}, DType::i32);
    std::int64_t row = 0;
    for (int p = 0; p < n; ++p)
      for (std::int64_t k = 0; k < rows(r, p); ++k, ++row)
        for (int j = 0; j < 2; ++j)
          in.data<std::int32_t>()[row * 2 + j] = r * 1000 + p * 100 + int(k) * 10 + j;
    all_to_all(g, out, in, out_splits, in_splits);
    rank.synchronize();
    row = 0;
    for (int p = 0; p < n; ++p)
      for (std::int64_t k = 0; k < rows(p, r); ++k, ++row)
        for (int j = 0; j < 2; ++j)
          EXPECT_EQ(out.data<std::int32_t>()[row * 2 + j], p * 1000 + r * 100 + int(k) * 10 + j);
  });
}

}  // namespace
}  // namespace cocemu
