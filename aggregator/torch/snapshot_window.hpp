// What an imported trace says about its window beyond its events (snapshot_window.cpp): the
// allocations and reserved ranges live before it began, and its batches.
#pragma once

#include <cstdint>
#include <vector>

#include "memsnap/record.hpp"
#include "torch/snapshot_parts.hpp"

namespace memsnap::torch::detail {

/// The allocations and reserved ranges live when the trace began, so that replaying the window's
/// events from them gives the allocator state at dump; `segment_stacks` are the stacks of
/// w.segments. Segments first, then by device and address.
std::vector<LiveAlloc> reconstruct_live_at_start(const WindowRecord& w,
                                                 const std::vector<std::uint32_t>& segment_stacks);

/// The window's batches: the trace's own marks where `annotations` (the snapshot's
/// external_annotations, or nullptr) has them, else inferred from its structure; opt.batch_start
/// renumbers them.
void find_batches(const RankRecord& rec, const Value* annotations, const ImportOptions& opt, WindowRecord& w);

}  // namespace memsnap::torch::detail
