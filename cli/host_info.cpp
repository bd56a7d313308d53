// What the host process runs with, for benchmark headers.
#include <dlfcn.h>

#include <string>

#include "commands.h"

namespace cocemu::cli {

std::string malloc_library() {
  Dl_info info{};
  void* fn = dlsym(RTLD_DEFAULT, "malloc");
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const std::string path = info.dli_fname;
  return path.substr(path.find_last_of('/') + 1);
}

}  // namespace cocemu::cli
