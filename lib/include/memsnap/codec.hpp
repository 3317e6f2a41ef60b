// memsnap's one binary codec: field tables that describe a struct once, and the byte writer and
// reader that lay out values by them. The spill's payloads (lib/src/spill_writer.cpp), the aggregator's gathered
// metadata and the store's row types (memsnap/store_rows.hpp) are all described this way.
//
// Layout of a value (all little-endian; x86-64 and aarch64 both are):
//   arithmetic, enum, std::array of them    its bytes
//   std::string, std::filesystem::path      u32 length | bytes
//   std::vector<T>, std::span<const T>      u32 count | count x T (raw bytes when T is
//                                           trivially copyable without a table, or kWireAsBytes)
//   a struct with Fields<S>                 its fields in table order, each laid out as above
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace memsnap {

/// One field of struct S: its name (a JSON key, a store column) and where it lives. `lo`/`hi`
/// bound an integer field read from text (meta_from_json); `since` is the store format version
/// that added the column (0: always there); `stored` false keeps it out of the store's columns.
template <class S, class M>
struct Field {
  using Struct = S;
  using Member = M;
  const char* name;
  M S::*member;
  std::int64_t lo = std::numeric_limits<std::int64_t>::min();
  std::int64_t hi = std::numeric_limits<std::int64_t>::max();
  int since = 0;
  bool stored = true;
  /// For a std::array member stored as one column per element: element i's column name.
  std::string (*element_name)(int) = nullptr;

  constexpr Field bounds(std::int64_t low, std::int64_t high) const {
    Field f = *this;
    f.lo = low;
    f.hi = high;
    return f;
  }
  constexpr Field since_version(int version) const {
    Field f = *this;
    f.since = version;
    return f;
  }
  constexpr Field not_stored() const {
    Field f = *this;
    f.stored = false;
    return f;
  }
  constexpr Field columns(std::string (*name_of)(int)) const {
    Field f = *this;
    f.element_name = name_of;
    return f;
  }
};

template <class S, class M>
constexpr Field<S, M> field(const char* name, M S::*member) {
  return Field<S, M>{name, member};
}

/// The field table of S, in layout order: specialise with
/// `static constexpr auto list = std::tuple{field("a", &S::a), ...};`.
template <class S>
struct Fields;

template <class S>
concept HasFields = requires { Fields<S>::list; };

/// Calls f(field) for every field of S's table, in order.
template <class S, class F>
constexpr void for_each_field(F&& f) {
  std::apply([&](const auto&... each) { (f(each), ...); }, Fields<S>::list);
}

/// True for a struct whose in-memory bytes are its layout (the spill's Event and LiveAlloc
/// arrays), even though it has a field table (for the store's column names).
template <class T>
inline constexpr bool kWireAsBytes = false;

namespace codec_detail {
template <class T>
struct IsVector : std::false_type {};
template <class T, class A>
struct IsVector<std::vector<T, A>> : std::true_type {
  using Item = T;
};
template <class T>
struct IsStdArray : std::false_type {};
template <class T, std::size_t N>
struct IsStdArray<std::array<T, N>> : std::true_type {
  using Item = T;
  static constexpr std::size_t size = N;
};

template <class T>
constexpr bool as_bytes() {
  if constexpr (HasFields<T>) {
    return kWireAsBytes<T>;
  } else {
    return std::is_trivially_copyable_v<T>;
  }
}
}  // namespace codec_detail

/// The fewest bytes one T takes: bounds a count read from a file before anything is allocated.
template <class T>
constexpr std::size_t min_wire_size() {
  if constexpr (codec_detail::as_bytes<T>()) {
    return sizeof(T);
  } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::filesystem::path> ||
                       codec_detail::IsVector<T>::value) {
    return sizeof(std::uint32_t);
  } else {
    std::size_t n = 0;
    for_each_field<T>([&](const auto& f) { n += min_wire_size<typename std::decay_t<decltype(f)>::Member>(); });
    return n;
  }
}

/// Appends values to a byte buffer. Never throws for a count too large for its u32 (a string or
/// vector over 4 GiB items): overflowed() turns true and the caller refuses the bytes.
class ByteWriter {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    m_out.insert(m_out.end(), p, p + sizeof(T));
  }
  void str(std::string_view s) {
    count(s.size());
    m_out.insert(m_out.end(), s.begin(), s.end());
  }
  /// The items' bytes, no count.
  template <class T>
  void raw(std::span<const T> items) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(items.data());
    m_out.insert(m_out.end(), p, p + items.size_bytes());
  }
  /// Count, then each item.
  template <class T>
  void items(std::span<const T> items) {
    count(items.size());
    if constexpr (codec_detail::as_bytes<T>()) {
      raw(items);
    } else {
      for (const T& item : items) value(item);
    }
  }
  /// Any value, laid out as the header comment says.
  template <class T>
  void value(const T& v) {
    if constexpr (std::is_same_v<T, std::string>) {
      str(v);
    } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
      str(v.native());
    } else if constexpr (codec_detail::IsVector<T>::value) {
      items(std::span<const typename codec_detail::IsVector<T>::Item>(v));
    } else if constexpr (codec_detail::as_bytes<T>()) {
      put(v);
    } else {
      for_each_field<T>([&](const auto& f) { value(v.*f.member); });
    }
  }
  bool overflowed() const { return m_overflow; }
  std::vector<char>& bytes() { return m_out; }
  const std::vector<char>& bytes() const { return m_out; }

 private:
  void count(std::size_t n) {
    if (n > std::numeric_limits<std::uint32_t>::max()) m_overflow = true;
    put(static_cast<std::uint32_t>(n));
  }
  std::vector<char> m_out;
  bool m_overflow = false;
};

/// Reads values from bytes; every read is bounds-checked and throws Short on overrun, and a count
/// is checked against the bytes left before anything is allocated.
class ByteReader {
 public:
  struct Short {};
  explicit ByteReader(std::span<const char> in) : m_in(in) {}

  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(static_cast<void*>(&v), m_in.data() + m_pos, sizeof(T));
    m_pos += sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = get<std::uint32_t>();
    need(n);
    std::string s(m_in.data() + m_pos, n);
    m_pos += n;
    return s;
  }
  /// Appends n items of raw bytes to `out`.
  template <class T>
  void raw(std::uint32_t n, std::vector<T>& out) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > remaining() / sizeof(T)) throw Short{};
    if (n == 0) return;  // memcpy may not see a null vector buffer, even for 0 bytes
    const std::size_t old = out.size();
    out.resize(old + n);
    std::memcpy(static_cast<void*>(out.data() + old), m_in.data() + m_pos, std::size_t{n} * sizeof(T));
    m_pos += std::size_t{n} * sizeof(T);
  }
  /// Reads a count, then appends that many items to `out`.
  template <class T>
  void items(std::vector<T>& out) {
    const auto n = get<std::uint32_t>();
    if constexpr (codec_detail::as_bytes<T>()) {
      raw(n, out);
    } else {
      if (n > remaining() / min_wire_size<T>()) throw Short{};
      out.reserve(out.size() + n);
      for (std::uint32_t i = 0; i < n; ++i) value(out.emplace_back());
    }
  }
  /// Any value, laid out as ByteWriter::value wrote it (vectors are appended to).
  template <class T>
  void value(T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      v = get<std::uint8_t>() != 0;  // any byte, never an invalid bool
    } else if constexpr (std::is_same_v<T, std::string>) {
      v = str();
    } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
      v = str();
    } else if constexpr (codec_detail::IsVector<T>::value) {
      items(v);
    } else if constexpr (codec_detail::as_bytes<T>()) {
      v = get<T>();
    } else {
      for_each_field<T>([&](const auto& f) { value(v.*f.member); });
    }
  }
  template <class T>
  T value() {
    T v{};
    value(v);
    return v;
  }
  std::size_t remaining() const { return m_in.size() - m_pos; }
  bool done() const { return m_pos == m_in.size(); }

 private:
  void need(std::size_t n) const {
    if (n > remaining()) throw Short{};
  }
  std::span<const char> m_in;
  std::size_t m_pos = 0;
};

}  // namespace memsnap
