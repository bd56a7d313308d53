// Where the shipped configs (devices/, models/, coc.yaml, validation.yaml) are found.
#include <dlfcn.h>
#include <link.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/profile.h"

#ifndef COCEMU_SOURCE_CONFIG_DIR
#define COCEMU_SOURCE_CONFIG_DIR "configs"
#endif
#ifndef COCEMU_BUILD_DIR
#define COCEMU_BUILD_DIR ""
#endif
#ifndef COCEMU_INSTALL_DATADIR
#define COCEMU_INSTALL_DATADIR "share"
#endif

namespace cocemu {

namespace {

namespace fs = std::filesystem;

/// The file holding this code: the shared object it was linked into (libcocemu.so, the Python
/// module) or, when linked statically into a program, that program.
struct CodeLocation {
  fs::path file;
  bool program = false;  ///< linked statically into the main program (the build tree's archives)
};

CodeLocation code_location() {
  Dl_info info{};
  link_map* map = nullptr;
  static const int anchor = 0;
  if (dladdr1(&anchor, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0 && map &&
      map->l_name && map->l_name[0] != '\0') {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(map->l_name, ec);
    if (!ec) return {p, false};
  }
  // The main program's link map has an empty name (and dladdr would give argv[0]).
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return {ec ? fs::path() : exe, true};
}

/// An installed layout: the file sits under <prefix>/bin, <prefix>/lib (or lib64, or
/// lib/<multiarch>, or lib/pythonX.Y/…-packages/cocemu for the Python module) beside
/// <prefix>/<datadir>/cocemu. The nearest such prefix at most six levels up wins.
std::optional<fs::path> installed_dir(const fs::path& file) {
  static constexpr std::array<std::string_view, 4> kInstallDirs = {"bin", "lib", "lib64",
                                                                   "libexec"};
  fs::path prefix = file.parent_path();
  for (int level = 0; level < 6 && prefix.has_relative_path(); ++level) {
    const fs::path below = file.lexically_relative(prefix);
    const std::string first = below.empty() ? "" : below.begin()->string();
    bool layout = false;
    for (std::string_view d : kInstallDirs)
      layout |= first == d;
    std::error_code ec;
    const fs::path candidate = prefix / COCEMU_INSTALL_DATADIR / "cocemu";
    if (layout && fs::is_directory(candidate / "devices", ec)) return candidate;
    prefix = prefix.parent_path();
  }
  return std::nullopt;
}

bool is_inside(const fs::path& file, const std::string& dir) {
  if (dir.empty()) return false;
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(dir, ec);
  if (ec) return false;
  const fs::path rel = file.lexically_relative(root);
  return !rel.empty() && rel.begin()->string() != "..";
}

/// The configs found from where this code lives, or an error saying where it looked.
struct Located {
  std::string dir;
  std::string error;
};

Located locate() {
  const auto [file, program] = code_location();
  if (file.empty()) return {"", "cannot tell where this program is (/proc/self/exe is unreadable)"};
  if (auto d = installed_dir(file)) return {d->string(), ""};
  if (is_inside(file, COCEMU_BUILD_DIR)) return {COCEMU_SOURCE_CONFIG_DIR, ""};
  // A program of one's own linked to the build tree's static libraries (only the shared library
  // is installed) reads the configs of the source tree it was built from, while that exists.
  std::error_code ec;
  if (program && fs::is_directory(fs::path(COCEMU_SOURCE_CONFIG_DIR) / "devices", ec))
    return {COCEMU_SOURCE_CONFIG_DIR, ""};
  return {"",
          fmt::format("'{}' is neither installed (beside <prefix>/{}/cocemu, under <prefix>/bin "
                      "or <prefix>/lib), nor in cocemu's build tree '{}', nor a program linked "
                      "to the static libraries of a source tree that still has its configs",
                      file.string(), COCEMU_INSTALL_DATADIR, COCEMU_BUILD_DIR)};
}

}  // namespace

std::string config_dir() {
  if (const char* d = std::getenv("COCEMU_CONFIG_DIR"); d && *d) return d;
  static const Located located = locate();
  COCEMU_CHECK_ARG(!located.dir.empty(),
                   "cannot find cocemu's configs (devices/, models/): {}; set COCEMU_CONFIG_DIR "
                   "to the folder that holds them",
                   located.error);
  return located.dir;
}

}  // namespace cocemu
