#pragma once
/// A world on several hosts (SPEC R-PY-21). Each host runs the threads of its own ranks, a
/// contiguous block: host h has world ranks [h·k, (h+1)·k) with k = world size / hosts. What ranks
/// on different hosts exchange (a collective's inputs, a p2p message, a split's colors, the
/// recorded graph at the end of a run) crosses as keyed messages through a `HostLink`, which an
/// existing transport implements (MPI for `mpirun cocemu …`, an in-process loopback for tests).
///
/// A key names one message of one run; both sides derive it from what they already agree on
/// (group key, call sequence number, member), so no message carries an address or a handshake.
/// Receiving waits like every cocemu wait: bounded by the thread's timeout, ended by its world's
/// abort, and ended with the peer's error when a host reports a failure.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cocemu/runtime/sync.h"

namespace cocemu {

namespace detail {
/// Storage of message buffers. Blocks of 1 MiB and more go back to a small process-wide cache
/// when freed (kCachedBufferBytes at most) and serve the next request of the same size: a
/// transfer repeated every step (a gradient bucket, a pipeline activation) lands in pages already
/// touched instead of faulting in fresh ones, which for 64 MiB took about 35 ms on the
/// development machine, half of the transfer. Elements are not zeroed on construction: a
/// message buffer is written before it is read.
void* allocate_buffer(std::size_t bytes);
void free_buffer(void* p, std::size_t bytes) noexcept;
inline constexpr std::size_t kCachedBufferBytes = std::size_t(256) << 20;

template <class T>
struct BufferAllocator {
  using value_type = T;
  BufferAllocator() = default;
  template <class U>
  BufferAllocator(const BufferAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(allocate_buffer(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { free_buffer(p, n * sizeof(T)); }
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;  // default-initialized: bytes are not zeroed
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  friend bool operator==(const BufferAllocator&, const BufferAllocator&) { return true; }
};
}  // namespace detail

/// A message's bytes (see detail::BufferAllocator).
using Bytes = std::vector<std::byte, detail::BufferAllocator<std::byte>>;

class HostLink {
 public:
  HostLink(int host, int n_hosts);
  virtual ~HostLink();
  HostLink(const HostLink&) = delete;
  HostLink& operator=(const HostLink&) = delete;

  int host() const { return host_; }
  int n_hosts() const { return n_hosts_; }
  /// A short name for errors: "host 1 of 2".
  std::string describe() const;

  /// Sends `data` to host `to` (not this one) under `key`. Returns without waiting for the
  /// receiver; the transport owns `data` from here.
  virtual void send(int to, const std::string& key, Bytes data) = 0;
  /// Tells every other host that this one failed with `text`; their waits end with it.
  virtual void report_failure(const std::string& text) = 0;
  /// What the transport is ("MPI (Open MPI 4.1.4), one communication thread").
  virtual std::string transport() const = 0;

  /// The message sent here under `key`, once it has arrived (consumed: each key is received
  /// once). Waits within the calling thread's WaitScope; `what` names the wait in errors.
  Bytes receive(const std::string& key, const std::function<std::string()>& what);

  /// Every host's message under `key`: sends `mine` to each other host, then calls
  /// `take(h, theirs)` for each other host h in host order once its message arrived. Every host
  /// calls it with the same key; `what(h)` names host h's message in errors.
  void exchange(const std::string& key, const Bytes& mine,
                const std::function<std::string(int host)>& what,
                const std::function<void(int host, const Bytes& theirs)>& take);

  /// Called when a peer host reports a failure (after its waits here are woken); set by `run`
  /// to abort the world in progress. Cleared with an empty function.
  void on_failure(std::function<void(int host, const std::string& text)> f);
  /// Runs started on this link so far: every host starts the same runs in the same order, so
  /// `next_run` gives the same number on each and keys carry it.
  std::uint64_t next_run() { return runs_++; }

 protected:
  /// The transport hands over a message that arrived.
  void deliver(std::string key, Bytes data);
  /// The transport hands over a peer's failure report.
  void deliver_failure(int host, std::string text);

 private:
  int host_, n_hosts_;
  std::uint64_t runs_ = 0;
  std::mutex mu_;
  std::unordered_map<std::string, Bytes> arrived_;
  std::string failure_;   // the first peer failure, "host 1 failed: …"
  std::mutex notify_mu_;  // held while on_failure_ runs or changes
  std::function<void(int, const std::string&)> on_failure_;
  Counter arrivals_;
};

/// n in-process hosts joined by memory, for tests: link(h) is host h's end.
class LoopbackHosts {
 public:
  explicit LoopbackHosts(int n_hosts);
  ~LoopbackHosts();
  std::shared_ptr<HostLink> link(int host) const;

 private:
  struct End;
  std::vector<std::shared_ptr<End>> ends_;
};

/// Combines a buffer that each host filled in part (its own ranks' rows, zero elsewhere) into
/// the whole on every host: the bytes are OR-ed, so the parts come through bit for bit (a sum
/// would turn -0.0 into +0.0). Every host calls it at the same point, with the same size; `what`
/// names it in errors.
void merge_disjoint_parts(HostLink& link, std::span<std::byte> data, const std::string& what);

/// Which host runs world rank `rank` when `world_size` ranks are spread over `n_hosts` hosts.
inline int host_of_rank(int rank, int world_size, int n_hosts) {
  return rank / (world_size / n_hosts);
}

namespace detail {
/// Appends plain values, strings and vectors to a message; `ByteReader` reads them back in the
/// same order and throws Errc::mismatch when the message ends early.
class ByteWriter {
 public:
  template <class T>
  ByteWriter& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
    return *this;
  }
  ByteWriter& put_bytes(const void* data, std::size_t n);
  ByteWriter& put_string(std::string_view s);
  template <class T, class A>
  ByteWriter& put_vector(const std::vector<T, A>& v) {
    put<std::uint64_t>(v.size());
    return put_bytes(v.data(), v.size() * sizeof(T));
  }
  /// Pads to a multiple of `a` bytes from the message's start (data read in place stays aligned).
  ByteWriter& align(std::size_t a) {
    out_.resize((out_.size() + a - 1) / a * a, std::byte{0});
    return *this;
  }
  Bytes take() { return std::move(out_); }

 private:
  Bytes out_;
};

class ByteReader {
 public:
  explicit ByteReader(const Bytes& in, std::string what) : in_(in), what_(std::move(what)) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  const std::byte* take(std::size_t n);
  std::string get_string();
  template <class T, class A = std::allocator<T>>
  std::vector<T, A> get_vector() {
    const auto n = get<std::uint64_t>();
    std::vector<T, A> v(n);
    if (n) std::memcpy(v.data(), take(n * sizeof(T)), n * sizeof(T));
    return v;
  }
  /// Skips the padding ByteWriter::align(a) wrote.
  void align(std::size_t a) { take((pos_ + a - 1) / a * a - pos_); }
  bool done() const { return pos_ == in_.size(); }

 private:
  const Bytes& in_;
  std::string what_;
  std::size_t pos_ = 0;
};
}  // namespace detail

}  // namespace cocemu
