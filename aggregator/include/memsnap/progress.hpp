// A "done / total" counter across MPI ranks for work that takes a while (aggregate, import):
// rank 0 prints it on stderr, and only on a terminal (quiet in pipes, logs and tests).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "memsnap/mpi.hpp"

namespace memsnap {

/// Counts finished work across ranks (point-to-point, workers -> rank 0, one message per add;
/// each rank's counts must sum to its share of `total`). Rank 0 drains the others' counts between
/// its own adds and in finish(). The line ("memsnap aggregate: 3/8 ranks written") updates in
/// place, first shown once the work has taken a second (MEMSNAP_PROGRESS_DELAY: other seconds, as
/// git's GIT_PROGRESS_DELAY).
class Progress {
 public:
  /// What the line says after the label, given the count done and the total.
  using Text = std::function<std::string(std::size_t done, std::size_t total)>;

  /// `label`: the line's start ("memsnap aggregate"), `unit`: what is counted ("ranks written"),
  /// or `text` says it. Off (`on` false) it sends and prints nothing; every rank must agree on `on`.
  Progress(const mpi::Comm& comm, bool on, std::size_t total, std::string label, std::string unit, int tag)
      : m_comm(comm), m_on(on), m_total(total), m_label(std::move(label)), m_tag(tag) {
    m_text = [unit = std::move(unit)](std::size_t done, std::size_t total_) {
      return std::to_string(done) + "/" + std::to_string(total_) + " " + unit;
    };
  }
  Progress(const mpi::Comm& comm, bool on, std::size_t total, std::string label, Text text, int tag)
      : m_comm(comm), m_on(on), m_total(total), m_label(std::move(label)), m_text(std::move(text)), m_tag(tag) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Whether a progress line would be seen: stderr is a terminal.
  static bool wanted() { return ::isatty(STDERR_FILENO) != 0; }

  void add(std::size_t n) {
    if (!m_on || n == 0) return;
    if (m_comm.rank() != 0) {
      const std::uint64_t v = n;
      mpi::check(MPI_Send(&v, 1, MPI_UINT64_T, 0, m_tag, m_comm.get()), "MPI_Send");
      return;
    }
    m_done += n;
    drain(false);
    print();
  }
  /// Rank 0: waits for the other ranks' counts to reach the total; ends the line if one was shown.
  void finish() {
    if (!m_on || m_comm.rank() != 0) return;
    drain(true);
    print();
    if (m_shown) std::fputc('\n', stderr);
    m_shown = false;
  }

 private:
  void drain(bool wait) {
    while (m_done < m_total) {
      int flag = 1;
      MPI_Status st;
      if (!wait) {
        mpi::check(MPI_Iprobe(MPI_ANY_SOURCE, m_tag, m_comm.get(), &flag, &st), "MPI_Iprobe");
        if (!flag) return;
      }
      std::uint64_t v = 0;
      mpi::check(MPI_Recv(&v, 1, MPI_UINT64_T, MPI_ANY_SOURCE, m_tag, m_comm.get(), &st), "MPI_Recv");
      m_done += v;
      if (wait) print();
    }
  }
  void print() {
    if (!m_shown && std::chrono::steady_clock::now() - m_start < m_delay) return;
    m_shown = true;
    // \033[K: the rest of the line cleared, where an earlier text was longer.
    std::fprintf(stderr, "\r%s: %s\033[K", m_label.c_str(), m_text(m_done, m_total).c_str());
    std::fflush(stderr);
  }
  const mpi::Comm& m_comm;
  bool m_on;
  std::size_t m_total;
  std::string m_label;
  Text m_text;
  int m_tag;
  std::size_t m_done = 0;
  bool m_shown = false;
  std::chrono::steady_clock::time_point m_start = std::chrono::steady_clock::now();
  std::chrono::duration<double> m_delay{delay_seconds()};

  static double delay_seconds() {
    const char* text = std::getenv("MEMSNAP_PROGRESS_DELAY");
    if (text == nullptr || *text == '\0') return 1.0;
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    return end != text && *end == '\0' && v >= 0 && v < 1e6 ? v : 1.0;
  }
};

}  // namespace memsnap
