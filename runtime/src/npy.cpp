#include "cocemu/runtime/npy.h"

#include <fmt/ranges.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/runtime/limits.h"

namespace cocemu {

namespace {
const char* descr_of(DType t) {
  switch (t) {
    case DType::f32:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::i32:
      return "<i4";
    case DType::i8:
      return "|i1";
    case DType::f16:
      return "<f2";
    case DType::i64:
      return "<i8";
    case DType::u8:
      return "|u1";
    case DType::boolean:
      return "|b1";
    case DType::bf16:
      break;
  }
  COCEMU_FAIL(Errc::invalid_argument,
              "write_npy: dtype {} has no NumPy equivalent; allowed: f32, "
              "f64, f16, i32, i8, i64, u8, bool",
              name_of(t));
}
}  // namespace

namespace {

/// A strict reader of the header dict NumPy writes: {'descr': '<f4', 'fortran_order': False,
/// 'shape': (2, 3), } — string keys, and values that are strings, booleans or tuples of
/// non-negative integers. No regular expressions: input of any length is read in one pass.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  struct Header {
    std::string descr;
    bool fortran_order = false;
    std::vector<std::int64_t> shape;
  };

  Header parse() {
    Header h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip();
    expect('{');
    for (;;) {
      skip();
      if (peek() == '}') break;
      const std::string key = quoted();
      skip();
      expect(':');
      skip();
      if (key == "descr") {
        check(!seen_descr, "'descr' given twice");
        h.descr = quoted();
        seen_descr = true;
      } else if (key == "fortran_order") {
        check(!seen_order, "'fortran_order' given twice");
        h.fortran_order = boolean();
        seen_order = true;
      } else if (key == "shape") {
        check(!seen_shape, "'shape' given twice");
        h.shape = tuple();
        seen_shape = true;
      } else {
        fail(fmt::format("unknown header key '{}'; allowed: descr, fortran_order, shape",
                         printable(key)));
      }
      skip();
      if (peek() == ',')
        ++pos_;
      else
        check(peek() == '}', "expected ',' or '}' after a value");
    }
    ++pos_;
    for (; pos_ < s_.size(); ++pos_)  // padding to the alignment, then a newline
      check(s_[pos_] == ' ' || s_[pos_] == '\n', "unexpected text after the header dict");
    check(seen_descr && seen_order && seen_shape,
          "the header must give 'descr', 'fortran_order' and 'shape'");
    return h;
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n'))
      ++pos_;
  }
  [[noreturn]] void fail(const std::string& what) const {
    COCEMU_FAIL(Errc::invalid_argument, "'{}': bad .npy header at byte {}: {}", name_, pos_, what);
  }
  void check(bool ok, const char* what) const {
    if (!ok) fail(what);
  }
  void expect(char c) {
    check(peek() == c, fmt::format("expected '{}'", c).c_str());
    ++pos_;
  }
  static std::string printable(std::string_view v) {
    std::string out;
    for (char c : v.substr(0, 40))
      out += (c >= 32 && c < 127) ? c : '?';
    return v.size() > 40 ? out + "..." : out;
  }
  std::string quoted() {
    const char q = peek();
    check(q == '\'' || q == '"', "expected a quoted string");
    const std::size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != q)
      ++pos_;
    check(pos_ < s_.size(), "unterminated string");
    check(pos_ - start <= 64, "a string longer than 64 characters");
    return std::string(s_.substr(start, pos_++ - start));
  }
  bool boolean() {
    if (s_.substr(pos_, 4) == "True") return pos_ += 4, true;
    if (s_.substr(pos_, 5) == "False") return pos_ += 5, false;
    fail("expected True or False");
  }
  std::vector<std::int64_t> tuple() {
    expect('(');
    std::vector<std::int64_t> dims;
    for (;;) {
      skip();
      if (peek() == ')') break;
      check(dims.size() < 4, "more than 4 dimensions; allowed up to 4");
      check(std::isdigit(static_cast<unsigned char>(peek())),
            "expected a non-negative dimension (a digit)");
      std::int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        check(v <= (std::int64_t(1) << 50), "a dimension above 2^50");
        v = v * 10 + (s_[pos_++] - '0');
      }
      dims.push_back(v);
      skip();
      if (peek() == ',')
        ++pos_;
      else
        check(peek() == ')', "expected ',' or ')' in the shape");
    }
    ++pos_;
    return dims;
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

}  // namespace

Tensor parse_npy(std::string_view bytes, const std::string& name) {
  COCEMU_CHECK_ARG(bytes.size() >= 10 && bytes.substr(0, 6) == "\x93NUMPY",
                   "'{}' is not an .npy file (bad magic)", name);
  const int major = static_cast<unsigned char>(bytes[6]),
            minor = static_cast<unsigned char>(bytes[7]);
  COCEMU_CHECK_ARG((major == 1 || major == 2 || major == 3) && minor == 0,
                   "'{}': .npy format version {}.{} is not supported; allowed 1.0, 2.0, 3.0", name,
                   major, minor);
  std::size_t header_len = 0, preamble = 10;
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  if (major == 1) {
    header_len = std::size_t(u[8]) | std::size_t(u[9]) << 8;
  } else {
    COCEMU_CHECK_ARG(bytes.size() >= 12, "'{}': file ends inside the .npy preamble", name);
    header_len = std::size_t(u[8]) | std::size_t(u[9]) << 8 | std::size_t(u[10]) << 16 |
                 std::size_t(u[11]) << 24;
    preamble = 12;
  }
  COCEMU_CHECK_ARG(header_len <= bytes.size() - preamble,
                   "'{}': the .npy header claims {} bytes but the file has {} after the preamble",
                   name, header_len, bytes.size() - preamble);
  COCEMU_CHECK_ARG(header_len <= (1u << 20), "'{}': .npy header of {} bytes; allowed up to 1 MiB",
                   name, header_len);
  const auto h = HeaderParser(bytes.substr(preamble, header_len), name).parse();
  COCEMU_CHECK_ARG(!h.fortran_order,
                   "'{}': Fortran-order arrays are not supported; save with C order", name);
  DType t;
  if (h.descr == "<f4")
    t = DType::f32;
  else if (h.descr == "<f8")
    t = DType::f64;
  else if (h.descr == "<i4")
    t = DType::i32;
  else if (h.descr == "<f2")
    t = DType::f16;
  else if (h.descr == "<i8")
    t = DType::i64;
  else if (h.descr == "|i1" || h.descr == "|u1" || h.descr == "|b1")
    t = DType::i8;  // masks: read as i8 whichever of the three wrote them
  else
    COCEMU_FAIL(Errc::invalid_argument,
                "'{}': dtype '{}' is not supported; allowed: <f4, <f8, <f2, <i4, <i8, |i1, |u1, "
                "|b1",
                name, h.descr);
  // The data must be exactly what the shape declares: checked before anything is allocated.
  std::uint64_t elems = 1;
  for (std::int64_t d : h.shape) {
    COCEMU_CHECK_ARG(d == 0 || elems <= (std::uint64_t(1) << 50) / std::uint64_t(d),
                     "'{}': the shape holds more than 2^50 elements", name);
    elems *= std::uint64_t(d);
  }
  const std::uint64_t data = bytes.size() - preamble - header_len,
                      need = elems * std::uint64_t(size_of(t));
  COCEMU_CHECK_ARG(data == need, "'{}': the shape {} of {} needs {} data bytes, the file has {}",
                   name, fmt::format("({})", fmt::join(h.shape, ", ")), h.descr, need, data);
  Tensor out = Tensor::zeros(Shape(h.shape), t);
  if (need) std::memcpy(out.raw(), bytes.data() + preamble + header_len, std::size_t(need));
  return out;
}

Tensor read_npy(const std::string& path) {
  // The array is copied once into its tensor: the file may take up to a quarter of the memory
  // this process may still use.
  return parse_npy(read_input_file(path, ".npy file", memory_limits().bytes() / 4), path);
}

std::int64_t count_non_finite(const Tensor& t) {
  std::int64_t n = 0;
  if (!is_floating(t.dtype()) || !t.has_data()) return 0;
  for (std::int64_t i = 0; i < t.numel(); ++i)
    n += !std::isfinite(t.item(i));
  return n;
}

void write_npy(const std::string& path, const Tensor& t) {
  std::string dims;
  for (int i = 0; i < t.ndim(); ++i)
    dims += fmt::format("{}, ", t.size(i));
  if (t.ndim() > 1) dims.resize(dims.size() - 2);
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   descr_of(t.dtype()), dims);
  const std::size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  COCEMU_CHECK_ARG(out.good(), "cannot write '{}'", path);
  out.write("\x93NUMPY\x01\x00", 8);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out << header;
  out.write(static_cast<const char*>(t.raw()), std::streamsize(t.nbytes()));
  out.close();
  COCEMU_CHECK_ARG(!out.fail(), "error while writing '{}' (disk full or not writable?)", path);
}

}  // namespace cocemu
