// The Python interpreter's current frames, captured from inside PyTorch's allocator.
//
// PyTorch releases the GIL around every operator, and the allocator's trace tracker must never
// take it (the allocator's lock is held; a thread holding the GIL may be waiting for that lock).
// So frames are read without the GIL, from the calling thread's own frame chain, which no other
// thread changes while this one is inside a C call: a few plain loads per frame, no allocation, no
// reference counting. Where the interpreter keeps that chain differs between CPython versions; it
// is found once with the GIL held (probe_python_frames, from memsnap_torch.attach()) and checked
// against the C API's own walk of the same frames. A layout the probe cannot confirm turns Python
// stacks off with one line, never guesses.
//
// Names and line numbers need the GIL: captured frames hold (code object, instruction offset),
// and resolve_pending_python_frames() turns new ones into names at the next optimizer step or
// memsnap_torch call, before the window that holds them is written.
//
// No Python headers and no libpython link: the C-API functions are looked up in the process.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "memsnap/event.hpp"

namespace memsnap::pytorch {

/// With the GIL held: finds and checks where this interpreter keeps a thread's frames. True when
/// Python frames can be captured; otherwise `why` says what did not fit.
bool probe_python_frames(std::string& why) noexcept;

/// Fills `out` with the calling thread's Python frames, innermost first, as foreign stack entries
/// (memsnap::kForeignFrame). Any thread, GIL or not; 0 before a successful probe.
int capture_python_frames(std::span<std::uintptr_t> out) noexcept;

/// With the GIL held: names and line numbers for the frames captured since the last call.
void resolve_pending_python_frames() noexcept;

/// The frame (function, file, line) of an entry made by capture_python_frames. Any thread.
Frame resolve_python_frame(std::uintptr_t entry) noexcept;

}  // namespace memsnap::pytorch
