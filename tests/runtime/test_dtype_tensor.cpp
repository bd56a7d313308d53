// dtypes and tensors (R-RT-4): round-to-nearest-even conversions with NaN/Inf preserved, views,
// and clear errors for bad shapes and accesses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "cocemu/runtime/tensor.h"
#include "testing.h"

namespace cocemu {
namespace {

using testing::expect_error;

// Reference f32 -> f16 rounding by exhaustive search over neighbouring half values (slow, exact).
double half_value(std::uint16_t bits) {
  return double(to_float(f16{bits}));
}

TEST(DType, F16RoundTripsEveryValue) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const f16 h{std::uint16_t(b)};
    const float f = to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(to_f16(f)))) << b;
      continue;
    }
    EXPECT_EQ(to_f16(f).bits, h.bits) << "half bits " << b << " value " << f;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // Midpoints between consecutive finite halves round to the even one.
  for (std::uint16_t b = 0; b < 0x7bff; b += 7) {
    const double lo = half_value(b), hi = half_value(std::uint16_t(b + 1));
    const float mid = float((lo + hi) / 2);  // exact in f32: halves have 11 significant bits
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    const std::uint16_t even = (b & 1) ? std::uint16_t(b + 1) : b;
    EXPECT_EQ(to_f16(mid).bits, even) << "between " << lo << " and " << hi;
    EXPECT_EQ(to_f16(std::nextafter(mid, 0.0f)).bits, b);
    EXPECT_EQ(to_f16(std::nextafter(mid, 1e9f)).bits, std::uint16_t(b + 1));
  }
  EXPECT_EQ(to_f16(65504.0f).bits, 0x7bff);  // largest finite
  EXPECT_EQ(to_f16(65519.0f).bits, 0x7bff);  // below the midpoint to 65536
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00);  // midpoint rounds to even = infinity
  EXPECT_EQ(to_f16(-1e30f).bits, 0xfc00);
  EXPECT_EQ(to_f16(5.9604645e-08f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(to_f16(2.9802322e-08f).bits, 0x0000);  // half of it: tie to even (zero)
  EXPECT_EQ(to_f16(2.9802326e-08f).bits, 0x0001);  // just above the tie
}

TEST(DType, Bf16RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(to_bf16(1.00390625f).bits, 0x3f80);
  // 1 + 3·2^-8 is the midpoint between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(to_bf16(1.01171875f).bits, 0x3f82);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must stay NaN (not become Inf).
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(to_float(to_f16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(to_f16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  for (std::uint32_t b = 0; b < 65536; b += 3) {
    const bf16 v{std::uint16_t(b)};
    if (!std::isnan(to_float(v))) {
      EXPECT_EQ(to_bf16(to_float(v)).bits, v.bits);
    }
  }
}

TEST(DType, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  expect_error([] { parse_dtype("f8"); }, Errc::invalid_argument, {"'f8'", "allowed"});
}

TEST(Tensor, ViewsShareStorage) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i)
    v[i] = float(i);
  Tensor t = Tensor::from<float>({4, 6}, v);
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 6}));
  EXPECT_EQ(r.item(0), 6.0);
  r.data<float>()[0] = 100;
  EXPECT_EQ(t.item(6), 100.0);
  Tensor m = t.reshape({2, 3, 4});
  EXPECT_EQ(m.ndim(), 3);
  EXPECT_EQ(m.item(23), 23.0);
  EXPECT_EQ(t.flat(20, 24).item(3), 23.0);
  EXPECT_TRUE(t.overlaps(r));
  EXPECT_FALSE(t.rows(0, 1).overlaps(t.rows(1, 2)));
  Tensor c = t.clone();
  c.data<float>()[0] = -1;
  EXPECT_EQ(t.item(0), 0.0);
}

TEST(Tensor, ConvertsWithRounding) {
  std::vector<double> v{1.0, 1.00390625, 65520.0, -0.0, std::numeric_limits<double>::infinity()};
  Tensor t = Tensor::from<double>({5}, v, DType::f32);
  Tensor h = t.to(DType::f16);
  EXPECT_EQ(h.data<f16>()[0].bits, 0x3c00);
  EXPECT_EQ(h.data<f16>()[2].bits, 0x7c00);
  EXPECT_EQ(h.data<f16>()[3].bits, 0x8000);
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.data<bf16>()[1].bits, 0x3f80);
  EXPECT_TRUE(std::isinf(b.item(4)));
  Tensor i = Tensor::from<double>({2}, std::vector<double>{3.0, -7.0}, DType::i32);
  EXPECT_EQ(i.data<std::int32_t>()[1], -7);
}

TEST(Tensor, BadInputGivesClearErrors) {
  Tensor t = Tensor::zeros({4, 3}, DType::f32);
  expect_error([&] { t.rows(2, 5); }, Errc::invalid_argument,
               {"rows [2, 5)", "f32[4, 3]", "4 rows"});
  expect_error([&] { t.reshape({5, 2}); }, Errc::invalid_argument, {"12 elements", "[5, 2]"});
  expect_error([&] { t.data<double>(); }, Errc::invalid_argument, {"f32[4, 3]", "f64"});
  expect_error(
      [] {
        Shape({1, 2, 3, 4, 5});
      },
      Errc::invalid_argument, {"5 dimensions", "at most 4"});
  expect_error([] { Shape({2, -1}); }, Errc::invalid_argument, {"-1"});
  Tensor s = Tensor::shape_only({2, 2}, DType::f32);
  expect_error([&] { s.raw(); }, Errc::invalid_argument, {"shape-only", "dry-run"});
  expect_error(
      [] {
        Tensor::from<float>({3}, std::vector<float>{1, 2});
      },
      Errc::invalid_argument, {"2 values", "[3]"});
}

TEST(Tensor, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512B");
  EXPECT_EQ(format_bytes(4096), "4KiB");
  EXPECT_EQ(format_bytes(2621440), "2.5MiB");
}

TEST(Tensor, EmptyStorageIsPoisonedInTests) {
  // The test library sets COCEMU_POISON_EMPTY=1: unwritten output elements read as NaN.
  ASSERT_STREQ(std::getenv("COCEMU_POISON_EMPTY"), "1");
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor e = Tensor::empty({5, 3}, t);
    for (std::int64_t i = 0; i < e.numel(); ++i)
      EXPECT_TRUE(std::isnan(e.item(i))) << name_of(t) << " element " << i;
  }
  EXPECT_EQ(Tensor::zeros({7}, DType::f32).item(6), 0.0);
}

}  // namespace
}  // namespace cocemu
