// The table of what is live, for the recorder (lib/: LiveState) and for every replay of a window
// (aggregator/: memsnap/window_replay.hpp): a map from 64-bit keys (live_key: an address on its
// device) to small values. Open addressing with linear probing and backward-shift erase, so an
// alloc/free pair allocates nothing (std::unordered_map's node per insert cost more than the
// rest of the recorder's drain, and was most of the window analysis' time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace memsnap {

// Allocation and reservation key: the address on its device.
inline std::uint64_t live_key(int device, std::uint64_t addr) {
  return addr ^ (static_cast<std::uint64_t>(static_cast<std::uint16_t>(device + 1)) << 48);
}

template <class V>
class FlatMap {
 public:
  /// `capacity`: the slots it starts with (rounded up to a power of two); it doubles when half full.
  explicit FlatMap(std::size_t capacity = 64) {
    std::size_t n = 2;
    while (n < capacity) n *= 2;
    rehash(n);
  }

  std::size_t size() const { return m_size; }
  bool empty() const { return m_size == 0; }

  /// The value of `key`, with `value` put there first when the key was absent (second: true).
  std::pair<V*, bool> try_emplace(std::uint64_t key, const V& value) {
    if ((m_size + 1) * 2 > m_slots.size()) rehash(m_slots.size() * 2);
    std::size_t i = index(key);
    while (m_slots[i].used) {
      if (m_slots[i].key == key) return {&m_slots[i].value, false};
      i = (i + 1) & m_mask;
    }
    m_slots[i] = Slot{key, value, true};
    ++m_size;
    return {&m_slots[i].value, true};
  }

  V* find(std::uint64_t key) { return const_cast<V*>(std::as_const(*this).find(key)); }
  const V* find(std::uint64_t key) const {
    for (std::size_t i = index(key); m_slots[i].used; i = (i + 1) & m_mask) {
      if (m_slots[i].key == key) return &m_slots[i].value;
    }
    return nullptr;
  }

  /// Removes `key`, its value copied to `*out` where given (one probe); false when it was absent.
  bool erase(std::uint64_t key, V* out = nullptr) {
    std::size_t i = index(key);
    while (m_slots[i].used && m_slots[i].key != key) i = (i + 1) & m_mask;
    if (!m_slots[i].used) return false;
    if (out != nullptr) *out = m_slots[i].value;
    // Backward shift: move later members of the probe run into the hole, so no tombstones pile
    // up under a stream of allocs and frees.
    for (std::size_t j = (i + 1) & m_mask; m_slots[j].used; j = (j + 1) & m_mask) {
      const std::size_t home = index(m_slots[j].key);
      if (((j - home) & m_mask) >= ((j - i) & m_mask)) {
        m_slots[i] = m_slots[j];
        i = j;
      }
    }
    m_slots[i].used = false;
    --m_size;
    return true;
  }

  /// Empties it, keeping its capacity.
  void clear() {
    for (auto& s : m_slots) s.used = false;
    m_size = 0;
  }

  /// f(key, value) for every entry, in no particular order (the same for the same inserts).
  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : m_slots) {
      if (s.used) f(s.key, s.value);
    }
  }

 private:
  struct Slot {
    std::uint64_t key = 0;
    V value{};
    bool used = false;
  };

  std::size_t index(std::uint64_t key) const {
    // Fibonacci hashing: addresses share their low bits (alignment) and high bits (the device).
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> m_shift) & m_mask;
  }

  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(m_slots);
    m_slots.assign(capacity, Slot{});
    m_mask = capacity - 1;
    m_shift = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) --m_shift;
    m_size = 0;
    for (const auto& s : old) {
      if (s.used) try_emplace(s.key, s.value);
    }
  }

  std::vector<Slot> m_slots;
  std::size_t m_size = 0;
  std::size_t m_mask = 0;
  unsigned m_shift = 64;
};

}  // namespace memsnap
