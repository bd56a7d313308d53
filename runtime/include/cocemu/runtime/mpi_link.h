#pragma once
/// The MPI transport of a world on several hosts (SPEC R-PY-21): `mpirun -n H cocemu …` starts H
/// processes, and each one's `mpi_hosts()` is its end of a `HostLink` whose host is its MPI rank.
/// Built into the `cocemu` executable (library `cocemu_hosts_mpi`) when Open MPI is found at
/// configure time; the Python module never links MPI. How the transport works is described at the
/// top of runtime/src/hosts/mpi_link.cpp.
#include <memory>

#include "cocemu/runtime/hosts.h"

namespace cocemu {

/// Whether this process is one of several started by mpirun (OMPI_COMM_WORLD_SIZE > 1).
bool started_by_mpirun();

/// Whether this build has the MPI transport (Open MPI found at configure time).
bool mpi_available();

/// Initializes MPI once and returns this process's link: host = MPI rank, hosts = MPI size.
/// Every call returns the same link until `close_mpi_hosts` (or program exit) ends it; after that
/// it throws Errc::invalid_argument (MPI cannot start twice in one process).
/// Without MPI in the build: throws cocemu::Error(Errc::invalid_argument) saying so and how
/// to get it (bootstrap installs libopenmpi-dev; reconfigure).
std::shared_ptr<HostLink> mpi_hosts();

/// Ends the MPI transport: every queued send completes, the hosts meet, MPI is finalized. A host
/// that the others do not meet within the default wait timeout (COCEMU_TIMEOUT_MS, else 60 s)
/// ends the whole MPI job with a message (MPI_Abort) rather than hang. Runs at program exit on
/// its own; calling it earlier is for programs that go on without MPI. A no-op when MPI was never
/// started (and in a build without MPI). Later sends on the link throw.
void close_mpi_hosts();

}  // namespace cocemu
