#pragma once
/// StableLog<T>: an append-only sequence whose elements never move, for the op records every
/// rank's host appends while its stream workers hold pointers into them.
///
/// Why not std::deque: libstdc++ gives a deque of records this size a node per two elements, and
/// the host faults in each fresh page on first touch — on a VM that costs ~1.5 µs per page, more
/// than the rest of recording an op (bench/speed/issue_speed, README "Host speed at scale").
/// StableLog maps its chunks with their pages populated (one system call per chunk). The first
/// chunks double from 64 elements to 512, so small graphs stay small; after them every chunk is
/// one 2 MiB huge page (advised MADV_HUGEPAGE, then populated), which the kernel fills in one
/// fault and one charge instead of 512.
#include <sys/mman.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace cocemu {

template <class T>
class StableLog {
  static constexpr std::size_t kFirst = 64;   // elements in chunk 0; chunk k has kFirst·2^k
  static constexpr std::size_t kGrowing = 4;  // chunks 0..3 grow: 64 .. 512
  static constexpr std::size_t kInGrowing = kFirst * ((std::size_t(1) << kGrowing) - 1);
  static constexpr std::size_t kHugePage = std::size_t(2) << 20;
  static_assert(sizeof(T) <= kHugePage / 64, "StableLog: elements this large want another layout");
  static constexpr std::size_t kLargest = kHugePage / sizeof(T);  // elements in a huge chunk

  static std::size_t chunk_size(std::size_t k) { return k < kGrowing ? kFirst << k : kLargest; }
  /// Chunk and offset of element i.
  static std::pair<std::size_t, std::size_t> locate(std::size_t i) {
    if (i < kInGrowing) {
      const std::size_t k = std::size_t(std::bit_width(i / kFirst + 1)) - 1;
      return {k, i - kFirst * ((std::size_t(1) << k) - 1)};
    }
    const std::size_t j = i - kInGrowing;
    return {kGrowing + j / kLargest, j % kLargest};
  }

 public:
  StableLog() = default;
  StableLog(const StableLog& o) {
    for (const T& v : o)
      emplace_back(v);
  }
  StableLog(StableLog&& o) noexcept
      : chunks_(std::exchange(o.chunks_, {})), size_(std::exchange(o.size_, 0)) {}
  StableLog& operator=(StableLog o) noexcept {
    std::swap(chunks_, o.chunks_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~StableLog() { clear(); }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) {
    const auto [k, j] = locate(i);
    return chunks_[k][j];
  }
  const T& operator[](std::size_t i) const {
    const auto [k, j] = locate(i);
    return chunks_[k][j];
  }
  T& front() { return chunks_[0][0]; }
  const T& front() const { return chunks_[0][0]; }
  T& back() { return (*this)[size_ - 1]; }
  const T& back() const { return (*this)[size_ - 1]; }

  template <class... Args>
  T& emplace_back(Args&&... args) {
    const auto [k, j] = locate(size_);
    if (k == chunks_.size())
      chunks_.push_back(k < kGrowing ? map_chunk(chunk_size(k)) : map_huge());
    T* p = new (chunks_[k] + j) T(std::forward<Args>(args)...);
    ++size_;
    return *p;
  }
  void push_back(const T& v) { emplace_back(v); }
  void push_back(T&& v) { emplace_back(std::move(v)); }

  void clear() {
    for (std::size_t k = 0, left = size_; k < chunks_.size(); ++k) {
      const std::size_t n = chunk_size(k);
      for (std::size_t j = 0; j < n && left > 0; ++j, --left)
        chunks_[k][j].~T();
      munmap(chunks_[k], k < kGrowing ? n * sizeof(T) : kHugePage);
    }
    chunks_.clear();
    size_ = 0;
  }

  template <bool Const>
  class Iter {
    using Log = std::conditional_t<Const, const StableLog, StableLog>;

   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = std::conditional_t<Const, const T*, T*>;
    using reference = std::conditional_t<Const, const T&, T&>;
    Iter() = default;
    Iter(Log* log, std::size_t i) : log_(log), i_(i) { settle(); }
    reference operator*() const { return *p_; }
    pointer operator->() const { return p_; }
    Iter& operator++() {
      ++i_;
      if (++p_ == end_) settle();
      return *this;
    }
    Iter operator++(int) {
      Iter t = *this;
      ++*this;
      return t;
    }
    bool operator==(const Iter& o) const { return i_ == o.i_; }

   private:
    void settle() {  // point at element i_ of its chunk
      if (!log_ || i_ >= log_->size_) return;
      const auto [k, j] = locate(i_);
      p_ = log_->chunks_[k] + j;
      end_ = log_->chunks_[k] + chunk_size(k);
    }
    Log* log_ = nullptr;
    std::size_t i_ = 0;
    pointer p_ = nullptr, end_ = nullptr;
  };
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;
  iterator begin() { return {this, 0}; }
  iterator end() { return {this, size_}; }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size_}; }

 private:
  static T* map_chunk(std::size_t n) {
    void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  /// A 2 MiB-aligned 2 MiB chunk, advised to be a huge page, populated. Where the kernel has no
  /// huge page to give (or lacks MADV_POPULATE_WRITE), it is populated page by page.
  static T* map_huge() {
    void* p =
        mmap(nullptr, 2 * kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    auto* raw = static_cast<std::byte*>(p);
    auto* aligned = reinterpret_cast<std::byte*>(
        (reinterpret_cast<std::uintptr_t>(raw) + kHugePage - 1) & ~(kHugePage - 1));
    if (aligned > raw) munmap(raw, std::size_t(aligned - raw));
    if (aligned + kHugePage < raw + 2 * kHugePage)
      munmap(aligned + kHugePage, std::size_t(raw + 2 * kHugePage - (aligned + kHugePage)));
    madvise(aligned, kHugePage, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
    if (madvise(aligned, kHugePage, MADV_POPULATE_WRITE) == 0) return reinterpret_cast<T*>(aligned);
#endif
    for (std::size_t b = 0; b < kHugePage; b += 4096)
      reinterpret_cast<volatile std::byte*>(aligned)[b] = std::byte{0};
    return reinterpret_cast<T*>(aligned);
  }
  std::vector<T*> chunks_;
  std::size_t size_ = 0;
};

}  // namespace cocemu
