// Compressed datasets written fast: chunks shuffled and deflated on several threads (libdeflate
// where it was found at build time, else zlib) and handed to HDF5 already filtered with
// H5Dwrite_chunk. The dataset declares HDF5's standard shuffle and deflate filters, so any HDF5
// reader (h5py, h5dump) decompresses it with its built-in zlib, no plugin needed.
#pragma once

#include <hdf5.h>

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace memsnap::h5 {

/// Threads that shuffle and deflate chunks at one level, kept from dataset to dataset and from
/// file to file: threads and buffers are made once, so the pages under them fault in once.
/// One thread: the caller compresses, no thread is started.
class ChunkCompressor {
 public:
  ChunkCompressor(int level, unsigned threads);  // threads 0: one per core
  ~ChunkCompressor();
  ChunkCompressor(const ChunkCompressor&) = delete;
  ChunkCompressor& operator=(const ChunkCompressor&) = delete;

  int level() const { return m_level; }
  unsigned threads() const;

  /// Compresses the chunks of `n` items of `size` bytes, `rows` items a chunk (the last one
  /// padded with zeros, as HDF5 stores it), and calls put(i, bytes) for each chunk i in order on
  /// the calling thread; bytes is null for a chunk that could not be compressed. Exceptions from
  /// `put` pass through, once no worker holds the data any more.
  void run(const char* data, std::size_t n, std::size_t rows, std::size_t size,
           const std::function<void(std::size_t, const std::vector<char>*)>& put);

 private:
  struct Job;
  struct Scratch;
  static bool compress(Job& job, std::size_t i, Scratch& s, std::vector<char>& out);
  void work();

  int m_level;
  std::unique_ptr<Scratch> m_scratch;  // the caller's, with no threads
  std::mutex m_mutex;
  // The workers' scratch not in use. Made when a chunk finds none, so there are as many as chunks
  // were ever compressed at once, not one a thread (a small window's few chunks on a 16-core
  // host kept 16 compressors and their buffers: 10 MiB).
  std::vector<std::unique_ptr<Scratch>> m_spare;
  std::condition_variable m_wake;   // workers: a job, or stop
  std::condition_variable m_ready;  // the caller: a chunk done, or a worker out of the job
  Job* m_job = nullptr;
  bool m_stop = false;
  std::vector<std::thread> m_threads;
};

/// Writes n items of `type` (`data` in the type's own layout) as the 1-D dataset `name`, in
/// chunks of `chunk_rows` rows, shuffled and deflated by `compressor`. Throws StoreError naming
/// `context` on failure.
void write_compressed(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n, std::size_t chunk_rows,
                      ChunkCompressor& compressor, const std::string& context);

/// The same with threads of its own, at `level` (1..9), `threads` of them (0: one per core).
void write_compressed(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n, std::size_t chunk_rows,
                      int level, unsigned threads, const std::string& context);

}  // namespace memsnap::h5
