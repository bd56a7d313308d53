// `cocemu attention`: one context-parallel attention configuration on n ranks — from .npy inputs
// to .npy outputs (real numerics), or shapes only (--dry-run) for full-size modeling, or the local
// attention speed benchmark (--bench).
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include <fmt/ranges.h>

#include "cocemu/attention/context_parallel.h"
#include "cocemu/bench/sensitivity.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/npy.h"
#include "cocemu/runtime/trace.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

using namespace attn;

struct AttnOpts {
  int cp = 4, window = 1, ulysses = 0, tp = 1;
  std::string algo = "megatron_cp_algo", mask = "causal", mask_file, layout = "bnsd";
  bool overlap = false, dry_run = false, bench = false, causal_bench = false, sensitivity = false;
  std::int64_t batch = 1, heads = 8, kv_heads = 0, seq = 256, head_dim = 64;
  std::string dtype = "f64", q, k, v, dout, out_dir, profile = "ascend-910b", trace, svg, json;
  std::uint64_t seed = 1;
};

/// Modeled forward+backward time of one configuration (a dry run on cp ranks).
std::int64_t modeled_ns(const CpConfig& c, const AttentionProblem& p,
                        std::shared_ptr<const DeviceProfile> profile) {
  WorldOptions wo;
  wo.n_ranks = c.context_parallel_size;
  wo.numerics = false;
  wo.profile = std::move(profile);
  const RunResult r = run(wo, [&](Rank& rank) {
    Group world = Group::world(rank);
    CpAttention attn(world, c, p);
    const std::int64_t S = std::int64_t(attn.positions().size());
    attn.forward(Tensor::shape_only({S, p.batch, p.heads * p.head_dim}, p.dtype),
                 Tensor::shape_only({S, p.batch, p.kv_heads * p.head_dim}, p.dtype),
                 Tensor::shape_only({S, p.batch, p.kv_heads * p.head_dim}, p.dtype));
    attn.backward(Tensor::shape_only({S, p.batch, p.heads * p.head_dim}, p.dtype));
  });
  return r.timeline.makespan_ns();
}

/// The valid cp_window_size values of a configuration (1 and the divisors of the ring degree
/// that MindSpeed's rules accept).
std::vector<int> valid_windows(CpConfig c, const AttentionProblem& p) {
  std::vector<int> out;
  if (c.context_parallel_algo == "ulysses_cp_algo") return {1};
  const int ring = c.context_parallel_algo == "hybrid_cp_algo"
                       ? c.context_parallel_size / std::max(1, c.ulysses_degree_in_cp)
                       : c.context_parallel_size;
  for (int w = 1; w <= ring; ++w) {
    if (ring % w) continue;
    c.cp_window_size = w;
    try {
      validate(c, p);
      out.push_back(w);
    } catch (const Error&) {
    }
  }
  return out;
}

Tensor load_sbh(const std::string& path, std::int64_t S, std::int64_t B, std::int64_t H,
                std::int64_t D, DType dtype, const char* what) {
  Tensor t;
  try {
    t = read_npy(path);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("--{}: {}", what, e.what()));
  }
  const bool four =
      t.ndim() == 4 && t.size(0) == S && t.size(1) == B && t.size(2) == H && t.size(3) == D;
  const bool three = t.ndim() == 3 && t.size(0) == S && t.size(1) == B && t.size(2) == H * D;
  COCEMU_CHECK_ARG((four || three) && is_floating(t.dtype()),
                   "--{} {}: array {} must be floating [S={}, B={}, H={}, D={}] or [S, B, H·D]",
                   what, path, t.describe(), S, B, H, D);
  // Non-finite inputs are reported, never passed on silently (a NaN score is not a mask).
  if (const std::int64_t bad = count_non_finite(t); bad > 0)
    std::fprintf(stderr, "cocemu: warning: --%s %s holds %lld NaN or Inf values of %lld\n", what,
                 path.c_str(), (long long)bad, (long long)t.numel());
  return t.reshape({S, B, H * D}).to(dtype);
}

Tensor random_sbh(std::int64_t S, std::int64_t B, std::int64_t H, std::int64_t D, DType t,
                  std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> v(std::size_t(S * B * H * D));
  for (auto& x : v)
    x = n(rng);
  return Tensor::from<double>({S, B, H * D}, v, t);
}

Tensor rows_of(const Tensor& t, const std::vector<std::int64_t>& pos) {
  Tensor out = t.has_data()
                   ? Tensor::zeros(t.shape().with_dim0(std::int64_t(pos.size())), t.dtype())
                   : Tensor::shape_only(t.shape().with_dim0(std::int64_t(pos.size())), t.dtype());
  if (t.has_data())
    for (std::size_t i = 0; i < pos.size(); ++i)
      out.rows(std::int64_t(i), std::int64_t(i) + 1).copy_from(t.rows(pos[i], pos[i] + 1));
  return out;
}

void run_bench(const AttnOpts& o) {
  // Local f32 flash attention forward vs OpenBLAS sgemm, both single-threaded, in this process.
  blas::init_thread();
  const std::int64_t S = o.seq, D = o.head_dim, H = o.heads;
  const std::string what =
      fmt::format("attention --bench with --seq {} --heads {} --head-dim {}", S, H, D);
  check_fits_in_memory(checked_mul(checked_mul(S, H * D, what), 6 * 4, what), what);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(S));
  for (std::int64_t i = 0; i < S; ++i)
    pos[std::size_t(i)] = i;
  AttentionArgs a;
  a.shape = {1, H, H, S, S, D};
  a.layout = Layout::bnsd;
  a.mask.kind = o.causal_bench ? MaskKind::causal : MaskKind::none;
  a.q_pos = a.k_pos = &pos;
  Tensor q = convert_layout(random_sbh(S, 1, H, D, DType::f32, 1), Layout::sbh, Layout::bnsd, H, D);
  Tensor k = convert_layout(random_sbh(S, 1, H, D, DType::f32, 2), Layout::sbh, Layout::bnsd, H, D);
  Tensor v = convert_layout(random_sbh(S, 1, H, D, DType::f32, 3), Layout::sbh, Layout::bnsd, H, D);
  Tensor out = Tensor::zeros(q.shape(), DType::f32), lse = Tensor::zeros({1, H, S}, DType::f32);
  auto time_of = [](auto&& fn, int reps) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double flops =
      4.0 * double(S) * double(S) * double(D) * double(H) * (o.causal_bench ? 0.5 : 1.0);
  const double t_attn = time_of([&] { attention_forward(a, q, k, v, out, lse); }, 3);
  const std::int64_t n = 2048;
  Tensor A = random_sbh(n, 1, 1, n, DType::f32, 4).reshape({n, n});
  Tensor B = random_sbh(n, 1, 1, n, DType::f32, 5).reshape({n, n});
  Tensor C = Tensor::zeros({n, n}, DType::f32);
  const double t_gemm = time_of([&] { blas::gemm(A, B, C); }, 3);
  const double attn_gflops = flops / t_attn / 1e9, gemm_gflops = 2.0 * n * n * n / t_gemm / 1e9;
  std::printf("# cocemu attention --bench: local f32 flash attention forward, 1 thread\n");
  std::printf("attention  S=%lld d=%lld heads=%lld %s: %.3f s, %.1f GFLOP/s (4·S²·d per head%s)\n",
              (long long)S, (long long)D, (long long)H, o.causal_bench ? "causal" : "no mask",
              t_attn, attn_gflops, o.causal_bench ? ", half for causal" : "");
  std::printf("sgemm      %lldx%lldx%lld: %.3f s, %.1f GFLOP/s\n", (long long)n, (long long)n,
              (long long)n, t_gemm, gemm_gflops);
  std::printf("ratio      %.1f%% of sgemm (target >= 40%%)\n", 100 * attn_gflops / gemm_gflops);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    COCEMU_CHECK_ARG(f.good(), "attention: cannot write --json file '{}'", o.json);
    f << nlohmann::json{{"attention_gflops", attn_gflops},
                        {"sgemm_gflops", gemm_gflops},
                        {"ratio", attn_gflops / gemm_gflops},
                        {"seq", S},
                        {"head_dim", D},
                        {"heads", H},
                        {"causal", o.causal_bench}}
             .dump(2)
      << "\n";
  }
}

}  // namespace

void add_attention(CLI::App& app) {
  auto o = std::make_shared<AttnOpts>();
  CLI::App* sub = app.add_subcommand(
      "attention",
      "run one context-parallel attention configuration (npy in/out, --dry-run, --bench)");
  number(sub, "--cp", o->cp, "context_parallel_size (= ranks)", 1, 64);
  sub->add_option("--algo", o->algo, "ulysses_cp_algo | megatron_cp_algo | hybrid_cp_algo")
      ->capture_default_str();
  sub->add_option("--window", o->window, "cp_window_size (double ring when > 1)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--ulysses-degree", o->ulysses, "ulysses_degree_in_cp (hybrid)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  sub->add_option("--tp", o->tp, "tensor_model_parallel_size (validation only)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--mask", o->mask, "attention_mask_type: causal | general")
      ->capture_default_str();
  sub->add_option("--mask-file", o->mask_file,
                  "general mask, .npy bool/uint8 [S, S] (true = visible)");
  sub->add_flag("--overlap", o->overlap, "use_cp_send_recv_overlap");
  sub->add_option("--layout", o->layout, "kernel layout: bnsd (megatron_cp_in_bnsd) | sbh")
      ->capture_default_str();
  number(sub, "--batch", o->batch, "", std::int64_t(1), std::int64_t(1) << 20);
  number(sub, "--heads", o->heads, "", std::int64_t(1), std::int64_t(1) << 16);
  number(sub, "--kv-heads", o->kv_heads, "0 = heads", std::int64_t(0), std::int64_t(1) << 16);
  number(sub, "--seq", o->seq, "", std::int64_t(1), std::int64_t(1) << 24);
  number(sub, "--head-dim", o->head_dim, "", std::int64_t(1), std::int64_t(1) << 12);
  sub->add_option("--dtype", o->dtype, "f64 | f32 (bf16 with --dry-run)")->capture_default_str();
  sub->add_option("--q", o->q, ".npy [S, B, H, D]");
  sub->add_option("--k", o->k, ".npy [S, B, Hkv, D]");
  sub->add_option("--v", o->v, ".npy [S, B, Hkv, D]");
  sub->add_option("--dout", o->dout, ".npy [S, B, H, D]");
  sub->add_option("--seed", o->seed, "seed of random inputs when no .npy is given")
      ->check(CLI::Range(std::uint64_t(0), std::uint64_t(INT64_MAX)))
      ->capture_default_str();
  sub->add_option("--out-dir", o->out_dir, "write out, lse, dq, dk, dv as .npy here");
  sub->add_option("--profile", o->profile, "device profile")->capture_default_str();
  sub->add_flag("--dry-run", o->dry_run, "shapes only: numerics skipped, modeled times reported");
  sub->add_option("--trace", o->trace, "write the modeled Chrome trace JSON here");
  sub->add_option("--svg", o->svg, "write the SVG timeline here");
  sub->add_flag(
      "--bench", o->bench,
      "local f32 flash attention forward vs sgemm (use --seq 4096 --head-dim 128 --heads 8)");
  sub->add_flag("--causal-bench", o->causal_bench, "benchmark with a causal mask");
  sub->add_option("--json", o->json, "write results as JSON");
  sub->add_flag("--sensitivity", o->sensitivity,
                "model every valid cp_window_size with each assumption of the profile scaled "
                "x0.5 and x2, and report whether the best window flips");
  sub->callback([o] {
    if (o->bench) return run_bench(*o);
    const DType dtype = parse_dtype(o->dtype);
    CpConfig c;
    c.context_parallel_size = o->cp;
    c.context_parallel_algo = o->algo;
    c.cp_window_size = o->window;
    c.ulysses_degree_in_cp = o->ulysses;
    c.attention_mask_type = o->mask;
    c.use_cp_send_recv_overlap = o->overlap;
    COCEMU_CHECK_ARG(o->layout == "bnsd" || o->layout == "sbh", "--layout '{}'; allowed: bnsd, sbh",
                     o->layout);
    c.megatron_cp_in_bnsd = o->layout == "bnsd";
    c.tensor_model_parallel_size = o->tp;
    AttentionProblem p{
        o->batch, o->heads, o->kv_heads ? o->kv_heads : o->heads, o->seq, o->head_dim, dtype,
        nullptr,  0};
    if (o->mask == "general") {
      COCEMU_CHECK_ARG(!o->mask_file.empty(), "--mask general needs --mask-file");
      Tensor m;
      try {
        m = read_npy(o->mask_file);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("--mask-file: {}", e.what()));
      }
      COCEMU_CHECK_ARG(
          m.ndim() == 2 && m.size(0) == p.seq && m.size(1) == p.seq && m.dtype() == DType::i8,
          "--mask-file {}: mask {} must be bool or uint8 [{}, {}] (true = visible)", o->mask_file,
          m.describe(), p.seq, p.seq);
      auto g = std::make_shared<GeneralMask>();
      g->seq = p.seq;
      const std::int8_t* mv = m.data<std::int8_t>();
      for (std::int64_t i = 0; i < m.numel(); ++i) {
        COCEMU_CHECK_ARG(mv[i] == 0 || mv[i] == 1,
                         "--mask-file {}: element {} is {}; allowed 0 (hidden) or 1 (visible)",
                         o->mask_file, i, int(mv[i]));
        g->visible.push_back(mv[i] != 0);
      }
      p.general_mask = g;
    }
    validate(c, p);
    if (o->sensitivity) {
      // The choice at stake: the window (double ring) for this algorithm, degree and shape.
      const std::vector<int> windows = valid_windows(c, p);
      AttentionProblem shapes = p;
      shapes.general_mask = nullptr;  // the cost model prices masks by visible pairs only
      CpConfig sc = c;
      if (sc.attention_mask_type == "general") sc.attention_mask_type = "causal";
      const auto analyse = [&](std::shared_ptr<const DeviceProfile> prof) {
        int best = windows.front();
        std::int64_t best_ns = -1;
        for (int w : windows) {
          sc.cp_window_size = w;
          const std::int64_t ns = modeled_ns(sc, shapes, prof);
          if (best_ns < 0 || ns < best_ns) best = w, best_ns = ns;
        }
        return bench::Conclusions{{"best cp_window_size", std::to_string(best)}};
      };
      const auto profile = load_named_profile(o->profile);
      const bench::Sensitivity sens = bench::sensitivity(profile, analyse);
      std::printf("# cocemu attention --sensitivity: %s cp=%d, windows %s, profile %s (modeled)\n",
                  c.context_parallel_algo.c_str(), c.context_parallel_size,
                  fmt::format("{}", fmt::join(windows, ", ")).c_str(), profile.name.c_str());
      std::printf("best cp_window_size %s%s\n", sens.base.at("best cp_window_size").c_str(),
                  sens.fragile("best cp_window_size").empty()
                      ? " (robust)"
                      : ("  [fragile: " + sens.fragile("best cp_window_size") + "]").c_str());
      std::fputs(bench::format_sensitivity(sens).c_str(), stdout);
      if (!o->json.empty())
        write_file(
            "--json", o->json,
            nlohmann::json{{"dry_run", true}, {"sensitivity", bench::to_json(sens)}}.dump(2) +
                "\n");
      return;
    }
    const bool numerics = !o->dry_run;
    // A dry run models shapes only: inputs it would ignore are an error, not a silent no-op.
    for (auto [option, path] : {std::pair{"--q", &o->q}, std::pair{"--k", &o->k},
                                std::pair{"--v", &o->v}, std::pair{"--dout", &o->dout}})
      COCEMU_CHECK_ARG(numerics || path->empty(),
                       "{} '{}': --dry-run models shapes only and would ignore this input; drop "
                       "one of the two",
                       option, *path);
    // Outputs are checked before the run, not after it.
    if (!o->out_dir.empty()) {
      COCEMU_CHECK_ARG(numerics, "--out-dir needs real numerics (not --dry-run)");
      check_output_dir("--out-dir", o->out_dir);
    }
    for (auto [option, path] : {std::pair{"--json", &o->json}, std::pair{"--trace", &o->trace},
                                std::pair{"--svg", &o->svg}})
      if (!path->empty()) check_output_file(option, *path);
    if (numerics) {
      COCEMU_CHECK_ARG(dtype == DType::f32 || dtype == DType::f64,
                       "--dtype {}: real numerics run in f32 or f64 (bf16 and f16 with --dry-run)",
                       o->dtype);
      // q, k, v, dout, out, dq, dk, dv, plus each rank's shards, kernel layouts and blocks.
      const std::string what = fmt::format(
          "attention with --batch {} --seq {} --heads {} "
          "--head-dim {}",
          p.batch, p.seq, p.heads, p.head_dim);
      const std::int64_t elems =
          checked_mul(checked_mul(p.batch, p.seq, what), p.heads * p.head_dim, what);
      check_fits_in_memory(checked_mul(elems, 16 * std::int64_t(size_of(dtype)), what), what);
    }
    Tensor q, k, v, dout;
    if (numerics) {
      q = o->q.empty() ? random_sbh(p.seq, p.batch, p.heads, p.head_dim, dtype, o->seed)
                       : load_sbh(o->q, p.seq, p.batch, p.heads, p.head_dim, dtype, "q");
      k = o->k.empty() ? random_sbh(p.seq, p.batch, p.kv_heads, p.head_dim, dtype, o->seed + 1)
                       : load_sbh(o->k, p.seq, p.batch, p.kv_heads, p.head_dim, dtype, "k");
      v = o->v.empty() ? random_sbh(p.seq, p.batch, p.kv_heads, p.head_dim, dtype, o->seed + 2)
                       : load_sbh(o->v, p.seq, p.batch, p.kv_heads, p.head_dim, dtype, "v");
      dout = o->dout.empty()
                 ? random_sbh(p.seq, p.batch, p.heads, p.head_dim, dtype, o->seed + 3)
                 : load_sbh(o->dout, p.seq, p.batch, p.heads, p.head_dim, dtype, "dout");
    } else {
      q = Tensor::shape_only({p.seq, p.batch, p.heads * p.head_dim}, dtype);
      k = Tensor::shape_only({p.seq, p.batch, p.kv_heads * p.head_dim}, dtype);
      v = k;
      dout = q;
    }
    Tensor out = numerics ? Tensor::zeros(q.shape(), dtype) : Tensor();
    Tensor dq = numerics ? Tensor::zeros(q.shape(), dtype) : Tensor();
    Tensor dk = numerics ? Tensor::zeros(k.shape(), dtype) : Tensor();
    Tensor dv = numerics ? Tensor::zeros(k.shape(), dtype) : Tensor();
    Tensor lse = numerics ? Tensor::zeros({p.batch, p.heads, p.seq}, dtype) : Tensor();
    WorldOptions wo;
    wo.n_ranks = o->cp;
    wo.numerics = numerics;
    wo.profile = std::make_shared<const DeviceProfile>(load_named_profile(o->profile));
    std::mutex mu;
    std::vector<std::uint32_t> boundary(std::size_t(o->cp), 0);  // first backward op, by rank
    std::vector<TransferRecord> fwd_xfer, bwd_xfer;
    RunResult r = run(wo, [&](Rank& rank) {
      Group world = Group::world(rank);
      CpAttention attn(world, c, p);
      const auto& pos = attn.positions();
      auto res = attn.forward(rows_of(q, pos), rows_of(k, pos), rows_of(v, pos));
      const auto fx = attn.transfers();
      const std::uint32_t b = std::uint32_t(rank.graph().ops.size());
      auto g = attn.backward(rows_of(dout, pos));
      std::lock_guard lock(mu);
      boundary[std::size_t(rank.id())] = b;
      if (rank.id() == 0) {
        fwd_xfer = fx;
        bwd_xfer = attn.transfers();
      }
      if (!numerics) return;
      const std::size_t e = size_of(dtype), Sl = pos.size();
      for (std::size_t i = 0; i < Sl; ++i) {
        const auto t = std::int64_t(i);
        out.rows(pos[i], pos[i] + 1).copy_from(res.out.rows(t, t + 1));
        dq.rows(pos[i], pos[i] + 1).copy_from(g.dq.rows(t, t + 1));
        dk.rows(pos[i], pos[i] + 1).copy_from(g.dk.rows(t, t + 1));
        dv.rows(pos[i], pos[i] + 1).copy_from(g.dv.rows(t, t + 1));
        for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh)
          std::memcpy(static_cast<std::byte*>(lse.raw()) +
                          (std::size_t(bh * p.seq) + std::size_t(pos[i])) * e,
                      static_cast<const std::byte*>(res.lse.raw()) + (std::size_t(bh) * Sl + i) * e,
                      e);
      }
    });
    // Modeled report. The ranks of a causal ring run different blocks (the first gets later
    // ranks' blocks cut to half their queries), so each pass is reported from the rank that ends
    // it: its time, its compute and what of its time no compute covers. The steps are rank 0's.
    struct PassEnd {
      std::int64_t end = -1, busy = 0;
      int rank = 0;
    };
    PassEnd fwd, all;
    std::vector<std::string> steps;
    for (int rk = 0; rk < o->cp; ++rk) {
      std::int64_t fwd_end = 0, end = 0, fwd_busy = 0, bwd_busy = 0;
      for (const OpRecord& op : r.graph.ranks[std::size_t(rk)].ops) {
        const ScheduledOp& s = r.timeline.at({rk, op.index});
        const bool forward = op.index < boundary[std::size_t(rk)];
        if (forward) fwd_end = std::max(fwd_end, s.end_ns);
        end = std::max(end, s.end_ns);
        if (op.lane == 1 && op.cls == OpClass::compute)
          (forward ? fwd_busy : bwd_busy) += s.end_ns - s.start_ns;
        if (rk == 0 && ((op.lane == 1 && op.name.rfind("attn ", 0) == 0) ||
                        (op.lane != 0 && op.cls == OpClass::comm)))
          steps.push_back(fmt::format("  {:<8} {:<44} {:>12.1f} {:>12.1f}",
                                      op.lane == 1 ? "compute" : "comm", op.name, s.start_ns / 1e3,
                                      (s.end_ns - s.start_ns) / 1e3));
      }
      if (fwd_end > fwd.end) fwd = {fwd_end, fwd_busy, rk};
      if (end > all.end) all = {end, bwd_busy, rk};
    }
    const std::int64_t fwd_end = fwd.end, fwd_busy = fwd.busy, bwd_busy = all.busy;
    const std::int64_t bwd_time = all.end - fwd_end;
    std::printf(
        "# cocemu attention: %s cp=%d window=%d ulysses=%d mask=%s overlap=%s layout=%s, %s, "
        "profile %s%s\n",
        c.context_parallel_algo.c_str(), c.context_parallel_size, c.cp_window_size, o->ulysses,
        c.attention_mask_type.c_str(), c.use_cp_send_recv_overlap ? "on" : "off", o->layout.c_str(),
        fmt::format("B={} H={} Hkv={} S={} D={} {}", p.batch, p.heads, p.kv_heads, p.seq,
                    p.head_dim, name_of(dtype))
            .c_str(),
        wo.profile->name.c_str(), numerics ? "" : "  [DRY RUN: shapes only, numerics skipped]");
    std::printf(
        "modeled forward  %12.1f us   compute %12.1f us   exposed comm %12.1f us   (rank %d, "
        "the last to finish)\n",
        fwd_end / 1e3, fwd_busy / 1e3, (fwd_end - fwd_busy) / 1e3, fwd.rank);
    std::printf(
        "modeled backward %12.1f us   compute %12.1f us   exposed comm %12.1f us   (rank %d, "
        "the last to finish)\n",
        bwd_time / 1e3, bwd_busy / 1e3, (bwd_time - bwd_busy) / 1e3, all.rank);
    std::uint64_t fb = 0, bb = 0;
    for (const auto& t : fwd_xfer)
      fb += t.bytes;
    for (const auto& t : bwd_xfer)
      bb += t.bytes;
    std::printf("rank 0 sent: forward %s in %zu steps, backward %s in %zu steps\n",
                format_bytes(fb).c_str(), fwd_xfer.size(), format_bytes(bb).c_str(),
                bwd_xfer.size());
    std::printf("host wall time %.1f ms%s\n", r.wall_ns / 1e6, numerics ? "" : " (dry run)");
    std::printf("rank 0 steps:  %-8s %-44s %12s %12s\n", "lane", "op", "start us", "dur us");
    for (const auto& s : steps)
      std::printf("%s\n", s.c_str());
    if (!o->trace.empty()) write_chrome_trace(r, o->trace);
    if (!o->svg.empty())
      write_svg_timeline(r, o->svg, "cocemu attention " + c.context_parallel_algo);
    if (!o->out_dir.empty()) {
      auto four_d = [&](const Tensor& t, std::int64_t H) {
        return t.reshape({p.seq, p.batch, H, p.head_dim});
      };
      write_npy(o->out_dir + "/out.npy", four_d(out, p.heads));
      write_npy(o->out_dir + "/lse.npy", lse);
      write_npy(o->out_dir + "/dq.npy", four_d(dq, p.heads));
      write_npy(o->out_dir + "/dk.npy", four_d(dk, p.kv_heads));
      write_npy(o->out_dir + "/dv.npy", four_d(dv, p.kv_heads));
      std::printf("wrote %s/{out,lse,dq,dk,dv}.npy\n", o->out_dir.c_str());
    }
    if (!o->json.empty())
      write_file("--json", o->json,
                 nlohmann::json{{"dry_run", !numerics},
                                {"forward_ns", fwd_end},
                                {"backward_ns", bwd_time},
                                {"forward_exposed_comm_ns", fwd_end - fwd_busy},
                                {"backward_exposed_comm_ns", bwd_time - bwd_busy},
                                {"wall_ns", r.wall_ns}}
                         .dump(2) +
                     "\n");
  });
}

}  // namespace cocemu::cli
