// Opcode names (pickle.hpp's opcode_name) and their bytes in error messages.
#include "torch/pickle.hpp"
#include "torch/pickle_opcodes.hpp"

namespace memsnap::pickle {

using namespace opcodes;

const char* opcode_name(std::uint8_t op) {
  switch (op) {
    case MARK: return "MARK";
    case STOP: return "STOP";
    case POP: return "POP";
    case POP_MARK: return "POP_MARK";
    case DUP: return "DUP";
    case FLOAT: return "FLOAT";
    case INT: return "INT";
    case BININT: return "BININT";
    case BININT1: return "BININT1";
    case LONG: return "LONG";
    case BININT2: return "BININT2";
    case NONE: return "NONE";
    case PERSID: return "PERSID";
    case BINPERSID: return "BINPERSID";
    case REDUCE: return "REDUCE";
    case STRING: return "STRING";
    case BINSTRING: return "BINSTRING";
    case SHORT_BINSTRING: return "SHORT_BINSTRING";
    case UNICODE: return "UNICODE";
    case BINUNICODE: return "BINUNICODE";
    case APPEND: return "APPEND";
    case BUILD: return "BUILD";
    case GLOBAL: return "GLOBAL";
    case DICT: return "DICT";
    case EMPTY_DICT: return "EMPTY_DICT";
    case APPENDS: return "APPENDS";
    case GET: return "GET";
    case BINGET: return "BINGET";
    case INST: return "INST";
    case LONG_BINGET: return "LONG_BINGET";
    case LIST: return "LIST";
    case EMPTY_LIST: return "EMPTY_LIST";
    case OBJ: return "OBJ";
    case PUT: return "PUT";
    case BINPUT: return "BINPUT";
    case LONG_BINPUT: return "LONG_BINPUT";
    case SETITEM: return "SETITEM";
    case TUPLE: return "TUPLE";
    case EMPTY_TUPLE: return "EMPTY_TUPLE";
    case SETITEMS: return "SETITEMS";
    case BINFLOAT: return "BINFLOAT";
    case PROTO: return "PROTO";
    case NEWOBJ: return "NEWOBJ";
    case EXT1: return "EXT1";
    case EXT2: return "EXT2";
    case EXT4: return "EXT4";
    case TUPLE1: return "TUPLE1";
    case TUPLE2: return "TUPLE2";
    case TUPLE3: return "TUPLE3";
    case NEWTRUE: return "NEWTRUE";
    case NEWFALSE: return "NEWFALSE";
    case LONG1: return "LONG1";
    case LONG4: return "LONG4";
    case BINBYTES: return "BINBYTES";
    case SHORT_BINBYTES: return "SHORT_BINBYTES";
    case SHORT_BINUNICODE: return "SHORT_BINUNICODE";
    case BINUNICODE8: return "BINUNICODE8";
    case BINBYTES8: return "BINBYTES8";
    case EMPTY_SET: return "EMPTY_SET";
    case ADDITEMS: return "ADDITEMS";
    case FROZENSET: return "FROZENSET";
    case NEWOBJ_EX: return "NEWOBJ_EX";
    case STACK_GLOBAL: return "STACK_GLOBAL";
    case MEMOIZE: return "MEMOIZE";
    case FRAME: return "FRAME";
    case BYTEARRAY8: return "BYTEARRAY8";
    case NEXT_BUFFER: return "NEXT_BUFFER";
    case READONLY_BUFFER: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

std::string hex_byte(std::uint8_t b) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  s += digits[b >> 4];
  s += digits[b & 15];
  return s;
}

}  // namespace memsnap::pickle
