// Shared helpers of the fuzz targets: a byte reader for the structured inputs and the rule for
// exceptions (documented ones are expected, anything else is a finding).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

namespace memsnap::fuzz {

/// A finding that is not a sanitizer report: prints one line and aborts, so that libFuzzer
/// saves the input and the replay test fails on it.
[[noreturn]] inline void finding(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: FINDING: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// MEMSNAP_FUZZ_ALLOW_EXCEPTIONS=1 tolerates exceptions of undocumented types (to keep fuzzing
/// for memory errors once such a finding is reported).
inline bool allow_other_exceptions() {
  static const bool allow = [] {
    const char* v = std::getenv("MEMSNAP_FUZZ_ALLOW_EXCEPTIONS");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return allow;
}

/// Runs `body`, which catches the exceptions its API documents; anything that escapes it is a
/// finding (an exception type the caller does not expect).
template <class Body>
void run_guarded(const char* target, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    if (allow_other_exceptions()) return;
    finding(target, std::string("undocumented exception ") + typeid(e).name() + ": " + e.what());
  } catch (...) {
    if (allow_other_exceptions()) return;
    finding(target, "an exception that is not a std::exception");
  }
}

#define MEMSNAP_FUZZ_CHECK(target, cond, what)                                              \
  do {                                                                                      \
    if (!(cond)) ::memsnap::fuzz::finding(target, std::string("check failed: " #cond ": ") + (what)); \
  } while (0)

/// Consumes a fuzz input front to back; reads past the end give zeros / empty strings.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : m_data(data), m_size(size) {}
  bool empty() const { return m_pos >= m_size; }
  std::size_t left() const { return m_size - m_pos; }
  template <class T>
  T get() {
    T v{};
    const std::size_t n = std::min(sizeof(T), left());
    if (n > 0) std::memcpy(&v, m_data + m_pos, n);
    m_pos += n;
    return v;
  }
  std::uint8_t byte() { return get<std::uint8_t>(); }
  /// A string of length byte() (capped at `max`).
  std::string short_string(std::size_t max = 255) {
    const std::size_t want = byte();
    const std::size_t n = std::min<std::size_t>({want, max, left()});
    std::string s(reinterpret_cast<const char*>(m_data + m_pos), n);
    m_pos += n;
    return s;
  }
  /// Bytes up to the next NUL (consumed) or the end.
  std::string until_nul() {
    std::string s;
    while (m_pos < m_size && m_data[m_pos] != 0) s += static_cast<char>(m_data[m_pos++]);
    if (m_pos < m_size) ++m_pos;
    return s;
  }
  std::string_view rest() {
    std::string_view s(reinterpret_cast<const char*>(m_data + m_pos), left());
    m_pos = m_size;
    return s;
  }
  std::string_view take(std::size_t n) {
    n = std::min(n, left());
    std::string_view s(reinterpret_cast<const char*>(m_data + m_pos), n);
    m_pos += n;
    return s;
  }

 private:
  const std::uint8_t* m_data;
  std::size_t m_size;
  std::size_t m_pos = 0;
};

}  // namespace memsnap::fuzz
