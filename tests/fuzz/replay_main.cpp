// Replays files through a fuzz target's LLVMFuzzerTestOneInput without libFuzzer: every corpus
// seed and every saved crash stays a test in the normal build. Arguments: files or folders
// (folders are read recursively; README files and dot files are skipped).
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

// Sanitizers reserve terabytes of address space: no RLIMIT_AS under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEMSNAP_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MEMSNAP_REPLAY_ASAN 1
#endif
#endif

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
#ifndef MEMSNAP_REPLAY_ASAN
  // An input that makes the reader allocate gigabytes fails here as bad_alloc (a finding), as it
  // does under libFuzzer's -malloc_limit_mb, instead of swapping the test machine. ASan reserves
  // terabytes of address space, so its builds rely on ASAN_OPTIONS=max_allocation_size_mb instead.
  const rlim_t limit = rlim_t{4} << 30;
  rlimit cur{};
  if (getrlimit(RLIMIT_AS, &cur) == 0 && (cur.rlim_cur == RLIM_INFINITY || cur.rlim_cur > limit)) {
    cur.rlim_cur = limit;
    setrlimit(RLIMIT_AS, &cur);
  }
#endif
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(arg)) {
        const std::string name = e.path().filename().string();
        if (e.is_regular_file() && name[0] != '.' && name.rfind("README", 0) != 0) files.push_back(e.path());
      }
    } else if (fs::is_regular_file(arg, ec)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or folder\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "replay: %zu inputs, no crash\n", files.size());
  return 0;
}
