// Prints where cocemu finds its configs and loads a profile by name from there: built against the
// installed package, it must print <prefix>/share/cocemu.
#include <cstdio>

#include "cocemu/runtime/profile.h"

int main(int argc, char** argv) {
  std::printf("%s\n", cocemu::config_dir().c_str());
  const cocemu::DeviceProfile p = cocemu::load_named_profile(argc > 1 ? argv[1] : "ascend-910b");
  std::printf("%s\n", p.name.c_str());
  return 0;
}
