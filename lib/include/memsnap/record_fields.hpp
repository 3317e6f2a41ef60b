// The field tables of the event model and of a rank's metadata (memsnap/codec.hpp): the spill's
// payloads, the META record's JSON keys, the aggregator's gathered metadata and the store's bulk
// tables are all laid out by these, so each struct is described here once.
#pragma once

#include <tuple>

#include "memsnap/codec.hpp"
#include "memsnap/record.hpp"

namespace memsnap {

/// The most ranks a job may have (bounds rank fields read from a file).
inline constexpr std::int64_t kMaxRanks = 1 << 24;


// Store column order (HDF5 compound members). The spill writes LiveAlloc as the raw 40-byte
// struct and Event packed (lib/src/event_packing.hpp).
template <>
struct Fields<Event> {
  static constexpr auto list = std::tuple{
      field("time_ns", &Event::time_ns),   field("addr", &Event::addr),         field("size", &Event::size),
      field("stream", &Event::stream),     field("stack_id", &Event::stack_id), field("device", &Event::device),
      field("action", &Event::action),     field("flags", &Event::flags)};
};
template <>
inline constexpr bool kWireAsBytes<Event> = true;

template <>
struct Fields<LiveAlloc> {
  static constexpr auto list = std::tuple{
      field("addr", &LiveAlloc::addr),         field("size", &LiveAlloc::size),
      field("stream", &LiveAlloc::stream),     field("time_ns", &LiveAlloc::time_ns),
      field("stack_id", &LiveAlloc::stack_id), field("device", &LiveAlloc::device),
      field("is_segment", &LiveAlloc::is_segment)};
};
template <>
inline constexpr bool kWireAsBytes<LiveAlloc> = true;

template <>
struct Fields<BatchMark> {
  static constexpr auto list = std::tuple{field("batch", &BatchMark::batch), field("time_ns", &BatchMark::time_ns)};
};

template <>
struct Fields<Frame> {
  static constexpr auto list = std::tuple{field("name", &Frame::name), field("file", &Frame::file), field("line", &Frame::line)};
};

template <>
struct Fields<Block> {
  static constexpr auto list = std::tuple{field("addr", &Block::addr), field("size", &Block::size),
                                          field("requested_size", &Block::requested_size), field("state", &Block::state),
                                          field("stack_id", &Block::stack_id)};
};

template <>
struct Fields<Segment> {
  static constexpr auto list = std::tuple{field("addr", &Segment::addr),     field("size", &Segment::size),
                                          field("stream", &Segment::stream), field("device", &Segment::device),
                                          field("pool", &Segment::pool),     field("blocks", &Segment::blocks)};
};

// The META record's JSON keys; the bounds are what meta_from_json accepts.
template <>
struct Fields<RankMeta> {
  static constexpr auto list = std::tuple{
      field("rank", &RankMeta::rank).bounds(0, kMaxRanks - 1),
      field("local_rank", &RankMeta::local_rank).bounds(0, kMaxRanks - 1),
      field("world_size", &RankMeta::world_size).bounds(1, kMaxRanks),
      field("local_world_size", &RankMeta::local_world_size).bounds(1, kMaxRanks),
      field("node_rank", &RankMeta::node_rank).bounds(0, kMaxRanks - 1),
      field("host", &RankMeta::host),
      field("pid", &RankMeta::pid).bounds(0, std::numeric_limits<std::int64_t>::max()),
      field("run_name", &RankMeta::run_name),
      field("source", &RankMeta::source),
      field("device_name", &RankMeta::device_name),
      field("config", &RankMeta::config_json),
      field("tool_version", &RankMeta::tool_version),
      field("start_unix_ns", &RankMeta::start_unix_ns),
      field("clock_offset_ns", &RankMeta::clock_offset_ns),
      field("device_total_bytes", &RankMeta::device_total_bytes),
      field("launch", &RankMeta::launch)};  // absent in older spills: empty
};

}  // namespace memsnap
