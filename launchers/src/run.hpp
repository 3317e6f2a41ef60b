// `memsnap run`: wraps one rank's training command under mpirun, srun or torchrun.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace memsnap {

struct RunOptions {
  std::string config;                // config file (default $MEMSNAP_CONFIG)
  std::vector<std::string> command;  // the training command and its arguments
  bool no_aggregate = false;         // record only; print the follow-up commands
  bool aggregate_when_done = false;  // torchrun (no MPI): rank 0 waits for every rank, then aggregates serially
  double wait_seconds = 600;         // how long rank 0 waits for the other ranks' records
  bool report = true;                // render the report after aggregating
  bool cupti = true;                 // inject libmemsnap_cupti.so when it is built
  bool torch = true;                 // Python jobs: attach to PyTorch's allocator (memsnap_torch)
  std::string self;                  // path of the memsnap binary (for the follow-up commands)
};

// Returns the child's exit code (128 + N when signal N ended it) and, in `ended_by`, that signal
// (0 when it exited), for end_by_signal.
int run_main(const RunOptions& options, int* ended_by = nullptr);

// Ends memsnap run as its command ended, by the same signal, so that a shell, a script's loop
// (bash stops a loop whose command died of SIGINT, not one that exited 130) or mpirun sees what it
// would have seen without memsnap. Core dumps are off first: the command's core is not memsnap's.
[[noreturn]] void end_by_signal(int sig);

// How a child ended, as recorded in RUN_DIR/spill/rank<R>.exit.json.
struct ExitRecord {
  int rank = 0;
  long pid = 0;
  int exit_code = 0;        // when it exited
  int signal = 0;           // when a signal killed it
  bool core_dumped = false;
  std::string how;          // "exited with 0", "killed by SIGKILL (often the kernel's OOM killer)", ...
  std::string used_mpi;     // "yes" | "no" | "unknown" (the child left no clean record)
  double seconds = 0;
  std::string command;
};

std::string describe_exit(int status, int& exit_code, int& signal, bool& core);

}  // namespace memsnap
