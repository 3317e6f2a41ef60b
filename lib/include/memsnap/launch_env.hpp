// Who am I in the job: rank, local rank, world size and node from the launcher's environment.
#pragma once

#include <string>

#include "memsnap/config.hpp"

namespace memsnap {

struct LaunchInfo {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  std::string launcher = "none";  // torchrun | openmpi | pmix | slurm | none
  std::string job_id;             // SLURM_JOB_ID, PMIx namespace, torchrun run id ... (may be empty)
};

// Reads, in order: torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK),
// Open MPI (OMPI_COMM_WORLD_*), PMIx (PMIX_RANK), Slurm (SLURM_PROCID, SLURM_LOCALID, ...).
LaunchInfo detect_launch(const EnvLookup& env);

// The run name when the config names none: "job-<id>" from the launcher, else "memsnap".
std::string default_run_name(const LaunchInfo& info);

}  // namespace memsnap
