#pragma once
/// Element types. f16 and bf16 are storage types: arithmetic converts them to f32, accumulates in
/// f32 and rounds once when storing (round-to-nearest-even, NaN and Inf preserved). Integers
/// accumulate in i32 (i64 in i64) and wrap like the device's; `boolean` (PyTorch's bool, one
/// byte 0 or 1) reduces as NCCL does: sum and max are a logical or, prod and min a logical and.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cocemu {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i8, i32, i64, u8, boolean };

constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i8:
      return 1;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
    case DType::boolean:
      return 1;
  }
  return 0;
}

constexpr std::string_view name_of(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i8:
      return "i8";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

/// Parses "f32", "float32", "bf16", "i64", "bool" …; throws a clear error for anything else.
DType parse_dtype(std::string_view text);

/// IEEE 754 binary16, stored as bits.
struct f16 {
  std::uint16_t bits = 0;
};
/// bfloat16 (the upper half of an f32), stored as bits.
struct bf16 {
  std::uint16_t bits = 0;
};

constexpr float to_float(bf16 v) {
  return std::bit_cast<float>(std::uint32_t(v.bits) << 16);
}

constexpr bf16 to_bf16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((x >> 16) | 0x40u)};  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even
  return bf16{std::uint16_t(x >> 16)};
}

constexpr float to_float(f16 v) {
  const std::uint32_t sign = std::uint32_t(v.bits & 0x8000u) << 16;
  const std::uint32_t exp = (v.bits >> 10) & 0x1fu;
  std::uint32_t mant = v.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal: normalise the mantissa.
  int e = -1;
  do {
    ++e;
    mant <<= 1;
  } while ((mant & 0x400u) == 0);
  return std::bit_cast<float>(sign | std::uint32_t(112 - e) << 23 | ((mant & 0x3ffu) << 13));
}

constexpr f16 to_f16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u)  // Inf or NaN (NaN stays quiet and keeps its top payload bits)
    return f16{
        std::uint16_t(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u))};
  if (x >= 0x477ff000u) return f16{std::uint16_t(sign | 0x7c00u)};  // rounds to infinity
  const std::uint32_t e = x >> 23;
  if (e < 113) {  // result is subnormal (or zero)
    const std::uint32_t shift = 126 - e;
    if (shift > 24) return f16{sign};
    const std::uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return f16{std::uint16_t(sign | q)};
  }
  std::uint32_t r = ((e - 112u) << 10) | ((x >> 13) & 0x3ffu);
  const std::uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return f16{std::uint16_t(sign | r)};
}

/// Maps a C++ element type to its DType.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<std::int8_t>() {
  return DType::i8;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

/// Calls `fn(T{})` with the C++ type matching `t`.
template <class Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::f16:
      return fn(f16{});
    case DType::bf16:
      return fn(bf16{});
    case DType::i8:
      return fn(std::int8_t{});
    case DType::i32:
      return fn(std::int32_t{});
    case DType::i64:
      return fn(std::int64_t{});
    case DType::u8:
      return fn(std::uint8_t{});
    case DType::boolean:
      return fn(bool{});
  }
  return fn(float{});
}

/// The accumulation type of reductions and matmuls: f32 for 16-bit floats, f64 for f64, i64 for
/// i64, i32 for the other integers and bool.
template <class T>
struct acc_type {
  using type = float;
};
template <>
struct acc_type<double> {
  using type = double;
};
template <>
struct acc_type<std::int8_t> {
  using type = std::int32_t;
};
template <>
struct acc_type<std::int32_t> {
  using type = std::int32_t;
};
template <>
struct acc_type<std::int64_t> {
  using type = std::int64_t;
};
template <>
struct acc_type<std::uint8_t> {
  using type = std::int32_t;
};
template <>
struct acc_type<bool> {
  using type = std::int32_t;
};
template <class T>
using acc_t = typename acc_type<T>::type;

/// Widening load and narrowing (rounding) store between storage and accumulation types.
template <class A, class T>
constexpr A load_as(T v) {
  if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>)
    return A(to_float(v));
  else
    return A(v);
}
template <class T, class A>
constexpr T store_as(A v) {
  if constexpr (std::is_same_v<T, f16>)
    return to_f16(float(v));
  else if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(float(v));
  else
    return T(v);
}

}  // namespace cocemu
