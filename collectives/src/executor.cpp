#include "executor.h"

#include <cstring>
#include <type_traits>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cocemu/runtime/error.h"

namespace cocemu::detail {

namespace {

constexpr std::int64_t kBlock = 4096;  // elements per block: the accumulator stays in L1

template <class A>
struct Sum {
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>)  // wrap like the device does, without signed overflow
      return A(std::make_unsigned_t<A>(a) + std::make_unsigned_t<A>(b));
    else
      return a + b;
  }
};
template <class A>
struct Prod {
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>)
      return A(std::make_unsigned_t<A>(a) * std::make_unsigned_t<A>(b));
    else
      return a * b;
  }
};
template <class A>
struct Max {
  static A apply(A a, A b) { return (a > b || a != a) ? a : b; }  // NaN propagates
};
template <class A>
struct Min {
  static A apply(A a, A b) { return (a < b || a != a) ? a : b; }
};

template <class A, class S>
void load_block(A* acc, const S* src, std::int64_t len) {
  for (std::int64_t i = 0; i < len; ++i)
    acc[i] = load_as<A>(src[i]);
}

template <class Op, class A, class S>
void combine_block(A* acc, const S* src, std::int64_t len) {
  for (std::int64_t i = 0; i < len; ++i)
    acc[i] = Op::apply(acc[i], load_as<A>(src[i]));
}

/// Four sources in one pass over the accumulator, combined in the listed order (the same bits
/// as four passes, a quarter of the accumulator's loads and stores).
template <class Op, class A, class S>
void combine4_block(A* __restrict acc, const S* __restrict s0, const S* __restrict s1,
                    const S* __restrict s2, const S* __restrict s3, std::int64_t len) {
  for (std::int64_t i = 0; i < len; ++i) {
    A x = Op::apply(acc[i], load_as<A>(s0[i]));
    x = Op::apply(x, load_as<A>(s1[i]));
    x = Op::apply(x, load_as<A>(s2[i]));
    acc[i] = Op::apply(x, load_as<A>(s3[i]));
  }
}

template <class D, class A>
void store_block(D* dst, const A* acc, std::int64_t len) {
  if constexpr (std::is_same_v<D, A>)
    std::memcpy(dst, acc, std::size_t(len) * sizeof(A));
  else
    for (std::int64_t i = 0; i < len; ++i)
      dst[i] = store_as<D>(acc[i]);
}

/// Steps writing at least this many bytes in all (count × destinations) write their data-buffer
/// destinations with non-temporal stores: the data will not be read again soon, and skipping the
/// read-for-ownership of every destination line cuts the memory traffic of an out-of-place
/// reduction by a third. Counting all destinations matters at scale: a 64-member direct
/// all_reduce of 4 MiB writes 64 KiB to each of 64 outputs, 4 MiB per step.
constexpr std::size_t kStreamingBytes = 256 << 10;

/// Copies `bytes` (a multiple of 4) with streaming stores where the destination is aligned.
void stream_copy(void* dst, const void* src, std::size_t bytes) {
#if defined(__AVX2__)
  auto* d = static_cast<std::byte*>(dst);
  auto* s = static_cast<const std::byte*>(src);
  const std::size_t head = std::min(bytes, (32 - reinterpret_cast<std::uintptr_t>(d) % 32) % 32);
  std::memcpy(d, s, head);
  std::size_t i = head;
  for (; i + 32 <= bytes; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void stream_fence() {
#if defined(__AVX2__)
  _mm_sfence();  // order the streaming stores before the barrier that publishes them
#endif
}

template <class T, class Op>
void reduce_step(const Step& st, int n, bool avg, const std::vector<MemberBuffers>& bufs,
                 bool may_stream) {
  using A = acc_t<T>;
  struct Src {
    const void* p;
    bool acc;
  };
  thread_local std::vector<Src> srcs;  // reused: small calls run thousands of steps per call
  srcs.clear();
  for (const BufRef& b : st.srcs) {
    const MemberBuffers& m = bufs[std::size_t(b.rank)];
    if (b.buf == Buf::scratch)
      srcs.push_back({reinterpret_cast<const A*>(m.scratch) + b.offset, true});
    else
      srcs.push_back(
          {reinterpret_cast<const T*>(b.buf == Buf::in ? m.in : m.out) + b.offset, false});
  }
  struct Dst {
    void* p;
    bool acc;
    bool is_src;  // in place: the line was just read, a plain store is cheaper
  };
  const bool streaming =
      may_stream && std::size_t(st.count) * sizeof(T) * st.dsts.size() >= kStreamingBytes;
  thread_local std::vector<Dst> dsts;
  dsts.clear();
  for (const BufRef& b : st.dsts) {
    const MemberBuffers& m = bufs[std::size_t(b.rank)];
    void* p =
        b.buf == Buf::scratch
            ? static_cast<void*>(reinterpret_cast<A*>(m.scratch) + b.offset)
            : static_cast<void*>(reinterpret_cast<T*>(b.buf == Buf::in ? m.in : m.out) + b.offset);
    // Only streaming stores ask whether a destination is also a source: small calls (a merged
    // 64-member step has 64 of each) skip the sources × destinations comparisons.
    bool is_src = false;
    if (streaming)
      for (const Src& s : srcs)
        is_src |= s.p == p;
    dsts.push_back({p, b.buf == Buf::scratch, is_src});
  }
  alignas(64) A acc[kBlock];
  for (std::int64_t base = 0; base < st.count; base += kBlock) {
    const std::int64_t len = std::min(kBlock, st.count - base);
    for (std::size_t k = 0; k < srcs.size(); ++k) {
      const Src& s = srcs[k];
      const auto data = [&](std::size_t j) { return static_cast<const T*>(srcs[j].p) + base; };
      if (k == 0) {
        if (s.acc)
          load_block(acc, static_cast<const A*>(s.p) + base, len);
        else
          load_block(acc, data(k), len);
      } else if (k + 4 <= srcs.size() && !s.acc && !srcs[k + 1].acc && !srcs[k + 2].acc &&
                 !srcs[k + 3].acc) {
        combine4_block<Op>(acc, data(k), data(k + 1), data(k + 2), data(k + 3), len);
        k += 3;
      } else if (s.acc) {
        combine_block<Op>(acc, static_cast<const A*>(s.p) + base, len);
      } else {
        combine_block<Op>(acc, static_cast<const T*>(s.p) + base, len);
      }
    }
    if (avg && st.finalize)
      for (std::int64_t i = 0; i < len; ++i)
        acc[i] = acc[i] / A(n);
    for (const Dst& d : dsts) {
      if (d.acc)
        store_block(static_cast<A*>(d.p) + base, acc, len);
      else if constexpr (std::is_same_v<T, A>)
        if (streaming && !d.is_src)
          stream_copy(static_cast<T*>(d.p) + base, acc, std::size_t(len) * sizeof(T));
        else
          store_block(static_cast<T*>(d.p) + base, acc, len);
      else
        store_block(static_cast<T*>(d.p) + base, acc, len);
    }
  }
  if (streaming) stream_fence();
}

template <class T>
void run_step(const Step& st, int n, ReduceOp op, const std::vector<MemberBuffers>& bufs,
              bool may_stream) {
  if (st.count == 0) return;
  if (st.kind == Step::copy) {
    const BufRef& s = st.srcs.front();
    COCEMU_CHECK(s.buf != Buf::scratch, Errc::internal, "copy from scratch is not supported");
    const MemberBuffers& sm = bufs[std::size_t(s.rank)];
    const T* src = reinterpret_cast<const T*>(s.buf == Buf::in ? sm.in : sm.out) + s.offset;
    for (const BufRef& d : st.dsts) {
      const MemberBuffers& dm = bufs[std::size_t(d.rank)];
      T* dst = reinterpret_cast<T*>(d.buf == Buf::in ? dm.in : dm.out) + d.offset;
      if (dst == src) continue;
      const std::size_t bytes = std::size_t(st.count) * sizeof(T);
      if (may_stream && bytes * st.dsts.size() >= kStreamingBytes && sizeof(T) % 4 == 0)
        stream_copy(dst, src, bytes);
      else
        std::memcpy(dst, src, bytes);
    }
    stream_fence();
    return;
  }
  using A = acc_t<T>;
  switch (op) {
    case ReduceOp::sum:
      return reduce_step<T, Sum<A>>(st, n, false, bufs, may_stream);
    case ReduceOp::avg:
      return reduce_step<T, Sum<A>>(st, n, true, bufs, may_stream);
    case ReduceOp::max:
      return reduce_step<T, Max<A>>(st, n, false, bufs, may_stream);
    case ReduceOp::min:
      return reduce_step<T, Min<A>>(st, n, false, bufs, may_stream);
    case ReduceOp::prod:
      return reduce_step<T, Prod<A>>(st, n, false, bufs, may_stream);
  }
}

}  // namespace

void execute_plan(const Plan& plan, int me, int n, const std::vector<MemberBuffers>& bufs,
                  DType dtype, ReduceOp op, const std::function<void(int)>& between_rounds,
                  bool may_stream) {
  for (std::size_t r = 0; r < plan.rounds.size(); ++r) {
    for (const Step& st : plan.rounds[r]) {
      if (st.actor != me) continue;
      visit_dtype(dtype, [&](auto tag) { run_step<decltype(tag)>(st, n, op, bufs, may_stream); });
    }
    if (r + 1 < plan.rounds.size()) between_rounds(int(r));
  }
}

namespace {
bool continues(const std::vector<BufRef>& prev, const std::vector<BufRef>& next,
               std::int64_t count) {
  if (prev.size() != next.size()) return false;
  for (std::size_t i = 0; i < prev.size(); ++i)
    if (prev[i].rank != next[i].rank || prev[i].buf != next[i].buf ||
        prev[i].offset + count != next[i].offset)
      return false;
  return true;
}
}  // namespace

Plan merge_for_one_actor(const Plan& plan) {
  Plan merged{plan.op, plan.algorithm, {}, plan.scratch_elems};
  merged.rounds.reserve(plan.rounds.size());
  for (const std::vector<Step>& round : plan.rounds) {
    std::vector<Step> steps;
    for (const Step& st : round) {
      if (!steps.empty()) {
        Step& last = steps.back();
        if (last.kind == st.kind && last.finalize == st.finalize &&
            continues(last.srcs, st.srcs, last.count) &&
            continues(last.dsts, st.dsts, last.count)) {
          last.count += st.count;
          continue;
        }
      }
      steps.push_back(st);
      steps.back().actor = 0;
    }
    merged.rounds.push_back(std::move(steps));
  }
  return merged;
}

}  // namespace cocemu::detail
