// Arguments of the text-protocol opcodes, decoded (pickle_text.cpp). Each returns false on bad
// text, with `problem` saying what is wrong; the reader adds the opcode and its offset.
#pragma once

#include <string>
#include <string_view>

namespace memsnap::pickle {

/// Decimal text with an optional sign (INT, LONG) to two's-complement little-endian bytes.
bool decimal_to_le(std::string_view text, std::string& out);
/// STRING's argument, a Python 2 repr (quoted, backslash escapes), to its bytes.
bool decode_string_literal(std::string_view s, std::string& out, const char*& problem);
/// UNICODE's argument (raw-unicode-escape: \uXXXX, \UXXXXXXXX, other bytes Latin-1) to UTF-8.
bool decode_raw_unicode_escape(std::string_view s, std::string& out, const char*& problem);

}  // namespace memsnap::pickle
