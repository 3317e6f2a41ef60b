// Compressed datasets written fast: see chunked_write.hpp.
//
// Before this, HDF5's own filter pipeline shuffled and deflated each chunk (zlib, one thread)
// inside H5Dwrite: about 40 % of aggregation time went to zlib. Here worker threads shuffle and
// deflate whole chunks (libdeflate is 2-3x zlib's speed at the same level) while the calling
// thread, the only one that calls HDF5, writes finished chunks in order with H5Dwrite_chunk.
// The bytes of a chunk are what HDF5's shuffle + deflate filters would have made of it: a zlib
// stream of the shuffled rows, the last chunk padded to full size with the fill value (zeros).
#include "chunked_write.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#ifdef MEMSNAP_HAVE_LIBDEFLATE
#include <libdeflate.h>
#else
#include <zlib.h>
#endif

#include "hdf5_util.hpp"
#include "memsnap/store.hpp"

namespace memsnap::h5 {

namespace {

/// HDF5's shuffle filter: byte j of every element together (all first bytes, then all second
/// bytes, ...), elements in order. Done in blocks of elements that stay in the L1 cache.
void shuffle(const char* in, char* out, std::size_t elements, std::size_t size) {
  if (size == 1) {
    std::memcpy(out, in, elements);
    return;
  }
  constexpr std::size_t kBlock = 256;
  for (std::size_t first = 0; first < elements; first += kBlock) {
    const std::size_t count = std::min(kBlock, elements - first);
    const char* src = in + first * size;
    for (std::size_t j = 0; j < size; ++j) {
      char* dst = out + j * elements + first;
      for (std::size_t i = 0; i < count; ++i) dst[i] = src[i * size + j];
    }
  }
}

/// One thread's deflate state, writing zlib streams (what HDF5's deflate filter reads).
class Deflater {
 public:
  explicit Deflater(int level) : m_level(level) {
#ifdef MEMSNAP_HAVE_LIBDEFLATE
    m_compressor = libdeflate_alloc_compressor(level);
#endif
  }
  ~Deflater() {
#ifdef MEMSNAP_HAVE_LIBDEFLATE
    if (m_compressor != nullptr) libdeflate_free_compressor(m_compressor);
#endif
  }
  Deflater(const Deflater&) = delete;
  Deflater& operator=(const Deflater&) = delete;

  /// Compresses `in` into `out` (resized to fit); false when it cannot.
  bool compress(const char* in, std::size_t n, std::vector<char>& out) {
#ifdef MEMSNAP_HAVE_LIBDEFLATE
    if (m_compressor == nullptr) return false;
    out.resize(libdeflate_zlib_compress_bound(m_compressor, n));
    const std::size_t len = libdeflate_zlib_compress(m_compressor, in, n, out.data(), out.size());
    out.resize(len);
    return len > 0;
#else
    uLongf len = compressBound(static_cast<uLong>(n));
    out.resize(len);
    const int rc = compress2(reinterpret_cast<Bytef*>(out.data()), &len, reinterpret_cast<const Bytef*>(in),
                             static_cast<uLong>(n), m_level);
    out.resize(rc == Z_OK ? len : 0);
    return rc == Z_OK;
#endif
  }

 private:
  int m_level;
#ifdef MEMSNAP_HAVE_LIBDEFLATE
  libdeflate_compressor* m_compressor = nullptr;
#endif
};

/// The compressed chunks of one dataset, made by worker threads and taken in order.
class ChunkQueue {
 public:
  ChunkQueue(const char* data, std::size_t n, std::size_t rows, std::size_t size, int level)
      : m_data(data), m_n(n), m_rows(rows), m_size(size), m_level(level), m_slots((n + rows - 1) / rows) {}

  std::size_t count() const { return m_slots.size(); }

  /// A worker: compresses chunks until none are left or the queue is closed.
  void work() {
    Deflater deflater(m_level);
    std::vector<char> shuffled(m_rows * m_size), padded;
    while (!m_closed.load()) {
      const std::size_t i = m_next.fetch_add(1);
      if (i >= m_slots.size()) break;
      std::vector<char> out;
      bool ok = false;
      try {
        const std::size_t first = i * m_rows;
        const std::size_t rows = std::min(m_rows, m_n - first);
        const char* src = m_data + first * m_size;
        if (rows < m_rows) {
          padded.assign(m_rows * m_size, '\0');
          std::memcpy(padded.data(), src, rows * m_size);
          src = padded.data();
        }
        shuffle(src, shuffled.data(), m_rows, m_size);
        ok = deflater.compress(shuffled.data(), shuffled.size(), out);
      } catch (const std::exception&) {
        ok = false;  // out of memory: reported by take()
      }
      {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_slots[i].bytes = std::move(out);
        m_slots[i].state = ok ? Slot::done : Slot::failed;
      }
      m_ready.notify_all();
    }
  }

  /// Waits for chunk i; false when it could not be compressed.
  bool take(std::size_t i, std::vector<char>& bytes) {
    std::unique_lock<std::mutex> lock(m_mutex);
    m_ready.wait(lock, [&] { return m_slots[i].state != Slot::pending; });
    bytes = std::move(m_slots[i].bytes);
    return m_slots[i].state == Slot::done;
  }

  /// Workers stop at their next chunk (the writer failed).
  void close() { m_closed.store(true); }

 private:
  struct Slot {
    enum State { pending, done, failed } state = pending;
    std::vector<char> bytes;
  };
  const char* m_data;
  std::size_t m_n, m_rows, m_size;
  int m_level;
  std::vector<Slot> m_slots;
  std::atomic<std::size_t> m_next{0};
  std::atomic<bool> m_closed{false};
  std::mutex m_mutex;
  std::condition_variable m_ready;
};

/// Joins the workers however the writer leaves (a StoreError from HDF5 included).
class Workers {
 public:
  Workers(ChunkQueue& queue, unsigned n) : m_queue(queue) {
    for (unsigned i = 0; i < n; ++i) m_threads.emplace_back([&queue] { queue.work(); });
  }
  ~Workers() {
    m_queue.close();
    for (auto& t : m_threads) t.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

 private:
  ChunkQueue& m_queue;
  std::vector<std::thread> m_threads;
};

}  // namespace

}  // namespace memsnap::h5

namespace memsnap {

const char* deflate_implementation() {
#ifdef MEMSNAP_HAVE_LIBDEFLATE
  return "libdeflate";
#else
  return "zlib";
#endif
}

}  // namespace memsnap

namespace memsnap::h5 {

void write_compressed(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n, std::size_t chunk_rows,
                      int level, unsigned threads, const std::string& context) {
  const std::string what = context + ": cannot write " + name;
  const std::size_t size = H5Tget_size(type);
  if (size == 0) fail(what);
  const std::size_t rows = std::max<std::size_t>(1, std::min(n, chunk_rows));
  const hsize_t dims[1] = {n};
  const hsize_t chunk[1] = {rows};
  Handle space = space_handle(H5Screate_simple(1, dims, nullptr), what);
  Handle dcpl = plist_handle(H5Pcreate(H5P_DATASET_CREATE), what);
  check_status(H5Pset_chunk(dcpl, 1, chunk), what);
  check_status(H5Pset_shuffle(dcpl), what);
  check_status(H5Pset_deflate(dcpl, static_cast<unsigned>(level)), what);
  Handle ds = dataset_handle(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), what);
  if (n == 0) return;

  ChunkQueue queue(static_cast<const char*>(data), n, rows, size, level);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, queue.count()));
  // One chunk, or one thread: compressed right here, no thread started.
  std::optional<Workers> workers;
  if (threads > 1) {
    workers.emplace(queue, threads);
  } else {
    queue.work();
  }
  std::vector<char> bytes;
  for (std::size_t i = 0; i < queue.count(); ++i) {
    if (!queue.take(i, bytes)) throw StoreError(what + ": a chunk could not be compressed");
    const hsize_t offset[1] = {i * rows};
    check_status(H5Dwrite_chunk(ds, H5P_DEFAULT, 0, offset, bytes.size(), bytes.data()), what);
  }
}

}  // namespace memsnap::h5
