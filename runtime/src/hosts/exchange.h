#pragma once
// What `run` exchanges between the hosts of one world (private to runtime/).
#include "cocemu/runtime/world.h"

namespace cocemu::detail {

/// Sends this host's ranks' recorded ops to every other host and installs theirs, so every host
/// holds the whole graph and computes one timeline. Waits within the caller's WaitScope.
void exchange_graphs(World& world);

}  // namespace cocemu::detail
