#pragma once
/// The group handle, shared by the collectives and layers bindings.
#include "cocemu/collectives/group.h"
#include "common.h"

namespace cocemu::python {

struct GroupHandle {
  Group group;
  SessionPtr session;
  Group& get(const char* call) {
    session->check(call);
    return group;
  }
  const Group& get(const char* call) const {
    session->check(call);
    return group;
  }
  /// As get, and the caller must be the owning rank's host thread.
  Group& host(const char* call) {
    session->check(call);
    check_host_thread(group.owner(), call);
    return group;
  }
};

}  // namespace cocemu::python
