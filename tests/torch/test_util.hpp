// Helpers shared by the torch interop tests: fixture paths, file I/O and running python3.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace memsnap::test {

inline std::string fixture(const std::string& name) {
  return std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/" + name;
}
inline std::string script(const std::string& name) {
  return std::string(MEMSNAP_TORCH_TEST_DIR) + "/" + name;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// A file name in the temp folder, unique to this process.
inline std::string temp_path(const std::string& stem) {
  auto dir = std::filesystem::temp_directory_path();
  return (dir / ("memsnap_test_torch_" + std::to_string(::getpid()) + "_" + stem)).string();
}

struct CommandResult {
  int status = -1;  // exit status, -1 when it did not exit normally
  std::string output;
};

/// Runs `python3 ARGS` (the interpreter CMake found), capturing stdout and stderr.
inline CommandResult run_python(const std::string& args) {
  std::string cmd = std::string("\"") + MEMSNAP_TEST_PYTHON + "\" " + args + " 2>&1";
  CommandResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace memsnap::test
