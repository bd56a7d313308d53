#pragma once
/// Reading the files that path options name (profiles, models, CoC and training configs,
/// validation references, .npy inputs), bounded: only regular files are read — a directory, a
/// named pipe, a device (/dev/zero) or a socket is refused before it is opened for reading, so
/// nothing blocks or reads forever — and a file's size is checked (fstat) before reading, which
/// then stops at the limit.
#include <cstdint>
#include <string>

namespace cocemu {

/// The size limit of configuration files (YAML).
inline constexpr std::int64_t kMaxConfigBytes = std::int64_t(4) << 20;

/// The bytes of the regular file at `path`, at most `max_bytes` of them, or an
/// `Errc::invalid_argument` naming `what` (the option or the kind of file: "--config", "device
/// profile") and the path: missing, a directory, not a regular file (and which kind), larger than
/// the limit, unreadable.
std::string read_input_file(const std::string& path, const std::string& what,
                            std::int64_t max_bytes = kMaxConfigBytes);

}  // namespace cocemu
