// Helpers shared by memsnap's tests.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace memsnap::test {

// What a shell command did: its exit code (128 + signal when killed) and stdout and stderr together.
struct ShellResult {
  int code = -1;
  std::string out;
};

// Runs `setup; cmd` under /bin/sh, stderr joined to stdout. `setup` is shell text run first
// (exports, unsets) so that each test file states its own environment once.
inline ShellResult run_shell(const std::string& cmd, const std::string& setup = "") {
  ShellResult r;
  const std::string full = (setup.empty() ? "" : setup + "; ") + cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "memsnap-test-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A string as one word of /bin/sh: single-quoted.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// What a shell command did, its stdout and stderr apart: the exit code (128 when killed).
struct SplitResult {
  int rc = -1;
  std::string out;
  std::string err;
};

// Runs `cmd` under /bin/sh with stdout and stderr each caught in a file of a TempDir.
inline SplitResult run_shell_split(const std::string& cmd) {
  TempDir t;
  const std::string full =
      "(" + cmd + ") >" + shell_quote((t / "out").string()) + " 2>" + shell_quote((t / "err").string());
  const int status = std::system(full.c_str());
  SplitResult r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  r.out = read_file(t / "out");
  r.err = read_file(t / "err");
  return r;
}

}  // namespace memsnap::test
