// The memo pre-pass: two scans of the opcodes (lengths only, nothing built) that find which
// memo entries some GET names and where each is named for the last time.
#include "torch/pickle_memo_refs.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "torch/pickle_opcodes.hpp"

namespace memsnap::pickle {

using namespace opcodes;

void MemoRefs::note(std::uint64_t i) {
  if (i >= m_limit) {
    m_sparse.emplace(i, 0);
    return;
  }
  const std::size_t w = static_cast<std::size_t>(i >> 6);
  if (w >= m_bits.size()) m_bits.resize(std::max(w + 1, m_bits.size() * 2), 0);
  m_bits[w] |= std::uint64_t{1} << (i & 63);
}

// Stops where the reader would stop (STOP) or fail (a bad length, an opcode it refuses): past
// that point no reference matters.
template <typename OnGet>
void MemoRefs::scan(std::string_view data, const MappedFile* file, const OnGet& on_get) {
  const std::size_t n = data.size();
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::size_t pos = 0;
  constexpr std::size_t kReleaseStep = std::size_t{16} << 20;
  std::size_t released = 0;
  auto le = [&](std::size_t at, int width) {
    std::uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= static_cast<std::uint64_t>(p[at + static_cast<std::size_t>(i)]) << (8 * i);
    return v;
  };
  // Skips `width` length bytes and the payload they announce; false when it does not fit.
  auto counted = [&](int width, bool is_signed) {
    if (n - pos < static_cast<std::size_t>(width)) return false;
    std::uint64_t len = le(pos, width);
    if (is_signed && (len & 0x80000000u)) return false;
    pos += static_cast<std::size_t>(width);
    if (len > n - pos) return false;
    pos += static_cast<std::size_t>(len);
    return true;
  };
  auto fixed = [&](std::size_t width) {
    if (n - pos < width) return false;
    pos += width;
    return true;
  };
  auto line = [&](std::string_view* text) {
    const void* end = std::memchr(p + pos, '\n', n - pos);
    if (!end) return false;
    const std::size_t e = static_cast<std::size_t>(static_cast<const unsigned char*>(end) - p);
    if (text) *text = data.substr(pos, e - pos);
    pos = e + 1;
    return true;
  };
  while (pos < n) {
    if (file && pos - released >= kReleaseStep) {
      file->release(released, pos);
      released = pos;
    }
    const std::size_t at = pos;
    const std::uint8_t op = p[pos++];
    bool ok = true;
    switch (op) {
      case STOP: return;
      case MARK: case POP: case POP_MARK: case DUP: case NONE: case NEWTRUE: case NEWFALSE:
      case EMPTY_LIST: case EMPTY_DICT: case EMPTY_TUPLE: case LIST: case TUPLE: case TUPLE1:
      case TUPLE2: case TUPLE3: case DICT: case APPEND: case APPENDS: case SETITEM: case SETITEMS:
      case MEMOIZE: break;
      case PROTO: case BININT1: case BINPUT: ok = fixed(1); break;
      case BININT2: ok = fixed(2); break;
      case BININT: case LONG_BINPUT: ok = fixed(4); break;
      case BINFLOAT: ok = fixed(8); break;
      case FRAME:
        ok = n - pos >= 8 && le(pos, 8) <= n - pos - 8;
        pos += ok ? 8 : 0;
        break;
      case BINGET:
        ok = fixed(1);
        if (ok) on_get(p[pos - 1], at);
        break;
      case LONG_BINGET:
        ok = fixed(4);
        if (ok) on_get(le(pos - 4, 4), at);
        break;
      case GET: {
        std::string_view text;
        std::uint64_t v = 0;
        ok = line(&text);
        if (ok) {
          auto [q, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          ok = ec == std::errc() && q == text.data() + text.size();
        }
        if (ok) on_get(v, at);
        break;
      }
      case FLOAT: case INT: case LONG: case STRING: case UNICODE: case PUT: ok = line(nullptr); break;
      case LONG1: case SHORT_BINUNICODE: case SHORT_BINSTRING: case SHORT_BINBYTES: ok = counted(1, false); break;
      case LONG4: case BINSTRING: ok = counted(4, true); break;
      case BINUNICODE: case BINBYTES: ok = counted(4, false); break;
      case BINUNICODE8: case BINBYTES8: case BYTEARRAY8: ok = counted(8, false); break;
      default: return;  // refused or unknown: the reader fails here
    }
    if (!ok) return;
  }
}

MemoRefs::MemoRefs(std::string_view data, const MappedFile* file) {
  // Indices below this go into a bitmap with a rank per word (a referenced index's slot in a
  // vector); larger ones (explicit PUTs far out) into a hash map. MEMOIZE indices stay below the
  // number of bytes, as each costs one.
  m_limit = static_cast<std::uint64_t>(data.size()) + 1;
  scan(data, file, [this](std::uint64_t i, std::size_t) { note(i); });
  m_rank.resize(m_bits.size());
  std::uint64_t total = 0;
  for (std::size_t w = 0; w < m_bits.size(); ++w) {
    m_rank[w] = total;
    total += count_bits(m_bits[w]);
  }
  m_slots = static_cast<std::size_t>(total);
  m_last.resize(m_slots);
  scan(data, file, [this](std::uint64_t i, std::size_t at) {
    if (dense(i))
      m_last[slot(i)] = at;
    else
      m_sparse[i] = at;
  });
}

}  // namespace memsnap::pickle
