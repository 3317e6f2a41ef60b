// The reader's memo bookkeeping: which memo entries a GET names, found by a pre-pass over the
// opcodes (pickle_memo_refs.cpp), and Python's memo length, which MEMOIZE stores at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "torch/pickle.hpp"

namespace memsnap::pickle {

// Set bits of a word. std::popcount is a library call where the build does not target POPCNT
// (-march), and the reader asks once per memo reference.
inline std::uint64_t count_bits(std::uint64_t w) {
  w -= (w >> 1) & 0x5555555555555555ull;
  w = (w & 0x3333333333333333ull) + ((w >> 2) & 0x3333333333333333ull);
  w = (w + (w >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (w * 0x0101010101010101ull) >> 56;
}

// The memo indices that some GET, BINGET or LONG_BINGET names, and the byte of the last GET of
// each. A pass over the opcodes (lengths only, nothing built) finds them, so that the reader keeps
// only those nodes, and only until their last reference: every other node is freed as soon as its
// container is, instead of living in the memo to the end.
//
// The pass notes each GET's byte by memo index in a plain vector, for indices below
// `one_pass_indices` (a snapshot of a few million entries stays below the default); a pickle
// naming larger indices has them found by a second pass once the first has counted them.
class MemoRefs {
 public:
  static constexpr std::size_t kNone = ~std::size_t{0};
  static constexpr std::uint64_t kOnePassIndices = std::uint64_t{1} << 23;  // 64 MiB of offsets at most

  /// Scans `data`; pages of `file` behind the scan are released as it goes.
  MemoRefs(std::string_view data, const MappedFile* file, std::uint64_t one_pass_indices = kOnePassIndices);

  /// The slot of a referenced index below the bitmap's limit, or kNone (not referenced, or far).
  std::size_t slot(std::uint64_t i) const {
    if (i >= m_limit) return kNone;
    const std::size_t w = static_cast<std::size_t>(i >> 6);
    if (w >= m_words.size()) return kNone;
    const Word& word = m_words[w];
    const std::uint64_t bit = std::uint64_t{1} << (i & 63);
    if ((word.bits & bit) == 0) return kNone;
    return static_cast<std::size_t>(word.rank + count_bits(word.bits & (bit - 1)));
  }
  bool dense(std::uint64_t i) const { return i < m_limit; }
  /// Whether a GET names an index past the bitmap's limit (explicit PUTs far out).
  bool referenced_far(std::uint64_t i) const { return m_sparse.count(i) != 0; }
  /// Whether some GET names index i (near or far).
  bool referenced(std::uint64_t i) const { return slot(i) != kNone || (!dense(i) && referenced_far(i)); }
  // The byte offset of the last GET of a referenced index past the bitmap's limit.
  std::size_t last_far_get(std::uint64_t i) const {
    auto it = m_sparse.find(i);
    return it == m_sparse.end() ? 0 : it->second;
  }
  // By slot: the byte offset of the last GET.
  const std::vector<std::size_t>& last_gets() const { return m_last; }
  std::size_t slots() const { return m_last.size(); }
  // How many passes over the opcodes it took (1 or 2).
  int passes() const { return m_passes; }

 private:
  struct Word {
    std::uint64_t bits = 0;  // referenced indices 64w..64w+63
    std::uint64_t rank = 0;  // referenced indices below 64w: the slot of the first bit
  };
  std::uint64_t m_limit = 0;
  std::vector<Word> m_words;
  std::unordered_map<std::uint64_t, std::size_t> m_sparse;  // index past the bitmap -> last GET
  std::vector<std::size_t> m_last;  // by slot: byte offset of the last GET
  int m_passes = 1;

  void note(std::uint64_t i);
  template <typename Offset>
  bool first_pass(std::string_view data, const MappedFile* file, std::uint64_t near);
  template <typename OnGet>
  void scan(std::string_view data, const MappedFile* file, const OnGet& on_get);
};

// Python's memo length (what MEMOIZE stores at), without a set entry per index: indices
// [0, m_dense) are all present, and m_above holds those past it (explicit PUTs out of order).
class MemoLength {
 public:
  void insert(std::uint64_t i) {
    if (i < m_dense) return;
    if (i > m_dense) {
      m_above.insert(i);
      return;
    }
    ++m_dense;
    while (!m_above.empty() && m_above.erase(m_dense)) ++m_dense;
  }
  std::uint64_t size() const { return m_dense + m_above.size(); }
  // Every index below size() is present (no PUT out of order): the next MEMOIZE is size().
  bool dense_only() const { return m_above.empty(); }

 private:
  std::uint64_t m_dense = 0;
  std::unordered_set<std::uint64_t> m_above;
};

}  // namespace memsnap::pickle
