// Native stacks: capture return addresses on the hot path, symbolise later, once per address.
#pragma once

#include <cstdint>
#include <memory>

#include "memsnap/event.hpp"

namespace memsnap::stacks {

// Fills `out` with up to `max_depth` return addresses of the calling thread, innermost first:
// by frame pointers where the whole chain keeps them, else by the DWARF unwinder.
int capture(std::uintptr_t* out, int max_depth) noexcept;

// capture()'s two ways, apart (for tests). The frame-pointer walk returns 0 when the chain is not
// whole (some frame on it does not keep its frame pointer); the DWARF unwinder is libunwind's
// where memsnap was built with it, glibc's backtrace otherwise.
int capture_with_frame_pointers(std::uintptr_t* out, int max_depth) noexcept;
int capture_with_dwarf(std::uintptr_t* out, int max_depth) noexcept;

// Loads the unwinder before the first hot-path capture (glibc's backtrace loads libgcc_s and
// allocates on first use).
void warm_up() noexcept;

// True when `pc` lies in memsnap's own library: such frames are trimmed from recorded stacks.
bool is_own_frame(std::uintptr_t pc) noexcept;

// Resolves return addresses to frames: function (demangled), and file:line where the module has
// debug info (elfutils libdw when built with it, else the dynamic symbol table only).
class Symbolizer {
 public:
  Symbolizer();
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;
  Frame resolve(std::uintptr_t return_address);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memsnap::stacks
