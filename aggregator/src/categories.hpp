// Categories: what an allocation's memory is for (parameters, gradients, optimizer state, the
// collectives' buffers, activations), decided from the frames of its stack. `category_name` and
// `categorize` (a stack of a record) are declared in memsnap/analysis.hpp.
#pragma once

#include <span>

#include "memsnap/analysis.hpp"

namespace memsnap {

/// The category of one stack given as its frames, innermost first (a null entry is a frame id
/// the record does not hold). Python frames decide where the stack has any; otherwise the
/// program's own native frames, the autograd engine's (a real backward: gradients), never the
/// dispatcher's or the allocator's.
Category categorize_frames(std::span<const Frame* const> stack);

}  // namespace memsnap
