#pragma once
/// Dense, contiguous tensors of up to four dimensions. Views (row ranges along dimension 0 and
/// reshapes) share storage with their base. A tensor may also be "shape-only" (no storage): the
/// dry-run mode uses those to model full-size programs without doing the numerics.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cocemu/runtime/dtype.h"
#include "cocemu/runtime/error.h"

namespace cocemu {

/// A shape of 0 to 4 dimensions.
class Shape {
 public:
  static constexpr int max_dims = 4;
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::span<const std::int64_t> dims);

  int ndim() const { return ndim_; }
  std::int64_t operator[](int d) const { return dims_[d]; }
  std::int64_t numel() const;
  /// Elements in one index step of dimension 0 (the product of the remaining dimensions).
  std::int64_t row_numel() const;
  Shape with_dim0(std::int64_t n) const;
  bool operator==(const Shape&) const = default;
  std::string str() const;

 private:
  std::array<std::int64_t, max_dims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;

  /// Zero-initialised tensor with its own storage (64-byte aligned).
  static Tensor zeros(const Shape& shape, DType dtype);
  /// Storage with unspecified contents (PyTorch's `torch.empty`), for outputs whose every element
  /// is written before it is read: GEMM and collective outputs. With the environment variable
  /// COCEMU_POISON_EMPTY=1 (set for the test suite) every byte is 0xFF, a NaN in every floating
  /// dtype, so an element that is read before it is written shows in the results.
  static Tensor empty(const Shape& shape, DType dtype);
  /// A tensor with a shape and dtype but no storage (dry-run mode).
  static Tensor shape_only(const Shape& shape, DType dtype);
  /// A tensor over memory it did not allocate (a NumPy array's, say): `storage` keeps that memory
  /// alive (typically an aliasing shared_ptr onto its owner) and the elements start
  /// `offset_bytes` into it. The caller guarantees numel·size_of(dtype) bytes there.
  static Tensor wrap(std::shared_ptr<std::byte[]> storage, std::size_t offset_bytes,
                     const Shape& shape, DType dtype);
  /// Copies `values` (converted from T) into a new tensor of `dtype`.
  template <class T>
  static Tensor from(const Shape& shape, std::span<const T> values, DType dtype = dtype_of<T>());

  bool defined() const { return dtype_set_; }
  bool has_data() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  std::int64_t size(int d) const { return shape_[d]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return std::size_t(numel()) * size_of(dtype_); }

  /// The storage shared by this tensor and its views (null for shape-only tensors), and where
  /// this tensor's elements start in it: what a view in another language needs to keep it alive.
  const std::shared_ptr<std::byte[]>& storage() const { return storage_; }
  std::size_t offset_bytes() const { return offset_bytes_; }
  /// Raw element storage; throws for shape-only tensors.
  void* raw() const;
  /// Typed element pointer; throws if T does not match the dtype.
  template <class T>
  T* data() const {
    COCEMU_CHECK_ARG(dtype_of<T>() == dtype_, "tensor {} accessed as {}", describe(),
                     name_of(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  /// Rows [begin, end) of dimension 0, as a view.
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  /// Same elements, another shape (numel must match), as a view.
  Tensor reshape(const Shape& shape) const;
  /// Flat elements [begin, end) as a 1-D view.
  Tensor flat(std::int64_t begin, std::int64_t end) const;
  Tensor clone() const;
  /// Converted copy (rounding to nearest even when narrowing floats).
  Tensor to(DType dtype) const;
  /// Copies `src` (same dtype and numel) into this tensor's elements.
  void copy_from(const Tensor& src) const;
  void fill_zero() const;

  /// Element i (flat) converted to double, for tests and printing.
  double item(std::int64_t i) const;
  /// Whether both tensors have identical dtype, shape and bytes.
  bool bitwise_equal(const Tensor& other) const;
  /// Whether the element ranges of the two tensors overlap in memory.
  bool overlaps(const Tensor& other) const;
  /// "f32[4, 8]" (plus " shape-only" when there is no storage).
  std::string describe() const;

 private:
  std::shared_ptr<std::byte[]> storage_;
  std::size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
  bool dtype_set_ = false;
};

/// Formats a byte count the way traces and tables show it: "4KiB", "2.5MiB".
std::string format_bytes(std::size_t bytes);

}  // namespace cocemu
