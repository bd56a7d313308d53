#include "cocemu/layers/detail/kernels.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/det_gemm.h"
#include "cocemu/runtime/error.h"

namespace cocemu::layers::detail {

Tensor alloc(const Rank& rank, const Shape& shape, DType dtype) {
  return rank.numerics() ? Tensor::zeros(shape, dtype) : Tensor::shape_only(shape, dtype);
}

Tensor alloc_out(const Rank& rank, const Shape& shape, DType dtype) {
  return rank.numerics() ? Tensor::empty(shape, dtype) : Tensor::shape_only(shape, dtype);
}

double gemm_cost_ns(const Rank& rank, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                    GemmLayout layout, SocPricing soc) {
  if (soc.weight_col_major) layout.trans_b = true;
  return gemm_ns(rank.profile(), m, n, soc.padded_k > 0 ? soc.padded_k : k, dtype, layout);
}

void gemm_now(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c,
              bool deterministic) {
  const std::int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const std::int64_t n = tb ? b.size(0) : b.size(1), kb = tb ? b.size(1) : b.size(0);
  COCEMU_CHECK_ARG(k == kb && c.size(0) == m && c.size(1) == n && a.dtype() == b.dtype() &&
                       a.dtype() == c.dtype(),
                   "matmul: {}{} · {}{} -> {} do not fit", a.describe(), ta ? "ᵀ" : "",
                   b.describe(), tb ? "ᵀ" : "", c.describe());
  if (m == 0 || n == 0) return;
  switch (a.dtype()) {
    case DType::f32:
      if (deterministic)
        blas::det_gemm(m, n, k, a.data<float>(), a.size(1), ta, b.data<float>(), b.size(1), tb,
                       c.data<float>(), n);
      else
        blas::gemm_raw(ta, tb, m, n, k, 1.0f, a.data<float>(), a.size(1), b.data<float>(),
                       b.size(1), 0.0f, c.data<float>(), n);
      return;
    case DType::f64:
      if (deterministic)
        blas::det_gemm(m, n, k, a.data<double>(), a.size(1), ta, b.data<double>(), b.size(1), tb,
                       c.data<double>(), n);
      else
        blas::gemm_raw(ta, tb, m, n, k, 1.0, a.data<double>(), a.size(1), b.data<double>(),
                       b.size(1), 0.0, c.data<double>(), n);
      return;
    case DType::f16:
    case DType::bf16: {
      Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32),
             c32 = Tensor::zeros(c.shape(), DType::f32);
      gemm_now(a32, ta, b32, tb, c32, deterministic);
      c.copy_from(c32.to(c.dtype()));
      return;
    }
    default:
      COCEMU_FAIL(Errc::invalid_argument,
                  "matmul: dtype {} unsupported; allowed f32, f64, f16, bf16", name_of(a.dtype()));
  }
}

void WeightOperand::gemm_now(const Tensor& a, const Tensor& c) const {
  if (!deterministic_ || a.dtype() != DType::f32 || w_.dtype() != DType::f32 ||
      c.dtype() != DType::f32 || a.size(0) == 0) {
    detail::gemm_now(a, false, w_, trans_, c, deterministic_);
    return;
  }
  const std::int64_t k = trans_ ? w_.size(1) : w_.size(0), n = trans_ ? w_.size(0) : w_.size(1);
  COCEMU_CHECK_ARG(a.size(1) == k && c.size(0) == a.size(0) && c.size(1) == n,
                   "matmul: {} · {}{} -> {} do not fit", a.describe(), w_.describe(),
                   trans_ ? "ᵀ" : "", c.describe());
  std::call_once(packed_once_, [&] {
    packed_ = std::make_unique<blas::PackedB>(w_.data<float>(), w_.size(1), trans_, k, n);
  });
  blas::det_gemm(a.size(0), a.data<float>(), k, false, *packed_, c.data<float>(), n);
}

void matmul(Rank& rank, const std::string& name, const Tensor& a,
            std::shared_ptr<const WeightOperand> w, const Tensor& c, SocPricing soc) {
  const std::int64_t m = a.size(0), k = a.size(1), n = c.size(1);
  rank.current_stream().launch(
      {.name = fmt::format("{} {}x{}x{}", name, m, k, n),
       .cls = OpClass::compute,
       .work_ns = gemm_cost_ns(rank, m, n, k, a.dtype(), {false, w->transposed()}, soc),
       .flops = std::uint64_t(2 * m * n * k),
       .hbm_bytes = std::uint64_t(gemm_memory_bytes(m, n, k, a.dtype()))},
      [=] { w->gemm_now(a, c); });
}

void matmul(Rank& rank, const std::string& name, const Tensor& a, bool ta, const Tensor& b, bool tb,
            const Tensor& c, SocPricing soc) {
  const std::int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const std::int64_t n = tb ? b.size(0) : b.size(1);
  rank.current_stream().launch({.name = fmt::format("{} {}x{}x{}", name, m, k, n),
                                .cls = OpClass::compute,
                                .work_ns = gemm_cost_ns(rank, m, n, k, a.dtype(), {ta, tb}, soc),
                                .flops = std::uint64_t(2 * m * n * k),
                                .hbm_bytes = std::uint64_t(gemm_memory_bytes(m, n, k, a.dtype()))},
                               [=, det = rank.deterministic()] { gemm_now(a, ta, b, tb, c, det); });
}

void add_bias_now(const Tensor& y, const Tensor& bias) {
  const std::int64_t m = y.size(0), n = y.size(1);
  visit_dtype(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    T* p = y.data<T>();
    const T* b = bias.data<T>();
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        p[i * n + j] = store_as<T>(A(load_as<A>(p[i * n + j]) + load_as<A>(b[j])));
  });
}

void add_bias(Rank& rank, const Tensor& y, const Tensor& bias) {
  if (!bias.defined()) return;
  rank.current_stream().launch({.name = "bias add",
                                .cls = OpClass::compute,
                                .work_ns = memory_ns(rank.profile(), 2 * y.nbytes()),
                                .hbm_bytes = std::uint64_t(2 * y.nbytes())},
                               [=] { add_bias_now(y, bias); });
}

namespace {

/// main_grad (f32, or f64 for f64 weights) += g, each element rounded once.
void add_into(const Tensor& main_grad, const Tensor& g) {
  if (main_grad.dtype() == DType::f64) {
    double* mg = main_grad.data<double>();
    const Tensor g64 = g.dtype() == DType::f64 ? g : g.to(DType::f64);
    const double* p = g64.data<double>();
    for (std::int64_t i = 0; i < main_grad.numel(); ++i)
      mg[i] += p[i];
    return;
  }
  float* mg = main_grad.data<float>();
  const Tensor g32 = g.dtype() == DType::f32 ? g : g.to(DType::f32);
  const float* p = g32.data<float>();
  for (std::int64_t i = 0; i < main_grad.numel(); ++i)
    mg[i] += p[i];
}

}  // namespace

DType grad_dtype(DType weight) {
  return weight == DType::f64 ? DType::f64 : DType::f32;
}

void accumulate(Rank& rank, const Tensor& main_grad, const Tensor& g) {
  rank.current_stream().launch({.name = "main_grad +=",
                                .cls = OpClass::compute,
                                .work_ns = memory_ns(rank.profile(), 3 * main_grad.nbytes()),
                                .hbm_bytes = std::uint64_t(3 * main_grad.nbytes())},
                               [=] { add_into(main_grad, g); });
}

void weight_grad(Rank& rank, const std::string& name, const Tensor& dy, const Tensor& x,
                 const Tensor& main_grad, bool fusion) {
  if (!fusion) {
    const Tensor dw = alloc(rank, main_grad.shape(), dy.dtype());
    matmul(rank, name, dy, true, x, false, dw);
    accumulate(rank, main_grad, dw);
    return;
  }
  const std::int64_t m = dy.size(0), n = dy.size(1), k = x.size(1);
  rank.current_stream().launch({.name = fmt::format("{} {}x{}x{} (+= main_grad)", name, n, m, k),
                                .cls = OpClass::compute,
                                .work_ns = gemm_cost_ns(rank, n, k, m, dy.dtype(), {true, false}),
                                .flops = std::uint64_t(2 * m * n * k),
                                .hbm_bytes = std::uint64_t(gemm_memory_bytes(n, k, m, dy.dtype()))},
                               [=, det = rank.deterministic()] {
                                 const DType wide = grad_dtype(dy.dtype());
                                 Tensor dw = Tensor::zeros(main_grad.shape(), wide);
                                 gemm_now(dy.dtype() == wide ? dy : dy.to(wide), true,
                                          x.dtype() == wide ? x : x.to(wide), false, dw, det);
                                 add_into(main_grad, dw);
                               });
}

void bias_grad(Rank& rank, const Tensor& db, const Tensor& dy) {
  if (!db.defined()) return;
  rank.current_stream().launch({.name = "bias grad",
                                .cls = OpClass::compute,
                                .work_ns = memory_ns(rank.profile(), dy.nbytes()),
                                .hbm_bytes = std::uint64_t(dy.nbytes())},
                               [=] {
                                 const Tensor d = dy.to(DType::f64);
                                 const std::int64_t m = d.size(0), n = d.size(1);
                                 float* out = db.data<float>();
                                 for (std::int64_t j = 0; j < n; ++j) {
                                   float s = 0;
                                   for (std::int64_t i = 0; i < m; ++i)
                                     s += float(d.data<double>()[i * n + j]);
                                   out[j] += s;
                                 }
                               });
}

void shuffle_rows(Rank& rank, const Tensor& src, const Tensor& dst, std::int64_t a,
                  std::int64_t b) {
  rank.current_stream().launch(
      {.name = fmt::format("reorder [{}, {}, per] -> [{}, {}, per]", a, b, b, a),
       .cls = OpClass::compute,
       .work_ns = memory_ns(rank.profile(), 2 * src.nbytes()),
       .hbm_bytes = std::uint64_t(2 * src.nbytes())},
      [=] {
        const std::int64_t rows = src.size(0), per = rows / (a * b);
        const std::size_t row_bytes = std::size_t(src.shape().row_numel()) * size_of(src.dtype());
        const auto* s = static_cast<const std::byte*>(src.raw());
        auto* d = static_cast<std::byte*>(dst.raw());
        for (std::int64_t i = 0; i < a; ++i)
          for (std::int64_t j = 0; j < b; ++j)
            std::memcpy(d + std::size_t((j * a + i) * per) * row_bytes,
                        s + std::size_t((i * b + j) * per) * row_bytes,
                        std::size_t(per) * row_bytes);
      });
}

void copy_columns(Rank& rank, const Tensor& narrow, const Tensor& wide, std::int64_t col0,
                  bool into_wide) {
  rank.current_stream().launch({.name = into_wide ? "place columns" : "take columns",
                                .cls = OpClass::compute,
                                .work_ns = memory_ns(rank.profile(), 2 * narrow.nbytes()),
                                .hbm_bytes = std::uint64_t(2 * narrow.nbytes())},
                               [=] {
                                 const std::int64_t m = narrow.size(0), w = narrow.size(1),
                                                    W = wide.size(1);
                                 const std::size_t e = size_of(narrow.dtype());
                                 auto* nb = static_cast<std::byte*>(narrow.raw());
                                 auto* wb = static_cast<std::byte*>(wide.raw());
                                 for (std::int64_t i = 0; i < m; ++i) {
                                   std::byte* wide_row = wb + std::size_t(i * W + col0) * e;
                                   std::byte* narrow_row = nb + std::size_t(i * w) * e;
                                   if (into_wide)
                                     std::memcpy(wide_row, narrow_row, std::size_t(w) * e);
                                   else
                                     std::memcpy(narrow_row, wide_row, std::size_t(w) * e);
                                 }
                               });
}

double at(const Tensor& t, std::int64_t i) {
  return t.item(i);
}

void set(const Tensor& t, std::int64_t i, double v) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    t.data<T>()[i] = store_as<T>(acc_t<T>(v));
  });
}

void rmsnorm(Rank& rank, const Tensor& x, const Tensor& y, const Tensor& rms) {
  elementwise(rank, "rmsnorm", 2 * x.nbytes(), [=] {
    const std::int64_t m = x.size(0), h = x.size(1);
    for (std::int64_t i = 0; i < m; ++i) {
      double ss = 0;
      for (std::int64_t j = 0; j < h; ++j)
        ss += at(x, i * h + j) * at(x, i * h + j);
      const double r = std::sqrt(ss / double(h) + 1e-6);  // eps
      rms.data<double>()[i] = r;
      for (std::int64_t j = 0; j < h; ++j)
        set(y, i * h + j, at(x, i * h + j) / r);
    }
  });
}

void rmsnorm_backward(Rank& rank, const Tensor& x, const Tensor& rms, const Tensor& dy,
                      const Tensor& accum) {
  elementwise(rank, "rmsnorm backward", 3 * x.nbytes(), [=] {
    const std::int64_t m = x.size(0), h = x.size(1);
    for (std::int64_t i = 0; i < m; ++i) {
      const double r = rms.data<double>()[i];
      double dot = 0;
      for (std::int64_t j = 0; j < h; ++j)
        dot += at(dy, i * h + j) * at(x, i * h + j) / r;
      dot /= double(h);
      for (std::int64_t j = 0; j < h; ++j) {
        const double xh = at(x, i * h + j) / r;
        set(accum, i * h + j, at(accum, i * h + j) + (at(dy, i * h + j) - xh * dot) / r);
      }
    }
  });
}

Tensor random_normal(const Shape& s, DType t, std::uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0, scale);
  std::vector<double> v(std::size_t(s.numel()));
  for (auto& x : v)
    x = d(rng);
  return Tensor::from<double>(s, v, t);
}

}  // namespace cocemu::layers::detail
