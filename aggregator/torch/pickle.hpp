// A safe reader for Python pickles that hold plain data (PyTorch memory snapshots): it builds
// values and never imports or calls anything.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memsnap/errors.hpp"

namespace memsnap::pickle {

/// A malformed pickle, or one that would run code. what() is one line naming the opcode (name and
/// hex) where there is one, and the byte offset.
class PickleError : public Error {
 public:
  PickleError(const std::string& message, std::size_t offset) : Error(message), m_offset(offset) {}
  /// Byte offset of the opcode (or value) at fault.
  std::size_t offset() const { return m_offset; }

 private:
  std::size_t m_offset;
};

/// A value asked for as the wrong type, or an integer that does not fit the asked-for width.
class ValueError : public Error {
 public:
  using Error::Error;
};

enum class Kind : std::uint8_t {
  none,
  boolean,
  integer,      // fits std::int64_t
  big_integer,  // does not: kept exactly as minimal two's-complement little-endian bytes
  floating,
  string,  // Python str, as the UTF-8 bytes the pickle holds
  bytes,   // Python bytes (and bytearray)
  list,
  tuple,
  dict,  // insertion order kept
};
const char* kind_name(Kind k);

class Value;
// A value tree is built, read and freed by one thread at a time (each pickle is read on one
// thread, and handed on only when that thread is done with it), so its reference counts need not
// be atomic: with libstdc++ they are not, which makes the memo references that a snapshot's
// frames are made of (40 per trace entry) plain increments.
#if defined(__GLIBCXX__)
template <typename T>
using SharedNode = std::__shared_ptr<T, __gnu_cxx::_S_single>;
template <typename T>
using WeakNode = std::__weak_ptr<T, __gnu_cxx::_S_single>;
template <typename T>
SharedNode<T> make_node() {
  return std::__make_shared<T, __gnu_cxx::_S_single>();
}
#else
template <typename T>
using SharedNode = std::shared_ptr<T>;
template <typename T>
using WeakNode = std::weak_ptr<T>;
template <typename T>
SharedNode<T> make_node() {
  return std::make_shared<T>();
}
#endif
/// Values are immutable once read and shared: a memo reference in the pickle is the same pointer.
using ValuePtr = SharedNode<const Value>;
using WeakValuePtr = WeakNode<const Value>;
using DictItems = std::vector<std::pair<ValuePtr, ValuePtr>>;

/// One pickled value. Containers hold shared pointers, so a frame list that a snapshot references
/// thousands of times exists once in memory.
class Value {
 public:
  Value() = default;
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  ~Value();  // iterative, so that a deeply nested value cannot overflow the stack

  /// Factories, for building values to write (and for tests).
  static ValuePtr none();
  static ValuePtr boolean(bool b);
  static ValuePtr integer(std::int64_t v);
  static ValuePtr unsigned_integer(std::uint64_t v);  // big_integer above INT64_MAX
  /// From minimal or non-minimal two's-complement little-endian bytes (Python's LONG1 payload).
  static ValuePtr integer_from_le_bytes(std::string_view bytes);
  static ValuePtr floating(double v);
  static ValuePtr string(std::string s);
  static ValuePtr bytes(std::string b);
  static ValuePtr list(std::vector<ValuePtr> items);
  static ValuePtr tuple(std::vector<ValuePtr> items);
  /// Keys are not checked for uniqueness here; the reader merges duplicates as Python does.
  static ValuePtr dict(DictItems items);

  Kind kind() const { return m_kind; }
  bool is_none() const { return m_kind == Kind::none; }
  bool is_int() const { return m_kind == Kind::integer || m_kind == Kind::big_integer; }
  bool is_string() const { return m_kind == Kind::string; }
  bool is_list() const { return m_kind == Kind::list; }
  bool is_tuple() const { return m_kind == Kind::tuple; }
  bool is_dict() const { return m_kind == Kind::dict; }

  /// Typed accessors: a ValueError names the expected and the actual kind.
  bool as_bool() const;
  std::int64_t as_int64() const;    // ValueError if not representable
  std::uint64_t as_uint64() const;  // ValueError if negative or above 2^64-1
  double as_double() const;         // floats, and ints converted
  const std::string& as_string() const;
  const std::string& as_bytes() const;
  /// Two's-complement little-endian bytes of any integer (minimal length).
  std::string int_le_bytes() const;
  /// The decimal text of any integer, exact for big ones.
  std::string int_decimal() const;

  /// Items of a list or tuple.
  const std::vector<ValuePtr>& items() const;
  /// Entries of a dict, in insertion order.
  const DictItems& dict_items() const;
  /// Number of items of a list, tuple or dict; 0 for scalars.
  std::size_t size() const;
  /// Dict lookup by a str key; nullptr when absent (or not a dict).
  const Value* find(std::string_view key) const;
  ValuePtr find_ptr(std::string_view key) const;
  /// Dict lookup that throws a ValueError naming the key when absent.
  const Value& at(std::string_view key) const;
  const Value& at(std::size_t index) const;

  /// Python equality for hashable kinds and containers (1 == 1.0 == True, like Python).
  bool equals(const Value& other) const;
  bool is_hashable() const;
  std::size_t hash() const;  // only for hashable values

  /// Nesting depth: 0 for scalars, 1 + deepest child for containers.
  std::uint32_t depth() const { return m_depth; }

  /// The reader met this node in more than one place (a memo reference or DUP): it stays alive and
  /// is the same node wherever the pickle refers to it. False for nodes built by the factories.
  bool is_shared() const { return m_shared; }

 private:
  friend class Builder;
  Kind m_kind = Kind::none;
  bool m_bool = false;
  bool m_nested = false;    // reader: already inside another container, so no longer mutable
  bool m_shared = false;    // reader: kept for a memo reference, or duplicated
  bool m_streamed = false;  // reader: a device trace list whose entries go to a TraceSink
  std::uint32_t m_depth = 0;
  std::int64_t m_int = 0;
  double m_float = 0.0;
  std::string m_text;  // str, bytes, or big integer bytes
  std::vector<ValuePtr> m_items;
  DictItems m_dict;
};

/// Limits of the reader; defaults fit any snapshot.
struct ReadOptions {
  std::uint32_t max_depth = 10000;  // nesting past this is rejected (protects every consumer)
  // Where the reader adds the bytes it has read past, every MiB (for a progress line; read
  // from another thread). The memo pre-pass is not counted; a pickle read again whole counts
  // twice.
  std::atomic<std::uint64_t>* progress = nullptr;
  // Streaming: offer trace entries to TraceSink::flat_entry first (tests turn it off to compare).
  bool flat_entries = true;
};

/// A file's bytes: mapped read-only when it is a regular file, else read into memory. Pages the
/// reader has passed are given back (release), so a large pickle does not stay resident.
class MappedFile {
 public:
  /// Opens and maps (or reads) `path`; PickleError at offset 0 naming the path on failure.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::string_view data() const { return m_data; }
  /// Drops the mapped pages wholly inside [begin, end) from memory; they are read again from the
  /// file if touched later. A no-op for a file that was read rather than mapped.
  void release(std::size_t begin, std::size_t end) const;
  /// How far a reader gets between releases of the pages behind it.
  static constexpr std::size_t kReleaseStep = std::size_t{1} << 20;

 private:
  void unmap() noexcept;
  void* m_map = nullptr;
  std::size_t m_map_size = 0;
  std::string m_buffer;  // a pipe or other file that cannot be mapped
  std::string_view m_data;
};

/// Parses a whole pickle (protocols 0 to 5, data opcodes only). Throws PickleError.
ValuePtr read(std::string_view data, const ReadOptions& opt = {});
/// Reads a file and parses it; I/O failures are PickleError at offset 0 naming the path.
ValuePtr read_file(const std::string& path, const ReadOptions& opt = {});

/// A trace entry decoded straight from the pickle's bytes, without a dict node: how the reader
/// hands on the entries of the common shape (torch's: keys and shared frames by memo reference,
/// ints and short strs inline). Nodes are the memo's, valid during TraceSink::flat_entry only.
struct FlatEntry {
  using NodeRef = const SharedNode<Value>*;
  enum class Is : std::uint8_t { node, integer, text, none, frames };
  struct Item {
    NodeRef key = nullptr;        // the key's node (a memo reference to a str), or nullptr: key_text
    std::string_view key_text;
    Is is = Is::none;
    NodeRef node = nullptr;       // Is::node: a memo reference
    std::int64_t integer = 0;     // Is::integer: BININT*, or LONG1 of at most 8 bytes
    std::string_view text;        // Is::text: a str inline (its bytes, as the pickle holds them)
  };
  static constexpr std::size_t kMaxItems = 12;
  Item items[kMaxItems];
  std::size_t count = 0;
  /// The list of the one Is::frames item, written inline: its items, each a dict by memo
  /// reference; `frames_node` is the node made for it when a later GET names the list (else null).
  std::vector<NodeRef> frames;
  NodeRef frames_node = nullptr;
};

/// Receives the entries of a PyTorch memory snapshot's device traces while the reader meets them,
/// so that they need not be kept (see read_streaming).
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  /// Called once, before the first entry, with the root dict's "segments" value when it came
  /// before "device_traces" (nullptr when not, or when it could still change). Returning false
  /// reads the pickle without streaming.
  virtual bool begin(const ValuePtr& segments) = 0;
  /// Entry `position` of device trace `device`, in the order a walk of the finished tree meets them.
  virtual void entry(std::size_t device, std::size_t position, const ValuePtr& entry) = 0;
  /// The same entry, decoded without a tree. Returning false (the entry is not of the shape the
  /// sink takes flat) makes the reader build it and call entry() instead; a sink that returns true
  /// must have done with it exactly what entry() would have.
  virtual bool flat_entry(std::size_t /*device*/, std::size_t /*position*/, const FlatEntry& /*entry*/) { return false; }
};

struct StreamedRead {
  ValuePtr root;
  /// True: every entry of every list in root["device_traces"] went to the sink (those lists are
  /// left empty), and root["segments"] is what begin got. False: the sink's calls, if any, are
  /// void (the pickle did something streaming cannot follow: it was read again) and root is whole.
  bool streamed = false;
};

/// Reads a pickle like read(), but when it has the shape torch.cuda.memory._dump_snapshot writes
/// (a root dict whose "device_traces" is a list of lists of entries), hands each trace entry to
/// `sink` instead of storing it. Any other pickle is read whole. `file`, when given, is where
/// `data` lives: pages behind the reader are released as it goes.
StreamedRead read_streaming(std::string_view data, TraceSink& sink, const ReadOptions& opt = {},
                            const MappedFile* file = nullptr);

/// The opcode's name as pickletools spells it ("BINUNICODE"), or nullptr for an unknown byte.
const char* opcode_name(std::uint8_t op);

/// Counts of what a value tree holds: `references` counts every edge, `unique_nodes` every distinct
/// node. Shared frame lists make references much larger than unique_nodes.
struct TreeStats {
  std::size_t unique_nodes = 0;
  std::size_t references = 0;
};
TreeStats tree_stats(const ValuePtr& root);

}  // namespace memsnap::pickle
