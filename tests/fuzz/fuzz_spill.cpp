// Fuzz target: the spill reader (read_spill_bytes), then the analysis the aggregator runs on
// every window it read, as `memsnap aggregate` does with a spill from a crashed or hostile rank.
#include <array>
#include <cstdint>
#include <cstring>
#include <span>

#include "fuzz_common.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/spill.hpp"

#ifdef MEMSNAP_LIBFUZZER
// Every record carries CRC-32C checksums, so nearly every blind mutation would stop at the first
// damaged record. The mutator below mutates, then (most of the time) rewrites the checksums of
// every record, so that the fuzzing reaches the payload decoders; the rest of the time the
// damage stays, to keep the corrupt-record paths covered.
namespace {

std::uint32_t crc32c(const std::uint8_t* p, std::size_t n) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = ~0u;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

void fix_checksums(std::uint8_t* data, std::size_t size) {
  std::size_t pos = memsnap::kSpillHeaderBytes;
  while (pos + memsnap::kRecordHeaderBytes <= size) {
    std::uint32_t head[4];
    std::memcpy(head, data + pos, sizeof head);
    const std::size_t room = size - pos - memsnap::kRecordHeaderBytes;
    if (head[1] > room) head[1] = static_cast<std::uint32_t>(room);
    head[2] = crc32c(data + pos + memsnap::kRecordHeaderBytes, head[1]);
    std::memcpy(data + pos, head, 12);
    head[3] = crc32c(data + pos, 12);
    std::memcpy(data + pos + 12, &head[3], 4);
    pos += memsnap::kRecordHeaderBytes + head[1];
  }
}

}  // namespace

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);
extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  size = LLVMFuzzerMutate(data, size, max_size);
  if (seed % 8 != 0) fix_checksums(data, size);
  return size;
}
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memsnap::fuzz::run_guarded("fuzz_spill", [&] {
    memsnap::RankRecord record;
    try {
      record = memsnap::read_spill_bytes(std::span<const char>(reinterpret_cast<const char*>(data), size), "fuzz.spill");
    } catch (const memsnap::SpillError&) {
      return;  // not a spill, or a version this reader does not know: documented
    }
    for (const auto& w : record.windows) {
      const memsnap::WindowStats stats = memsnap::analyse_window(record, w);
      (void)stats;
    }
    for (std::uint32_t s = 0; s < record.stacks.size() && s < 64; ++s) {
      (void)memsnap::site_name(record, s);
      (void)memsnap::categorize(record, s);
    }
  });
  return 0;
}
