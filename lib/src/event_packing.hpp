// The spill's packed events (record EVENTS_PACKED, spill.hpp): each event as its changes from the
// one before it in the same record, in LEB128 varints. A training loop's alloc/free stream packs
// to 4-12 bytes an event instead of the 40 of the raw struct: fewer bytes for the recorder to
// checksum and hand to the kernel, and smaller spills on the node's disk.
//
// One event:
//   u8 head      bits 0-3 the action (15: escaped, see below); bit 4 size, bit 5 stream, bit 6
//                stack_id, bit 7 device: set when that field equals the previous event's
//   varint       zigzag(time_ns - previous time_ns)
//   varint       zigzag(addr - previous addr), wrapping
//   [varint]     size                  unless bit 4
//   [varint]     stream                unless bit 5
//   [varint]     stack_id + 1 (mod 2^32: kNoStack is 0)   unless bit 6
//   [varint]     zigzag(device)        unless bit 7
//   [u8 u8]      action, flags         when the action nibble is 15: an action past 14, or flags
// The previous event of a record's first event is all zero, with stack_id kNoStack: each record
// unpacks on its own.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "memsnap/event.hpp"

namespace memsnap::packing {

// The most bytes one event can take.
inline constexpr std::size_t kMaxPackedEventBytes = 1 + 10 + 10 + 10 + 10 + 5 + 3 + 2;
// The fewest: the head, and one byte each for the time and the address.
inline constexpr std::size_t kMinPackedEventBytes = 3;

// Packs `events` into `out` (room for events.size() * kMaxPackedEventBytes); returns the bytes used.
std::size_t pack(std::span<const Event> events, char* out);

// Unpacks exactly `n` events from `bytes` (all of them: a byte left over is an error) onto `out`.
// Throws std::runtime_error naming what is wrong when the bytes are not n packed events.
void unpack(std::span<const char> bytes, std::size_t n, std::vector<Event>& out);

}  // namespace memsnap::packing
