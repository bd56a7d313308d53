// HostLink over MPI (mpi_link.h): the transport of `mpirun -n H cocemu …`.
//
// Threads. One communication thread per process makes every MPI call, from MPI_Init_thread to
// MPI_Finalize (so it is MPI's main thread, and MPI_THREAD_FUNNELED would suffice; it asks for
// MPI_THREAD_SERIALIZED). Open MPI's blocking calls spin, and a host's rank threads already
// oversubscribe its cores, so the thread never blocks in MPI: it polls with MPI_Iprobe and
// MPI_Testsome, and when a pass found nothing to do it sleeps 50 us (on a condition variable
// that a new send wakes at once; the thread's timer slack is 1 us, so a sleep is near 50 us).
//
// Sending. `send` and `report_failure` only enqueue and wake the thread. The thread posts a header
// (tag kTagHeader: kind, payload size, chunk size, key) with MPI_Isend, and a payload above
// kInlineBytes as MPI_Isend chunks of at most 1 GiB (tag kTagData; MPI counts are ints); smaller
// payloads travel inside the header. The message owns its buffers until its requests complete.
//
// Receiving. MPI_Iprobe for headers from any source; MPI_Recv of a probed header returns at once.
// For a payload in chunks the thread allocates it and posts MPI_Irecv for each chunk from that
// source. MPI matches messages of one source, tag and communicator in posting order, so the k-th
// header from a host and the k-th payload from it belong together. A complete message is handed
// to HostLink::deliver; a failure report to HostLink::deliver_failure.
//
// Shutdown (close_mpi_hosts, or program exit): sends are refused from then on; the thread
// completes the queued and in-flight sends (still receiving, so peers' sends complete too), then
// joins an MPI_Ibarrier it polls, completes its in-flight receives, and calls MPI_Finalize. A
// host that does not reach the barrier within the default wait timeout (it crashed, hangs, or
// exits without its link ending) would make the others wait forever: after that time the thread
// prints what it waited for and calls MPI_Abort, which ends every process of the job.
// The C API only: Open MPI's mpi.h otherwise pulls in its C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <list>
#include <thread>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/mpi_link.h"
#include "cocemu/runtime/sync.h"

namespace cocemu {

bool started_by_mpirun() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size && std::atoi(size) > 1;
}

bool mpi_available() {
  return true;
}

namespace {

constexpr int kTagHeader = 7301;  // below 32767, the smallest MPI_TAG_UB the standard allows
constexpr int kTagData = 7302;
constexpr std::size_t kInlineBytes = 64 << 10;
constexpr std::size_t kDefaultChunkBytes = std::size_t(1) << 30;
constexpr auto kIdleSleep = std::chrono::microseconds(50);

enum class Kind : std::uint8_t { message = 1, failure = 2 };

// The largest MPI message of a payload: COCEMU_MPI_CHUNK_BYTES (1..INT_MAX) for tests that cover
// payloads of several chunks without gigabytes of memory, else 1 GiB. Only the sender reads it:
// the header carries it.
std::size_t chunk_bytes() {
  const char* env = std::getenv("COCEMU_MPI_CHUNK_BYTES");
  if (!env || !*env) return kDefaultChunkBytes;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  COCEMU_CHECK_ARG(*end == '\0' && v >= 1 && v <= INT_MAX,
                   "COCEMU_MPI_CHUNK_BYTES='{}'; allowed: an integer in 1..{}", env, INT_MAX);
  return std::size_t(v);
}

struct Started {
  int rank = 0, size = 1, thread_level = MPI_THREAD_SINGLE;
  std::string library;
};

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

class MpiLink final : public HostLink {
 public:
  static std::shared_ptr<MpiLink> start(std::size_t chunk);
  MpiLink(const Started& s, std::size_t chunk)
      : HostLink(s.rank, s.size),
        chunk_(chunk),
        transport_(fmt::format("MPI ({}, {}, one communication thread)", s.library,
                               thread_level_name(s.thread_level))) {}
  ~MpiLink() override { close(); }

  void send(int to, const std::string& key, Bytes data) override {
    COCEMU_CHECK_ARG(to >= 0 && to < n_hosts() && to != host(),
                     "{}: send to host {}; allowed: another host in 0..{}", describe(), to,
                     n_hosts() - 1);
    enqueue({to, Kind::message, key, std::move(data)});
  }
  void report_failure(const std::string& text) override {
    for (int h = 0; h < n_hosts(); ++h)
      if (h != host()) enqueue({h, Kind::failure, text, {}}, /*best_effort=*/true);
  }
  std::string transport() const override { return transport_; }

  // Ends the transport (see the file's comment); idempotent.
  void close() {
    {
      std::lock_guard lock(mu_);
      if (!closing_) {
        closing_ = true;
        shutdown_deadline_ = std::chrono::steady_clock::now() + default_timeout();
      }
    }
    wake_.notify_all();
    std::lock_guard join_lock(join_mu_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Outgoing {
    int to;
    Kind kind;
    std::string key;  // the message's key, or a failure's text
    Bytes data;
  };
  // A message in flight: its buffers and how many of its requests are still open.
  struct InFlight {
    bool receiving;
    int peer;
    std::string key;
    Bytes header, data;
    int open = 0;
  };

  void enqueue(Outgoing m, bool best_effort = false) {
    {
      std::lock_guard lock(mu_);
      if (closing_) {
        if (best_effort) return;
        COCEMU_FAIL(Errc::invalid_argument,
                    "{}: send of '{}' to host {} after the MPI transport was closed "
                    "(close_mpi_hosts or program exit)",
                    describe(), m.key, m.to);
      }
      queue_.push_back(std::move(m));
    }
    wake_.notify_one();
  }

  void loop();
  void post(Outgoing& m);
  bool poll_headers();
  bool test_requests();
  void track(InFlight* f, MPI_Request r) {
    requests_.push_back(r);
    owners_.push_back(f);
    ++f->open;
  }
  [[noreturn]] void abort_job(const std::string& waiting_for);

  const std::size_t chunk_;
  const std::string transport_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Outgoing> queue_;  // guarded by mu_
  bool closing_ = false;        // guarded by mu_
  std::chrono::steady_clock::time_point shutdown_deadline_;
  std::mutex join_mu_;
  std::thread thread_;
  // Owned by the communication thread.
  std::list<InFlight> in_flight_;
  std::vector<MPI_Request> requests_;
  std::vector<InFlight*> owners_;
  int sends_open_ = 0, receives_open_ = 0;
};

std::shared_ptr<MpiLink> MpiLink::start(std::size_t chunk) {
  std::promise<Started> started;
  auto started_future = started.get_future();
  std::promise<MpiLink*> attached;
  std::thread thread([&started, ready = attached.get_future()]() mutable {
    prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us: the idle sleep stays near 50 us
    Started s;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &s.thread_level);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.size);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    s.library.assign(version, std::size_t(length));
    // "Open MPI v4.1.4, package: …": the name and version.
    if (auto comma = s.library.find(','); comma != std::string::npos) s.library.resize(comma);
    while (!s.library.empty() && std::isspace(static_cast<unsigned char>(s.library.back())))
      s.library.pop_back();
    started.set_value(s);
    if (MpiLink* link = ready.get()) {
      link->loop();
    } else {
      MPI_Finalize();
    }
  });
  std::shared_ptr<MpiLink> link;
  try {
    link = std::make_shared<MpiLink>(started_future.get(), chunk);
  } catch (...) {
    attached.set_value(nullptr);
    thread.join();
    throw;
  }
  link->thread_ = std::move(thread);
  attached.set_value(link.get());
  return link;
}

void MpiLink::loop() {
  enum class Phase { running, draining, meeting, finishing } phase = Phase::running;
  MPI_Request barrier = MPI_REQUEST_NULL;
  for (;;) {
    std::deque<Outgoing> batch;
    {
      std::lock_guard lock(mu_);
      batch.swap(queue_);
      if (closing_ && phase == Phase::running) phase = Phase::draining;
    }
    bool busy = !batch.empty();
    for (auto& m : batch)
      post(m);
    busy |= poll_headers();
    busy |= test_requests();

    if (phase == Phase::draining && sends_open_ == 0) {
      MPI_Ibarrier(MPI_COMM_WORLD, &barrier);
      phase = Phase::meeting;
    }
    if (phase == Phase::meeting) {
      int done = 0;
      MPI_Test(&barrier, &done, MPI_STATUS_IGNORE);
      if (done) phase = Phase::finishing;
    }
    if (phase == Phase::finishing && receives_open_ == 0) break;
    if (phase != Phase::running && std::chrono::steady_clock::now() > shutdown_deadline_) {
      if (phase == Phase::draining) abort_job(fmt::format("its {} sends to complete", sends_open_));
      if (phase == Phase::meeting) abort_job("the other hosts to reach the end");
      abort_job(fmt::format("its {} receives to complete", receives_open_));
    }
    if (!busy) {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, kIdleSleep, [&] { return !queue_.empty(); });
    }
  }
  MPI_Finalize();
}

void MpiLink::post(Outgoing& m) {
  const bool inline_data = m.data.size() <= kInlineBytes;
  detail::ByteWriter w;
  w.put(m.kind).put<std::uint64_t>(m.data.size()).put<std::uint64_t>(chunk_).put_string(m.key);
  if (inline_data) w.put_bytes(m.data.data(), m.data.size());
  InFlight& f = in_flight_.emplace_back(InFlight{false, m.to, {}, w.take(), {}});
  if (!inline_data) f.data = std::move(m.data);
  MPI_Request r;
  MPI_Isend(f.header.data(), int(f.header.size()), MPI_BYTE, m.to, kTagHeader, MPI_COMM_WORLD, &r);
  track(&f, r);
  for (std::size_t at = 0; at < f.data.size(); at += chunk_) {
    const std::size_t n = std::min(chunk_, f.data.size() - at);
    MPI_Isend(f.data.data() + at, int(n), MPI_BYTE, m.to, kTagData, MPI_COMM_WORLD, &r);
    track(&f, r);
  }
  ++sends_open_;
}

bool MpiLink::poll_headers() {
  bool any = false;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kTagHeader, MPI_COMM_WORLD, &flag, &status);
    if (!flag) return any;
    any = true;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    const int from = status.MPI_SOURCE;
    Bytes header(static_cast<std::size_t>(count));
    MPI_Recv(header.data(), count, MPI_BYTE, from, kTagHeader, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    Kind kind;
    std::uint64_t size = 0, chunk = 0;
    std::string key;
    try {
      detail::ByteReader r(header, fmt::format("header from host {}", from));
      kind = r.get<Kind>();
      size = r.get<std::uint64_t>();
      chunk = r.get<std::uint64_t>();
      key = r.get_string();
      COCEMU_CHECK(kind == Kind::message || kind == Kind::failure, Errc::mismatch,
                   "header from host {} has kind {}; allowed: 1 (message) or 2 (failure)", from,
                   int(kind));
      COCEMU_CHECK(chunk >= 1 && chunk <= INT_MAX, Errc::mismatch,
                   "header from host {} has chunk size {}; allowed: 1..{}", from, chunk, INT_MAX);
      if (size <= kInlineBytes) {
        const std::byte* p = r.take(size);
        COCEMU_CHECK(r.done(), Errc::mismatch, "header from host {} has {} bytes after its payload",
                     from, header.size());
        if (kind == Kind::failure) {
          deliver_failure(from, std::move(key));
        } else {
          deliver(std::move(key), Bytes(p, p + size));
        }
        continue;
      }
    } catch (const Error& e) {
      deliver_failure(from, fmt::format("sent a message this host cannot read ({}); hosts running "
                                        "different cocemu versions?",
                                        e.message()));
      continue;
    }
    InFlight& f = in_flight_.emplace_back(InFlight{true, from, std::move(key), {}, {}});
    f.data.resize(size);
    for (std::size_t at = 0; at < size; at += chunk) {
      const std::size_t n = std::min<std::size_t>(chunk, size - at);
      MPI_Request req;
      MPI_Irecv(f.data.data() + at, int(n), MPI_BYTE, from, kTagData, MPI_COMM_WORLD, &req);
      track(&f, req);
    }
    ++receives_open_;
  }
}

bool MpiLink::test_requests() {
  if (requests_.empty()) return false;
  int done = 0;
  std::vector<int> indices(requests_.size());
  MPI_Testsome(int(requests_.size()), requests_.data(), &done, indices.data(), MPI_STATUSES_IGNORE);
  if (done == MPI_UNDEFINED || done == 0) return false;
  for (int i = 0; i < done; ++i) {
    InFlight* f = owners_[std::size_t(indices[std::size_t(i)])];
    if (--f->open > 0) continue;
    if (f->receiving) {
      deliver(std::move(f->key), std::move(f->data));
      --receives_open_;
    } else {
      --sends_open_;
    }
    in_flight_.remove_if([f](const InFlight& g) { return &g == f; });
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    requests_[kept] = requests_[i];
    owners_[kept++] = owners_[i];
  }
  requests_.resize(kept);
  owners_.resize(kept);
  return true;
}

void MpiLink::abort_job(const std::string& waiting_for) {
  std::fprintf(stderr,
               "cocemu: %s: waited %lld ms at the end of the program for %s (a host that "
               "crashed, hangs, or never ends its MPI link?); ending the MPI job (MPI_Abort)\n",
               describe().c_str(), static_cast<long long>(default_timeout().count()),
               waiting_for.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

// The process's link, ended by close_mpi_hosts or at exit (this object is made on the first
// mpi_hosts(), after the MPI libraries were loaded, so it is destroyed before they are).
struct Registry {
  std::mutex mu;
  std::shared_ptr<MpiLink> link;
  bool ended = false;
  ~Registry() {
    if (link) link->close();
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::shared_ptr<HostLink> mpi_hosts() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  COCEMU_CHECK_ARG(!r.ended,
                   "mpi_hosts(): the MPI transport of this process was closed "
                   "(close_mpi_hosts), and MPI cannot start twice in one process");
  if (!r.link) r.link = MpiLink::start(chunk_bytes());
  return r.link;
}

void close_mpi_hosts() {
  Registry& r = registry();
  std::shared_ptr<MpiLink> link;
  {
    std::lock_guard lock(r.mu);
    link = r.link;
    if (link) r.ended = true;
  }
  if (link) link->close();
}

}  // namespace cocemu
