// The MPI HostLink between real MPI processes (run by test_mpi_link.py under mpirun_netns.py, one
// process per network namespace). One mode per run, as MPI starts once per process:
//
//   mpi_link_check messages   keyed messages of many sizes between every pair of hosts, both
//                             ways, contents checked; a wait that times out; a failure report
//                             from the last host reaching every other host as an error naming it
//   mpi_link_check bandwidth  64 MiB from host 0 to host 1 through HostLink, best of 5
//   mpi_link_check raw        the same transfer with MPI_Send/MPI_Recv, best of 5
//   mpi_link_check stuck      host 0 ends its link while the others sleep 60 s without ending
//                             theirs: host 0 must end the job (MPI_Abort) after its timeout
//
// Prints "ok …" lines and, for the bandwidth modes, "bandwidth <mode> <bytes> <seconds> <GB/s>"
// (GB = 1e9 bytes); exits 1 with "FAILED: …" on the first wrong result.
// The C API only: Open MPI's mpi.h otherwise pulls in its C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/mpi_link.h"
#include "cocemu/runtime/sync.h"

using namespace cocemu;

namespace {

constexpr std::size_t kBandwidthBytes = std::size_t(64) << 20;
constexpr int kRepeats = 5;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  std::fflush(stderr);
  std::exit(1);
}

void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// The byte at `i` of the message from `from` to `to` of `size` bytes: every message differs.
std::byte pattern(int from, int to, std::size_t size, std::size_t i) {
  return std::byte((i * 131 + size * 7 + std::size_t(from) * 31 + std::size_t(to) * 17) % 251);
}

Bytes make(int from, int to, std::size_t size) {
  Bytes b(size);
  for (std::size_t i = 0; i < size; ++i)
    b[i] = pattern(from, to, size, i);
  return b;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void print_bandwidth(const char* mode, double best_s) {
  std::printf("bandwidth %s %zu %.6f %.3f\n", mode, kBandwidthBytes, best_s,
              double(kBandwidthBytes) / best_s / 1e9);
}

// Sizes around the inline limit (64 KiB) and the chunk size the test sets
// (COCEMU_MPI_CHUNK_BYTES = 1000003: 3 MB + 1 is four chunks).
const std::vector<std::size_t> kSizes = {
    0, 1, 7, 65535, 65536, 65537, 1 << 20, 1000003, 1000004, 3000010, (1 << 20) * 24 + 1};

void messages(HostLink& link) {
  const int me = link.host(), n = link.n_hosts();
  auto key = [](int from, int to, std::size_t size, int i) {
    return fmt::format("m/{}/{}/{}/{}", from, to, size, i);
  };
  // Everything first, then receive in the opposite order: arrival order must not matter.
  std::size_t sent = 0;
  for (int to = 0; to < n; ++to) {
    if (to == me) continue;
    for (std::size_t size : kSizes) {
      link.send(to, key(me, to, size, 0), make(me, to, size));
      sent += size;
    }
    for (int i = 0; i < 200; ++i)  // many small messages under distinct keys
      link.send(to, key(me, to, 3, i + 1), make(me, to, 3 + std::size_t(i)));
  }
  for (int from = n - 1; from >= 0; --from) {
    if (from == me) continue;
    for (int i = 200; i >= 1; --i) {
      const std::size_t size = 3 + std::size_t(i - 1);
      Bytes got = link.receive(key(from, me, 3, i), [] { return std::string("small message"); });
      expect(got == make(from, me, size),
             fmt::format("small message {} from host {} differs", i, from));
    }
    for (auto it = kSizes.rbegin(); it != kSizes.rend(); ++it) {
      Bytes got = link.receive(key(from, me, *it, 0), [] { return std::string("message"); });
      expect(got.size() == *it,
             fmt::format("message of {} B from host {} arrived with {} B", *it, from, got.size()));
      expect(got == make(from, me, *it),
             fmt::format("message of {} B from host {} has other contents", *it, from));
    }
  }
  std::printf(
      "ok messages: %zu sizes (0 B .. %zu B) and 200 small ones, each way between %d "
      "hosts; host %d sent %zu payload bytes to the others\n",
      kSizes.size(), kSizes.back(), n, me, sent);

  // A wait for a message that never comes ends with a timeout naming it.
  {
    WaitScope scope;
    scope.timeout = std::chrono::milliseconds(300);
    ScopedWaitScope installed(scope);
    try {
      link.receive("never-sent", [] { return std::string("the message never sent"); });
      fail("receive of a message never sent returned");
    } catch (const Error& e) {
      expect(e.code() == Errc::timeout,
             fmt::format("timeout gave code {}: {}", to_string(e.code()), e.what()));
      expect(std::string(e.what()).find("the message never sent") != std::string::npos,
             fmt::format("timeout message does not name the wait: {}", e.what()));
    }
    std::printf("ok timeout: a receive that nobody sends to ends after 300 ms\n");
  }

  // The last host fails once every other host is past its timeout check; every other host's
  // wait ends with its report.
  const int failing = n - 1;
  if (me == failing) {
    for (int h = 0; h < failing; ++h)
      link.receive(fmt::format("ready/{}", h), [] { return std::string("ready"); });
    link.report_failure("injected failure for the test");
  } else {
    link.send(failing, fmt::format("ready/{}", me), {});
    try {
      link.receive("after-failure", [] { return std::string("a message after the failure"); });
      fail("receive after a peer's failure returned");
    } catch (const Error& e) {
      const std::string text = e.what();
      expect(e.code() == Errc::remote_failure,
             fmt::format("peer failure gave code {}: {}", to_string(e.code()), text));
      const std::string want =
          fmt::format("host {} failed: injected failure for the test", failing);
      expect(text.find(want) != std::string::npos,
             fmt::format("peer failure message lacks '{}': {}", want, text));
      std::printf("ok failure: %s\n", e.message().c_str());
    }
  }
}

void link_bandwidth(HostLink& link) {
  const int me = link.host();
  if (me > 1) return;
  const Bytes payload = make(0, 1, kBandwidthBytes);
  double best = 1e300;
  for (int i = 0; i <= kRepeats; ++i) {  // round 0 warms up
    const std::string key = fmt::format("bw/{}", i), ack = fmt::format("ack/{}", i);
    if (me == 0) {
      Bytes copy = payload;  // not timed: send takes its buffer
      const auto t0 = std::chrono::steady_clock::now();
      link.send(1, key, std::move(copy));
      link.receive(ack, [] { return std::string("ack"); });
      if (i > 0) best = std::min(best, seconds_since(t0));
    } else {
      Bytes got = link.receive(key, [] { return std::string("64 MiB"); });
      link.send(0, ack, {});
      expect(got == payload, "64 MiB message has other contents");
    }
  }
  if (me == 0) print_bandwidth("link", best);
}

void raw_bandwidth() {
  MPI_Init(nullptr, nullptr);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  expect(n >= 2, fmt::format("raw mode needs 2 or more MPI processes, got {}", n));
  if (me <= 1) {
    Bytes buf = make(0, 1, kBandwidthBytes);
    if (me == 1) std::fill(buf.begin(), buf.end(), std::byte{0});
    double best = 1e300;
    for (int i = 0; i <= kRepeats; ++i) {
      if (me == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        MPI_Send(buf.data(), int(buf.size()), MPI_BYTE, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(nullptr, 0, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (i > 0) best = std::min(best, seconds_since(t0));
      } else {
        MPI_Recv(buf.data(), int(buf.size()), MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(nullptr, 0, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
      }
    }
    if (me == 1) expect(buf == make(0, 1, kBandwidthBytes), "raw 64 MiB has other contents");
    if (me == 0) print_bandwidth("raw", best);
  }
  MPI_Finalize();
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run killed at its timeout still shows its lines
  const std::string mode = argc == 2 ? argv[1] : "";
  try {
    if (mode == "raw") {
      raw_bandwidth();
      return 0;
    }
    if (mode != "messages" && mode != "bandwidth" && mode != "stuck") {
      std::fprintf(stderr, "usage: %s messages|bandwidth|raw|stuck (got '%s')\n", argv[0],
                   mode.c_str());
      return 2;
    }
    expect(mpi_available(), "mpi_available() is false in a build with MPI");
    auto link = mpi_hosts();
    expect(link->n_hosts() >= 2, fmt::format("{}: needs 2 or more hosts", link->describe()));
    expect(mpi_hosts() == link, "a second mpi_hosts() gave another link");
    expect(link->transport().find("MPI (") == 0,
           fmt::format("transport() = '{}'", link->transport()));
    std::printf("%s: %s\n", link->describe().c_str(), link->transport().c_str());
    if (mode == "stuck") {
      if (link->host() != 0) std::this_thread::sleep_for(std::chrono::seconds(60));
      close_mpi_hosts();  // host 0: aborts the job after COCEMU_TIMEOUT_MS
      fail(fmt::format("{}: close_mpi_hosts() returned while another host never ended its link",
                       link->describe()));
    }
    if (mode == "messages") {
      messages(*link);
    } else {
      link_bandwidth(*link);
    }
    close_mpi_hosts();
    try {
      link->send((link->host() + 1) % link->n_hosts(), "late", {});
      fail("send after close_mpi_hosts() was accepted");
    } catch (const Error& e) {
      expect(e.code() == Errc::invalid_argument, e.what());
    }
    std::printf("ok closed\n");
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
}
