// The store's own chunk compression (aggregator/src/chunked_write.cpp) against what HDF5's shuffle
// and deflate filters define: each chunk inflates to its rows shuffled (a last, short chunk as if
// padded with zero rows), and HDF5 reads the values back, whatever the threads and however many
// chunks are compressed at once.
#include <gtest/gtest.h>

#include <hdf5.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "chunked_write.hpp"
#include "hdf5_util.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

// HDF5's shuffle of `rows` items of `size` bytes, padded with zero items to `chunk_rows`.
std::vector<unsigned char> shuffled(const unsigned char* items, std::size_t rows, std::size_t chunk_rows, std::size_t size) {
  std::vector<unsigned char> padded(chunk_rows * size, 0), out(chunk_rows * size);
  std::copy(items, items + rows * size, padded.begin());
  for (std::size_t i = 0; i < chunk_rows; ++i)
    for (std::size_t j = 0; j < size; ++j) out[j * chunk_rows + i] = padded[i * size + j];
  return out;
}

TEST(ChunkedWriteTest, ChunksAreShuffledDeflatedRowsThatHdf5ReadsBack) {
  test::TempDir dir;
  std::mt19937_64 rng(7);
  constexpr std::size_t kChunkRows = 1000;
  for (std::size_t size : {std::size_t{1}, std::size_t{4}, std::size_t{40}}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{999}, std::size_t{1000}, std::size_t{7 * 1000 + 13}}) {
      for (unsigned threads : {1u, 4u}) {
        SCOPED_TRACE("size " + std::to_string(size) + ", " + std::to_string(n) + " items, " + std::to_string(threads) + " threads");
        std::vector<unsigned char> data(n * size);
        for (auto& b : data) b = static_cast<unsigned char>(rng() % 7);  // compressible, not constant
        const std::string path = (dir.path() / ("c" + std::to_string(size) + "_" + std::to_string(n) + "_" + std::to_string(threads) + ".h5")).string();
        const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(file, 0);
        const hid_t type = H5Tcreate(H5T_OPAQUE, size);
        h5::write_compressed(file, "d", type, data.data(), n, kChunkRows, 4, threads, "test");
        const hid_t ds = H5Dopen2(file, "d", H5P_DEFAULT);
        std::vector<unsigned char> back(n * size);
        ASSERT_GE(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data()), 0);
        EXPECT_EQ(back, data);
        const std::size_t chunk = std::min(n, kChunkRows);  // a dataset shorter than a chunk is one chunk of its size
        for (std::size_t first = 0; first < n; first += chunk) {
          const hsize_t offset[1] = {first};
          hsize_t stored = 0;
          ASSERT_GE(H5Dget_chunk_storage_size(ds, offset, &stored), 0);
          std::vector<unsigned char> raw(stored);
          std::uint32_t filters = 0;
          ASSERT_GE(H5Dread_chunk(ds, H5P_DEFAULT, offset, &filters, raw.data()), 0);
          std::vector<unsigned char> inflated(chunk * size);
          uLongf len = inflated.size();
          ASSERT_EQ(uncompress(inflated.data(), &len, raw.data(), raw.size()), Z_OK);
          ASSERT_EQ(len, inflated.size());
          EXPECT_EQ(inflated, shuffled(data.data() + first * size, std::min(chunk, n - first), chunk, size))
              << "chunk at " << first;
        }
        H5Dclose(ds);
        H5Tclose(type);
        H5Fclose(file);
      }
    }
  }
}

}  // namespace
}  // namespace memsnap
