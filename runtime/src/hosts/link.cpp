// HostLink's receiving side, the in-process loopback transport, and message encoding (hosts.h).
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/hosts.h"

namespace cocemu {

HostLink::HostLink(int host, int n_hosts) : host_(host), n_hosts_(n_hosts) {
  COCEMU_CHECK_ARG(n_hosts >= 1 && host >= 0 && host < n_hosts,
                   "host {} of {}: need 0 <= host < hosts and hosts >= 1", host, n_hosts);
}

HostLink::~HostLink() = default;

std::string HostLink::describe() const {
  return fmt::format("host {} of {}", host_, n_hosts_);
}

Bytes HostLink::receive(const std::string& key, const std::function<std::string()>& what) {
  for (;;) {
    std::uint32_t seen;
    {
      std::lock_guard lock(mu_);
      if (auto it = arrived_.find(key); it != arrived_.end()) {
        Bytes data = std::move(it->second);
        arrived_.erase(it);
        return data;
      }
      if (!failure_.empty())
        throw Error(Errc::remote_failure,
                    fmt::format("{} gave up waiting for {}: {}", describe(), what(), failure_));
      seen = arrivals_.load();
    }
    arrivals_.wait_geq(seen + 1, [&] { return fmt::format("{} (on {})", what(), describe()); });
  }
}

void HostLink::exchange(const std::string& key, const Bytes& mine,
                        const std::function<std::string(int)>& what,
                        const std::function<void(int, const Bytes&)>& take) {
  for (int h = 0; h < n_hosts_; ++h)
    if (h != host_) send(h, fmt::format("{}/{}", key, host_), mine);
  for (int h = 0; h < n_hosts_; ++h)
    if (h != host_) take(h, receive(fmt::format("{}/{}", key, h), [&] { return what(h); }));
}

void HostLink::on_failure(std::function<void(int, const std::string&)> f) {
  std::lock_guard lock(notify_mu_);  // a call in progress ends before its target goes away
  on_failure_ = std::move(f);
}

void HostLink::deliver(std::string key, Bytes data) {
  {
    std::lock_guard lock(mu_);
    arrived_.insert_or_assign(std::move(key), std::move(data));
  }
  arrivals_.add(1);
}

void HostLink::deliver_failure(int host, std::string text) {
  std::string message = fmt::format("host {} failed: {}", host, text);
  {
    std::lock_guard lock(mu_);
    if (failure_.empty()) failure_ = message;
  }
  arrivals_.add(1);
  std::lock_guard lock(notify_mu_);
  if (on_failure_) on_failure_(host, message);
}

// -------------------------------------------------------------------------------------------
// Loopback: every end delivers straight into its peer's HostLink.

struct LoopbackHosts::End final : HostLink {
  End(int host, int n) : HostLink(host, n) {}
  std::vector<End*> peers;  // by host; set once every end exists
  void send(int to, const std::string& key, Bytes data) override {
    COCEMU_CHECK_ARG(to >= 0 && to < n_hosts() && to != host(),
                     "{}: send to host {}; allowed: another host in 0..{}", describe(), to,
                     n_hosts() - 1);
    peers[std::size_t(to)]->deliver(key, std::move(data));
  }
  void report_failure(const std::string& text) override {
    for (End* p : peers)
      if (p != this) p->deliver_failure(host(), text);
  }
  std::string transport() const override { return "loopback (in-process, for tests)"; }
};

LoopbackHosts::LoopbackHosts(int n_hosts) {
  for (int h = 0; h < n_hosts; ++h)
    ends_.push_back(std::make_shared<End>(h, n_hosts));
  for (auto& e : ends_)
    for (auto& p : ends_)
      e->peers.push_back(p.get());
}

LoopbackHosts::~LoopbackHosts() = default;

std::shared_ptr<HostLink> LoopbackHosts::link(int host) const {
  return ends_.at(std::size_t(host));
}

void merge_disjoint_parts(HostLink& link, std::span<std::byte> data, const std::string& what) {
  link.exchange(
      fmt::format("r{}/parts/{}", link.next_run(), what), Bytes(data.begin(), data.end()),
      [&](int h) { return fmt::format("host {}'s part of {}", h, what); },
      [&](int h, const Bytes& theirs) {
        COCEMU_CHECK(theirs.size() == data.size(), Errc::mismatch,
                     "{}: host {} sent {} bytes of its part, this host has {}", what, h,
                     theirs.size(), data.size());
        for (std::size_t i = 0; i < data.size(); ++i)
          data[i] |= theirs[i];
      });
}

// -------------------------------------------------------------------------------------------

namespace detail {

namespace {
constexpr std::size_t kCachedFrom = std::size_t(1) << 20;
struct BufferCache {
  std::mutex mu;
  std::unordered_multimap<std::size_t, void*> free;  // by size
  std::size_t bytes = 0;
};
BufferCache& buffer_cache() {
  static BufferCache* cache = new BufferCache;  // outlives every static that frees a buffer
  return *cache;
}
}  // namespace

void* allocate_buffer(std::size_t bytes) {
  if (bytes >= kCachedFrom) {
    BufferCache& c = buffer_cache();
    std::lock_guard lock(c.mu);
    if (auto it = c.free.find(bytes); it != c.free.end()) {
      void* p = it->second;
      c.free.erase(it);
      c.bytes -= bytes;
      return p;
    }
  }
  return ::operator new(bytes);
}

void free_buffer(void* p, std::size_t bytes) noexcept {
  if (bytes >= kCachedFrom) {
    BufferCache& c = buffer_cache();
    std::lock_guard lock(c.mu);
    if (c.bytes + bytes <= kCachedBufferBytes) {
      try {
        c.free.emplace(bytes, p);
        c.bytes += bytes;
        return;
      } catch (const std::bad_alloc&) {  // no room to remember it: free it
      }
    }
  }
  ::operator delete(p);
}

ByteWriter& ByteWriter::put_bytes(const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  out_.insert(out_.end(), p, p + n);
  return *this;
}

ByteWriter& ByteWriter::put_string(std::string_view s) {
  put<std::uint64_t>(s.size());
  return put_bytes(s.data(), s.size());
}

const std::byte* ByteReader::take(std::size_t n) {
  COCEMU_CHECK(n <= in_.size() - pos_, Errc::mismatch,
               "message {} ends after {} bytes, {} more expected (hosts running different "
               "programs or cocemu versions?)",
               what_, in_.size(), n - (in_.size() - pos_));
  const std::byte* p = in_.data() + pos_;
  pos_ += n;
  return p;
}

std::string ByteReader::get_string() {
  const auto n = get<std::uint64_t>();
  const std::byte* p = take(n);
  return std::string(reinterpret_cast<const char*>(p), n);
}
}  // namespace detail

}  // namespace cocemu
