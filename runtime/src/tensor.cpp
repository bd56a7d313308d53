#include "cocemu/runtime/tensor.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include <sys/mman.h>

#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/limits.h"

namespace cocemu {

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "float") return DType::f32;
  if (s == "f64" || s == "float64" || s == "double") return DType::f64;
  if (s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "i8" || s == "int8") return DType::i8;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "i64" || s == "int64") return DType::i64;
  if (s == "u8" || s == "uint8") return DType::u8;
  if (s == "bool") return DType::boolean;
  COCEMU_FAIL(Errc::invalid_argument,
              "unknown dtype '{}'; allowed: f32, f64, f16, bf16, i8, i32, i64, u8, bool", s);
}

Shape::Shape(std::initializer_list<std::int64_t> dims)
    : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) {
  COCEMU_CHECK_ARG(dims.size() <= max_dims, "shape has {} dimensions; at most {} are allowed",
                   dims.size(), max_dims);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    COCEMU_CHECK_ARG(dims[i] >= 0, "shape dimension {} is {}; dimensions must be >= 0", i, dims[i]);
    dims_[i] = dims[i];
  }
  ndim_ = int(dims.size());
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim_; ++i)
    n *= dims_[i];
  return n;
}

std::int64_t Shape::row_numel() const {
  std::int64_t n = 1;
  for (int i = 1; i < ndim_; ++i)
    n *= dims_[i];
  return n;
}

Shape Shape::with_dim0(std::int64_t n) const {
  Shape s = *this;
  s.dims_[0] = n;
  return s;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i)
    s += fmt::format("{}{}", i ? ", " : "", dims_[i]);
  return s + "]";
}

namespace {

/// A caching allocator, as PyTorch's: freed blocks are kept by size and handed out again, so the
/// layers' per-call activations do not pay page faults and page clearing every time. At most
/// kCacheLimit bytes are kept; blocks are 64-byte aligned.
class BlockCache {
 public:
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache();  // never destroyed: tensors may outlive main
    return *cache;
  }
  std::byte* get(std::size_t bytes) {
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        std::byte* p = it->second;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
    }
    auto* p = static_cast<std::byte*>(::operator new[](bytes, align_for(bytes)));
    // Large blocks are marked for transparent huge pages (the default policy is "madvise"), so
    // streaming through them costs a TLB miss and a prefetcher restart per 2 MiB instead of per
    // 4 KiB page, and first touch one fault per 2 MiB. Advice only: without THP nothing changes.
    if (bytes >= kHugeFrom) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
  }
  /// Called by a tensor's deleter, which must not throw: when the map's node cannot be
  /// allocated (the process is out of memory), the block is freed instead of kept.
  void put(std::byte* p, std::size_t bytes) noexcept {
    try {
      std::lock_guard lock(mu_);
      if (cached_ + bytes <= kCacheLimit) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    } catch (const std::bad_alloc&) {
    }
    ::operator delete[](p, align_for(bytes));
  }

 private:
  /// 64 bytes; 2 MiB (a huge page) for blocks of kHugeFrom and more. get and put agree by size.
  static std::align_val_t align_for(std::size_t bytes) {
    return bytes < kHugeFrom ? kAlign : kHugeAlign;
  }
  static constexpr std::align_val_t kAlign{64};
  static constexpr std::align_val_t kHugeAlign{std::size_t(2) << 20};
  static constexpr std::size_t kHugeFrom = std::size_t(4) << 20;
  static constexpr std::size_t kCacheLimit = std::size_t(4) << 30;
  std::mutex mu_;
  std::multimap<std::size_t, std::byte*> free_;
  std::size_t cached_ = 0;
};

enum class Fill { zeros, none };

std::shared_ptr<std::byte[]> allocate(std::size_t bytes, Fill fill) {
  const std::size_t n = bytes ? bytes : 1;
  std::byte* p = BlockCache::instance().get(n);
  if (fill == Fill::zeros) {
    std::memset(p, 0, n);
  } else {
    static const bool poison = [] {
      const char* v = std::getenv("COCEMU_POISON_EMPTY");
      return v && parse_integer("COCEMU_POISON_EMPTY", v, 0, 1) == 1;
    }();
    if (poison) std::memset(p, 0xFF, n);
  }
  return std::shared_ptr<std::byte[]>(p, [n](std::byte* q) { BlockCache::instance().put(q, n); });
}
}  // namespace

namespace {
/// Storage for a tensor of `shape`: a request larger than the memory this process may still use
/// is refused up front (Errc::too_large), and one the allocator cannot serve is a
/// resource_exhausted error; both name the tensor and the memory there is.
std::shared_ptr<std::byte[]> allocate_for(const Shape& shape, DType dtype, std::size_t bytes,
                                          Fill fill) {
  // Below this, reading the limits (/proc) would cost more than the allocation is worth checking.
  constexpr std::size_t kCheckFrom = std::size_t(256) << 20;
  if (bytes >= kCheckFrom) {
    const MemoryLimits m = memory_limits();
    COCEMU_CHECK(std::int64_t(std::min<std::size_t>(bytes, std::size_t(INT64_MAX))) <= m.bytes(),
                 Errc::too_large,
                 "a tensor of shape {} {} needs {} ({} bytes); {}; use smaller sizes, fewer "
                 "ranks, or a dry run",
                 shape.str(), name_of(dtype),
                 format_gib(std::int64_t(std::min<std::size_t>(bytes, std::size_t(INT64_MAX)))),
                 bytes, memory_limits_summary());
  }
  try {
    return allocate(bytes, fill);
  } catch (const std::bad_alloc&) {
    COCEMU_FAIL(Errc::resource_exhausted,
                "a tensor of shape {} {} needs {} ({} bytes) and the allocation failed; {}; use "
                "smaller sizes, fewer ranks, or a dry run",
                shape.str(), name_of(dtype), format_gib(std::int64_t(bytes)), bytes,
                memory_limits_summary());
  }
}
}  // namespace

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = shape_only(shape, dtype);
  t.storage_ = allocate_for(shape, dtype, t.nbytes(), Fill::zeros);
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  Tensor t = shape_only(shape, dtype);
  t.storage_ = allocate_for(shape, dtype, t.nbytes(), Fill::none);
  return t;
}

Tensor Tensor::shape_only(const Shape& shape, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  return t;
}

Tensor Tensor::wrap(std::shared_ptr<std::byte[]> storage, std::size_t offset_bytes,
                    const Shape& shape, DType dtype) {
  COCEMU_CHECK_ARG(storage != nullptr, "Tensor::wrap of {}[{}] without storage", name_of(dtype),
                   shape.str());
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_bytes_ = offset_bytes;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  return t;
}

template <class T>
Tensor Tensor::from(const Shape& shape, std::span<const T> values, DType dtype) {
  COCEMU_CHECK_ARG(std::int64_t(values.size()) == shape.numel(),
                   "{} values given for shape {} ({} elements)", values.size(), shape.str(),
                   shape.numel());
  Tensor t = zeros(shape, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using U = decltype(tag);
    U* out = static_cast<U*>(t.raw());
    for (std::size_t i = 0; i < values.size(); ++i)
      out[i] = store_as<U>(load_as<double>(values[i]));
  });
  return t;
}

void* Tensor::raw() const {
  COCEMU_CHECK_ARG(storage_ != nullptr,
                   "tensor {} has no storage (shape-only, dry-run mode); numerics are skipped",
                   describe());
  return storage_.get() + offset_bytes_;
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  COCEMU_CHECK_ARG(ndim() >= 1, "rows() on a 0-d tensor {}", describe());
  COCEMU_CHECK_ARG(0 <= begin && begin <= end && end <= size(0),
                   "rows [{}, {}) out of range for {} (dimension 0 has {} rows)", begin, end,
                   describe(), size(0));
  Tensor t = *this;
  t.shape_ = shape_.with_dim0(end - begin);
  t.offset_bytes_ += std::size_t(begin * shape_.row_numel()) * size_of(dtype_);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  COCEMU_CHECK_ARG(shape.numel() == numel(), "cannot reshape {} ({} elements) to {} ({} elements)",
                   describe(), numel(), shape.str(), shape.numel());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::flat(std::int64_t begin, std::int64_t end) const {
  return reshape(Shape{numel()}).rows(begin, end);
}

Tensor Tensor::clone() const {
  Tensor t = has_data() ? zeros(shape_, dtype_) : shape_only(shape_, dtype_);
  if (has_data()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (!has_data()) return shape_only(shape_, dtype);
  Tensor t = zeros(shape_, dtype);
  const std::int64_t n = numel();
  visit_dtype(dtype_, [&](auto src_tag) {
    using S = decltype(src_tag);
    const S* src = static_cast<const S*>(raw());
    visit_dtype(dtype, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      D* dst = static_cast<D*>(t.raw());
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = store_as<D>(load_as<double>(src[i]));
    });
  });
  return t;
}

void Tensor::copy_from(const Tensor& src) const {
  COCEMU_CHECK_ARG(src.dtype() == dtype_ && src.numel() == numel(),
                   "copy_from: source {} does not match destination {} (dtype and element count "
                   "must agree)",
                   src.describe(), describe());
  if (!has_data() || !src.has_data()) return;
  std::memmove(raw(), src.raw(), nbytes());
}

void Tensor::fill_zero() const {
  if (has_data()) std::memset(raw(), 0, nbytes());
}

double Tensor::item(std::int64_t i) const {
  COCEMU_CHECK_ARG(0 <= i && i < numel(), "item({}) out of range for {}", i, describe());
  return visit_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    return load_as<double>(static_cast<const T*>(raw())[i]);
  });
}

bool Tensor::bitwise_equal(const Tensor& o) const {
  if (dtype_ != o.dtype_ || !(shape_ == o.shape_)) return false;
  if (!has_data() || !o.has_data()) return has_data() == o.has_data();
  return std::memcmp(raw(), o.raw(), nbytes()) == 0;
}

bool Tensor::overlaps(const Tensor& o) const {
  if (!has_data() || !o.has_data() || nbytes() == 0 || o.nbytes() == 0) return false;
  auto* a = static_cast<const std::byte*>(raw());
  auto* b = static_cast<const std::byte*>(o.raw());
  return a < b + o.nbytes() && b < a + nbytes();
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{}{}{}", name_of(dtype_), shape_.str(), has_data() ? "" : " shape-only");
}

std::string format_bytes(std::size_t b) {
  if (b < 1024) return fmt::format("{}B", b);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  std::string s = fmt::format("{:.2f}", v);
  while (s.back() == '0')
    s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s + units[u];
}

template Tensor Tensor::from<float>(const Shape&, std::span<const float>, DType);
template Tensor Tensor::from<double>(const Shape&, std::span<const double>, DType);
template Tensor Tensor::from<std::int32_t>(const Shape&, std::span<const std::int32_t>, DType);

}  // namespace cocemu
