// The store's on-disk types, shared by store_writer.cpp and store_reader.cpp: HDF5 compound types
// for the bulk records (which map the in-memory structs one to one, so HDF5 converts nothing) and
// row codecs for the index tables (whose string widths are sized to the longest value written).
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "hdf5_util.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/event.hpp"
#include "memsnap/store.hpp"

namespace memsnap::layout {

using h5::Handle;

inline Handle action_type() {
  Handle t = h5::type_handle(H5Tenum_create(H5T_NATIVE_UINT8), "cannot create the action type");
  for (int i = 0; i < kActionCount; ++i) {
    const auto v = static_cast<std::uint8_t>(i);
    const std::string name(action_name(static_cast<Action>(i)));
    h5::check_status(H5Tenum_insert(t, name.c_str(), &v), "cannot create the action type");
  }
  return t;
}

inline Handle category_type() {
  Handle t = h5::type_handle(H5Tenum_create(H5T_NATIVE_UINT8), "cannot create the category type");
  for (int i = 0; i < kCategoryCount; ++i) {
    const auto v = static_cast<std::uint8_t>(i);
    h5::check_status(H5Tenum_insert(t, category_name(static_cast<Category>(i)), &v), "cannot create the category type");
  }
  return t;
}

inline void member(hid_t compound, const char* name, std::size_t offset, hid_t type) {
  h5::check_status(H5Tinsert(compound, name, offset, type), std::string("cannot build a compound type (") + name + ")");
}

inline Handle compound(std::size_t size) {
  return h5::type_handle(H5Tcreate(H5T_COMPOUND, size), "cannot create a compound type");
}

/// events: time_ns, action, device, addr, size, stream, stack_id, flags (memsnap::Event).
inline Handle event_type() {
  Handle t = compound(sizeof(Event));
  Handle action = action_type();
  member(t, "time_ns", offsetof(Event, time_ns), H5T_NATIVE_INT64);
  member(t, "addr", offsetof(Event, addr), H5T_NATIVE_UINT64);
  member(t, "size", offsetof(Event, size), H5T_NATIVE_UINT64);
  member(t, "stream", offsetof(Event, stream), H5T_NATIVE_UINT64);
  member(t, "stack_id", offsetof(Event, stack_id), H5T_NATIVE_UINT32);
  member(t, "device", offsetof(Event, device), H5T_NATIVE_INT16);
  member(t, "action", offsetof(Event, action), action);
  member(t, "flags", offsetof(Event, flags), H5T_NATIVE_UINT8);
  return t;
}

/// live_at_start: memsnap::LiveAlloc.
inline Handle live_type() {
  Handle t = compound(sizeof(LiveAlloc));
  member(t, "addr", offsetof(LiveAlloc, addr), H5T_NATIVE_UINT64);
  member(t, "size", offsetof(LiveAlloc, size), H5T_NATIVE_UINT64);
  member(t, "stream", offsetof(LiveAlloc, stream), H5T_NATIVE_UINT64);
  member(t, "time_ns", offsetof(LiveAlloc, time_ns), H5T_NATIVE_INT64);
  member(t, "stack_id", offsetof(LiveAlloc, stack_id), H5T_NATIVE_UINT32);
  member(t, "device", offsetof(LiveAlloc, device), H5T_NATIVE_INT16);
  member(t, "is_segment", offsetof(LiveAlloc, is_segment), H5T_NATIVE_UINT8);
  return t;
}

/// batches: memsnap::BatchMark.
inline Handle batch_type() {
  Handle t = compound(sizeof(BatchMark));
  member(t, "batch", offsetof(BatchMark, batch), H5T_NATIVE_INT64);
  member(t, "time_ns", offsetof(BatchMark, time_ns), H5T_NATIVE_INT64);
  return t;
}

/// segments: one row per segment; its blocks are blocks[first_block : first_block + n_blocks].
inline constexpr std::size_t kPoolWidth = 32;
struct SegmentRow {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint64_t first_block = 0;
  std::uint32_t n_blocks = 0;
  std::int16_t device = 0;
  char pool[kPoolWidth] = {};
};

inline Handle segment_type() {
  Handle t = compound(sizeof(SegmentRow));
  Handle pool = h5::string_type(kPoolWidth);
  member(t, "addr", offsetof(SegmentRow, addr), H5T_NATIVE_UINT64);
  member(t, "size", offsetof(SegmentRow, size), H5T_NATIVE_UINT64);
  member(t, "stream", offsetof(SegmentRow, stream), H5T_NATIVE_UINT64);
  member(t, "first_block", offsetof(SegmentRow, first_block), H5T_NATIVE_UINT64);
  member(t, "n_blocks", offsetof(SegmentRow, n_blocks), H5T_NATIVE_UINT32);
  member(t, "device", offsetof(SegmentRow, device), H5T_NATIVE_INT16);
  member(t, "pool", offsetof(SegmentRow, pool), pool);
  return t;
}

struct BlockRow {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;
  std::uint32_t stack_id = kNoStack;
  std::uint8_t state = 0;
};

inline Handle block_type() {
  Handle t = compound(sizeof(BlockRow));
  member(t, "addr", offsetof(BlockRow, addr), H5T_NATIVE_UINT64);
  member(t, "size", offsetof(BlockRow, size), H5T_NATIVE_UINT64);
  member(t, "requested_size", offsetof(BlockRow, requested_size), H5T_NATIVE_UINT64);
  member(t, "stack_id", offsetof(BlockRow, stack_id), H5T_NATIVE_UINT32);
  member(t, "state", offsetof(BlockRow, state), H5T_NATIVE_UINT8);
  return t;
}

// --- index tables: rows laid out at run time ---------------------------------------------------

/// A packed compound row built column by column; string columns get the width asked for.
class RowLayout {
 public:
  void add(const std::string& name, hid_t native) {
    Handle t = h5::type_handle(H5Tcopy(native), "cannot copy a type");
    push(name, std::move(t), 0);
  }
  void add_string(const std::string& name, std::size_t width) {
    width = std::max<std::size_t>(width, 1);
    push(name, h5::string_type(width), width);
  }
  void add_type(const std::string& name, Handle type) { push(name, std::move(type), 0); }

  Handle compound_type() const {
    Handle t = compound(std::max<std::size_t>(m_size, 1));
    for (const auto& c : m_columns) member(t, c.name.c_str(), c.offset, c.type);
    return t;
  }
  std::size_t size() const { return m_size; }
  std::size_t offset(const std::string& name) const { return column(name).offset; }
  std::size_t width(const std::string& name) const { return column(name).width; }

 private:
  struct Column {
    std::string name;
    Handle type;
    std::size_t offset;
    std::size_t width;
  };
  void push(const std::string& name, Handle type, std::size_t width) {
    const std::size_t size = H5Tget_size(type);
    m_index[name] = m_columns.size();
    m_columns.push_back(Column{name, std::move(type), m_size, width});
    m_size += size;
  }
  const Column& column(const std::string& name) const { return m_columns.at(m_index.at(name)); }
  std::vector<Column> m_columns;
  std::map<std::string, std::size_t> m_index;
  std::size_t m_size = 0;
};

/// Rows in a byte buffer addressed through a RowLayout.
class Rows {
 public:
  Rows(const RowLayout& layout, std::size_t n) : m_layout(layout), m_bytes(layout.size() * n, '\0'), m_n(n) {}
  Rows(const RowLayout& layout, std::vector<char> bytes)
      : m_layout(layout), m_bytes(std::move(bytes)), m_n(layout.size() ? m_bytes.size() / layout.size() : 0) {}

  template <class T>
  void put(std::size_t row, const char* col, T v) {
    std::memcpy(at(row, col), &v, sizeof v);
  }
  void put_string(std::size_t row, const char* col, const std::string& s) {
    const std::size_t w = m_layout.width(col);
    const std::size_t n = std::min(s.size(), w - 1);  // NUL-terminated; widths fit the longest value
    std::memcpy(at(row, col), s.data(), n);
  }
  template <class T>
  T get(std::size_t row, const char* col) const {
    T v;
    std::memcpy(&v, at(row, col), sizeof v);
    return v;
  }
  std::string get_string(std::size_t row, const char* col) const {
    const char* p = at(row, col);
    return std::string(p, strnlen(p, m_layout.width(col)));
  }
  std::size_t count() const { return m_n; }
  char* data() { return m_bytes.data(); }
  const char* data() const { return m_bytes.data(); }

 private:
  char* at(std::size_t row, const char* col) { return m_bytes.data() + row * m_layout.size() + m_layout.offset(col); }
  const char* at(std::size_t row, const char* col) const {
    return m_bytes.data() + row * m_layout.size() + m_layout.offset(col);
  }
  const RowLayout& m_layout;
  std::vector<char> m_bytes;
  std::size_t m_n;
};

/// The width of string member `name` of a file's compound type, or `fallback` when absent.
inline std::size_t member_string_width(hid_t compound_type, const char* name, std::size_t fallback) {
  const int i = H5Tget_member_index(compound_type, name);
  if (i < 0) {
    H5Eclear2(H5E_DEFAULT);
    return fallback;
  }
  Handle t = h5::type_handle(H5Tget_member_type(compound_type, static_cast<unsigned>(i)), "cannot read a member type");
  return H5Tget_size(t) + 1;  // room for the NUL the memory type adds
}

inline std::string category_column(int c) { return std::string(category_name(static_cast<Category>(c))) + "_at_peak"; }

/// /summary's columns. Widths (including the NUL) are those of host, device, status and
/// batch_method; method_w 0 leaves out batch_method and batch_confidence (stores written before
/// they existed).
inline RowLayout summary_layout(std::size_t host_w, std::size_t device_w, std::size_t status_w, std::size_t method_w) {
  RowLayout l;
  l.add("rank", H5T_NATIVE_INT32);
  l.add("window", H5T_NATIVE_INT32);
  l.add("batch_start", H5T_NATIVE_INT64);
  l.add("batch_end", H5T_NATIVE_INT64);
  l.add_string("host", host_w);
  l.add_string("device", device_w);
  l.add("n_events", H5T_NATIVE_UINT64);
  l.add("dropped", H5T_NATIVE_UINT64);
  l.add("peak_allocated", H5T_NATIVE_UINT64);
  l.add("peak_allocated_time_ns", H5T_NATIVE_INT64);
  l.add("peak_reserved", H5T_NATIVE_UINT64);
  l.add("peak_reserved_time_ns", H5T_NATIVE_INT64);
  l.add("live_at_open", H5T_NATIVE_UINT64);
  l.add("live_at_close", H5T_NATIVE_UINT64);
  l.add("reserved_at_open", H5T_NATIVE_UINT64);
  l.add("reserved_at_close", H5T_NATIVE_UINT64);
  l.add("persistent", H5T_NATIVE_UINT64);
  l.add("fragmentation_at_peak", H5T_NATIVE_UINT64);
  l.add("oom", H5T_NATIVE_UINT8);
  l.add("oom_requested", H5T_NATIVE_UINT64);
  l.add_string("status", status_w);
  for (int c = 0; c < kCategoryCount; ++c) l.add(category_column(c), H5T_NATIVE_UINT64);
  if (method_w > 0) {
    l.add_string("batch_method", method_w);
    l.add("batch_confidence", H5T_NATIVE_DOUBLE);
  }
  return l;
}

/// /ranks' columns.
struct RankWidths {
  std::size_t status = 1, detail = 1, host = 1, device = 1, source = 1, data_file = 1, spill = 1;
};

inline RowLayout ranks_layout(const RankWidths& w) {
  RowLayout l;
  l.add("rank", H5T_NATIVE_INT32);
  l.add_string("status", w.status);
  l.add_string("host", w.host);
  l.add_string("device", w.device);
  l.add("pid", H5T_NATIVE_INT64);
  l.add("local_rank", H5T_NATIVE_INT32);
  l.add("node_rank", H5T_NATIVE_INT32);
  l.add("local_world_size", H5T_NATIVE_INT32);
  l.add_string("source", w.source);
  l.add("n_windows", H5T_NATIVE_UINT32);
  l.add_string("data_file", w.data_file);
  l.add_string("spill", w.spill);
  l.add_string("status_detail", w.detail);
  return l;
}

/// /sites' columns.
inline RowLayout sites_layout() {
  RowLayout l;
  l.add("rank", H5T_NATIVE_INT32);
  l.add("window", H5T_NATIVE_INT32);
  l.add("batch", H5T_NATIVE_INT64);
  l.add("site_id", H5T_NATIVE_UINT32);
  l.add_type("category", category_type());
  l.add("bytes_at_peak", H5T_NATIVE_UINT64);
  l.add("count", H5T_NATIVE_UINT64);
  l.add("bytes_allocated", H5T_NATIVE_UINT64);
  l.add("allocations", H5T_NATIVE_UINT64);
  l.add("stack_id", H5T_NATIVE_UINT32);
  return l;
}

/// Packs strings into one byte blob plus n+1 offsets.
inline void pack_strings(const std::vector<std::string>& strings, std::vector<std::uint8_t>& blob,
                         std::vector<std::uint64_t>& offsets) {
  blob.clear();
  offsets.assign(1, 0);
  for (const auto& s : strings) {
    blob.insert(blob.end(), s.begin(), s.end());
    offsets.push_back(blob.size());
  }
}

inline std::vector<std::string> unpack_strings(const std::vector<std::uint8_t>& blob,
                                               const std::vector<std::uint64_t>& offsets, const std::string& what) {
  std::vector<std::string> out;
  if (offsets.empty()) return out;
  out.reserve(offsets.size() - 1);
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
    if (offsets[i] > offsets[i + 1] || offsets[i + 1] > blob.size()) throw StoreError(what + ": string offsets out of range");
    out.emplace_back(reinterpret_cast<const char*>(blob.data()) + offsets[i], offsets[i + 1] - offsets[i]);
  }
  return out;
}

}  // namespace memsnap::layout
