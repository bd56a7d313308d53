#pragma once
// Failures of ranks and stream ops as the errors `run` reports (world.cpp); shared by world.cpp
// and run.cpp. Private to the runtime.
#include <exception>
#include <string_view>

namespace cocemu::detail {

/// A failure, named with `where` it happened (a stream and its op, the host thread) when it does
/// not say it itself; never throws: when the description cannot be built (out of memory), the
/// original exception is returned as it is. `wrap_resource`: a resource_exhausted cocemu::Error
/// gets `where` too.
std::exception_ptr op_failure(std::exception_ptr e, std::string_view where,
                              bool wrap_resource = true) noexcept;

}  // namespace cocemu::detail
