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
#include <functional>
#include <memory>
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
/// bytes, ...), elements in order. Done in blocks of elements that stay in the L1 cache. A last
/// chunk of `elements` short of `stride` is shuffled as if padded with zero elements to `stride`
/// (how HDF5 stores it), without a padded copy.
void shuffle(const char* in, char* out, std::size_t elements, std::size_t stride, std::size_t size) {
  if (size == 1) {
    std::memcpy(out, in, elements);
  } else {
    constexpr std::size_t kBlock = 256;
    for (std::size_t first = 0; first < elements; first += kBlock) {
      const std::size_t count = std::min(kBlock, elements - first);
      const char* src = in + first * size;
      for (std::size_t j = 0; j < size; ++j) {
        char* dst = out + j * stride + first;
        for (std::size_t i = 0; i < count; ++i) dst[i] = src[i * size + j];
      }
    }
  }
  if (elements < stride)
    for (std::size_t j = 0; j < size; ++j) std::memset(out + j * stride + elements, 0, stride - elements);
}

/// One thread's deflate state, writing zlib streams (what HDF5's deflate filter reads) into a
/// buffer of its own that is sized once.
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

  /// Compresses `in` into `out`; false when it cannot.
  bool compress(const char* in, std::size_t n, std::vector<char>& out) {
#ifdef MEMSNAP_HAVE_LIBDEFLATE
    if (m_compressor == nullptr) return false;
    grow(libdeflate_zlib_compress_bound(m_compressor, n));
    const std::size_t len = libdeflate_zlib_compress(m_compressor, in, n, m_buffer.get(), m_capacity);
#else
    grow(compressBound(static_cast<uLong>(n)));
    uLongf len = m_capacity;
    if (compress2(reinterpret_cast<Bytef*>(m_buffer.get()), &len, reinterpret_cast<const Bytef*>(in), static_cast<uLong>(n),
                  m_level) != Z_OK) {
      len = 0;
    }
#endif
    out.assign(m_buffer.get(), m_buffer.get() + len);
    return len > 0;
  }

 private:
  // Not a vector: resizing one would zero the bytes the compressor overwrites.
  void grow(std::size_t n) {
    if (n <= m_capacity) return;
    m_buffer.reset(new char[n]);
    m_capacity = n;
  }
  int m_level;
  std::unique_ptr<char[]> m_buffer;
  std::size_t m_capacity = 0;
#ifdef MEMSNAP_HAVE_LIBDEFLATE
  libdeflate_compressor* m_compressor = nullptr;
#endif
};

}  // namespace

/// The chunks of one dataset: taken by the workers in order, compressed, handed back in order.
struct ChunkCompressor::Job {
  struct Slot {
    enum State { pending, done, failed } state = pending;
    std::vector<char> bytes;
  };
  const char* data;
  std::size_t n, rows, size;
  std::vector<Slot> slots;
  std::size_t next = 0;    // the next chunk to hand out
  unsigned active = 0;     // workers inside a chunk of this job
  // Chunks compressed at once, at most: a quarter of them (one at least), so that the buffers of
  // the chunks in flight (about two chunks' size each) stay within half the data's own size,
  // whatever the thread count. A 300k-event window (5 chunks) with 16 threads: import peak RSS
  // 47.8 -> 41.5 MiB against half of them; 1M events (16 chunks) still compress 4 at a time.
  std::size_t most_active = 1;
  bool closed = false;     // the writer left: hand out no more
};

/// What a thread keeps from chunk to chunk: its compressor and buffers.
struct ChunkCompressor::Scratch {
  explicit Scratch(int level) : deflater(level) {}
  Deflater deflater;
  std::vector<char> shuffled;
};

ChunkCompressor::ChunkCompressor(int level, unsigned threads) : m_level(level) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // One thread: the caller compresses, nothing is started.
  if (threads > 1) {
    m_spare.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) m_threads.emplace_back([this] { work(); });
  } else {
    m_scratch = std::make_unique<Scratch>(level);
  }
}

ChunkCompressor::~ChunkCompressor() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  for (auto& t : m_threads) t.join();
}

unsigned ChunkCompressor::threads() const { return std::max<unsigned>(1, static_cast<unsigned>(m_threads.size())); }

bool ChunkCompressor::compress(Job& job, std::size_t i, Scratch& s, std::vector<char>& out) {
  try {
    const std::size_t first = i * job.rows;
    const std::size_t rows = std::min(job.rows, job.n - first);
    s.shuffled.resize(job.rows * job.size);
    shuffle(job.data + first * job.size, s.shuffled.data(), rows, job.rows, job.size);
    return s.deflater.compress(s.shuffled.data(), s.shuffled.size(), out);
  } catch (const std::exception&) {
    return false;  // out of memory: the writer reports the chunk
  }
}

void ChunkCompressor::work() {
  std::unique_lock<std::mutex> lock(m_mutex);
  for (;;) {
    m_wake.wait(lock, [&] {
      return m_stop || (m_job != nullptr && !m_job->closed && m_job->next < m_job->slots.size() &&
                        m_job->active < m_job->most_active);
    });
    if (m_stop) return;
    Job& job = *m_job;
    const std::size_t i = job.next++;
    ++job.active;
    std::unique_ptr<Scratch> scratch;
    if (!m_spare.empty()) {
      scratch = std::move(m_spare.back());
      m_spare.pop_back();
    }
    lock.unlock();
    std::vector<char> out;
    bool ok = false;
    try {
      if (!scratch) scratch = std::make_unique<Scratch>(m_level);
      ok = compress(job, i, *scratch, out);
    } catch (const std::exception&) {
      ok = false;  // out of memory: the writer reports the chunk
    }
    lock.lock();
    if (scratch) m_spare.push_back(std::move(scratch));  // room reserved: one a thread at most
    job.slots[i].bytes = std::move(out);
    job.slots[i].state = ok ? Job::Slot::done : Job::Slot::failed;
    --job.active;
    m_ready.notify_all();
  }
}

void ChunkCompressor::run(const char* data, std::size_t n, std::size_t rows, std::size_t size,
                          const std::function<void(std::size_t, const std::vector<char>*)>& put) {
  Job job{data, n, rows, size, std::vector<Job::Slot>((n + rows - 1) / rows)};
  job.most_active = std::max<std::size_t>(1, job.slots.size() / 4);
  if (m_threads.empty()) {
    std::vector<char> bytes;
    for (std::size_t i = 0; i < job.slots.size(); ++i) put(i, compress(job, i, *m_scratch, bytes) ? &bytes : nullptr);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_job = &job;
  }
  m_wake.notify_all();
  // However the writer leaves (a StoreError from HDF5 included), no worker touches the job after.
  struct Leave {
    ChunkCompressor& c;
    Job& job;
    ~Leave() {
      std::unique_lock<std::mutex> lock(c.m_mutex);
      job.closed = true;
      c.m_ready.wait(lock, [&] { return job.active == 0; });
      c.m_job = nullptr;
    }
  } leave{*this, job};
  std::vector<char> bytes;
  for (std::size_t i = 0; i < job.slots.size(); ++i) {
    bool ok = false;
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_ready.wait(lock, [&] { return job.slots[i].state != Job::Slot::pending; });
      bytes = std::move(job.slots[i].bytes);
      ok = job.slots[i].state == Job::Slot::done;
    }
    put(i, ok ? &bytes : nullptr);
  }
}

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
                      ChunkCompressor& compressor, const std::string& context) {
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
  check_status(H5Pset_deflate(dcpl, static_cast<unsigned>(compressor.level())), what);
  Handle ds = dataset_handle(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), what);
  if (n == 0) return;
  compressor.run(static_cast<const char*>(data), n, rows, size, [&](std::size_t i, const std::vector<char>* bytes) {
    if (bytes == nullptr) throw StoreError(what + ": a chunk could not be compressed");
    const hsize_t offset[1] = {i * rows};
    check_status(H5Dwrite_chunk(ds, H5P_DEFAULT, 0, offset, bytes->size(), bytes->data()), what);
  });
}

void write_compressed(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n, std::size_t chunk_rows,
                      int level, unsigned threads, const std::string& context) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t chunks = (n + std::max<std::size_t>(1, std::min(n, chunk_rows)) - 1) / std::max<std::size_t>(1, std::min(n, chunk_rows));
  ChunkCompressor compressor(level, static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(chunks, 1))));
  write_compressed(loc, name, type, data, n, chunk_rows, compressor, context);
}

}  // namespace memsnap::h5
