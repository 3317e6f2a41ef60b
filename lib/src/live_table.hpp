// Live allocations by key: an open-addressing hash table (linear probing, backward-shift erase).
// The recorder updates it for every event it drains; std::unordered_map's node per insert cost
// more than the rest of the drain together.
#pragma once

#include <cstdint>
#include <vector>

#include "memsnap/event.hpp"

namespace memsnap {

class LiveTable {
 public:
  static constexpr std::uint64_t kEmpty = ~0ull;

  LiveTable() { rehash(1024); }

  std::size_t size() const { return size_; }

  // Inserts or replaces; returns the size of the allocation it replaced (0 if none).
  std::uint64_t put(std::uint64_t key, const LiveAlloc& value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) rehash(slots_.size() * 2);
    std::size_t i = index(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    std::uint64_t replaced = 0;
    if (slots_[i].key == key) {
      replaced = slots_[i].value.size;
    } else {
      ++size_;
    }
    slots_[i] = Slot{key, value};
    return replaced;
  }

  const LiveAlloc* find(std::uint64_t key) const {
    std::size_t i = index(key);
    while (slots_[i].key != kEmpty) {
      if (slots_[i].key == key) return &slots_[i].value;
      i = (i + 1) & mask_;
    }
    return nullptr;
  }

  static constexpr std::uint64_t kAbsent = ~0ull;

  // Removes the key; returns false when it was not there.
  bool erase(std::uint64_t key) { return erase_size(key) != kAbsent; }

  // Removes the key and returns its allocation's size (one probe for a free), or kAbsent.
  std::uint64_t erase_size(std::uint64_t key) {
    std::size_t i = index(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == kEmpty) return kAbsent;
      i = (i + 1) & mask_;
    }
    const std::uint64_t size = slots_[i].value.size;
    // Backward shift: move later entries of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
      const std::size_t home = index(slots_[j].key);
      const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].key = kEmpty;
    --size_;
    return size;
  }

  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : slots_) {
      if (s.key != kEmpty) f(s.key, s.value);
    }
  }

 private:
  struct Slot {
    std::uint64_t key = kEmpty;
    LiveAlloc value;
  };
  std::size_t index(std::uint64_t key) const {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return static_cast<std::size_t>(key) & mask_;
  }
  void rehash(std::size_t n) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    size_ = 0;
    for (const auto& s : old) {
      if (s.key != kEmpty) put(s.key, s.value);
    }
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace memsnap
