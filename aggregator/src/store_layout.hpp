// The store's on-disk types, made from the field tables (memsnap/record_fields.hpp,
// memsnap/store_rows.hpp) and shared by store_writer.cpp and store_reader.cpp: HDF5 compound
// types for the bulk records (which map the in-memory structs one to one, so HDF5 converts
// nothing), packing for the index tables (whose string widths fit the longest value written) and
// the attributes of /rank/<r>.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "hdf5_util.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/event.hpp"
#include "memsnap/record_fields.hpp"
#include "memsnap/store.hpp"
#include "memsnap/store_rows.hpp"

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

// --- types of the fields in the tables --------------------------------------------------------

/// The HDF5 type of a fixed-size field (not a string): bool is a u8 holding 0 or 1.
template <class T>
Handle native_type() {
  auto copy = [](hid_t t) { return h5::type_handle(H5Tcopy(t), "cannot copy a type"); };
  if constexpr (std::is_same_v<T, Action>) {
    return action_type();
  } else if constexpr (std::is_same_v<T, Category>) {
    return category_type();
  } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::uint8_t>) {
    return copy(H5T_NATIVE_UINT8);
  } else if constexpr (std::is_same_v<T, std::int16_t>) {
    return copy(H5T_NATIVE_INT16);
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return copy(H5T_NATIVE_INT32);
  } else if constexpr (std::is_same_v<T, std::uint32_t>) {
    return copy(H5T_NATIVE_UINT32);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return copy(H5T_NATIVE_INT64);
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    return copy(H5T_NATIVE_UINT64);
  } else if constexpr (std::is_same_v<T, double>) {
    return copy(H5T_NATIVE_DOUBLE);
  } else if constexpr (std::is_array_v<T> && std::is_same_v<std::remove_extent_t<T>, char>) {
    return h5::string_type(std::extent_v<T>);  // a fixed NUL-terminated text field
  } else {
    static_assert(sizeof(T) == 0, "no HDF5 type for this field");
  }
}

// --- bulk records: structs whose memory is the HDF5 row ----------------------------------------

/// The compound type of S from its field table, members at the struct's own offsets, so HDF5
/// converts nothing on write or read.
template <class S>
Handle compound_type() {
  static_assert(std::is_trivially_copyable_v<S>);
  Handle t = compound(sizeof(S));
  static const S probe{};
  for_each_field<S>([&](const auto& f) {
    using M = typename std::decay_t<decltype(f)>::Member;
    const std::size_t offset = reinterpret_cast<const char*>(&(probe.*f.member)) - reinterpret_cast<const char*>(&probe);
    Handle mt = native_type<M>();
    member(t, f.name, offset, mt);
  });
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

/// blocks: memsnap::Block in the store's member order.
struct BlockRow {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;
  std::uint32_t stack_id = kNoStack;
  std::uint8_t state = 0;
};

}  // namespace memsnap::layout

namespace memsnap {
template <>
struct Fields<layout::SegmentRow> {
  static constexpr auto list = std::tuple{
      field("addr", &layout::SegmentRow::addr),           field("size", &layout::SegmentRow::size),
      field("stream", &layout::SegmentRow::stream),       field("first_block", &layout::SegmentRow::first_block),
      field("n_blocks", &layout::SegmentRow::n_blocks),   field("device", &layout::SegmentRow::device),
      field("pool", &layout::SegmentRow::pool)};
};
template <>
struct Fields<layout::BlockRow> {
  static constexpr auto list = std::tuple{
      field("addr", &layout::BlockRow::addr), field("size", &layout::BlockRow::size),
      field("requested_size", &layout::BlockRow::requested_size), field("stack_id", &layout::BlockRow::stack_id),
      field("state", &layout::BlockRow::state)};
};
}  // namespace memsnap

namespace memsnap::layout {

// --- index tables: packed rows whose string columns are as wide as the longest value ----------

/// A packed compound row built column by column.
class RowLayout {
 public:
  struct Column {
    std::string name;
    Handle type;
    std::size_t offset;
    std::size_t width;  // string columns: bytes including the NUL; else 0
  };
  void add(const std::string& name, Handle type, std::size_t width = 0) {
    const std::size_t size = H5Tget_size(type);
    m_index[name] = m_columns.size();
    m_columns.push_back(Column{name, std::move(type), m_size, width});
    m_size += size;
  }
  Handle compound_type() const {
    Handle t = compound(std::max<std::size_t>(m_size, 1));
    for (const auto& c : m_columns) member(t, c.name.c_str(), c.offset, c.type);
    return t;
  }
  std::size_t size() const { return m_size; }
  /// The column, or nullptr when this layout leaves it out (an older store's).
  const Column* find(const std::string& name) const {
    const auto it = m_index.find(name);
    return it == m_index.end() ? nullptr : &m_columns[it->second];
  }

 private:
  std::vector<Column> m_columns;
  std::map<std::string, std::size_t> m_index;
  std::size_t m_size = 0;
};

/// Calls f(column_name, value) for every stored column of a row of S (std::array fields give
/// one column per element); `value` is a reference into `row`.
template <class S, class Row, class F>
void for_each_column(Row& row, F&& f) {
  for_each_field<S>([&](const auto& field) {
    if (!field.stored) return;
    auto& v = row.*field.member;
    using M = std::decay_t<decltype(v)>;
    if constexpr (codec_detail::IsStdArray<M>::value) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        f(field.element_name ? field.element_name(static_cast<int>(i)) : field.name + std::to_string(i), v[i], field.since);
      }
    } else {
      f(std::string(field.name), v, field.since);
    }
  });
}

/// The layout of S's table. string_width(name): a string column's width with its NUL;
/// present(name): whether a column added after format 1 is there.
template <class S, class Width, class Present>
RowLayout table_layout(Width&& string_width, Present&& present) {
  RowLayout l;
  const S probe{};
  for_each_column<S>(probe, [&](const std::string& name, const auto& v, int since) {
    using M = std::decay_t<decltype(v)>;
    if (since > 0 && !present(name)) return;
    if constexpr (std::is_same_v<M, std::string>) {
      const std::size_t w = std::max<std::size_t>(string_width(name), 1);
      l.add(name, h5::string_type(w), w);
    } else {
      l.add(name, native_type<M>());
    }
  });
  return l;
}

/// The writer's layout for `rows`: every column, strings as wide as the longest value.
template <class S>
RowLayout layout_of_rows(const std::vector<S>& rows) {
  std::map<std::string, std::size_t> widths;
  for (const S& r : rows) {
    for_each_column<S>(r, [&](const std::string& name, const auto& v, int) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
        widths[name] = std::max(widths[name], v.size() + 1);
      }
    });
  }
  return table_layout<S>([&](const std::string& name) { return widths[name]; }, [](const std::string&) { return true; });
}

/// The reader's layout for a file's row type: its string widths, its optional columns.
template <class S>
RowLayout layout_of_file(hid_t file_type) {
  auto width = [&](const std::string& name) -> std::size_t {
    const int i = H5Tget_member_index(file_type, name.c_str());
    if (i < 0) {
      H5Eclear2(H5E_DEFAULT);
      return 1;
    }
    Handle t = h5::type_handle(H5Tget_member_type(file_type, static_cast<unsigned>(i)), "cannot read a member type");
    return H5Tget_size(t) + 1;  // room for the NUL the memory type adds
  };
  auto present = [&](const std::string& name) {
    const bool found = H5Tget_member_index(file_type, name.c_str()) >= 0;
    if (!found) H5Eclear2(H5E_DEFAULT);
    return found;
  };
  return table_layout<S>(width, present);
}

/// Rows packed into bytes laid out by `l`.
template <class S>
std::vector<char> pack(const RowLayout& l, const std::vector<S>& rows) {
  std::vector<char> bytes(l.size() * rows.size(), '\0');
  for (std::size_t i = 0; i < rows.size(); ++i) {
    char* row = bytes.data() + i * l.size();
    for_each_column<S>(rows[i], [&](const std::string& name, const auto& v, int) {
      using M = std::decay_t<decltype(v)>;
      const RowLayout::Column* c = l.find(name);
      if (c == nullptr) return;
      if constexpr (std::is_same_v<M, std::string>) {
        std::memcpy(row + c->offset, v.data(), std::min(v.size(), c->width - 1));  // NUL-terminated
      } else if constexpr (std::is_same_v<M, bool>) {
        row[c->offset] = v ? 1 : 0;
      } else {
        std::memcpy(row + c->offset, &v, sizeof v);
      }
    });
  }
  return bytes;
}

/// Rows unpacked from bytes laid out by `l`; columns it leaves out keep S's defaults.
template <class S>
std::vector<S> unpack(const RowLayout& l, const std::vector<char>& bytes) {
  std::vector<S> rows(l.size() ? bytes.size() / l.size() : 0);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const char* row = bytes.data() + i * l.size();
    for_each_column<S>(rows[i], [&](const std::string& name, auto& v, int) {
      using M = std::decay_t<decltype(v)>;
      const RowLayout::Column* c = l.find(name);
      if (c == nullptr) return;
      if constexpr (std::is_same_v<M, std::string>) {
        v.assign(row + c->offset, strnlen(row + c->offset, c->width));
      } else if constexpr (std::is_same_v<M, bool>) {
        v = row[c->offset] != 0;
      } else {
        std::memcpy(static_cast<void*>(&v), row + c->offset, sizeof v);
      }
    });
  }
  return rows;
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

// --- the root file's attributes ----------------------------------------------------------------

/// One attribute of the root file (besides format and format_version): its name and the
/// StoreAttrs member it holds; a store without a `required` one is refused.
template <class Member>
struct RootAttr {
  const char* name;
  Member StoreAttrs::*member;
  bool required;
};

inline constexpr auto kRootAttrs = std::tuple{RootAttr<std::string>{"run_name", &StoreAttrs::run_name, true},
                                              RootAttr<int>{"world_size", &StoreAttrs::world_size, true},
                                              RootAttr<std::string>{"created", &StoreAttrs::created, false},
                                              RootAttr<std::string>{"tool_version", &StoreAttrs::tool_version, false},
                                              RootAttr<std::string>{"config", &StoreAttrs::config_json, false}};

inline void write_root_attrs(hid_t loc, const StoreAttrs& attrs, const std::string& c) {
  std::apply([&](const auto&... a) { (h5::write_attr(loc, a.name, attrs.*a.member, c), ...); }, kRootAttrs);
}

/// Reads the root file's attributes; one that is not `required` and absent reads as empty.
inline void read_root_attrs(hid_t loc, StoreAttrs& attrs, const std::string& c) {
  auto read = [&](const auto& a) {
    if (!a.required && !h5::has_attr(loc, a.name)) return;
    auto& v = attrs.*a.member;
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      v = h5::read_attr_string(loc, a.name, c);
    } else {
      v = static_cast<std::decay_t<decltype(v)>>(h5::read_attr<std::int64_t>(loc, a.name, c));
    }
  };
  std::apply([&](const auto&... a) { (read(a), ...); }, kRootAttrs);
}

// --- the attributes of /rank/<r> -------------------------------------------------------------

/// One attribute of /rank/<r>: its name in the file, the RankMeta member and the RankInfo member
/// it holds (nullptr: none). A rank file's root carries every attribute, from the RankMeta member
/// where there is one, else from RankInfo; the root file's group of a rank without data (of which
/// only its /ranks row is known) carries those with a RankInfo member.
template <class MetaMember, class InfoMember>
struct RankAttr {
  const char* name;
  MetaMember meta;
  InfoMember info;
  const char* old_name = nullptr;  // also read, where `name` is absent
  bool read = true;                // false: written for h5py users, not read back into a record

  constexpr RankAttr also_read_as(const char* old) const {
    RankAttr a = *this;
    a.old_name = old;
    return a;
  }
  constexpr RankAttr not_read() const {
    RankAttr a = *this;
    a.read = false;
    return a;
  }
};

template <class MetaMember, class InfoMember>
constexpr RankAttr<MetaMember, InfoMember> rank_attr(const char* name, MetaMember meta, InfoMember info) {
  return {name, meta, info};
}

/// In the order they are written. Every store memsnap wrote names the host "hostname" (the
/// field tables say "host"); "host" is read too.
inline constexpr auto kRankAttrs = std::tuple{
    rank_attr("rank", nullptr, &RankInfo::rank).not_read(),  // the group's name says it
    rank_attr("hostname", &RankMeta::host, &RankInfo::host).also_read_as("host"),
    rank_attr("pid", &RankMeta::pid, &RankInfo::pid),
    rank_attr("local_rank", &RankMeta::local_rank, &RankInfo::local_rank),
    rank_attr("local_world_size", &RankMeta::local_world_size, nullptr),
    rank_attr("node_rank", &RankMeta::node_rank, &RankInfo::node_rank),
    rank_attr("world_size", &RankMeta::world_size, nullptr),
    rank_attr("device_name", &RankMeta::device_name, &RankInfo::device),
    rank_attr("source", &RankMeta::source, &RankInfo::source),
    rank_attr("run_name", &RankMeta::run_name, nullptr),
    rank_attr("config", &RankMeta::config_json, nullptr),
    rank_attr("tool_version", &RankMeta::tool_version, nullptr),
    rank_attr("start_unix_ns", &RankMeta::start_unix_ns, nullptr),
    rank_attr("clock_offset_ns", &RankMeta::clock_offset_ns, nullptr),
    rank_attr("status", nullptr, &RankInfo::status),
    rank_attr("status_detail", nullptr, &RankInfo::status_detail),
    rank_attr("spill", nullptr, &RankInfo::spill).not_read()};  // the spill it came from, for people

template <class F>
void for_each_rank_attr(F&& f) {
  std::apply([&](const auto&... each) { (f(each), ...); }, kRankAttrs);
}

/// A rank file's attributes: `meta` is the record's, `info` its /ranks row (rank and status).
inline void write_rank_attrs(hid_t loc, const RankMeta& meta, const RankInfo& info, const std::string& c) {
  for_each_rank_attr([&](const auto& a) {
    if constexpr (!std::is_null_pointer_v<decltype(a.meta)>) {
      h5::write_attr(loc, a.name, meta.*a.meta, c);
    } else {
      h5::write_attr(loc, a.name, info.*a.info, c);
    }
  });
}

/// The attributes of the root file's group for a rank without data: what its /ranks row knows.
inline void write_rank_status_attrs(hid_t loc, const RankInfo& info, const std::string& c) {
  for_each_rank_attr([&](const auto& a) {
    if constexpr (!std::is_null_pointer_v<decltype(a.info)>) h5::write_attr(loc, a.name, info.*a.info, c);
  });
}

/// Reads /rank/<r>'s attributes into `meta` (those with a RankMeta member) and `info` (the
/// others); an attribute the group lacks leaves its member as it was.
inline void read_rank_attrs(hid_t loc, RankMeta& meta, RankInfo& info, const std::string& c) {
  auto read_into = [&](const auto& a, auto& v) {
    const char* name = h5::has_attr(loc, a.name) ? a.name : nullptr;
    if (name == nullptr && a.old_name != nullptr && h5::has_attr(loc, a.old_name)) name = a.old_name;
    if (name == nullptr) return;
    using M = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<M, std::string>) {
      v = h5::read_attr_string(loc, name, c);
    } else {
      static_assert(std::is_integral_v<M>, "a rank attribute is text or an integer");
      v = static_cast<M>(h5::read_attr<std::int64_t>(loc, name, c));
    }
  };
  for_each_rank_attr([&](const auto& a) {
    if (!a.read) return;
    if constexpr (!std::is_null_pointer_v<decltype(a.meta)>) {
      read_into(a, meta.*a.meta);
    } else {
      read_into(a, info.*a.info);
    }
  });
}

}  // namespace memsnap::layout
