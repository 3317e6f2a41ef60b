// What the spill's writer and reader share: the checksum, the fixed parts of the small records
// and their field tables. The byte layout is drawn beside the writer, in spill_writer.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <tuple>

#include "crc32c.hpp"
#include "memsnap/codec.hpp"
#include "memsnap/record.hpp"
#include "memsnap/record_fields.hpp"

namespace memsnap {
namespace spill_records {

inline std::uint32_t crc(const void* data, std::size_t n, std::uint32_t seed = 0) { return crc32c(data, n, seed); }

template <class T>
std::span<const char> bytes_of(std::span<const T> items) {
  return {reinterpret_cast<const char*>(items.data()), items.size_bytes()};
}

// The fixed parts of the small records; the others are a u32 prefix and one value of the event
// model, laid out by its table in memsnap/record_fields.hpp.
struct WindowOpenRecord {
  std::uint32_t window = 0;
  std::int64_t batch_start = 0;
  std::int64_t time_ns = 0;
};
struct BatchRecord {
  std::uint32_t window = 0;
  BatchMark mark;
};
struct WindowCloseRecord {
  std::uint32_t window = 0;
  std::int64_t batch_end = 0;
  std::int64_t time_ns = 0;
  bool oom = false;
  std::uint64_t dropped = 0;
};
struct WindowBatchesRecord {
  std::uint32_t window = 0;
  std::string method;
  double confidence = 1.0;
  std::string detail;
};

}  // namespace spill_records

template <>
struct Fields<spill_records::WindowOpenRecord> {
  using R = spill_records::WindowOpenRecord;
  static constexpr auto list =
      std::tuple{field("window", &R::window), field("batch_start", &R::batch_start), field("time_ns", &R::time_ns)};
};
template <>
struct Fields<spill_records::BatchRecord> {
  using R = spill_records::BatchRecord;
  static constexpr auto list = std::tuple{field("window", &R::window), field("mark", &R::mark)};
};
template <>
struct Fields<spill_records::WindowCloseRecord> {
  using R = spill_records::WindowCloseRecord;
  static constexpr auto list =
      std::tuple{field("window", &R::window), field("batch_end", &R::batch_end), field("time_ns", &R::time_ns),
                 field("oom", &R::oom), field("dropped", &R::dropped)};
};
template <>
struct Fields<spill_records::WindowBatchesRecord> {
  using R = spill_records::WindowBatchesRecord;
  static constexpr auto list = std::tuple{field("window", &R::window), field("method", &R::method),
                                          field("confidence", &R::confidence), field("detail", &R::detail)};
};

}  // namespace memsnap
