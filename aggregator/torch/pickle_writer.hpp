// A small protocol-4 pickle writer for plain data, the counterpart of pickle.hpp: what it writes
// Python's pickle.load reads, with shared nodes written once and referenced after. Whole value
// trees (write) or opcode by opcode as the data is walked (Writer), into a string or a sink.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "torch/pickle.hpp"

namespace memsnap::pickle {

struct WriteOptions {
  /// Group opcodes into ~64 KiB FRAMEs as Python's protocol 4 does (readers may prefetch frames).
  bool frames = true;
};

/// Receives a pickle's bytes in order, as the writer completes them (a frame at a time).
using ByteSink = std::function<void(std::string_view)>;

/// Serialises `root` as a protocol-4 pickle. A node reached more than once (the same pointer, such
/// as a frame list shared by many trace entries) is written once, memoised, and referenced with
/// BINGET/LONG_BINGET afterwards. Throws ValueError for a null node.
std::string write(const ValuePtr& root, const WriteOptions& opt = {});

/// A protocol-4 pickle written opcode by opcode, for data too large to build as one value first:
/// the caller walks its data and says what comes next; each finished frame goes to the sink, so
/// memory holds one frame. The opcodes are write()'s for the same value: a caller that memoises
/// what write() would (the nodes reached more than once) and batches as Batches does gets the
/// same bytes.
class Writer {
 public:
  /// Writes PROTO 4.
  explicit Writer(ByteSink sink, const WriteOptions& opt = {});
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void none();
  void boolean(bool b);
  void integer(std::int64_t v);
  void unsigned_integer(std::uint64_t v);
  void string(std::string_view s);
  void empty_list();
  void empty_dict();
  /// A whole value tree, every node written where it is reached (nothing memoised): write()'s
  /// bytes for a tree none of whose containers, strings or big ints is reached twice.
  void value(const Value& v);
  /// MEMOIZE: the value just written (or the container just opened) gets the next memo index.
  std::uint32_t memoize();
  /// BINGET or LONG_BINGET of a memoised value.
  void get(std::uint32_t index);
  /// STOP, and the last frame to the sink. Nothing may be written after it.
  void finish();

  /// The items of a list or dict just opened, `count` of them, in batches of 1000 as Python's
  /// pickler writes them: MARK, the items, APPENDS (SETITEMS), or APPEND (SETITEM) alone for a
  /// batch of one. begin_item() before each item (a dict's: its key and value), end_item() after.
  class Batches {
   public:
    Batches(Writer& w, std::size_t count, bool dict) : m_w(w), m_count(count), m_dict(dict) {}
    void begin_item();
    void end_item();

   private:
    Writer& m_w;
    std::size_t m_count;
    std::size_t m_done = 0;
    bool m_dict;
    bool m_single = false;  // the current batch holds one item
  };

 private:
  friend class TreeEmitter;
  void op(char code);
  void op_sized(char op1, char op4, char op8, std::string_view payload);
  void long_integer(std::string_view le_bytes);  // LONG1 / LONG4
  void floating(double d);
  void begin_op();
  void commit_frame();

  ByteSink m_sink;
  WriteOptions m_opt;
  std::string m_frame;
  std::uint32_t m_memo = 0;  // memo indices handed out
};

}  // namespace memsnap::pickle
