// Owning handles and checked calls over the HDF5 C API, for the store's writer and reader.
//
// Every call whose return code matters goes through check(), which turns a failure into a
// StoreError naming the file, the object and HDF5's innermost error message. Destructors close
// quietly and log a line on failure, never throw (the checked close() is for files being written).
#pragma once

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memsnap/errors.hpp"

namespace memsnap::h5 {

// chunked_write.hpp: a shuffled, deflated dataset compressed on several threads.
class ChunkCompressor;
void write_compressed(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n, std::size_t chunk_rows,
                      ChunkCompressor& compressor, const std::string& context);
void write_compressed(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n, std::size_t chunk_rows,
                      int level, unsigned threads, const std::string& context);

/// The innermost message of the current thread's HDF5 error stack ("" when empty).
inline std::string last_error() {
  std::string innermost, outermost;
  struct Acc {
    std::string* inner;
    std::string* outer;
  } acc{&innermost, &outermost};
  // Walking upward visits the most specific error first.
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
        auto* a = static_cast<Acc*>(data);
        const std::string desc = err->desc != nullptr ? err->desc : "";
        if (n == 0) *a->inner = desc;
        *a->outer = desc;
        return 0;
      },
      &acc);
  if (innermost.empty()) return outermost;
  return innermost;
}

/// Turns off HDF5's automatic error-stack printing while it lives and restores what was there
/// (the application's own HDF5 settings survive an in-job write).
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &m_func, &m_data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, m_func, m_data); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t m_func = nullptr;
  void* m_data = nullptr;
};

[[noreturn]] inline void fail(const std::string& context) {
  const std::string why = last_error();
  H5Eclear2(H5E_DEFAULT);
  throw StoreError(why.empty() ? context : context + ": " + why);
}

inline hid_t check(hid_t id, const std::string& context) {
  if (id < 0) fail(context);
  return id;
}

inline void check_status(herr_t rc, const std::string& context) {
  if (rc < 0) fail(context);
}

/// An owned HDF5 identifier (file, group, dataset, dataspace, datatype, attribute, plist).
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : m_id(id), m_close(close) {}
  ~Handle() { reset(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : m_id(std::exchange(other.m_id, H5I_INVALID_HID)), m_close(other.m_close) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      m_id = std::exchange(other.m_id, H5I_INVALID_HID);
      m_close = other.m_close;
    }
    return *this;
  }

  hid_t get() const { return m_id; }
  operator hid_t() const { return m_id; }  // NOLINT: handles pass straight into the C API
  bool valid() const { return m_id >= 0; }

  /// Closes now; a failure (e.g. a file that cannot be flushed) throws StoreError(context).
  void close(const std::string& context) {
    if (m_id < 0) return;
    const hid_t id = std::exchange(m_id, H5I_INVALID_HID);
    check_status(m_close(id), context);
  }

  /// Closes quietly; a failure is logged, never thrown.
  void reset() noexcept {
    if (m_id < 0 || m_close == nullptr) return;
    if (m_close(m_id) < 0) {
      std::cerr << "memsnap: warning: closing an HDF5 object failed: " << last_error() << "\n";
      H5Eclear2(H5E_DEFAULT);
    }
    m_id = H5I_INVALID_HID;
  }

 private:
  hid_t m_id = H5I_INVALID_HID;
  Closer m_close = nullptr;
};

inline Handle file_handle(hid_t id, const std::string& c) { return {check(id, c), H5Fclose}; }
inline Handle group_handle(hid_t id, const std::string& c) { return {check(id, c), H5Gclose}; }
inline Handle dataset_handle(hid_t id, const std::string& c) { return {check(id, c), H5Dclose}; }
inline Handle space_handle(hid_t id, const std::string& c) { return {check(id, c), H5Sclose}; }
inline Handle type_handle(hid_t id, const std::string& c) { return {check(id, c), H5Tclose}; }
inline Handle attr_handle(hid_t id, const std::string& c) { return {check(id, c), H5Aclose}; }
inline Handle plist_handle(hid_t id, const std::string& c) { return {check(id, c), H5Pclose}; }

/// File access properties for every store file: HDF5 file locking where the file system has it,
/// and no failure where it does not (NFS, Lustre without flock), instead of "unable to lock file".
inline Handle file_access() {
  Handle fapl = plist_handle(H5Pcreate(H5P_FILE_ACCESS), "cannot create file access properties");
#if H5_VERS_MAJOR > 1 || (H5_VERS_MAJOR == 1 && (H5_VERS_MINOR >= 13 || (H5_VERS_MINOR == 12 && H5_VERS_RELEASE >= 1) || \
                                                (H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)))
  check_status(H5Pset_file_locking(fapl, true, true), "cannot set file locking");
#endif
  return fapl;
}

/// A fixed-length, NUL-terminated UTF-8 string type of `size` bytes (at least 1).
inline Handle string_type(std::size_t size) {
  Handle t = type_handle(H5Tcopy(H5T_C_S1), "cannot create a string type");
  check_status(H5Tset_size(t, size == 0 ? 1 : size), "cannot size a string type");
  check_status(H5Tset_strpad(t, H5T_STR_NULLTERM), "cannot set string padding");
  check_status(H5Tset_cset(t, H5T_CSET_UTF8), "cannot set string encoding");
  return t;
}

inline bool exists(hid_t loc, const std::string& path) {
  // H5Lexists needs every intermediate link to exist, so walk the path component by component.
  std::size_t pos = path[0] == '/' ? 1 : 0;
  while (true) {
    const std::size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    const htri_t e = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

// --- attributes ------------------------------------------------------------------------------

inline void write_attr(hid_t loc, const char* name, hid_t type, const void* value, const std::string& context) {
  Handle space = space_handle(H5Screate(H5S_SCALAR), context);
  Handle attr = attr_handle(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT),
                            context + ": cannot create attribute " + name);
  check_status(H5Awrite(attr, type, value), context + ": cannot write attribute " + name);
}

inline void write_attr(hid_t loc, const char* name, const std::string& value, const std::string& context) {
  Handle type = string_type(value.size() + 1);
  std::vector<char> buf(value.size() + 1, '\0');
  std::memcpy(buf.data(), value.data(), value.size());
  write_attr(loc, name, type, buf.data(), context);
}

inline void write_attr(hid_t loc, const char* name, const char* value, const std::string& context) {
  write_attr(loc, name, std::string(value), context);
}

inline void write_attr(hid_t loc, const char* name, std::int64_t value, const std::string& context) {
  write_attr(loc, name, H5T_NATIVE_INT64, &value, context);
}

inline void write_attr(hid_t loc, const char* name, std::uint64_t value, const std::string& context) {
  write_attr(loc, name, H5T_NATIVE_UINT64, &value, context);
}

inline void write_attr(hid_t loc, const char* name, int value, const std::string& context) {
  write_attr(loc, name, static_cast<std::int64_t>(value), context);
}

inline void write_attr(hid_t loc, const char* name, double value, const std::string& context) {
  write_attr(loc, name, H5T_NATIVE_DOUBLE, &value, context);
}

inline void write_attr(hid_t loc, const char* name, bool value, const std::string& context) {
  const std::uint8_t v = value ? 1 : 0;
  write_attr(loc, name, H5T_NATIVE_UINT8, &v, context);
}

inline bool has_attr(hid_t loc, const char* name) {
  const htri_t e = H5Aexists(loc, name);
  if (e < 0) H5Eclear2(H5E_DEFAULT);
  return e > 0;
}

/// An attribute memsnap reads as one value must hold exactly one: reading several elements into
/// one would overrun the destination.
inline void require_single_value(hid_t attr, const char* name, const std::string& context) {
  Handle space = space_handle(H5Aget_space(attr), context + ": attribute " + name);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n != 1) {
    throw StoreError(context + ": attribute " + name + " holds " + std::to_string(n) + " values, not one");
  }
}

inline std::string read_attr_string(hid_t loc, const char* name, const std::string& context) {
  Handle attr = attr_handle(H5Aopen(loc, name, H5P_DEFAULT), context + ": no attribute " + name);
  require_single_value(attr, name, context);
  Handle ftype = type_handle(H5Aget_type(attr), context + ": attribute " + name);
  if (H5Tget_class(ftype) != H5T_STRING) throw StoreError(context + ": attribute " + name + " is not a string");
  if (H5Tis_variable_str(ftype) > 0) {
    // Written by another tool: read variable-length strings too.
    Handle mtype = type_handle(H5Tcopy(H5T_C_S1), context);
    check_status(H5Tset_size(mtype, H5T_VARIABLE), context);
    char* p = nullptr;
    check_status(H5Aread(attr, mtype, &p), context + ": cannot read attribute " + name);
    std::string s = p != nullptr ? p : "";
    H5free_memory(p);
    return s;
  }
  const std::size_t size = H5Tget_size(ftype);
  Handle mtype = string_type(size + 1);
  std::vector<char> buf(size + 1, '\0');
  check_status(H5Aread(attr, mtype, buf.data()), context + ": cannot read attribute " + name);
  return std::string(buf.data(), strnlen(buf.data(), buf.size()));
}

/// One numeric attribute as T (std::int64_t, std::uint64_t or double), converted by HDF5 from
/// whatever numeric type it was written with.
template <class T>
T read_attr(hid_t loc, const char* name, const std::string& context) {
  static_assert(std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t> || std::is_same_v<T, double>,
                "read_attr reads int64, uint64 or double");
  hid_t mem_type = H5T_NATIVE_DOUBLE;
  if constexpr (std::is_same_v<T, std::int64_t>) mem_type = H5T_NATIVE_INT64;
  if constexpr (std::is_same_v<T, std::uint64_t>) mem_type = H5T_NATIVE_UINT64;
  Handle attr = attr_handle(H5Aopen(loc, name, H5P_DEFAULT), context + ": no attribute " + name);
  require_single_value(attr, name, context);
  T v{};
  check_status(H5Aread(attr, mem_type, &v), context + ": cannot read attribute " + name);
  return v;
}

// --- datasets --------------------------------------------------------------------------------

/// Rows per chunk of a compressed 1-D dataset: about 2.5 MiB of 40-byte events.
inline constexpr hsize_t kChunkRows = 65536;

/// How a dataset is compressed: deflate level (0: not at all) and threads (0: one per core), or
/// by a compressor kept from dataset to dataset (its level then; it decides the threads).
struct Compression {
  Compression(int deflate_level, unsigned thread_count = 0) : level(deflate_level), threads(thread_count) {}  // NOLINT
  Compression(int deflate_level, ChunkCompressor* kept) : level(deflate_level), compressor(kept) {}
  int level = 0;
  unsigned threads = 0;
  ChunkCompressor* compressor = nullptr;
};

/// Creates and writes a 1-D dataset of n items of `type` (`data` in the type's own layout) in one
/// call. Datasets of at least 1024 items are chunked, shuffled and deflated when the level is
/// above 0 and the library has the filter (chunked_write.hpp: on several threads).
inline void write_array(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n,
                        Compression compression, const std::string& context) {
  if (compression.level > 0 && n >= 1024 && H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) {
    if (compression.compressor != nullptr) {
      write_compressed(loc, name, type, data, n, kChunkRows, *compression.compressor, context);
    } else {
      write_compressed(loc, name, type, data, n, kChunkRows, compression.level, compression.threads, context);
    }
    return;
  }
  const std::string what = context + ": cannot write " + name;
  const hsize_t dims[1] = {n};
  Handle space = space_handle(H5Screate_simple(1, dims, nullptr), what);
  Handle ds = dataset_handle(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), what);
  if (n > 0) check_status(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), what);
}

template <class T>
void write_vector(hid_t loc, const char* name, hid_t type, const std::vector<T>& v, Compression compression,
                  const std::string& context) {
  write_array(loc, name, type, v.data(), v.size(), compression, context);
}

/// Number of items of the 1-D dataset `name`.
inline std::size_t array_size(hid_t ds, const std::string& what) {
  Handle space = space_handle(H5Dget_space(ds), what);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank != 1) throw StoreError(what + ": not a one-dimensional dataset");
  hsize_t dims[1] = {0};
  check_status(H5Sget_simple_extent_dims(space, dims, nullptr), what);
  return static_cast<std::size_t>(dims[0]);
}

/// Reads a whole 1-D dataset into items of T converted to the memory type `type`.
template <class T>
std::vector<T> read_vector(hid_t loc, const char* name, hid_t type, const std::string& context) {
  const std::string what = context + ": cannot read " + name;
  Handle ds = dataset_handle(H5Dopen2(loc, name, H5P_DEFAULT), what);
  const std::size_t n = array_size(ds, what);
  // A damaged or hostile file can declare any extent: allocate only what its stored bytes can
  // plausibly hold (memsnap's deflate reaches ~7x on events; 1 GiB is always allowed).
  const double declared = static_cast<double>(n) * static_cast<double>(sizeof(T));
  const double stored = static_cast<double>(H5Dget_storage_size(ds));
  if (declared > static_cast<double>(1ull << 30) && declared > 256.0 * stored) {
    throw StoreError(what + ": it declares " + std::to_string(n) + " items but stores only " +
                     std::to_string(static_cast<std::uint64_t>(stored)) + " bytes (damaged file?)");
  }
  std::vector<T> out(n);
  if (!out.empty()) check_status(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), what);
  return out;
}

}  // namespace memsnap::h5
