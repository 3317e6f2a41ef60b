// The recorder's stack interner: stacks interned by value, memsnap's own frames trimmed, frames
// symbolised when written.
#include "stack_interner.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <string_view>

#include "memsnap/recorder.hpp"
#include "memsnap/spill.hpp"
#include "recorder_impl.hpp"  // g_foreign_resolver

namespace memsnap::detail {

bool StackInterner::in_trimmed_module(std::uintptr_t pc) const {
  if (trim_modules.empty()) return false;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr) return false;
  const std::string_view file = info.dli_fname;
  for (const auto& m : trim_modules) {
    if (file.find(m) != std::string_view::npos) return true;
  }
  return false;
}

std::uint32_t StackInterner::intern(const std::uintptr_t* pcs, int depth) {
  // Seen before: one hash lookup. New: trim memsnap's own frames (the hook, the C API) from the
  // top once, and intern the trimmed stack.
  m_raw_key.assign(pcs, pcs + depth);
  if (auto it = m_raw_ids.find(m_raw_key); it != m_raw_ids.end()) return it->second;
  // The capture machinery sits on top: memsnap's own frames, the trimmed modules, and whatever
  // wraps backtrace() itself (a sanitizer's interceptor). Cut below the deepest of ours among
  // the top frames.
  auto ours = [&](std::uintptr_t pc) {
    return (pc & kForeignFrame) == 0 && (stacks::is_own_frame(pc) || in_trimmed_module(pc));
  };
  int first = 0;
  for (int i = 0; i < std::min(depth, 12); ++i) {
    if (ours(pcs[i])) first = i + 1;
  }
  while (first < depth && ours(pcs[first])) ++first;
  std::vector<std::uintptr_t> key(pcs + first, pcs + depth);
  std::uint32_t id = kNoStack;
  if (!key.empty()) {
    auto [it, inserted] = m_ids.try_emplace(std::move(key), static_cast<std::uint32_t>(m_stacks.size()));
    if (inserted) m_stacks.push_back(it->first);
    id = it->second;
  }
  m_raw_ids.emplace(m_raw_key, id);
  return id;
}

bool StackInterner::write_new(SpillWriter& spill) {
  if (m_stacks_written == m_stacks.size()) return true;
  std::vector<Stack> fresh;
  const ForeignFrameResolver foreign = g_foreign_resolver.load();
  for (std::size_t i = m_stacks_written; i < m_stacks.size(); ++i) {
    Stack s;
    for (auto pc : m_stacks[i]) {
      auto [it, inserted] = m_frame_ids.try_emplace(pc, static_cast<std::uint32_t>(m_frames.size()));
      if (inserted) {
        if ((pc & kForeignFrame) != 0) {
          m_frames.push_back(foreign != nullptr ? foreign(pc) : Frame{"<frame>", "", 0});
        } else {
          if (!m_symbolizer) m_symbolizer = std::make_unique<stacks::Symbolizer>();
          m_frames.push_back(m_symbolizer->resolve(pc));
        }
      }
      s.push_back(it->second);
    }
    fresh.push_back(std::move(s));
  }
  if (m_frames.size() > m_frames_written) {
    if (!spill.write_frames(static_cast<std::uint32_t>(m_frames_written),
                            std::span<const Frame>(m_frames).subspan(m_frames_written))) return false;
    m_frames_written = m_frames.size();
  }
  if (!spill.write_stacks(static_cast<std::uint32_t>(m_stacks_written), fresh)) return false;
  m_stacks_written = m_stacks.size();
  return true;
}

}  // namespace memsnap::detail
