// Arguments of the text-protocol opcodes (protocol 0: INT, LONG, STRING, UNICODE) decoded to the
// values they stand for.
#include "torch/pickle_text.hpp"

#include <cstdint>
#include <vector>

namespace memsnap::pickle {

namespace {

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool failed(const char*& problem, const char* what) {
  problem = what;
  return false;
}

}  // namespace

// Decimal text (optional sign) to two's-complement little-endian bytes, for INT/LONG text opcodes.
bool decimal_to_le(std::string_view text, std::string& out) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return false;
  std::vector<std::uint32_t> limbs;  // magnitude, little-endian
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    std::uint64_t carry = static_cast<std::uint64_t>(c - '0');
    for (auto& limb : limbs) {
      std::uint64_t cur = static_cast<std::uint64_t>(limb) * 10 + carry;
      limb = static_cast<std::uint32_t>(cur);
      carry = cur >> 32;
    }
    if (carry) limbs.push_back(static_cast<std::uint32_t>(carry));
  }
  out.assign(limbs.size() * 4 + 1, '\0');  // one extra byte keeps the sign bit clear
  for (std::size_t i = 0; i < limbs.size(); ++i)
    for (int b = 0; b < 4; ++b) out[i * 4 + b] = static_cast<char>((limbs[i] >> (8 * b)) & 0xff);
  if (negative) {
    unsigned carry = 1;
    for (auto& c : out) {
      unsigned v = static_cast<unsigned char>(~static_cast<unsigned char>(c)) + carry;
      c = static_cast<char>(v & 0xff);
      carry = v >> 8;
    }
  }
  return true;
}

bool decode_string_literal(std::string_view s, std::string& out, const char*& problem) {
  // STRING holds a Python 2 repr: quoted, with backslash escapes.
  if (s.size() < 2 || (s.front() != '\'' && s.front() != '"') || s.back() != s.front())
    return failed(problem, "STRING argument is not quoted");
  s = s.substr(1, s.size() - 2);
  out.clear();
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '\\' || i + 1 >= s.size()) {
      out += c;
      continue;
    }
    char e = s[++i];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;
      case 'x': {
        if (i + 2 >= s.size() || hex_value(s[i + 1]) < 0 || hex_value(s[i + 2]) < 0)
          return failed(problem, "bad \\x escape in STRING");
        out += static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
        i += 2;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) v = v * 8 + (s[++i] - '0');
          out += static_cast<char>(v & 0xff);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return true;
}

bool decode_raw_unicode_escape(std::string_view s, std::string& out, const char*& problem) {
  out.clear();
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\' && i + 1 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
      int digits = s[i + 1] == 'u' ? 4 : 8;
      if (i + 1 + static_cast<std::size_t>(digits) >= s.size()) return failed(problem, "bad \\u escape in UNICODE");
      std::uint32_t cp = 0;
      for (int k = 0; k < digits; ++k) {
        int h = hex_value(s[i + 2 + k]);
        if (h < 0) return failed(problem, "bad \\u escape in UNICODE");
        cp = cp * 16 + static_cast<std::uint32_t>(h);
      }
      if (cp > 0x10ffff) return failed(problem, "code point out of range in UNICODE");
      append_utf8(out, cp);
      i += 1 + digits;
    } else {
      append_utf8(out, c);  // raw-unicode-escape: other bytes are Latin-1
    }
  }
  return true;
}

}  // namespace memsnap::pickle
