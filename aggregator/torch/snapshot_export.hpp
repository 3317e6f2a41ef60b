// The export of a window as a torch snapshot pickle, written as the window is walked, so that a
// long trace is never held as values (or as events, when they come from the store in pieces).
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include <nlohmann/json.hpp>

#include "memsnap/record.hpp"
#include "torch/pickle_writer.hpp"

namespace memsnap::torch {

/// Hands a window's events to `piece` in order, in consecutive pieces, until `piece` returns
/// false or the events end. Called more than once by one export (a count, then once per device
/// trace that has entries), each time from the first event.
using EventPieces = std::function<void(const std::function<bool(std::span<const Event>)>& piece)>;

/// Writes export_snapshot(record, window, extras)'s bytes to `sink` as it makes them: `window`'s
/// segments, batches and extras are read from `window`, its events only from `events`
/// (window.events is not looked at); record gives the frames and stacks. Memory holds the
/// segments, the frames and stacks the window uses, the extras, the strings it writes and one
/// frame of output, not the trace. The bytes are the same as the tests' reference writer gives
/// (tests/torch/snapshot_tree.cpp, the whole value tree pickled; test_snapshot_export.cpp).
void write_snapshot(const RankRecord& record, const WindowRecord& window, const EventPieces& events,
                    const nlohmann::json& extras, const pickle::ByteSink& sink);

}  // namespace memsnap::torch
