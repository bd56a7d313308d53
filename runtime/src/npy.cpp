#include "cocemu/runtime/npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <vector>

#include "cocemu/runtime/error.h"

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
    case DType::bf16:
      break;
  }
  COCEMU_FAIL(Errc::invalid_argument,
              "write_npy: dtype {} has no NumPy equivalent; allowed: f32, "
              "f64, f16, i32, i8",
              name_of(t));
}
}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  COCEMU_CHECK_ARG(in.good(), "cannot open .npy file '{}'", path);
  char magic[8];
  in.read(magic, 8);
  COCEMU_CHECK_ARG(in.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0,
                   "'{}' is not an .npy file (bad magic)", path);
  std::size_t header_len = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = std::size_t(b[0]) | std::size_t(b[1]) << 8;
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = std::size_t(b[0]) | std::size_t(b[1]) << 8 | std::size_t(b[2]) << 16 |
                 std::size_t(b[3]) << 24;
  }
  std::string header(header_len, '\0');
  in.read(header.data(), std::streamsize(header_len));
  std::smatch m;
  COCEMU_CHECK_ARG(std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'")),
                   "'{}': no descr in the .npy header", path);
  const std::string descr = m[1];
  COCEMU_CHECK_ARG(!std::regex_search(header, std::regex("'fortran_order':\\s*True")),
                   "'{}': Fortran-order arrays are not supported; save with C order", path);
  COCEMU_CHECK_ARG(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")),
                   "'{}': no shape in the .npy header", path);
  std::vector<std::int64_t> dims;
  const std::string shape = m[1];
  const std::regex number("\\d+");
  for (std::sregex_iterator it(shape.begin(), shape.end(), number), end; it != end; ++it)
    dims.push_back(std::stoll(it->str()));
  DType t;
  if (descr == "<f4")
    t = DType::f32;
  else if (descr == "<f8")
    t = DType::f64;
  else if (descr == "<i4")
    t = DType::i32;
  else if (descr == "<f2")
    t = DType::f16;
  else if (descr == "|i1" || descr == "|u1" || descr == "|b1")
    t = DType::i8;
  else
    COCEMU_FAIL(Errc::invalid_argument,
                "'{}': dtype '{}' is not supported; allowed: <f4, <f8, "
                "<f2, <i4, |i1, |u1, |b1",
                path, descr);
  Tensor out = Tensor::zeros(Shape(dims), t);
  in.read(static_cast<char*>(out.raw()), std::streamsize(out.nbytes()));
  COCEMU_CHECK_ARG(in.gcount() == std::streamsize(out.nbytes()),
                   "'{}': file ends early ({} of {} data bytes)", path, in.gcount(), out.nbytes());
  return out;
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
  COCEMU_CHECK_ARG(out.good(), "error while writing '{}'", path);
}

}  // namespace cocemu
