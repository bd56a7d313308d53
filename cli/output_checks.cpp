// Up-front checks of output paths, so a long run never ends in a write that cannot happen.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/limits.h"
#include "commands.h"

namespace cocemu::cli {

double time_budget(double value) {
  return value > 0 ? value : default_max_seconds();
}

void check_output_dir(const std::string& option, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  COCEMU_CHECK_ARG(!ec && std::filesystem::is_directory(dir),
                   "{} '{}' cannot be used as an output folder: {}", option, dir,
                   ec ? ec.message() : "it is not a directory");
  const std::string probe = dir + "/.cocemu-write-test";
  {
    std::ofstream f(probe);
    COCEMU_CHECK_ARG(f.good(), "{} '{}' is not writable", option, dir);
  }
  std::filesystem::remove(probe, ec);
}

namespace {
/// An output that is a named pipe (or a socket) would block the write until something reads it:
/// outputs are regular files, or a device such as /dev/null.
void check_not_a_pipe(const std::string& option, const std::string& path) {
  std::error_code ec;
  const auto type = std::filesystem::status(path, ec).type();
  COCEMU_CHECK_ARG(
      type != std::filesystem::file_type::fifo && type != std::filesystem::file_type::socket,
      "{} '{}' is a {}; outputs go to regular files (or a device such as /dev/null): "
      "writing to it would wait for a reader",
      option, path, type == std::filesystem::file_type::fifo ? "named pipe" : "socket");
}
}  // namespace

void check_output_file(const std::string& option, const std::string& path) {
  std::error_code ec;
  COCEMU_CHECK_ARG(!std::filesystem::is_directory(path, ec), "{} '{}' is a directory", option,
                   path);
  check_not_a_pipe(option, path);
  const bool existed = std::filesystem::exists(path, ec);
  std::ofstream f(path, std::ios::app);
  COCEMU_CHECK_ARG(f.good(), "{} '{}' cannot be written (missing folder or no permission)", option,
                   path);
  f.close();
  if (!existed) std::filesystem::remove(path, ec);
}

}  // namespace cocemu::cli

namespace cocemu::cli {

void write_file(const std::string& option, const std::string& path, const std::string& text) {
  std::error_code ec;
  COCEMU_CHECK_ARG(!std::filesystem::is_directory(path, ec), "{} '{}' is a directory", option,
                   path);
  check_not_a_pipe(option, path);
  std::ofstream f(path);
  COCEMU_CHECK_ARG(f.good(), "{} '{}' cannot be written (missing folder or no permission)", option,
                   path);
  f << text;
  f.close();
  COCEMU_CHECK_ARG(!f.fail(), "{} '{}': the write failed (disk full?)", option, path);
}

}  // namespace cocemu::cli
