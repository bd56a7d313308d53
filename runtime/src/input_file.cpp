#include "cocemu/runtime/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/limits.h"

namespace cocemu {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// Refuses anything but a regular file of at most `max_bytes`.
void check_kind_and_size(const struct stat& st, const std::string& path, const std::string& what,
                         std::int64_t max_bytes) {
  COCEMU_CHECK_ARG(!S_ISDIR(st.st_mode), "{} '{}' is a directory, not a file", what, path);
  COCEMU_CHECK_ARG(S_ISREG(st.st_mode),
                   "{} '{}' is {}, not a regular file; cocemu reads only regular files (a pipe "
                   "or a device could block or never end)",
                   what, path, kind_of(st.st_mode));
  COCEMU_CHECK_ARG(
      std::int64_t(st.st_size) <= max_bytes, "{} '{}' has {} bytes ({}); at most {} are read", what,
      path, std::int64_t(st.st_size), format_gib(std::int64_t(st.st_size)), format_gib(max_bytes));
}

}  // namespace

std::string read_input_file(const std::string& path, const std::string& what,
                            std::int64_t max_bytes) {
  COCEMU_CHECK_ARG(!path.empty(), "{}: the path is empty", what);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    COCEMU_FAIL(Errc::invalid_argument, "cannot open {} '{}': {}", what, path, std::strerror(err));
  }
  check_kind_and_size(st, path, what, max_bytes);
  // Non-blocking, and checked again on the open file: the path may have been replaced by a pipe
  // between the two calls.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    COCEMU_FAIL(Errc::invalid_argument, "cannot open {} '{}': {}", what, path, std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  COCEMU_CHECK_ARG(::fstat(fd, &st) == 0, "cannot read {} '{}': {}", what, path,
                   std::strerror(errno));
  check_kind_and_size(st, path, what, max_bytes);
  // Files of /proc report size 0 and still have text: read up to the limit, one byte past it to
  // see whether there is more.
  std::string out;
  out.resize(std::size_t(std::max<std::int64_t>(st.st_size, 0)) + 1);
  std::size_t have = 0;
  for (;;) {
    if (have == out.size()) {
      if (std::int64_t(have) > max_bytes) break;
      out.resize(
          std::min<std::size_t>(std::size_t(max_bytes) + 1, std::max<std::size_t>(have * 2, 4096)));
    }
    const ssize_t n = ::read(fd, out.data() + have, out.size() - have);
    if (n < 0 && errno == EINTR) continue;
    COCEMU_CHECK_ARG(n >= 0, "cannot read {} '{}': {}", what, path, std::strerror(errno));
    if (n == 0) break;
    have += std::size_t(n);
  }
  COCEMU_CHECK_ARG(std::int64_t(have) <= max_bytes,
                   "{} '{}' has more than {} bytes ({}); at most {} are read", what, path,
                   max_bytes, format_gib(max_bytes), format_gib(max_bytes));
  out.resize(have);
  return out;
}

}  // namespace cocemu
