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
// each. Two passes over the opcodes (lengths only, nothing built) find them, so that the reader
// keeps only those nodes, and only until their last reference: every other node is freed as soon
// as its container is, instead of living in the memo to the end.
class MemoRefs {
 public:
  /// Scans `data` twice; pages of `file` behind the scan are released as it goes.
  MemoRefs(std::string_view data, const MappedFile* file);

  bool referenced(std::uint64_t i) const {
    if (i < m_limit) {
      const std::size_t w = static_cast<std::size_t>(i >> 6);
      return w < m_bits.size() && ((m_bits[w] >> (i & 63)) & 1) != 0;
    }
    return m_sparse.count(i) != 0;
  }
  // The byte offset of the last GET of a referenced index past the slots' range.
  std::size_t last_far_get(std::uint64_t i) const {
    auto it = m_sparse.find(i);
    return it == m_sparse.end() ? 0 : it->second;
  }
  std::size_t last_get_of_slot(std::size_t slot) const { return m_last[slot]; }
  bool dense(std::uint64_t i) const { return i < m_limit; }
  // The slot of a referenced index below the limit.
  std::size_t slot(std::uint64_t i) const {
    const std::size_t w = static_cast<std::size_t>(i >> 6);
    const std::uint64_t below = m_bits[w] & ((std::uint64_t{1} << (i & 63)) - 1);
    return static_cast<std::size_t>(m_rank[w] + count_bits(below));
  }
  std::size_t slots() const { return m_slots; }

 private:
  std::uint64_t m_limit = 0;
  std::vector<std::uint64_t> m_bits;
  std::vector<std::uint64_t> m_rank;
  std::unordered_map<std::uint64_t, std::size_t> m_sparse;  // index past the bitmap -> last GET
  std::size_t m_slots = 0;
  std::vector<std::size_t> m_last;  // by slot: byte offset of the last GET

  void note(std::uint64_t i);
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

 private:
  std::uint64_t m_dense = 0;
  std::unordered_set<std::uint64_t> m_above;
};

}  // namespace memsnap::pickle
