#include "memsnap/launch_env.hpp"

#include <cstdlib>

namespace memsnap {
namespace {

std::optional<int> env_int(const EnvLookup& env, const char* name) {
  auto v = env(name);
  if (!v || v->empty()) return std::nullopt;
  char* end = nullptr;
  long n = std::strtol(v->c_str(), &end, 10);
  if (*end != '\0' || n < 0 || n > (1 << 30)) return std::nullopt;
  return static_cast<int>(n);
}

}  // namespace

LaunchInfo detect_launch(const EnvLookup& env) {
  LaunchInfo info;
  auto take = [&](const char* rank, const char* local_rank, const char* world, const char* local_world,
                  const char* node, const char* launcher) {
    auto r = env_int(env, rank);
    if (!r) return false;
    info.rank = *r;
    info.local_rank = local_rank ? env_int(env, local_rank).value_or(0) : 0;
    info.world_size = world ? env_int(env, world).value_or(info.rank + 1) : info.rank + 1;
    info.local_world_size = local_world ? env_int(env, local_world).value_or(1) : 1;
    info.node_rank = node ? env_int(env, node).value_or(0) : 0;
    info.launcher = launcher;
    return true;
  };
  // torchrun first: it sets per-process values even when started by srun or mpirun.
  if (!take("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "torchrun") &&
      !take("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "openmpi") &&
      !take("PMIX_RANK", "PMIX_LOCAL_RANK", "PMIX_SIZE", "PMIX_LOCAL_SIZE", "PMIX_NODE_RANK", "pmix") &&
      !take("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "slurm")) {
    info.launcher = "none";
  }
  if (info.world_size <= info.rank) info.world_size = info.rank + 1;
  // Slurm's SLURM_NTASKS_PER_NODE may read "4(x2)"; fall back to the step's local task count.
  if (info.launcher == "slurm" && !env_int(env, "SLURM_NTASKS_PER_NODE")) {
    info.local_world_size = env_int(env, "SLURM_STEP_NUM_TASKS").value_or(1);
  }

  for (const char* id : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"}) {
    if (auto v = env(id); v && !v->empty() && *v != "none") {
      info.job_id = *v;
      break;
    }
  }
  return info;
}

std::string default_run_name(const LaunchInfo& info) {
  if (info.job_id.empty()) return "memsnap";
  std::string name = "job-";
  for (char c : info.job_id) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    name += keep ? c : '_';
  }
  return name;
}

}  // namespace memsnap
