// The Python interpreter's current frames, captured from inside PyTorch's allocator.
//
// No Python headers and no libpython link: the few C-API functions needed are looked up in the
// process (the interpreter that imported torch exports them), so one build serves every Python
// 3.9+. Frames are captured only by a thread that already holds the GIL (the allocator's trace
// tracker must never take it); other threads (autograd's backward threads) get none.
#pragma once

#include <cstdint>
#include <span>

#include "memsnap/event.hpp"

namespace memsnap::pytorch {

/// Looks the C-API functions up. False (and captures nothing later) where there is no Python.
bool python_frames_available() noexcept;

/// Fills `out` with the calling thread's Python frames, innermost first, as foreign stack entries
/// (memsnap::kForeignFrame). Returns how many; 0 without the GIL or without Python.
int capture_python_frames(std::span<std::uintptr_t> out) noexcept;

/// The frame (function, file, line) of an entry made by capture_python_frames. Any thread.
Frame resolve_python_frame(std::uintptr_t entry) noexcept;

}  // namespace memsnap::pytorch
