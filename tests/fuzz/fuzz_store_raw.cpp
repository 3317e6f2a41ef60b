// Fuzz target: StoreReader on raw file bytes. This mostly exercises the HDF5 library's own file
// format parsing (fuzz_store keeps to memsnap's code by editing valid files through HDF5).
// Input: u32 n | n bytes of the root file (memsnap.h5) | the rank 0 file (memsnap.h5.d/rank0.h5).
// An input too short for its n is the root file alone.
#include <cstdint>
#include <cstring>

#include "fuzz_store_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fs = std::filesystem;
  const fs::path dir = memsnap::fuzz::scratch_dir();
  const fs::path root = dir / "memsnap.h5";
  const fs::path rank_dir = dir / "memsnap.h5.d";
  std::error_code ec;
  fs::create_directories(rank_dir, ec);
  std::string_view all(reinterpret_cast<const char*>(data), size);
  std::uint32_t n = 0;
  if (size >= 4) std::memcpy(&n, data, 4);
  if (size >= 4 && n <= size - 4) {
    memsnap::fuzz::write_file(root, all.substr(4, n));
    memsnap::fuzz::write_file(rank_dir / "rank0.h5", all.substr(4 + n));
  } else {
    memsnap::fuzz::write_file(root, all);
    fs::remove(rank_dir / "rank0.h5", ec);
  }
  memsnap::fuzz::run_guarded("fuzz_store_raw", [&] { memsnap::fuzz::exercise_store(root); });
  return 0;
}
