// `cocemu attention`: one context-parallel attention configuration on n ranks — from .npy inputs
// to .npy outputs (real numerics), or shapes only (--dry-run) for full-size modeling; every
// algorithm and window for the request side by side (--compare, --sensitivity); or the local
// attention speed benchmark (--bench).
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>

#include <fmt/ranges.h>

#include "cocemu/attention/context_parallel.h"
#include "cocemu/bench/cp_compare.h"
#include "cocemu/bench/limits/estimate.h"
#include "cocemu/bench/sensitivity.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/mpi_link.h"
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
  bool compare = false, steps = false;
  std::int64_t batch = 1, heads = 8, kv_heads = 0, seq = 256, head_dim = 64;
  std::string dtype = "auto", q, k, v, dout, out_dir, profile = "ascend-910b", trace, svg, json;
  std::string model;
  std::uint64_t seed = 1;
  double max_seconds = 0;
};

/// The request as the ranks run it: MindSpeed's options, and the shapes of one TP rank.
struct Request {
  CpConfig config;  ///< tensor_model_parallel_size 1: `problem` holds one TP rank's heads
  AttentionProblem problem;
  int tp = 1;
  std::int64_t heads = 0, kv_heads = 0;  ///< the model's (all TP ranks')
  std::string shapes;                    ///< "B=1 S=32768 heads 64 (KV 8) / tp 1 ..." for headings
  bool modeled_only = false;             ///< --dry-run, --compare or --sensitivity
};

Tensor load_sbh(const std::string& path, std::int64_t S, std::int64_t B, std::int64_t H,
                std::int64_t D, DType dtype, const char* what) {
  Tensor t;
  try {
    t = read_npy(path);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("--{}: {}", what, e.message()), e.origin());
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
  // The forward of every repeat, against as many sgemm's: an estimate as attention's (no cp).
  check_estimate(bench::estimate_attention(1, S, H, H, D, 4, 1, o.causal_bench ? 0.5 : 1.0, what),
                 time_budget(o.max_seconds));
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

/// Shapes: from --model (heads, KV heads and head size; its seq_length and micro_batch_size unless
/// --seq / --batch are given) or from the flags. --heads and --kv-heads are the model's totals
/// (Megatron's num_attention_heads and num_query_groups), divided by --tp as Megatron does.
void resolve_shapes(AttnOpts& o, const CLI::App& sub, Request& r) {
  if (!o.model.empty()) {
    for (const char* flag : {"--heads", "--kv-heads", "--head-dim"})
      COCEMU_CHECK_ARG(sub.count(flag) == 0,
                       "{} conflicts with --model {}, which sets it; give one of the two", flag,
                       o.model);
    const layers::ModelConfig m = layers::load_model_config(o.model);
    o.heads = m.num_attention_heads;
    o.kv_heads = m.num_query_groups;
    o.head_dim = m.hidden_size / m.num_attention_heads;
    if (sub.count("--seq") == 0) o.seq = m.seq_length;
    if (sub.count("--batch") == 0) o.batch = m.micro_batch_size;
  }
  const std::int64_t kv = o.kv_heads ? o.kv_heads : o.heads;
  COCEMU_CHECK_ARG(o.heads % o.tp == 0 && kv % o.tp == 0,
                   "--heads {} and --kv-heads {} are the model's totals (num_attention_heads, "
                   "num_query_groups) and must be divisible by --tp {}, as Megatron requires",
                   o.heads, kv, o.tp);
  if (o.tp > 1)
    std::fprintf(stderr,
                 "cocemu: note: --heads %lld and --kv-heads %lld are the model's totals; with --tp "
                 "%d each rank computes %lld query and %lld KV heads\n",
                 (long long)o.heads, (long long)kv, o.tp, (long long)(o.heads / o.tp),
                 (long long)(kv / o.tp));
  r.tp = o.tp;
  r.heads = o.heads;
  r.kv_heads = kv;
  r.modeled_only = o.dry_run || o.compare || o.sensitivity;
  const std::string dtype_name = o.dtype == "auto" ? (r.modeled_only ? "bf16" : "f64") : o.dtype;
  r.problem = {o.batch,    o.heads / o.tp,          kv / o.tp, o.seq,
               o.head_dim, parse_dtype(dtype_name), nullptr,   0};
  r.shapes = fmt::format(
      "B={} S={} heads {} (KV {}){} D={} {}{}", o.batch, o.seq, o.heads, kv,
      o.tp > 1 ? fmt::format(" / tp {} = {} (KV {}) per rank", o.tp, o.heads / o.tp, kv / o.tp)
               : std::string(),
      o.head_dim, dtype_name, o.model.empty() ? "" : ", model " + o.model);
}

/// MindSpeed's options; a flag the chosen algorithm would ignore is an error naming the conflict.
void resolve_config(const AttnOpts& o, const CLI::App& sub, Request& r) {
  CpConfig& c = r.config;
  c.context_parallel_size = o.cp;
  c.context_parallel_algo = o.algo;
  c.cp_window_size = o.window;
  c.use_cp_send_recv_overlap = o.overlap;
  c.tensor_model_parallel_size = 1;  // the problem holds one TP rank's heads (check_cp_heads)
  // MindSpeed reads ulysses_degree_in_cp for hybrid_cp_algo only (arguments.py,
  // _validate_cp_args); the ring and Ulysses would silently run without it.
  COCEMU_CHECK_ARG(o.ulysses == 0 || o.algo == "hybrid_cp_algo",
                   "--ulysses-degree {} applies to --algo hybrid_cp_algo only; {} would ignore it "
                   "(MindSpeed reads ulysses_degree_in_cp for hybrid_cp_algo): add --algo "
                   "hybrid_cp_algo, or drop --ulysses-degree",
                   o.ulysses, o.algo);
  c.ulysses_degree_in_cp = o.ulysses;
  // A mask file is a general mask: with --mask left out it selects one; with --mask causal it
  // would be ignored.
  const bool mask_given = sub.count("--mask") > 0;
  COCEMU_CHECK_ARG(o.mask_file.empty() || !mask_given || o.mask == "general",
                   "--mask-file {} is a general mask but --mask is {}; drop --mask (a mask file "
                   "means --mask general) or the mask file",
                   o.mask_file, o.mask);
  c.attention_mask_type = o.mask_file.empty() ? o.mask : "general";
  COCEMU_CHECK_ARG(o.layout == "bnsd" || o.layout == "sbh", "--layout '{}'; allowed: bnsd, sbh",
                   o.layout);
  c.megatron_cp_in_bnsd = o.layout == "bnsd";
  if (c.attention_mask_type == "general") {
    COCEMU_CHECK_ARG(!o.mask_file.empty(), "--mask general needs --mask-file");
    Tensor m;
    try {
      m = read_npy(o.mask_file);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("--mask-file: {}", e.message()), e.origin());
    }
    const AttentionProblem& p = r.problem;
    COCEMU_CHECK_ARG(
        m.ndim() == 2 && m.size(0) == p.seq && m.size(1) == p.seq && m.dtype() == DType::i8,
        "--mask-file {}: mask {} must be bool or uint8 [{}, {}] (true = visible)", o.mask_file,
        m.describe(), p.seq, p.seq);
    auto g = std::make_shared<GeneralMask>();
    g->seq = p.seq;
    const std::int8_t* mv = m.data<std::int8_t>();
    for (std::int64_t i = 0; i < m.numel(); ++i) {
      COCEMU_CHECK_ARG(mv[i] == 0 || mv[i] == 1,
                       "--mask-file {}: element {} is {}; allowed 0 (hidden) or 1 (visible)",
                       o.mask_file, i, int(mv[i]));
      g->visible.push_back(mv[i] != 0);
    }
    r.problem.general_mask = g;
  }
  // --compare lists the request among the others, valid or not (with MindSpeed's reason).
  if (o.compare || o.sensitivity) return;
  bench::check_cp_heads(c, r.problem, r.tp);
  validate(c, r.problem);
}

std::string describe_request(const Request& r, const std::string& profile) {
  const CpConfig& c = r.config;
  return fmt::format("cp {}, {}, mask {}, send/recv overlap {}, layout {}, profile {}",
                     c.context_parallel_size, r.shapes, c.attention_mask_type,
                     c.use_cp_send_recv_overlap ? "on" : "off",
                     c.megatron_cp_in_bnsd ? "bnsd" : "sbh", profile);
}

/// --compare / --sensitivity: every algorithm and window for the request, modeled.
void run_compare(const AttnOpts& o, const Request& r) {
  for (auto [option, value] :
       {std::pair{"--q", &o.q}, std::pair{"--k", &o.k}, std::pair{"--v", &o.v},
        std::pair{"--dout", &o.dout}, std::pair{"--out-dir", &o.out_dir},
        std::pair{"--trace", &o.trace}, std::pair{"--svg", &o.svg}})
    COCEMU_CHECK_ARG(value->empty(),
                     "{} '{}': --compare and --sensitivity model every configuration without "
                     "numerics and draw none; run the configuration you want without them",
                     option, *value);
  COCEMU_CHECK_ARG(!o.steps,
                   "--steps lists one run's kernels; --compare and --sensitivity make no such "
                   "run: drop one of the two");
  if (!o.json.empty()) check_output_file("--json", o.json);
  const auto profile = std::make_shared<const DeviceProfile>(load_named_profile(o.profile));
  bench::CpComparison cmp =
      bench::cp_options(r.config, r.problem, profile->topology.devices_per_node, r.tp);
  bench::model_options(cmp, r.problem, profile);
  std::optional<bench::Sensitivity> sens;
  if (o.sensitivity) {
    std::fprintf(stderr,
                 "cocemu: modeling %zu configurations on %zu variants of profile %s (each "
                 "assumption x0.5 and x2)...\n",
                 cmp.options.size(), 1 + 2 * profile->assumptions.size(), profile->name.c_str());
    sens = bench::sensitivity(*profile, [&](std::shared_ptr<const DeviceProfile> p) {
      bench::CpComparison scaled = cmp;
      bench::model_options(scaled, r.problem, std::move(p));
      return bench::cp_conclusions(scaled);
    });
  }
  const std::string heading = fmt::format(
      "# cocemu attention --compare: {} (modeled: shapes only, numerics skipped; forward + "
      "backward of one attention; hybrid keeps its Ulysses all-to-all inside a node of {})",
      describe_request(r, profile->name), cmp.devices_per_node);
  std::fputs(bench::format_cp_comparison(cmp, heading, sens ? &*sens : nullptr).c_str(), stdout);
  if (sens) std::fputs(bench::format_sensitivity(*sens).c_str(), stdout);
  if (!o.json.empty()) {
    nlohmann::json j{{"dry_run", true}, {"comparison", bench::to_json(cmp)}};
    if (sens) j["sensitivity"] = bench::to_json(*sens);
    write_file("--json", o.json, j.dump(2) + "\n");
  }
}

/// One configuration: real numerics (npy in and out) or a dry run.
void run_one(const AttnOpts& o, const Request& r) {
  const CpConfig& c = r.config;
  const AttentionProblem& p = r.problem;
  const DType dtype = p.dtype;
  const bool numerics = !o.dry_run;
  // A dry run models shapes only: inputs it would ignore are an error, not a silent no-op.
  for (auto [option, path] : {std::pair{"--q", &o.q}, std::pair{"--k", &o.k},
                              std::pair{"--v", &o.v}, std::pair{"--dout", &o.dout}})
    COCEMU_CHECK_ARG(numerics || path->empty(),
                     "{} '{}': --dry-run models shapes only and would ignore this input; drop "
                     "one of the two",
                     option, *path);
  // Outputs are checked before the run, not after it.
  if (!o.out_dir.empty()) {
    COCEMU_CHECK_ARG(numerics, "--out-dir needs real numerics (not --dry-run)");
    check_output_dir("--out-dir", o.out_dir);
  }
  for (auto [option, path] :
       {std::pair{"--json", &o.json}, std::pair{"--trace", &o.trace}, std::pair{"--svg", &o.svg}})
    if (!path->empty()) check_output_file(option, *path);
  if (numerics) {
    COCEMU_CHECK_ARG(dtype == DType::f32 || dtype == DType::f64,
                     "--dtype {}: real numerics run in f32 or f64 (bf16 and f16 with --dry-run)",
                     o.dtype);
    // q, k, v, dout, out, dq, dk, dv, plus each rank's shards, kernel layouts and blocks.
    const std::string what = fmt::format(
        "attention with --batch {} --seq {} --heads {} "
        "--head-dim {}",
        p.batch, p.seq, r.heads, p.head_dim);
    check_estimate(bench::estimate_attention(p.batch, p.seq, p.heads, p.kv_heads, p.head_dim,
                                             int(size_of(dtype)), c.context_parallel_size,
                                             c.attention_mask_type == "causal" ? 0.5 : 1.0, what),
                   time_budget(o.max_seconds));
  }
  Tensor q, k, v, dout;
  if (numerics) {
    q = o.q.empty() ? random_sbh(p.seq, p.batch, p.heads, p.head_dim, dtype, o.seed)
                    : load_sbh(o.q, p.seq, p.batch, p.heads, p.head_dim, dtype, "q");
    k = o.k.empty() ? random_sbh(p.seq, p.batch, p.kv_heads, p.head_dim, dtype, o.seed + 1)
                    : load_sbh(o.k, p.seq, p.batch, p.kv_heads, p.head_dim, dtype, "k");
    v = o.v.empty() ? random_sbh(p.seq, p.batch, p.kv_heads, p.head_dim, dtype, o.seed + 2)
                    : load_sbh(o.v, p.seq, p.batch, p.kv_heads, p.head_dim, dtype, "v");
    dout = o.dout.empty() ? random_sbh(p.seq, p.batch, p.heads, p.head_dim, dtype, o.seed + 3)
                          : load_sbh(o.dout, p.seq, p.batch, p.heads, p.head_dim, dtype, "dout");
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
  wo.n_ranks = o.cp;
  // Under mpirun every process is one host of the world: each runs its ranks, host 0 reports.
  wo.hosts = started_by_mpirun() ? mpi_hosts() : nullptr;
  wo.numerics = numerics;
  wo.profile = std::make_shared<const DeviceProfile>(load_named_profile(o.profile));
  std::mutex mu;
  std::vector<std::uint32_t> boundary(std::size_t(o.cp), 0);  // first backward op, by rank
  std::vector<TransferRecord> fwd_xfer, bwd_xfer;
  RunResult run_result = run(wo, [&](Rank& rank) {
    Group world = Group::world(rank);
    CpAttention attn(world, c, p);
    const auto& pos = attn.positions();
    rank.set_segment("attention forward");
    auto res = attn.forward(rows_of(q, pos), rows_of(k, pos), rows_of(v, pos));
    const auto fx = attn.transfers();
    const std::uint32_t b = std::uint32_t(rank.graph().ops.size());
    rank.set_segment("attention backward");
    auto g = attn.backward(rows_of(dout, pos));
    rank.set_segment("");
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
  if (HostLink* link = wo.hosts.get()) {
    // Each host wrote its ranks' rows (and boundaries) and left the others zero.
    const auto merge = [&](void* p, std::size_t n, const char* what) {
      merge_disjoint_parts(*link, {static_cast<std::byte*>(p), n}, what);
    };
    merge(boundary.data(), boundary.size() * sizeof(std::uint32_t), "attention boundaries");
    if (numerics)
      for (auto [t, name] :
           {std::pair{&out, "out"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}, {&lse, "lse"}})
        merge(t->raw(), t->nbytes(), name);
    if (link->host() != 0) {
      std::printf("cocemu attention: %s ran ranks %d..%d over %s; host 0 reports\n",
                  link->describe().c_str(), link->host() * (o.cp / link->n_hosts()),
                  (link->host() + 1) * (o.cp / link->n_hosts()) - 1, link->transport().c_str());
      return;
    }
    std::printf("# %d hosts over %s; this is host 0\n", link->n_hosts(), link->transport().c_str());
  }
  // Modeled report. The ranks of a causal ring run different blocks (the first gets later
  // ranks' blocks cut to half their queries), so each pass is reported from the rank that ends
  // it: its time, its compute and what of its time no compute covers.
  const bench::CpPassTimes t = bench::cp_pass_times(run_result, boundary);
  std::printf("# cocemu attention: %s (%s, window %d%s), %s%s\n", bench::cp_label(c).c_str(),
              c.context_parallel_algo.c_str(), c.cp_window_size,
              c.context_parallel_algo == "hybrid_cp_algo"
                  ? fmt::format(", Ulysses degree {}", c.ulysses_degree_in_cp).c_str()
                  : "",
              describe_request(r, wo.profile->name).c_str(),
              numerics ? "" : "  [DRY RUN: shapes only, numerics skipped]");
  std::printf(
      "modeled forward  %12.1f us   compute %12.1f us   exposed comm %12.1f us   (rank %d, "
      "the last to finish)\n",
      t.forward_ns / 1e3, t.forward_compute_ns / 1e3, (t.forward_ns - t.forward_compute_ns) / 1e3,
      t.forward_rank);
  std::printf(
      "modeled backward %12.1f us   compute %12.1f us   exposed comm %12.1f us   (rank %d, "
      "the last to finish)\n",
      t.backward_ns / 1e3, t.backward_compute_ns / 1e3,
      (t.backward_ns - t.backward_compute_ns) / 1e3, t.backward_rank);
  std::uint64_t fb = 0, bb = 0;
  for (const auto& x : fwd_xfer)
    fb += x.bytes;
  for (const auto& x : bwd_xfer)
    bb += x.bytes;
  std::printf("rank 0 sent: forward %s in %zu steps, backward %s in %zu steps\n",
              format_bytes(fb).c_str(), fwd_xfer.size(), format_bytes(bb).c_str(), bwd_xfer.size());
  std::printf("host wall time %.1f ms%s\n", run_result.wall_ns / 1e6, numerics ? "" : " (dry run)");
  if (o.steps) {
    std::printf("rank 0 steps:  %-8s %-44s %12s %12s\n", "lane", "op", "start us", "dur us");
    for (const OpRecord& op : run_result.graph.ranks[0].ops) {
      if (!((op.lane == 1 && op.name.rfind("attn ", 0) == 0) ||
            (op.lane != 0 && op.cls == OpClass::comm)))
        continue;
      const ScheduledOp& s = run_result.timeline.at({0, op.index});
      std::printf("  %-8s %-44s %12.1f %12.1f\n", op.lane == 1 ? "compute" : "comm",
                  op.name.c_str(), s.start_ns / 1e3, (s.end_ns - s.start_ns) / 1e3);
    }
  } else {
    std::printf(
        "(--steps lists rank 0's kernels and transfers; --compare models every algorithm and "
        "window for this request)\n");
  }
  if (!o.trace.empty()) write_chrome_trace(run_result, o.trace);
  if (!o.svg.empty())
    write_svg_timeline(
        run_result, o.svg,
        fmt::format("cocemu attention: {} ({}) — cp {}, S={}, {} heads (KV {}) "
                    "per rank, {} mask, overlap {}",
                    bench::cp_label(c), c.context_parallel_algo, c.context_parallel_size, p.seq,
                    p.heads, p.kv_heads, c.attention_mask_type,
                    c.use_cp_send_recv_overlap ? "on" : "off"));
  if (!o.out_dir.empty()) {
    auto four_d = [&](const Tensor& x, std::int64_t H) {
      return x.reshape({p.seq, p.batch, H, p.head_dim});
    };
    write_npy(o.out_dir + "/out.npy", four_d(out, p.heads));
    write_npy(o.out_dir + "/lse.npy", lse);
    write_npy(o.out_dir + "/dq.npy", four_d(dq, p.heads));
    write_npy(o.out_dir + "/dk.npy", four_d(dk, p.kv_heads));
    write_npy(o.out_dir + "/dv.npy", four_d(dv, p.kv_heads));
    std::printf("wrote %s/{out,lse,dq,dk,dv}.npy\n", o.out_dir.c_str());
  }
  if (!o.json.empty())
    write_file("--json", o.json,
               nlohmann::json{{"dry_run", !numerics},
                              {"configuration", bench::cp_label(c)},
                              {"heads_per_rank", p.heads},
                              {"kv_heads_per_rank", p.kv_heads},
                              {"tp", r.tp},
                              {"head_dim", p.head_dim},
                              {"seq", p.seq},
                              {"batch", p.batch},
                              {"dtype", name_of(dtype)},
                              {"forward_ns", t.forward_ns},
                              {"backward_ns", t.backward_ns},
                              {"forward_exposed_comm_ns", t.forward_ns - t.forward_compute_ns},
                              {"backward_exposed_comm_ns", t.backward_ns - t.backward_compute_ns},
                              {"wall_ns", run_result.wall_ns}}
                       .dump(2) +
                   "\n");
}

}  // namespace

void add_attention(CLI::App& app) {
  auto o = std::make_shared<AttnOpts>();
  CLI::App* sub = app.add_subcommand(
      "attention",
      "context-parallel attention: one configuration (npy in/out, or --dry-run for modeled "
      "times), every algorithm and window side by side (--compare, --sensitivity), or the local "
      "kernel benchmark (--bench)");
  // What to run.
  number(sub, "--cp", o->cp, "context_parallel_size: ranks the sequence is split over", 1, 64);
  sub->add_option("--algo", o->algo,
                  "context_parallel_algo: megatron_cp_algo (ring; double ring with --window > 1) "
                  "| ulysses_cp_algo | hybrid_cp_algo (Ulysses inside, ring across)")
      ->capture_default_str();
  sub->add_option("--window", o->window,
                  "cp_window_size: ranks in the inner ring of a double ring (1 = plain ring); "
                  "must divide the ring size and be smaller")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--ulysses-degree", o->ulysses,
                  "ulysses_degree_in_cp: Ulysses ranks inside hybrid_cp_algo (0 = not set; "
                  "other algorithms refuse it)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  sub->add_option("--tp", o->tp,
                  "tensor_model_parallel_size: --heads and --kv-heads are divided by it, as "
                  "Megatron splits heads over TP ranks")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--mask", o->mask,
                  "attention_mask_type: causal | general (general needs --mask-file; a mask file "
                  "alone means general)")
      ->capture_default_str();
  sub->add_option("--mask-file", o->mask_file,
                  "general mask: .npy bool or uint8 [seq, seq], true = the query (row) sees the "
                  "key (column)");
  sub->add_flag("--overlap", o->overlap,
                "use_cp_send_recv_overlap: ring sends and receives on separate communicators");
  sub->add_option("--layout", o->layout,
                  "kernel layout: bnsd (megatron_cp_in_bnsd) | sbh; tensors are stored SBH")
      ->capture_default_str();
  // Shapes.
  sub->add_option("--model", o->model,
                  "model config (name under configs/models/ or a path): sets --heads, --kv-heads "
                  "and --head-dim, and --seq / --batch unless given");
  number(sub, "--batch", o->batch, "micro-batch size (sequences)", std::int64_t(1),
         std::int64_t(1) << 20);
  number(sub, "--heads", o->heads,
         "attention heads of the model, all TP ranks together (Megatron's num_attention_heads); "
         "each rank computes heads / --tp",
         std::int64_t(1), std::int64_t(1) << 16);
  number(sub, "--kv-heads", o->kv_heads,
         "KV heads of the model, all TP ranks together (num_query_groups; GQA/MQA when fewer "
         "than --heads); 0 = as many as --heads",
         std::int64_t(0), std::int64_t(1) << 16);
  number(sub, "--seq", o->seq,
         "sequence length in tokens (the whole sequence, before the CP split)", std::int64_t(1),
         std::int64_t(1) << 24);
  number(sub, "--head-dim", o->head_dim, "head size (elements per head)", std::int64_t(1),
         std::int64_t(1) << 12);
  sub->add_option("--dtype", o->dtype,
                  "f64 | f32 | bf16 | f16; auto = f64 for real numerics (exact checks), bf16 when "
                  "modeled only (--dry-run, --compare, --sensitivity); bf16/f16 are modeled only")
      ->capture_default_str();
  // Inputs and outputs of a real-numerics run.
  sub->add_option("--q", o->q, "query input, .npy [seq, batch, heads per rank, head-dim]");
  sub->add_option("--k", o->k, "key input, .npy [seq, batch, KV heads per rank, head-dim]");
  sub->add_option("--v", o->v, "value input, .npy [seq, batch, KV heads per rank, head-dim]");
  sub->add_option("--dout", o->dout,
                  "output gradient, .npy [seq, batch, heads per rank, head-dim]");
  sub->add_option("--seed", o->seed, "seed of the random inputs used when no .npy is given")
      ->check(CLI::Range(std::uint64_t(0), std::uint64_t(INT64_MAX)))
      ->capture_default_str();
  sub->add_option("--out-dir", o->out_dir,
                  "write out, lse, dq, dk, dv here as .npy (out/dq/dk/dv [seq, batch, heads, "
                  "head-dim], lse [batch, heads, seq])");
  sub->add_option("--profile", o->profile,
                  "device profile (name under configs/devices/ or a path): prices the modeled "
                  "times")
      ->capture_default_str();
  sub->add_flag("--dry-run", o->dry_run,
                "shapes only: numerics skipped, modeled times in microseconds reported");
  sub->add_flag("--steps", o->steps,
                "list rank 0's kernels and transfers with modeled start and duration (us)");
  sub->add_option("--trace", o->trace, "write the modeled Chrome trace JSON (Perfetto) here");
  sub->add_option("--svg", o->svg,
                  "write the SVG timeline here (forward and backward marked as bands)");
  sub->add_option("--json", o->json,
                  "write results as JSON: times in ns (forward_ns, backward_ns, …; with --compare "
                  "every configuration)");
  max_seconds_option(sub, o->max_seconds);
  // Choosing.
  sub->add_flag("--compare", o->compare,
                "model every algorithm and window MindSpeed accepts for this request — ring, each "
                "double-ring window, Ulysses, hybrid with each Ulysses degree inside a node — "
                "and print forward/backward ms of each, the best marked, with its flags");
  sub->add_flag("--sensitivity", o->sensitivity,
                "--compare, and model it again with each assumption of the profile scaled x0.5 "
                "and x2: says whether the best configuration (and each best window) changes");
  // The kernel benchmark.
  sub->add_flag("--bench", o->bench,
                "local f32 flash attention forward vs sgemm on this host, GFLOP/s (use --seq 4096 "
                "--head-dim 128 --heads 8)");
  sub->add_flag("--causal-bench", o->causal_bench, "benchmark with a causal mask");
  sub->callback([o, sub] {
    if (o->bench) {
      for (const char* other : {"--model", "--compare", "--sensitivity", "--dry-run"})
        COCEMU_CHECK_ARG(sub->count(other) == 0,
                         "--bench times the local kernel on this host with --seq, --heads and "
                         "--head-dim; {} does not apply to it",
                         other);
      return run_bench(*o);
    }
    Request r;
    resolve_shapes(*o, *sub, r);
    resolve_config(*o, *sub, r);
    if (o->compare || o->sensitivity) return run_compare(*o, r);
    run_one(*o, r);
  });
}

}  // namespace cocemu::cli
