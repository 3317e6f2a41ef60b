// Owning handles and checked calls over MPI for the aggregator and the layers above it (report,
// the CLI): an MPI session, a duplicated communicator, and the byte gathers/broadcasts that carry
// serialized metadata to rank 0.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "memsnap/errors.hpp"
#include "memsnap/interrupt.hpp"

namespace memsnap::mpi {

inline bool initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

inline bool finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

namespace detail {
// Read as the program loads, before anything initialises MPI: a singleton's MPI_Init sets
// PMIX_RANK in the process's own environment (Open MPI 4.1), so a later look would see a launch.
inline const bool g_launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
                               std::getenv("PMI_RANK") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}  // namespace detail

/// Whether a launcher (mpirun, srun, another PMI) started this process; if not, MPI makes it a
/// singleton.
inline bool launched() { return detail::g_launched; }

inline void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw AggregateError(std::string("MPI: ") + what + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

/// Initialises MPI if nobody did, and finalises it at the end only in that case.
class Session {
 public:
  Session() {
    if (finalized()) throw AggregateError("MPI was already finalized in this process; it cannot be used again");
    if (!initialized()) {
      // A process no launcher started (`memsnap import`, `view`, `report` on a login node) is a
      // singleton that only ever talks to itself, yet Open MPI would first start a daemon (orted)
      // and open every network and GPU component it has: on a GPU host with Ubuntu's Open MPI that
      // took 0.53 s of a 0.54 s import (hwloc probing the GPUs, UCX, CUDA). Measured there, the
      // settings below bring it to 0.04 s. They are set only for this MPI_Init, only where the user
      // has not set them, and taken back after, so a command memsnap starts later (`memsnap run`'s
      // child) inherits none of them. Other MPIs ignore these variables.
      static constexpr const char* kSingleton[][2] = {
          {"OMPI_MCA_ess_singleton_isolated", "1"},  // no orted
          {"OMPI_MCA_pml", "ob1"},                   // not UCX
          {"OMPI_MCA_btl", "self"},                  // one process: no shared memory, no network
          {"OMPI_MCA_mtl", "^ofi,psm2"},
          {"OMPI_MCA_osc", "^ucx"},
          {"OMPI_MCA_coll", "^hcoll"},
          {"OMPI_MCA_opal_cuda_support", "0"},
          // No GPU probing, and no I/O discovery at all (`-linuxio`): hwloc read every PCI
          // device's config space from sysfs, 10 ms of a 90 ms import on a VM of 6 devices.
          {"HWLOC_COMPONENTS", "-cuda,-nvml,-opencl,-rsmi,-levelzero,-gl,-linuxio"},
          // nor their plugins loaded (with the libraries they need: X11, OpenCL, libxml2, NVML):
          // 2 MiB of resident memory on Debian, where a 27 MB pickle's import peaks near 42 MiB.
          {"HWLOC_PLUGINS_BLACKLIST",
           "hwloc_pci,hwloc_cuda,hwloc_nvml,hwloc_opencl,hwloc_gl,hwloc_rsmi,hwloc_levelzero,hwloc_xml_libxml"},
      };
      std::vector<const char*> set_here;
      if (!launched()) {
        for (const auto& [name, value] : kSingleton) {
          if (std::getenv(name) != nullptr) continue;
          ::setenv(name, value, 0);
          set_here.push_back(name);
        }
        // Every isolated singleton is job family 0, so all of them would keep their session files
        // in the same folder (TMPDIR/ompi.HOST.UID/jf.0/1): two memsnap commands at once then
        // race on it, and one fails in MPI_Init ("mkdir ... File exists"). Each gets a folder
        // of its own, removed after MPI_Finalize.
        const bool isolated_here = !set_here.empty() && std::string(set_here.front()) == "OMPI_MCA_ess_singleton_isolated";
        if (isolated_here && std::getenv(kSessionBase) == nullptr) {
          std::error_code ec;
          std::string folder = (std::filesystem::temp_directory_path(ec) / "memsnap-mpi-XXXXXX").string();
          if (!ec && ::mkdtemp(folder.data()) != nullptr) {
            m_session_base = folder;
            m_session_guard = interrupt::Temporary(folder);  // and if the command is interrupted
            ::setenv(kSessionBase, folder.c_str(), 0);
            set_here.push_back(kSessionBase);
          }
        }
      }
      int argc = 0;
      char** argv = nullptr;
      const int rc = MPI_Init(&argc, &argv);
      for (const char* name : set_here) ::unsetenv(name);
      if (rc != MPI_SUCCESS) remove_session_base();
      check(rc, "MPI_Init");
      m_owned = true;
    }
  }
  ~Session() {
    if (m_owned && !finalized()) MPI_Finalize();
    remove_session_base();
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  static constexpr const char* kSessionBase = "OMPI_MCA_orte_tmpdir_base";
  bool m_owned = false;
  std::string m_session_base;  // the folder made for this process's Open MPI session, or empty
  interrupt::Temporary m_session_guard;

  void remove_session_base() noexcept {
    if (m_session_base.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(m_session_base, ec);  // made by mkdtemp here: only this process wrote in it
    m_session_base.clear();
    m_session_guard.release();
  }
};

/// A private duplicate of a communicator: our messages never mix with the application's, and
/// errors return codes (checked) instead of aborting the job.
class Comm {
 public:
  explicit Comm(MPI_Comm parent) {
    if (!initialized() || finalized()) throw AggregateError("MPI is not initialised (or already finalized)");
    check(MPI_Comm_dup(parent, &m_comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(m_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m_comm, &m_rank);
    MPI_Comm_size(m_comm, &m_size);
  }
  ~Comm() {
    if (m_comm != MPI_COMM_NULL && !finalized()) {
      if (MPI_Comm_free(&m_comm) != MPI_SUCCESS) std::cerr << "memsnap: warning: MPI_Comm_free failed\n";
    }
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  Comm(Comm&& o) noexcept
      : m_comm(std::exchange(o.m_comm, MPI_COMM_NULL)), m_rank(o.m_rank), m_size(o.m_size) {}
  Comm& operator=(Comm&&) = delete;

  MPI_Comm get() const { return m_comm; }
  int rank() const { return m_rank; }
  int size() const { return m_size; }

 private:
  MPI_Comm m_comm = MPI_COMM_NULL;
  int m_rank = 0;
  int m_size = 1;
};

/// MPI for one command: initialised when nobody did (and finalised at the end then), and a
/// private duplicate of MPI_COMM_WORLD. Throws AggregateError.
struct World {
  Session session;
  Comm comm{MPI_COMM_WORLD};
};

/// Broadcasts a byte buffer from `root` (resized on the receivers).
inline void bcast_bytes(const Comm& comm, std::vector<char>& bytes, int root) {
  std::uint64_t n = bytes.size();
  check(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm.get()), "MPI_Bcast");
  if (n > static_cast<std::uint64_t>(INT_MAX)) throw AggregateError("a broadcast of " + std::to_string(n) + " bytes is too large");
  bytes.resize(n);
  if (n > 0) check(MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_BYTE, root, comm.get()), "MPI_Bcast");
}

/// Gathers every rank's bytes to `root` (one buffer per rank there; empty elsewhere).
/// The sizes go first and the root broadcasts whether the total fits one Gatherv, so every rank
/// takes the same path and none waits on a collective another skipped.
inline std::vector<std::vector<char>> gather_bytes(const Comm& comm, const std::vector<char>& mine, int root) {
  const std::uint64_t n = mine.size();
  std::vector<std::uint64_t> sizes(comm.rank() == root ? comm.size() : 0);
  check(MPI_Gather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, root, comm.get()), "MPI_Gather");
  int fits = 1;
  std::uint64_t total = 0;
  if (comm.rank() == root) {
    for (auto s : sizes) total += s;
    fits = total <= static_cast<std::uint64_t>(INT_MAX) ? 1 : 0;
  }
  check(MPI_Bcast(&fits, 1, MPI_INT, root, comm.get()), "MPI_Bcast");
  if (!fits) throw AggregateError("the gathered metadata (" + std::to_string(total) + " bytes) is over 2 GiB");
  std::vector<int> counts, displs;
  std::vector<char> all;
  if (comm.rank() == root) {
    counts.resize(comm.size());
    displs.resize(comm.size());
    int off = 0;
    for (int r = 0; r < comm.size(); ++r) {
      counts[r] = static_cast<int>(sizes[r]);
      displs[r] = off;
      off += counts[r];
    }
    all.resize(total);
  }
  check(MPI_Gatherv(mine.data(), static_cast<int>(n), MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE,
                    root, comm.get()),
        "MPI_Gatherv");
  std::vector<std::vector<char>> out;
  if (comm.rank() == root) {
    for (int r = 0; r < comm.size(); ++r) out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + counts[r]);
  }
  return out;
}

/// Every rank learns whether any rank failed: returns "" when none did, else the first failing
/// rank's message (on rank 0; "failed" elsewhere). Collective, so no rank waits on one that quit.
inline std::string agree_on_error(const Comm& comm, const std::string& mine) {
  int bad = mine.empty() ? 0 : 1, any = 0;
  check(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm.get()), "MPI_Allreduce");
  if (!any) return {};
  const auto all = gather_bytes(comm, std::vector<char>(mine.begin(), mine.end()), 0);
  for (const auto& m : all) {
    if (!m.empty()) return std::string(m.begin(), m.end());
  }
  return "failed";
}

}  // namespace memsnap::mpi
