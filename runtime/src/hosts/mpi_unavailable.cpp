// mpi_link.h in a build without MPI: the CLI still links, and a run on several hosts says what
// is missing.
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/mpi_link.h"

#include <cstdlib>

namespace cocemu {

bool started_by_mpirun() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size && std::atoi(size) > 1;
}

bool mpi_available() {
  return false;
}

std::shared_ptr<HostLink> mpi_hosts() {
  COCEMU_FAIL(Errc::invalid_argument,
              "this cocemu was built without MPI, so it cannot run a world on several hosts "
              "(mpirun): install Open MPI (`./bootstrap.sh deps` installs libopenmpi-dev and "
              "openmpi-bin on Debian) and reconfigure (cmake -S . -B build), which finds it");
}

void close_mpi_hosts() {}

}  // namespace cocemu
