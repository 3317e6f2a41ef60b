// The recorder's stack interner: raw return-address stacks interned by value as they are drained,
// symbolised and written to the spill (FRAMES and STACKS records) only when a window closes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "memsnap/event.hpp"
#include "stacks.hpp"

namespace memsnap {

class SpillWriter;

namespace detail {

struct StackKeyHash {
  std::size_t operator()(const std::vector<std::uintptr_t>& v) const noexcept {
    std::size_t h = 1469598103934665603ull;
    for (auto pc : v) h = (h ^ pc) * 1099511628211ull;
    return h;
  }
};

// Used under the recorder's lock only.
class StackInterner {
 public:
  // Modules whose frames are cut from the top of a stack, like memsnap's own (the PyTorch
  // attachment names itself).
  std::vector<std::string> trim_modules;

  // The id of a captured stack (innermost first), memsnap's own frames cut from its top; kNoStack
  // when nothing is left.
  std::uint32_t intern(const std::uintptr_t* pcs, int depth);

  // Symbolises the stacks interned since the last call and appends their new frames and the
  // stacks to `spill`. False when a write failed (spill.error() says why).
  bool write_new(SpillWriter& spill);

 private:
  bool in_trimmed_module(std::uintptr_t pc) const;

  std::unordered_map<std::vector<std::uintptr_t>, std::uint32_t, StackKeyHash> m_ids;      // trimmed
  std::unordered_map<std::vector<std::uintptr_t>, std::uint32_t, StackKeyHash> m_raw_ids;  // untrimmed
  std::vector<std::vector<std::uintptr_t>> m_stacks;  // by id, trimmed
  std::vector<std::uintptr_t> m_raw_key;              // intern()'s lookup key, reused
  std::unordered_map<std::uintptr_t, std::uint32_t> m_frame_ids;
  std::vector<Frame> m_frames;
  std::unique_ptr<stacks::Symbolizer> m_symbolizer;  // one for the process's life: debug info loads once
  std::size_t m_frames_written = 0, m_stacks_written = 0;
};

}  // namespace detail
}  // namespace memsnap
