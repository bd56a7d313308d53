// The fused kernels: MATMUL_ALL_REDUCE, MATMUL_REDUCE_SCATTER, ALL_GATHER_MATMUL(_V2).
//
// Protocol (per communication step s, slot = s % 2 of a double-buffered symmetric buffer; flags
// are monotonic counters in each rank's memory, incremented by every peer):
//   1. compute role: wait until every peer has consumed the slot's previous use (`free` flag),
//      produce this step's tiles into the slot, then raise `ready` on every peer;
//   2. comm role: wait for `ready` from all ranks, reduce (or gather) peers' tiles in rank order
//      (deterministic) or from the segment owner on (non-deterministic);
//   3. all_reduce only: raise `reduced`, wait for all, gather every rank's reduced segment;
//   4. raise `free` on every peer: the slot may be overwritten.
#include "cocemu/layers/fused_kernels.h"

#include <array>
#include <cstring>
#include <functional>
#include <thread>

#include "cocemu/collectives/plan.h"
#include "cocemu/layers/detail/kernels.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/symmetric.h"

namespace cocemu::layers {

namespace {

// Flag slots (+ slot index 0 or 1). kPublished is raised by a rank on itself only; kConsumed has
// one counter per (slot, reader), raised by the reader on the slot's owner (checked mode).
enum Flag : int { kReady = 0, kReduced = 2, kFree = 4, kPublished = 6, kConsumed = 8 };
constexpr int flag_count(int n) {
  return kConsumed + 2 * n;
}
int consumed_flag(int slot, int reader) {
  return kConsumed + slot * 64 + reader;
}

/// The checks of checked mode and the test hook, around a kernel's slot accesses.
struct Protocol {
  SymmetricBuffer buf;
  int n, me;
  FusedOptions o;
  std::string kernel;

  bool misbehaving() const { return o.test_hook.rank == me; }
  void stall() const {
    if (o.test_hook.rank >= 0 && !misbehaving() && o.test_hook.delay_others.count() > 0)
      std::this_thread::sleep_for(o.test_hook.delay_others);
  }
  void wait_free(int slot, std::uint32_t use, std::int64_t step) const {
    buf.wait(kFree + slot, use * std::uint32_t(n),
             fmt::format("{} slot {} free for step {}", kernel, slot, step));
  }
  void wait_ready(int slot, std::uint32_t use, std::int64_t step) const {
    if (!(misbehaving() && o.test_hook.skip_ready_wait))
      buf.wait(kReady + slot, (use + 1) * std::uint32_t(n),
               fmt::format("{} tiles of step {} from every rank", kernel, step));
  }
  void before_write(int slot, std::uint32_t use, std::int64_t step) const {
    if (!o.checked) return;
    for (int j = 0; j < n; ++j) {
      const std::uint32_t got = buf.flag(me, consumed_flag(slot, j));
      COCEMU_CHECK(got >= use, Errc::internal,
                   "{} protocol violation: rank {} overwrote slot {} at step {} before peer {} "
                   "consumed its previous contents (peer consumed {} uses, needed {})",
                   kernel, me, slot, step, j, got, use);
    }
  }
  void published(int slot) const {
    if (o.checked) buf.signal(me, kPublished + slot);
  }
  void before_read(int peer, int slot, std::uint32_t use, std::int64_t step) const {
    if (!o.checked) return;
    const std::uint32_t got = buf.flag(peer, kPublished + slot);
    COCEMU_CHECK(got >= use + 1, Errc::internal,
                 "{} protocol violation: rank {} read peer {}'s slot {} at step {} before its flag "
                 "was raised (peer published {} uses, needed {})",
                 kernel, me, peer, slot, step, got, use + 1);
  }
  /// The test hook's premature overwrite: the write of step s+2 into this slot, right now.
  void maybe_overwrite_early(int slot, std::uint32_t use, std::int64_t step) const {
    if (misbehaving() && o.test_hook.overwrite_early && step == 0)
      before_write(slot, use + 1, step + 2);
  }
  void consumed(int slot) const {
    stall();
    if (o.checked)
      for (int j = 0; j < n; ++j)
        buf.signal(j, consumed_flag(slot, me));
  }
};

struct Pipeline {
  std::int64_t step_rows, steps;
};

Pipeline pipeline(std::int64_t rows, const FusedOptions& o) {
  COCEMU_CHECK_ARG(o.tile_rows >= 1 && o.tiles_per_step >= 1 && o.tiles_per_step <= 15,
                   "fused kernel: tile_rows {} must be >= 1 and tiles_per_step {} in 1..15",
                   o.tile_rows, o.tiles_per_step);
  // A step holds no more rows than the kernel has: the workspace (two steps' slots) is sized by
  // it, and tile_rows up to 2^20 must not allocate gigabytes for a few rows. Same steps.
  const std::int64_t sr = std::min(o.tile_rows * o.tiles_per_step, std::max<std::int64_t>(rows, 1));
  return {sr, rows == 0 ? 0 : (rows + sr - 1) / sr};
}

/// The steps a kernel is priced with: the vendor kernel's own where the profile gives them (steps
/// of about step_bytes of communicated rows per rank, one per rank for a ring exchange, or a
/// fixed count), else the options' tiling, which the numerics always use (they do not depend on
/// it). `row_bytes`: one communicated row.
Pipeline priced_pipeline(const FusedKernelCost::Steps& rule, std::int64_t rows,
                         std::int64_t row_bytes, int ranks, const Pipeline& tiled) {
  if (rows == 0) return tiled;
  std::int64_t step_rows = tiled.step_rows;
  if (rule.ring)
    step_rows = (rows + ranks - 1) / ranks;
  else if (rule.count > 0)
    step_rows = (rows + rule.count - 1) / rule.count;
  else if (rule.step_bytes > 0)
    step_rows = std::max<std::int64_t>(1, std::int64_t(rule.step_bytes) / row_bytes);
  return {step_rows, (rows + step_rows - 1) / step_rows};
}

/// The modeled time of a two-stage pipeline and its per-step phases.
struct PipelineCost {
  double total = 0;
  double compute = 0, comm = 0;  ///< sums over the steps (what the pipeline overlaps)
  double hbm_bytes = 0;          ///< device-memory traffic of the whole kernel
  std::vector<std::pair<std::string, double>> phases;
};

/// One pipeline step's work at full speed, and the device-memory traffic of each half.
struct StepCost {
  double compute = 0, comm = 0;
  double compute_bytes = 0, comm_bytes = 0;
};

/// Steps overlap as LCOC runs them: the producer of step i beside the consumer of step i − 1
/// (its double buffer lets the matmul run one step ahead). Overlapped compute and comm slow each
/// other by the profile's contention factors and by their memory traffic, as they do between
/// script-side ops (`overlapped_ns`, the schedule's own rule). `steps` steps: all `full` but the
/// last, `last` (so a kernel of any size is priced in constant time).
PipelineCost price_pipeline(std::int64_t steps, StepCost full, StepCost last, bool comm_first,
                            const ContentionModel& contention) {
  PipelineCost p;
  if (steps == 0) return p;
  const auto first = [&](const StepCost& c) { return comm_first ? c.comm : c.compute; };
  const auto second = [&](const StepCost& c) { return comm_first ? c.compute : c.comm; };
  const auto overlap = [&](const StepCost& producer, const StepCost& consumer) {
    // The producer's first half (compute, or comm when comm-first) beside the previous step's
    // second half.
    return comm_first ? overlapped_ns(second(consumer), first(producer), contention,
                                      consumer.compute_bytes, producer.comm_bytes)
                      : overlapped_ns(first(producer), second(consumer), contention,
                                      producer.compute_bytes, consumer.comm_bytes);
  };
  const double n = double(steps);
  p.compute = (n - 1) * full.compute + last.compute;
  p.comm = (n - 1) * full.comm + last.comm;
  p.hbm_bytes =
      (n - 1) * (full.compute_bytes + full.comm_bytes) + last.compute_bytes + last.comm_bytes;
  const char* head = comm_first ? "comm" : "compute";
  const char* tail = comm_first ? "compute" : "comm";
  if (steps == 1) {
    p.total = first(last) + second(last);
    p.phases = {{fmt::format("step 1/1 {}", head), first(last)},
                {fmt::format("step 1/1 {}", tail), second(last)}};
    return p;
  }
  const double middle = overlap(full, full), end = overlap(last, full);
  p.total = first(full) + (n - 2) * middle + end + second(last);
  p.phases.push_back({fmt::format("step 1/{} {}", steps, head), first(full)});
  if (steps > 2)
    p.phases.push_back({fmt::format("steps 2-{}/{} overlapped ({} x {:.0f} ns)", steps - 1, steps,
                                    steps - 2, middle),
                        (n - 2) * middle});
  p.phases.push_back({fmt::format("step {}/{} overlapped", steps, steps), end});
  p.phases.push_back({fmt::format("step {}/{} {}", steps, steps, tail), second(last)});
  return p;
}

/// A step's in-kernel transfer: the direct plan's link time, with the link latency per round in
/// place of a collective library's per-step α (the kernel writes peer memory and raises flags
/// itself; no collective is launched), plus the profile's fixed cost of a step (LCOC's step
/// waits for the matmul's blocks, syncs every rank through flags in peer memory before and after
/// moving the data, and hands the slot back: hicann/ascend-transformer-boost, src/kernels/lcal/
/// src/kernels/coc_reduce_scatter.cce, CrossRankSyncV1/V2 per step). `hbm_bytes` gets the step's
/// device-memory traffic: what this rank sends is read, what it receives written, and a
/// reduction also reads the data it adds to.
double comm_cost(const DeviceProfile& p, CollOp op, int n, std::int64_t count, DType t,
                 double* hbm_bytes) {
  const Plan plan = build_plan({op, Algorithm::direct, n, count, 0, true, {}});
  const PlanCost c = price_plan(plan, p, t);
  const double alpha = p.algorithms.at("direct").step_latency_ns;
  *hbm_bytes = double(c.max_link_bytes) * (op == CollOp::all_gather ? 2 : 3);
  return c.total_ns + double(c.round_ns.size()) * (p.topology.intra_latency_ns - alpha) +
         (n > 1 ? p.fused.step_overhead_ns : 0.0);
}

/// The fused kernel's transfers' slowdown while its matmul runs: the profile's comm_slowdown
/// times the shape rule of Ascend's MC2 tiling model (hicann/ops-transformer, mc2/common/src/
/// matmul_performance.cpp FindCubeUtilByL2Usage, and SetCommTimeFactorForOther in
/// mc2/all_gather_matmul and mc2/matmul_reduce_scatter's *_formulaic_tiling.cpp): the matmul's
/// working set is the base blocks of 128 rows x 256 columns its cores hold at once,
/// (min(m blocks, cores)·128 + min(n blocks, cores)·256)·k elements; past the L2 budget the
/// transfers slow by l2_overflow_slowdown, else, for k >= large_k and n > large_n, by
/// large_kn_slowdown. Groups of 2 and MATMUL_ALL_REDUCE keep the base factor, as there.
/// `m_rows`: the rows of one rank's block (MC2 sizes the working set on the whole kernel).
ContentionModel fused_contention(const DeviceProfile& p, FusedKind kind, std::int64_t m_rows,
                                 std::int64_t n, std::int64_t k, int ranks, DType t) {
  ContentionModel c = p.contention;
  const FusedKernelCost& f = p.fused;
  if (f.cube_cores <= 0 || kind == FusedKind::matmul_all_reduce || ranks <= 2) return c;
  const int which = kind == FusedKind::all_gather_matmul ? 0 : 1;
  // The rank tiles a step schedules at once (MC2's rankTileNum: ranks - 1 for the gather,
  // ranks for the reduce-scatter).
  const std::int64_t tiles = kind == FusedKind::all_gather_matmul ? ranks - 1 : ranks;
  const std::int64_t base_m = 128, base_n = 256, cores = f.cube_cores;
  const std::int64_t rows = std::max<std::int64_t>(m_rows, 1);
  const std::int64_t m_blocks = (rows + base_m - 1) / base_m * tiles;
  const std::int64_t n_blocks = (n + base_n - 1) / base_n;
  const double working_set = double(std::min(m_blocks, cores) * std::min(base_m, rows) +
                                    std::min(n_blocks, cores) * base_n) *
                             double(k) * double(size_of(t));
  if (working_set > f.l2_bytes)
    c.comm_slowdown *= f.l2_overflow_slowdown[which];
  else if (k >= f.large_k && n > f.large_n)
    c.comm_slowdown *= f.large_kn_slowdown[which];
  return c;
}

/// Prices a kernel's steps: `per_step(h)` gives, for a step of h rows, its GEMM time and the
/// element count its direct collective `op` moves per rank. Kernels price a step's GEMM as its
/// share of the whole product at the whole product's efficiency: a fused kernel runs one GEMM
/// whose tiles it schedules step by step (LCOC), not a series of small GEMMs. `m, n, k`: the
/// whole product, whose memory traffic is shared out over the steps as its time is.
template <class PerStep>
PipelineCost price_steps(const DeviceProfile& profile, const Pipeline& tiled, std::int64_t rows,
                         CollOp op, bool comm_first, DType t, int n_ranks, FusedKind kind,
                         std::int64_t m, std::int64_t n, std::int64_t k, PerStep per_step) {
  if (tiled.steps == 0) return {};
  // A gather communicates the input's rows (k wide), the reductions the output's (n wide).
  const std::int64_t row_bytes = (op == CollOp::all_gather ? k : n) * std::int64_t(size_of(t));
  const FusedKernelCost::Steps& rule =
      kind == FusedKind::all_gather_matmul ? profile.fused.gather : profile.fused.reduce;
  const Pipeline pl = priced_pipeline(rule, rows, row_bytes, n_ranks, tiled);
  const double gemm_bytes = gemm_memory_bytes(m, n, k, t);
  const auto cost = [&](std::int64_t h) {
    auto [gemm, count] = per_step(h);
    // Split GEMMs (TE): each step's matmul at its own size; a step computes its h rows of every
    // rank's block, except the all-reduce kernel's h rows.
    if (rule.separate_gemms)
      gemm = gemm_ns(profile, kind == FusedKind::matmul_all_reduce ? h : h * n_ranks, n, k, t);
    StepCost s;
    // The matmul runs on what the kernel's transfers leave it (TE's SM margin), the whole kernel.
    s.compute = gemm * rule.compute_slowdown;
    s.compute_bytes = gemm_bytes * double(h) / double(rows);
    s.comm = comm_cost(profile, op, n_ranks, count, t, &s.comm_bytes);
    return s;
  };
  const StepCost full = cost(pl.step_rows), last = cost(rows - (pl.steps - 1) * pl.step_rows);
  return price_pipeline(pl.steps, full, last, comm_first,
                        fused_contention(profile, kind, rows, n, k, n_ranks, t));
}

/// Adds `src` rows into an f32/f64 accumulator, or starts it.
template <class T>
void accumulate_rows(acc_t<T>* acc, const T* src, std::int64_t count, bool first) {
  for (std::int64_t i = 0; i < count; ++i)
    acc[i] = first ? load_as<acc_t<T>>(src[i]) : acc_t<T>(acc[i] + load_as<acc_t<T>>(src[i]));
}

/// dst = Σ over ranks (in `order`) of the segment at byte offset `off` of each rank's slot.
void reduce_segment(const SymmetricBuffer& buf, std::size_t slot_off, std::size_t off,
                    std::int64_t count, DType t, const std::vector<int>& order, void* dst) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::int32_t>) {
      COCEMU_FAIL(Errc::invalid_argument, "fused kernels need a floating dtype, got {}",
                  name_of(t));
    } else {
      std::vector<acc_t<T>> acc(static_cast<std::size_t>(count));
      bool first = true;
      for (int j : order) {
        accumulate_rows(acc.data(), reinterpret_cast<const T*>(buf.peer(j) + slot_off + off), count,
                        first);
        first = false;
      }
      T* out = static_cast<T*>(dst);
      for (std::int64_t i = 0; i < count; ++i)
        out[i] = store_as<T>(acc[std::size_t(i)]);
    }
  });
}

std::vector<int> order_for(int n, int owner, bool deterministic) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i)
    v.push_back(deterministic ? i : (owner + i) % n);
  return v;
}

/// Waits until every peer has freed both slots for all of this call's steps, so no peer still
/// reads this rank's slots when the kernel returns (and the next call may reuse them).
void drain(const SymmetricBuffer& buf, const std::array<std::uint32_t, 2>& base, std::int64_t steps,
           int n_ranks) {
  for (int slot = 0; slot < 2; ++slot) {
    const std::uint32_t uses = base[std::size_t(slot)] + std::uint32_t((steps - slot + 1) / 2);
    buf.wait(kFree + slot, uses * std::uint32_t(n_ranks), "peers to finish the last steps");
  }
}

void signal_all(const SymmetricBuffer& buf, int flag) {
  for (int j = 0; j < buf.team_size(); ++j)
    buf.signal(j, flag);
}

/// A symmetric double buffer reused by every fused kernel of one size on one group. Flags are
/// monotonic across calls: `base[slot]` counts the slot's uses by earlier calls (host side, so
/// every rank agrees).
struct Workspace {
  SymmetricBuffer buf;
  bool allocated = false;
  std::uint32_t uses[2] = {0, 0};
};

/// The workspace and this call's flag bases; records the call's slot uses.
std::pair<SymmetricBuffer, std::array<std::uint32_t, 2>> workspace(Group& g, std::size_t bytes,
                                                                   std::int64_t steps) {
  Rank& rank = g.owner();
  auto ws =
      rank.world().shared<Workspace>(fmt::format("fused-ws/{}/{}/{}", rank.id(), g.key(), bytes),
                                     [] { return std::make_shared<Workspace>(); });
  // Allocated outside World::shared's lock (allocation uses the registry too). The workspace is
  // this rank's own, so no other thread races on it.
  if (!ws->allocated) {
    ws->buf = SymmetricBuffer::allocate(rank, g.ranks(), bytes, kConsumed + 2 * 64);
    ws->allocated = true;
  }
  std::array<std::uint32_t, 2> base{ws->uses[0], ws->uses[1]};
  ws->uses[0] += std::uint32_t((steps + 1) / 2);
  ws->uses[1] += std::uint32_t(steps / 2);
  return {ws->buf, base};
}

void launch_fused(Group& g, std::string name, PipelineCost cost, std::uint64_t flops,
                  std::function<void()> fn) {
  // LCOC writes peer memory over the intra-node fabric: the group must sit in one node.
  const Topology& topo = g.owner().profile().topology;
  for (int w : g.ranks())
    COCEMU_CHECK_ARG(topo.node_of(w) == topo.node_of(g.ranks().front()),
                     "{} on rank {}: group {} spans nodes (world ranks {} and {} are on nodes {} "
                     "and {}); fused kernels reach peers through intra-node memory only",
                     name, g.owner().id(), g.name(), g.ranks().front(), w,
                     topo.node_of(g.ranks().front()), topo.node_of(w));
  OpSpec spec;
  spec.name = std::move(name);
  spec.cls = OpClass::fused;
  spec.work_ns = cost.total;
  spec.launch = LaunchKind::fused;
  spec.flops = flops;
  spec.phases = std::make_shared<const Phases>(std::move(cost.phases));
  spec.inner_compute_ns = cost.compute;
  spec.inner_comm_ns = cost.comm;
  spec.hbm_bytes = std::uint64_t(cost.hbm_bytes);
  // One kernel on every rank of the group: it starts and ends together (flags synchronise it).
  // Keyed by the group's unique key, as collectives are: display names need not be unique.
  spec.rendezvous.push_back({fmt::format("fused/{}/{}", g.key(), g.next_sequence()), g.size()});
  g.owner().current_stream().launch(std::move(spec), std::move(fn));
}

}  // namespace

namespace {
/// MATMUL_ALL_REDUCE with the weight produced inside the kernel by `weight` (the plain weight, or
/// the w8A16 dequantisation), as [n, k] (trans_w) or [k, n].
void all_reduce_kernel(Group& g, const Tensor& x, std::function<Tensor()> weight, bool trans_w,
                       std::int64_t n, const Tensor& bias, const Tensor& out, const FusedOptions& o,
                       const std::string& kernel, double prologue_ns) {
  Rank& rank = g.owner();
  const int n_ranks = g.size(), me = g.rank();
  const std::int64_t m = x.size(0), k = x.size(1);
  COCEMU_CHECK_ARG(out.size(0) == m && out.size(1) == n && out.dtype() == x.dtype(),
                   "{} on rank {}: x {} -> out {} do not fit (expected out [{}, {}] of {})", kernel,
                   rank.id(), x.describe(), out.describe(), m, n, name_of(x.dtype()));
  const Pipeline pl = pipeline(m, o);
  const std::size_t e = size_of(x.dtype()), slot_bytes = std::size_t(pl.step_rows * n) * e;
  const auto ws = workspace(g, 2 * slot_bytes, pl.steps);
  const SymmetricBuffer buf = ws.first;
  const std::array<std::uint32_t, 2> base = ws.second;
  const double whole = detail::gemm_cost_ns(rank, m, n, k, x.dtype(), {false, trans_w});
  PipelineCost pc =
      price_steps(rank.profile(), pl, m, CollOp::all_reduce, false, x.dtype(), n_ranks,
                  FusedKind::matmul_all_reduce, m, n, k, [&](std::int64_t h) {
                    return std::pair{whole * double(h) / double(m), h * n};
                  });
  if (prologue_ns > 0) {
    pc.total += prologue_ns;
    pc.compute += prologue_ns;
    pc.phases.insert(pc.phases.begin(), {"dequantise weight", prologue_ns});
  }
  const bool det = o.deterministic;
  launch_fused(
      g, fmt::format("{}{} {}x{}x{}{}", o.label, kernel, m, k, n, det ? "" : " nondet"), pc,
      std::uint64_t(2 * m * n * k), [=] {
        const detail::WeightOperand w(weight(), trans_w, o.deterministic);
        const Protocol pr{buf, n_ranks, me, o, kernel};
        for (std::int64_t s = 0; s < pl.steps; ++s) {
          const int slot = int(s % 2);
          const std::uint32_t use = base[std::size_t(s % 2)] + std::uint32_t(s / 2);
          const std::int64_t r0 = s * pl.step_rows, h = std::min(pl.step_rows, m - r0);
          const std::size_t slot_off = std::size_t(slot) * slot_bytes;
          // 1. compute: wait for the slot to be free, produce the step's tiles, announce them.
          pr.wait_free(slot, use, s);
          Tensor tiles = Tensor::empty({h, n}, x.dtype());  // tiling-invariant: one call per step
          w.gemm_now(x.rows(r0, r0 + h), tiles);
          pr.before_write(slot, use, s);
          std::memcpy(buf.local() + slot_off, tiles.raw(), tiles.nbytes());
          pr.stall();
          pr.published(slot);
          signal_all(buf, kReady + slot);
          // 2. reduce my segment of the step's elements from every rank's slot.
          pr.wait_ready(slot, use, s);
          for (int j = 0; j < n_ranks; ++j)
            pr.before_read(j, slot, use, s);
          const std::int64_t count = h * n;
          const std::int64_t off = segment_offset(count, n_ranks, me),
                             len = segment_length(count, n_ranks, me);
          std::vector<std::byte> reduced(std::size_t(len) * e);
          reduce_segment(buf, slot_off, std::size_t(off) * e, len, x.dtype(),
                         order_for(n_ranks, me, det), reduced.data());
          pr.maybe_overwrite_early(slot, use, s);
          // 3. publish it in my slot (peers only read their own segments from it) and gather.
          std::memcpy(buf.local() + slot_off + std::size_t(off) * e, reduced.data(),
                      reduced.size());
          signal_all(buf, kReduced + slot);
          buf.wait(kReduced + slot, (use + 1) * std::uint32_t(n_ranks),
                   fmt::format("reduced segments of step {}", s));
          auto* dst = static_cast<std::byte*>(out.raw()) + std::size_t(r0 * n) * e;
          for (int j = 0; j < n_ranks; ++j) {
            const std::int64_t jo = segment_offset(count, n_ranks, j),
                               jl = segment_length(count, n_ranks, j);
            std::memcpy(dst + std::size_t(jo) * e, buf.peer(j) + slot_off + std::size_t(jo) * e,
                        std::size_t(jl) * e);
          }
          // 4. the slot may be overwritten by every peer.
          pr.consumed(slot);
          signal_all(buf, kFree + slot);
        }
        // Do not leave (and free the buffer) while a peer may still read my slots.
        drain(buf, base, pl.steps, n_ranks);
        if (bias.defined()) detail::add_bias_now(out, bias);
      });
}
}  // namespace

void matmul_all_reduce(Group& g, const Tensor& x, const Tensor& w, const Tensor& bias,
                       const Tensor& out, const FusedOptions& o) {
  COCEMU_CHECK_ARG(
      w.ndim() == 2 && x.ndim() == 2 && w.size(1) == x.size(1) && w.dtype() == x.dtype(),
      "MATMUL_ALL_REDUCE on rank {}: x {} · wᵀ {} do not fit", g.owner().id(), x.describe(),
      w.describe());
  all_reduce_kernel(
      g, x, [w] { return w; }, true, w.size(0), bias, out, o, "MATMUL_ALL_REDUCE", 0);
}

namespace {
/// Scales (and offsets) per granularity: 1, n, or ceil(k/g)·n (the last group may be ragged).
std::int64_t scale_count(const W8A16Weight& q, std::int64_t k, std::int64_t n) {
  switch (q.granularity) {
    case QuantGranularity::per_tensor:
      return 1;
    case QuantGranularity::per_channel:
      return n;
    case QuantGranularity::per_group:
      return (k + q.group_size - 1) / q.group_size * n;
  }
  return 1;
}
/// The scale/offset element of weight element (i, j).
std::int64_t scale_index(const W8A16Weight& q, std::int64_t i, std::int64_t j, std::int64_t n) {
  switch (q.granularity) {
    case QuantGranularity::per_tensor:
      return 0;
    case QuantGranularity::per_channel:
      return j;
    case QuantGranularity::per_group:
      return (i / q.group_size) * n + j;
  }
  return 0;
}
}  // namespace

Tensor dequantize(const W8A16Weight& q, DType to) {
  const std::int64_t k = q.weight.size(0), n = q.weight.size(1);
  Tensor out = Tensor::zeros({k, n}, to);
  const std::int8_t* w = q.weight.data<std::int8_t>();
  const float* sc = q.scale.data<float>();
  const float* of = q.offset.defined() ? q.offset.data<float>() : nullptr;
  visit_dtype(to, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::int32_t>) {
      COCEMU_FAIL(Errc::invalid_argument, "dequantize to {}: allowed f16, bf16, f32, f64",
                  name_of(to));
    } else {
      T* o = out.data<T>();
      for (std::int64_t i = 0; i < k; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t idx = scale_index(q, i, j, n);
          const float v = (float(w[i * n + j]) + (of ? of[idx] : 0.0f)) * sc[idx];
          o[i * n + j] = store_as<T>(acc_t<T>(v));
        }
    }
  });
  return out;
}

void w8a16_matmul_all_reduce(Group& g, const Tensor& x, const W8A16Weight& q, const Tensor& bias,
                             const Tensor& out, const FusedOptions& o) {
  Rank& rank = g.owner();
  COCEMU_CHECK_ARG(x.ndim() == 2 && (x.dtype() == DType::f16 || x.dtype() == DType::bf16),
                   "w8A16 MATMUL_ALL_REDUCE on rank {}: activations {} must be 2-D f16 or bf16",
                   rank.id(), x.describe());
  COCEMU_CHECK_ARG(
      q.weight.ndim() == 2 && q.weight.dtype() == DType::i8 && q.weight.size(0) == x.size(1),
      "w8A16 MATMUL_ALL_REDUCE on rank {}: weight {} must be i8 [k = {}, n]", rank.id(),
      q.weight.describe(), x.size(1));
  const std::int64_t k = q.weight.size(0), n = q.weight.size(1);
  COCEMU_CHECK_ARG(q.granularity != QuantGranularity::per_group || q.group_size >= 1,
                   "w8A16 per-group: group_size = {} must be >= 1", q.group_size);
  const std::int64_t expect = scale_count(q, k, n);
  COCEMU_CHECK_ARG(
      q.scale.dtype() == DType::f32 && q.scale.numel() == expect,
      "w8A16 on rank {}: scale {} must hold {} f32 values ({} for k = {}, n = {}{})", rank.id(),
      q.scale.describe(), expect,
      q.granularity == QuantGranularity::per_tensor    ? "[1]"
      : q.granularity == QuantGranularity::per_channel ? "[n]"
                                                       : "[ceil(k/g), n]",
      k, n,
      q.granularity == QuantGranularity::per_group ? fmt::format(", g = {}", q.group_size) : "");
  COCEMU_CHECK_ARG(
      !q.offset.defined() || (q.offset.dtype() == DType::f32 && q.offset.numel() == expect),
      "w8A16 on rank {}: offset {} must match the scale's shape ({} f32 values)", rank.id(),
      q.offset.describe(), expect);
  const double prologue =
      memory_ns(rank.profile(), std::uint64_t(k * n) * (1 + size_of(x.dtype())));
  all_reduce_kernel(
      g, x, [q, t = x.dtype()] { return dequantize(q, t); }, false, n, bias, out, o,
      "W8A16_MATMUL_ALL_REDUCE", prologue);
}

void matmul_reduce_scatter(Group& g, const Tensor& x, const Tensor& w, bool trans_w,
                           const Tensor& bias, const Tensor& out, const FusedOptions& o) {
  Rank& rank = g.owner();
  const int n_ranks = g.size(), me = g.rank();
  const std::int64_t m = x.size(0), k = x.size(1), n = trans_w ? w.size(0) : w.size(1);
  COCEMU_CHECK_ARG(m % n_ranks == 0,
                   "MATMUL_REDUCE_SCATTER on rank {}: m = {} must be a multiple "
                   "of the group size {}",
                   rank.id(), m, n_ranks);
  const std::int64_t ml = m / n_ranks;
  COCEMU_CHECK_ARG((trans_w ? w.size(1) : w.size(0)) == k && out.size(0) == ml && out.size(1) == n,
                   "MATMUL_REDUCE_SCATTER on rank {}: x {} · w{} {} -> out {} do not fit",
                   rank.id(), x.describe(), trans_w ? "ᵀ" : "", w.describe(), out.describe());
  const Pipeline pl = pipeline(ml, o);
  const std::size_t e = size_of(x.dtype());
  const std::size_t block_bytes = std::size_t(pl.step_rows * n) * e,
                    slot_bytes = block_bytes * std::size_t(n_ranks);
  const auto ws = workspace(g, 2 * slot_bytes, pl.steps);
  const SymmetricBuffer buf = ws.first;
  const std::array<std::uint32_t, 2> base = ws.second;
  const double whole = detail::gemm_cost_ns(rank, m, n, k, x.dtype(), {false, trans_w});
  const PipelineCost pc =
      price_steps(rank.profile(), pl, ml, CollOp::reduce_scatter, false, x.dtype(), n_ranks,
                  FusedKind::matmul_reduce_scatter, m, n, k, [&](std::int64_t h) {
                    return std::pair{whole * double(h) / double(ml), h * n};
                  });
  const bool det = o.deterministic;
  launch_fused(
      g, fmt::format("{}MATMUL_REDUCE_SCATTER {}x{}x{}{}", o.label, m, k, n, det ? "" : " nondet"),
      pc, std::uint64_t(2 * m * n * k), [=] {
        const Protocol pr{buf, n_ranks, me, o, "MATMUL_REDUCE_SCATTER"};
        const detail::WeightOperand wop(w, trans_w, o.deterministic);
        for (std::int64_t s = 0; s < pl.steps; ++s) {
          const int slot = int(s % 2);
          const std::uint32_t use = base[std::size_t(s % 2)] + std::uint32_t(s / 2);
          const std::int64_t r0 = s * pl.step_rows, h = std::min(pl.step_rows, ml - r0);
          const std::size_t slot_off = std::size_t(slot) * slot_bytes;
          pr.wait_free(slot, use, s);
          pr.before_write(slot, use, s);
          // Block j of the slot holds this step's rows of rank j's output region.
          for (int j = 0; j < n_ranks; ++j) {
            const std::int64_t xr = j * ml + r0;  // the step's tiles in one tiling-invariant call
            Tensor tiles = Tensor::empty({h, n}, x.dtype());
            wop.gemm_now(x.rows(xr, xr + h), tiles);
            std::memcpy(buf.local() + slot_off + std::size_t(j) * block_bytes, tiles.raw(),
                        tiles.nbytes());
          }
          pr.stall();
          pr.published(slot);
          signal_all(buf, kReady + slot);
          pr.wait_ready(slot, use, s);
          for (int j = 0; j < n_ranks; ++j)
            pr.before_read(j, slot, use, s);
          reduce_segment(buf, slot_off, std::size_t(me) * block_bytes, h * n, x.dtype(),
                         order_for(n_ranks, me, det),
                         static_cast<std::byte*>(out.raw()) + std::size_t(r0 * n) * e);
          pr.maybe_overwrite_early(slot, use, s);
          pr.consumed(slot);
          signal_all(buf, kFree + slot);
        }
        drain(buf, base, pl.steps, n_ranks);
        if (bias.defined()) detail::add_bias_now(out, bias);
      });
}

void all_gather_matmul(Group& g, const Tensor& x, const Tensor& w, bool trans_w, const Tensor& bias,
                       const Tensor& out, const Tensor& gathered, const FusedOptions& o) {
  Rank& rank = g.owner();
  const int n_ranks = g.size();
  const std::int64_t ml = x.size(0), k = x.size(1), m = ml * n_ranks,
                     n = trans_w ? w.size(0) : w.size(1);
  COCEMU_CHECK_ARG((trans_w ? w.size(1) : w.size(0)) == k && out.size(0) == m && out.size(1) == n,
                   "ALL_GATHER_MATMUL on rank {}: all_gather(x {}) · w {} -> out {} do not fit",
                   rank.id(), x.describe(), w.describe(), out.describe());
  COCEMU_CHECK_ARG(!gathered.defined() || (gathered.size(0) == m && gathered.size(1) == k),
                   "ALL_GATHER_MATMUL_V2 on rank {}: gathered output {} must be [{}, {}]",
                   rank.id(), gathered.describe(), m, k);
  const Pipeline pl = pipeline(ml, o);
  const std::size_t e = size_of(x.dtype()), slot_bytes = std::size_t(pl.step_rows * k) * e;
  const auto ws = workspace(g, 2 * slot_bytes, pl.steps);
  const SymmetricBuffer buf = ws.first;
  const std::array<std::uint32_t, 2> base = ws.second;
  const double whole = detail::gemm_cost_ns(rank, m, n, k, x.dtype(), {false, trans_w});
  const PipelineCost pc =
      price_steps(rank.profile(), pl, ml, CollOp::all_gather, true, x.dtype(), n_ranks,
                  FusedKind::all_gather_matmul, m, n, k, [&](std::int64_t h) {
                    return std::pair{whole * double(h) / double(ml), h * k};
                  });
  const Tensor full = gathered.defined() ? gathered : Tensor::shape_only({m, k}, x.dtype());
  launch_fused(
      g,
      fmt::format("{}ALL_GATHER_MATMUL{} {}x{}x{}", o.label, gathered.defined() ? "_V2" : "", m, k,
                  n),
      pc, std::uint64_t(2 * m * n * k), [=] {
        const Tensor xf = full.has_data() ? full : Tensor::zeros({m, k}, x.dtype());
        const detail::WeightOperand wop(w, trans_w, o.deterministic);
        for (std::int64_t s = 0; s < pl.steps; ++s) {
          const int slot = int(s % 2);
          const std::uint32_t use = base[std::size_t(s % 2)] + std::uint32_t(s / 2);
          const std::int64_t r0 = s * pl.step_rows, h = std::min(pl.step_rows, ml - r0);
          const std::size_t slot_off = std::size_t(slot) * slot_bytes;
          // Comm first: publish this step's input rows, gather everyone's.
          buf.wait(kFree + slot, use * std::uint32_t(n_ranks),
                   fmt::format("slot {} free for step {}", slot, s));
          std::memcpy(buf.local() + slot_off,
                      static_cast<const std::byte*>(x.raw()) + std::size_t(r0 * k) * e,
                      std::size_t(h * k) * e);
          signal_all(buf, kReady + slot);
          buf.wait(kReady + slot, (use + 1) * std::uint32_t(n_ranks),
                   fmt::format("input rows of step {} from every rank", s));
          for (int j = 0; j < n_ranks; ++j)
            std::memcpy(static_cast<std::byte*>(xf.raw()) + std::size_t((j * ml + r0) * k) * e,
                        buf.peer(j) + slot_off, std::size_t(h * k) * e);
          signal_all(buf, kFree + slot);
          // Compute the output rows of the gathered input.
          for (int j = 0; j < n_ranks; ++j) {
            const std::int64_t xr = j * ml + r0;  // the step's tiles in one tiling-invariant call
            wop.gemm_now(xf.rows(xr, xr + h), out.rows(xr, xr + h));
          }
        }
        drain(buf, base, pl.steps, n_ranks);
        if (bias.defined()) detail::add_bias_now(out, bias);
      });
}

double fused_kernel_ns(const DeviceProfile& profile, FusedKind kind, std::int64_t m, std::int64_t k,
                       std::int64_t n, int ranks, DType dtype, const FusedOptions& o,
                       bool trans_w) {
  COCEMU_CHECK_ARG(ranks >= 1 && m >= 0 && k >= 1 && n >= 1,
                   "fused_kernel_ns: m {} k {} n {} ranks {} must be positive", m, k, n, ranks);
  const double whole = gemm_ns(profile, m, n, k, dtype, {false, trans_w});
  switch (kind) {
    case FusedKind::matmul_all_reduce: {
      const Pipeline pl = pipeline(m, o);
      return price_steps(profile, pl, m, CollOp::all_reduce, false, dtype, ranks, kind, m, n, k,
                         [&](std::int64_t h) {
                           return std::pair{whole * double(h) / double(m), h * n};
                         })
          .total;
    }
    case FusedKind::matmul_reduce_scatter: {
      const std::int64_t ml = m / ranks;
      const Pipeline pl = pipeline(ml, o);
      return price_steps(profile, pl, ml, CollOp::reduce_scatter, false, dtype, ranks, kind, m, n,
                         k,
                         [&](std::int64_t h) {
                           return std::pair{whole * double(h) / double(ml), h * n};
                         })
          .total;
    }
    case FusedKind::all_gather_matmul: {
      const std::int64_t ml = m / ranks;
      const Pipeline pl = pipeline(ml, o);
      return price_steps(profile, pl, ml, CollOp::all_gather, true, dtype, ranks, kind, m, n, k,
                         [&](std::int64_t h) {
                           return std::pair{whole * double(h) / double(ml), h * k};
                         })
          .total;
    }
  }
  return 0;
}

}  // namespace cocemu::layers
