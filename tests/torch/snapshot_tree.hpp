// The reference writer of a window's torch snapshot (snapshot_tree.cpp): the whole value tree,
// what the streamed export (torch/snapshot_export.hpp) must write byte for byte once pickled.
#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

#include "memsnap/record.hpp"
#include "torch/pickle.hpp"

namespace memsnap::torch {

/// The snapshot value of window `window_index` of `record`, with the import's extras (what
/// pickle::write of it gives is export_snapshot's bytes). SnapshotError if there is no such window.
pickle::ValuePtr snapshot_value(const RankRecord& record, std::size_t window_index,
                                const nlohmann::json& extras = nlohmann::json());

}  // namespace memsnap::torch
