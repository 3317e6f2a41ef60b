// Shared by the store fuzz targets: a private scratch folder and the reads memsnap makes of a
// store (`memsnap info`, `memsnap report`, `memsnap export`), with analysis of every window read.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz_common.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/errors.hpp"
#include "memsnap/store.hpp"

namespace memsnap::fuzz {

/// A folder of this process's own under TMPDIR (or /tmp), made once, removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/memsnap-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) finding("fuzz_store", "mkdtemp failed");
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) finding("fuzz_store", "cannot write " + path.string());
}

inline std::string read_whole(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Everything a reader of the store does; StoreError (memsnap::Error) is the documented failure.
inline void exercise_store(const std::filesystem::path& root) {
  try {
    StoreReader reader(root);
    StoreInfo info;
    try {
      info = reader.info();
    } catch (const Error&) {
    }
    try {
      (void)reader.sites();
    } catch (const Error&) {
    }
    const int ranks = std::min(std::max(info.world_size, 1), 4);
    for (int r = 0; r < ranks; ++r) {
      try {
        const RankRecord rec = reader.read_rank(r);
        for (const auto& w : rec.windows) (void)analyse_window(rec, w);
      } catch (const Error&) {
      }
      try {
        for (auto b : reader.batches(r)) (void)reader.read_window(r, b);
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
}

}  // namespace memsnap::fuzz
