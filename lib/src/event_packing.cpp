#include "event_packing.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace memsnap::packing {
namespace {

constexpr unsigned kEscaped = 15;
constexpr unsigned kSameSize = 1u << 4, kSameStream = 1u << 5, kSameStack = 1u << 6, kSameDevice = 1u << 7;

std::uint64_t zigzag(std::int64_t v) { return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63); }
std::int64_t unzigzag(std::uint64_t v) { return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1); }

inline char* put_varint(char* p, std::uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

// Reads packed bytes; every read checks what is left.
struct Cursor {
  const unsigned char* p;
  const unsigned char* end;
  std::size_t index = 0;  // the event being read, for the message

  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error("packed event " + std::to_string(index) + ": " + what);
  }
  std::uint8_t byte() {
    if (p == end) fail("cut short");
    return *p++;
  }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const std::uint8_t b = byte();
      // The tenth byte holds bit 63 alone.
      if (shift == 63 && b > 1) fail("a number past 64 bits");
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
  }
};

}  // namespace

std::size_t pack(std::span<const Event> events, char* out) {
  char* p = out;
  Event prev;
  prev.stack_id = kNoStack;
  for (const Event& e : events) {
    const auto action = static_cast<unsigned>(e.action);
    const bool escaped = action >= kEscaped || e.flags != 0;
    unsigned head = escaped ? kEscaped : action;
    if (e.size == prev.size) head |= kSameSize;
    if (e.stream == prev.stream) head |= kSameStream;
    if (e.stack_id == prev.stack_id) head |= kSameStack;
    if (e.device == prev.device) head |= kSameDevice;
    *p++ = static_cast<char>(head);
    p = put_varint(p, zigzag(static_cast<std::int64_t>(static_cast<std::uint64_t>(e.time_ns) -
                                                       static_cast<std::uint64_t>(prev.time_ns))));
    p = put_varint(p, zigzag(static_cast<std::int64_t>(e.addr - prev.addr)));
    if ((head & kSameSize) == 0) p = put_varint(p, e.size);
    if ((head & kSameStream) == 0) p = put_varint(p, e.stream);
    if ((head & kSameStack) == 0) p = put_varint(p, static_cast<std::uint32_t>(e.stack_id + 1));
    if ((head & kSameDevice) == 0) p = put_varint(p, zigzag(e.device));
    if (escaped) {
      *p++ = static_cast<char>(action);
      *p++ = static_cast<char>(e.flags);
    }
    prev = e;
  }
  return static_cast<std::size_t>(p - out);
}

namespace {

void unpack_onto(Cursor& c, std::size_t n, std::vector<Event>& out) {
  Event e;
  e.stack_id = kNoStack;
  for (; c.index < n; ++c.index) {
    const unsigned head = c.byte();
    e.time_ns = static_cast<std::int64_t>(static_cast<std::uint64_t>(e.time_ns) + static_cast<std::uint64_t>(unzigzag(c.varint())));
    e.addr += static_cast<std::uint64_t>(unzigzag(c.varint()));
    if ((head & kSameSize) == 0) e.size = c.varint();
    if ((head & kSameStream) == 0) e.stream = c.varint();
    if ((head & kSameStack) == 0) {
      const std::uint64_t id = c.varint();
      if (id > 0xffffffffu) c.fail("a stack id past 32 bits");
      e.stack_id = static_cast<std::uint32_t>(id) - 1;
    }
    if ((head & kSameDevice) == 0) {
      const std::int64_t device = unzigzag(c.varint());
      if (device < INT16_MIN || device > INT16_MAX) c.fail("a device number past 16 bits");
      e.device = static_cast<std::int16_t>(device);
    }
    unsigned action = head & 15u;
    e.flags = 0;
    if (action == kEscaped) {
      action = c.byte();
      e.flags = c.byte();
    }
    e.action = static_cast<Action>(action);
    out.push_back(e);
  }
  if (c.p != c.end) throw std::runtime_error(std::to_string(c.end - c.p) + " bytes after the last packed event");
}

}  // namespace

void unpack(std::span<const char> bytes, std::size_t n, std::vector<Event>& out) {
  if (n > bytes.size() / kMinPackedEventBytes) {
    throw std::runtime_error(std::to_string(n) + " packed events announced in " + std::to_string(bytes.size()) + " bytes");
  }
  Cursor c{reinterpret_cast<const unsigned char*>(bytes.data()), reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size()};
  const std::size_t first = out.size();
  try {
    unpack_onto(c, n, out);
  } catch (...) {
    out.resize(first);  // none of a damaged record's events
    throw;
  }
}

}  // namespace memsnap::packing
