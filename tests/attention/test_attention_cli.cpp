// `cocemu attention`: .npy inputs to .npy outputs equal to the dense reference; the dry run says
// so.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "attention_testing.h"
#include "cocemu/runtime/npy.h"

namespace cocemu::attn {
namespace {

TEST(AttentionCli, NpyInputsGiveReferenceOutputs) {
  const std::string dir = ::testing::TempDir() + "/cocemu_attn_cli";
  std::filesystem::create_directories(dir);
  AttentionProblem p{2, 4, 2, 32, 8, DType::f64, nullptr, 0};
  const testing::Full in = testing::random_inputs(p, 77);
  write_npy(dir + "/q.npy", in.q.reshape({32, 2, 4, 8}));
  write_npy(dir + "/k.npy", in.k.reshape({32, 2, 2, 8}));
  write_npy(dir + "/v.npy", in.v);
  write_npy(dir + "/dout.npy", in.dout);
  int status = 0;
  const std::string out = cocemu::testing::run_command(
      fmt::format(
          "{} attention --cp 4 --algo hybrid_cp_algo --ulysses-degree 2 --batch 2 --heads 4 "
          "--kv-heads 2 --seq 32 --head-dim 8 --q {d}/q.npy --k {d}/k.npy --v {d}/v.npy "
          "--dout {d}/dout.npy --out-dir {d}/res",
          COCEMU_BINARY, fmt::arg("d", dir)),
      &status);
  ASSERT_EQ(status, 0) << out;
  std::vector<std::int64_t> pos(32);
  for (int i = 0; i < 32; ++i)
    pos[std::size_t(i)] = i;
  AttentionArgs a;
  a.shape = {2, 4, 2, 32, 32, 8};
  a.layout = Layout::sbh;
  a.mask.kind = MaskKind::causal;
  a.q_pos = a.k_pos = &pos;
  Tensor ro = Tensor::zeros(in.q.shape(), DType::f64), rl = Tensor::zeros({2, 4, 32}, DType::f64);
  Tensor rq = ro.clone(), rk = Tensor::zeros(in.k.shape(), DType::f64), rv = rk.clone();
  reference_attention(a, in.q, in.k, in.v, ro, rl);
  reference_attention_backward(a, in.q, in.k, in.v, in.dout, rq, rk, rv);
  const Tensor o = read_npy(dir + "/res/out.npy");
  EXPECT_EQ(o.shape(), (Shape{32, 2, 4, 8}));
  EXPECT_LE(testing::rel_error(o.reshape(ro.shape()), ro), 1e-12);
  EXPECT_LE(testing::rel_error(read_npy(dir + "/res/lse.npy"), rl), 1e-12);
  EXPECT_LE(testing::rel_error(read_npy(dir + "/res/dq.npy").reshape(rq.shape()), rq), 1e-12);
  EXPECT_LE(testing::rel_error(read_npy(dir + "/res/dk.npy").reshape(rk.shape()), rk), 1e-12);
  EXPECT_LE(testing::rel_error(read_npy(dir + "/res/dv.npy").reshape(rv.shape()), rv), 1e-12);
}

TEST(AttentionCli, DryRunIsLabelledAndBadOptionsAreErrors) {
  int status = 0;
  std::string out = cocemu::testing::run_command(
      fmt::format("{} attention --dry-run --cp 16 --seq 32768 --heads 32 "
                  "--kv-heads 8 --head-dim 128 --dtype bf16 --overlap",
                  COCEMU_BINARY),
      &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("DRY RUN: shapes only, numerics skipped"), std::string::npos) << out;
  EXPECT_NE(out.find("modeled forward"), std::string::npos);
  EXPECT_NE(out.find("exposed comm"), std::string::npos);
  // A causal ring's forward ends on its last rank: the one whose blocks from earlier ranks are
  // cut to half their keys (fewer keys per row: the slowest kernels).
  EXPECT_NE(out.find("(rank 15, the last to finish)"), std::string::npos) << out;
  out = cocemu::testing::run_command(
      fmt::format("{} attention --cp 4 --algo ulysses_cp_algo --heads 6", COCEMU_BINARY), &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("num_attention_heads 6"), std::string::npos) << out;
}

TEST(Npy, RoundTripsEveryDtype) {
  const std::string path = ::testing::TempDir() + "/cocemu_npy_test.npy";
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i8}) {
    Tensor x = Tensor::from<double>({2, 3}, std::vector<double>{1, -2, 3, 4, 5, -6}, t);
    write_npy(path, x);
    EXPECT_TRUE(read_npy(path).bitwise_equal(x)) << name_of(t);
  }
  cocemu::testing::expect_error([] { read_npy("/nonexistent.npy"); }, Errc::invalid_argument,
                                {"/nonexistent.npy"});
}

}  // namespace
}  // namespace cocemu::attn
