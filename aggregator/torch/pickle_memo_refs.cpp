// The memo pre-pass: a scan of the opcodes (lengths only, nothing built) that finds which memo
// entries some GET names and where each is named for the last time.
#include "torch/pickle_memo_refs.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>

#include "torch/pickle_opcodes.hpp"

namespace memsnap::pickle {

using namespace opcodes;

void MemoRefs::note(std::uint64_t i) {
  const std::size_t w = static_cast<std::size_t>(i >> 6);
  if (w >= m_words.size()) m_words.resize(std::max(w + 1, m_words.size() * 2));
  m_words[w].bits |= std::uint64_t{1} << (i & 63);
}

namespace {

// How the scan skips each opcode: the fixed-length ones by their whole length (opcode byte
// included), the rest by what their argument is.
enum Skip : std::uint8_t {
  kEnd = 0,        // STOP, or an opcode the reader refuses or does not know: the scan ends
  kBinGet = 16,    // a 1-byte memo index
  kLongBinGet,     // a 4-byte memo index
  kGet,            // a memo index as a line of text
  kLine,           // a line of text
  kCounted1,       // a 1-byte length and that many bytes
  kCounted4,       // a 4-byte length and that many bytes
  kSigned4,        // a 4-byte length whose top bit must be clear, and that many bytes
  kCounted8,       // an 8-byte length and that many bytes
  kFrame,          // an 8-byte frame length that must fit the rest of the input
};

struct SkipTable {
  std::uint8_t skip[256] = {};
  constexpr SkipTable() {
    for (std::uint8_t op : {MARK, POP, POP_MARK, DUP, NONE, NEWTRUE, NEWFALSE, EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE,
                            LIST, TUPLE, TUPLE1, TUPLE2, TUPLE3, DICT, APPEND, APPENDS, SETITEM, SETITEMS, MEMOIZE})
      skip[op] = 1;
    for (std::uint8_t op : {PROTO, BININT1, BINPUT}) skip[op] = 2;
    skip[BININT2] = 3;
    for (std::uint8_t op : {BININT, LONG_BINPUT}) skip[op] = 5;
    skip[BINFLOAT] = 9;
    skip[BINGET] = kBinGet;
    skip[LONG_BINGET] = kLongBinGet;
    skip[GET] = kGet;
    for (std::uint8_t op : {FLOAT, INT, LONG, STRING, UNICODE, PUT}) skip[op] = kLine;
    for (std::uint8_t op : {LONG1, SHORT_BINUNICODE, SHORT_BINSTRING, SHORT_BINBYTES}) skip[op] = kCounted1;
    for (std::uint8_t op : {BINUNICODE, BINBYTES}) skip[op] = kCounted4;
    for (std::uint8_t op : {LONG4, BINSTRING}) skip[op] = kSigned4;
    for (std::uint8_t op : {BINUNICODE8, BINBYTES8, BYTEARRAY8}) skip[op] = kCounted8;
    skip[FRAME] = kFrame;
  }
};
constexpr SkipTable kSkipTable;

}  // namespace

// Stops where the reader would stop (STOP) or fail (a bad length, an opcode it refuses): past
// that point no reference matters.
template <typename OnGet>
void MemoRefs::scan(std::string_view data, const MappedFile* file, const OnGet& on_get) {
  const std::size_t n = data.size();
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::size_t pos = 0;
  std::size_t released = 0;
  auto le = [&](std::size_t at, int width) { return le_uint(p + at, width); };
  // From `pos` (past the opcode): `width` length bytes and the payload they announce, or npos.
  auto counted = [&](int width, bool is_signed) -> std::size_t {
    if (n - pos < static_cast<std::size_t>(width)) return std::string_view::npos;
    const std::uint64_t len = le(pos, width);
    if (is_signed && (len & 0x80000000u)) return std::string_view::npos;
    if (len > n - pos - static_cast<std::size_t>(width)) return std::string_view::npos;
    return pos + static_cast<std::size_t>(width) + static_cast<std::size_t>(len);
  };
  while (pos < n) {
    if (file && pos - released >= MappedFile::kReleaseStep) {
      file->release(released, pos);
      released = pos;
    }
    const std::size_t at = pos;
    const std::uint8_t skip = kSkipTable.skip[p[pos]];
    if (skip < kBinGet) {  // fixed length, GETs aside: most opcodes
      if (skip == kEnd || n - pos < skip) return;
      pos += skip;
      continue;
    }
    ++pos;
    switch (skip) {
      case kBinGet:
        if (n - pos < 1) return;
        on_get(p[pos], at);
        pos += 1;
        continue;
      case kLongBinGet:
        if (n - pos < 4) return;
        on_get(le(pos, 4), at);
        pos += 4;
        continue;
      case kGet:
      case kLine: {
        const void* end = std::memchr(p + pos, '\n', n - pos);
        if (!end) return;
        const std::size_t e = static_cast<std::size_t>(static_cast<const unsigned char*>(end) - p);
        if (skip == kGet) {
          const std::string_view text = data.substr(pos, e - pos);
          std::uint64_t v = 0;
          auto [q, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (ec != std::errc() || q != text.data() + text.size()) return;
          on_get(v, at);
        }
        pos = e + 1;
        continue;
      }
      case kFrame:
        if (n - pos < 8 || le(pos, 8) > n - pos - 8) return;
        pos += 8;
        continue;
      default: {
        const std::size_t next = skip == kCounted1   ? counted(1, false)
                                 : skip == kCounted4 ? counted(4, false)
                                 : skip == kSigned4  ? counted(4, true)
                                                     : counted(8, false);
        if (next == std::string_view::npos) return;
        pos = next;
      }
    }
  }
}

MemoRefs::MemoRefs(std::string_view data, const MappedFile* file, std::uint64_t one_pass_indices) {
  // Indices below the limit go into a bitmap with a rank per word (a referenced index's slot in a
  // vector); larger ones (explicit PUTs far out) into a hash map. MEMOIZE indices stay below the
  // number of bytes, as each costs one.
  m_limit = static_cast<std::uint64_t>(data.size()) + 1;
  const std::uint64_t near = std::min(one_pass_indices, m_limit);
  // Offsets of 4 bytes where the pickle is under 4 GiB: the first pass writes one at a random
  // place for each GET, and half the bytes miss the cache half as often.
  const bool beyond = data.size() < std::numeric_limits<std::uint32_t>::max()
                          ? first_pass<std::uint32_t>(data, file, near)
                          : first_pass<std::uint64_t>(data, file, near);
  if (!beyond) return;
  m_passes = 2;
  scan(data, file, [&](std::uint64_t i, std::size_t at) {
    if (i >= near && i < m_limit) m_last[slot(i)] = at;
  });
}

// The pass that notes every referenced index and, below `near`, the byte of its last GET; true
// when some GET names an index in [near, m_limit) (its last GET is found by a second pass).
template <typename Offset>
bool MemoRefs::first_pass(std::string_view data, const MappedFile* file, std::uint64_t near) {
  std::vector<Offset> last_plus_one;  // by index below `near`: the last GET's byte + 1, or 0
  bool beyond = false;
  // Address space for as many indices as MEMOIZEs could fit in the bytes (pages are touched only
  // as far as indices go): no copy as the vector grows.
  last_plus_one.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(near, data.size() / 4)));
  scan(data, file, [&](std::uint64_t i, std::size_t at) {
    if (i < near) {
      if (i >= last_plus_one.size()) {  // in steps: MEMOIZE indices come one at a time
        const std::uint64_t step = std::max<std::uint64_t>(i + 1, last_plus_one.size() + (std::uint64_t{1} << 16));
        last_plus_one.resize(static_cast<std::size_t>(std::min(near, step)), 0);
      }
      last_plus_one[static_cast<std::size_t>(i)] = static_cast<Offset>(at + 1);
    } else if (i < m_limit) {
      note(i);
      beyond = true;
    } else {
      m_sparse[i] = at;
    }
  });
  for (std::size_t i = 0; i < last_plus_one.size(); ++i)
    if (last_plus_one[i] != 0) note(i);
  std::uint64_t total = 0;
  for (Word& word : m_words) {
    word.rank = total;
    total += count_bits(word.bits);
  }
  m_last.resize(static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < last_plus_one.size(); ++i)
    if (last_plus_one[i] != 0) m_last[slot(i)] = static_cast<std::size_t>(last_plus_one[i]) - 1;
  return beyond;
}

}  // namespace memsnap::pickle
