// libFuzzer targets for every parser of untrusted input. Each target feeds the fuzzer's bytes to
// one reader; a cocemu::Error is the expected answer to bad input, anything else (a crash, an
// uncaught exception, a sanitizer report, a hang) is a finding. Built with
// -DCOCEMU_FUZZ=ON by clang (`./bootstrap.sh fuzz`); COCEMU_FUZZ_TARGET selects the reader.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cocemu/layers/coc_config.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/npy.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/config.h"
#include "cocemu/train/validate.h"

namespace {

void parse(const std::string& text) {
#if COCEMU_FUZZ_TARGET == 1
  cocemu::parse_npy(text, "fuzz.npy");
#elif COCEMU_FUZZ_TARGET == 2
  cocemu::parse_device_profile(text, "fuzz.yaml");
#elif COCEMU_FUZZ_TARGET == 3
  cocemu::layers::parse_model_config(text, "fuzz.yaml");
#elif COCEMU_FUZZ_TARGET == 4
  cocemu::layers::parse_coc_config(text, "fuzz.yaml",
                                   [](const std::string&) { return std::nullopt; });
#elif COCEMU_FUZZ_TARGET == 5
  cocemu::bench::validate(text, "fuzz.yaml");
#elif COCEMU_FUZZ_TARGET == 6
  cocemu::bench::parse_train_config(text, "fuzz.yaml");
#else
#error "COCEMU_FUZZ_TARGET must be 1..6"
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    parse(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const cocemu::Error&) {
    // A clear error: the expected answer to bad input.
  }
  return 0;
}
