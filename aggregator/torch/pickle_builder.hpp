// The reader's stack machine (class Builder), shared by its two files: pickle_reader.cpp (the
// opcodes, the stack, the memo and the values they build) and pickle_streaming.cpp (handing a
// torch snapshot's trace entries to a TraceSink instead of keeping them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "torch/pickle.hpp"
#include "torch/pickle_memo_refs.hpp"
#include "torch/pickle_opcodes.hpp"

namespace memsnap::pickle {

// Thrown inside the reader when a streamed pickle turns out to use a streamed node in a way the
// sink cannot follow: it is then read again without streaming.
struct ReadAgainWhole {};

// Builds values on a stack. Containers are mutable while the pickle fills them; once a container
// is placed inside another it is frozen, which rules out reference cycles (a container can only
// come to contain itself by being modified after it was nested, or by a direct self-insert).
//
// Streaming (with a TraceSink): torch's _dump_snapshot pickles its root dict as EMPTY_DICT MARK
// key value ... SETITEMS and each list as EMPTY_LIST MARK items APPENDS (batches of 1000), so
// while a trace fills, the stack holds [root, MARK, "segments", segments, "device_traces",
// traces, MARK, trace_0, ..., trace_d, MARK, entries...]. The list pushed as the value of
// "device_traces" in the root dict, and each list pushed right above it, are recognised when
// pushed; entries appended to those go to the sink and are not stored. Whatever would let the
// tree see a streamed list again (a memo reference kept or a DUP of the root, of the traces
// list or of a trace list) stops streaming, and at STOP the tree must hold the streamed lists
// where they were assumed to go; if either fails after entries went out, the pickle is read again
// without streaming.
class Builder {
 public:
  using Node = SharedNode<Value>;

  Builder(std::string_view data, const ReadOptions& opt, const MemoRefs& refs, const MappedFile* file,
          TraceSink* sink)
      : m_data(data), m_opt(opt), m_refs(refs), m_file(file), m_sink(sink), m_streaming(sink != nullptr) {
    m_slots.resize(refs.slots());
    for (std::size_t i = 0; i < m_slots.size(); ++i) m_slots[i].last_get = refs.last_gets()[i];
  }

  /// Reads to STOP and returns the one value left; PickleError on anything malformed.
  ValuePtr run();
  // The sink saw every entry (the tree's trace lists are empty).
  bool streamed() const { return m_began; }

 private:
  std::string_view m_data;
  ReadOptions m_opt;
  const MemoRefs& m_refs;
  const MappedFile* m_file;
  std::size_t m_pos = 0;
  std::size_t m_op_offset = 0;
  std::uint8_t m_op = 0;
  std::vector<Node> m_stack;
  std::vector<std::size_t> m_marks;  // stack heights at each open MARK
  // Referenced memo entries, by MemoRefs::slot, each beside the byte of its last GET (one cache
  // line for a GET to touch).
  struct Slot {
    Node node;
    std::size_t last_get = 0;
  };
  std::vector<Slot> m_slots;
  std::unordered_map<std::uint64_t, Node> m_far_memo;  // referenced entries past the slots' range
  MemoLength m_memo_length;
  // Index of big dicts under construction, so that duplicate keys stay linear to merge.
  // The entry keeps its dict alive so that a popped dict's address cannot be reused meanwhile.
  struct DictIndex {
    Node keep;
    std::unordered_multimap<std::size_t, std::size_t> positions;
  };
  std::unordered_map<const Value*, DictIndex> m_dict_index;
  Node m_none, m_true, m_false;
  // Ints below 2^16 (BININT1, BININT2: sizes, line numbers), one node each, made when first met.
  std::vector<Node> m_small_ints;
  static constexpr std::int64_t kSmallInts = 1 << 16;

  // Every MappedFile::kReleaseStep bytes: the mapped file's pages behind the reader released,
  // the bytes passed added to ReadOptions::progress.
  std::size_t m_release_at = MappedFile::kReleaseStep;
  std::size_t m_released = 0;

  // Streaming.
  struct StreamedList {
    Value* list;
    std::size_t device;
    std::size_t count;
  };
  TraceSink* m_sink;
  bool m_streaming;
  bool m_began = false;
  // Placeholders of entries streamed early: m_stack[m_early_base, m_early_end) (0: none).
  std::size_t m_early_base = 0;
  std::size_t m_early_end = 0;
  Node m_root, m_traces;
  ValuePtr m_segments;
  std::vector<StreamedList> m_lists;

  // --- raw input (pickle_reader.cpp) ---------------------------------------------------------
  void release_behind();
  std::string where() const;
  [[noreturn]] void fail(const std::string& problem) const;
  std::size_t left() const { return m_data.size() - m_pos; }
  std::string_view take(std::uint64_t n);
  std::uint64_t take_le(int width);
  std::string_view take_line();
  std::uint64_t line_index();

  // --- stack ---------------------------------------------------------------------------------
  std::size_t frame_base() const { return m_marks.empty() ? 0 : m_marks.back(); }
  std::size_t available() const { return m_stack.size() - frame_base(); }
  [[noreturn]] void underflow(std::size_t n, std::size_t has) const;
  void need(std::size_t n) const;
  Node pop();
  Node& top();
  std::size_t close_mark();
  Node& below(std::size_t base);
  void push(Node n) { m_stack.push_back(std::move(n)); }

  // --- values --------------------------------------------------------------------------------
  Node scalar(Kind kind);
  Node make_int(std::int64_t v);
  Node make_text(Kind kind, std::string_view s);
  Node make_le_int(std::string_view bytes);
  Node make_decimal(std::string_view text);
  Node make_container(Kind kind);
  void adopt(Value& parent, const Node& child);
  Node make_sequence(Kind kind, std::size_t base);
  void list_append(Value& list, std::size_t base);
  void dict_set(const Node& dict_node, Node key, Node value);
  void dict_set_items(const Node& dict_node, std::size_t base);

  // --- memo ----------------------------------------------------------------------------------
  void memo_put(std::uint64_t index);
  void memo_get(std::uint64_t index);
  void memo_store(std::uint64_t index, Node node);
  // The memo's node at `index` and the byte of its last GET; nullptr when never stored. Here, so
  // that both the stack machine and the flat reading inline it (once per frame reference).
  Node* memo_find(std::uint64_t index, std::size_t& last_get) {
    if (const std::size_t slot = m_refs.slot(index); slot != MemoRefs::kNone) {
      last_get = m_slots[slot].last_get;
      return m_slots[slot].node ? &m_slots[slot].node : nullptr;
    }
    if (m_refs.dense(index)) return nullptr;
    auto it = m_far_memo.find(index);
    if (it == m_far_memo.end()) return nullptr;
    last_get = m_refs.last_far_get(index);
    return &it->second;
  }
  void share(const Node& node);

  // --- opcodes -------------------------------------------------------------------------------
  void step();
  ValuePtr stop();
  [[noreturn]] void refuse_code() const;

  // --- streaming (pickle_streaming.cpp) ------------------------------------------------------
  void recognise_list();
  void stream_entries(Value& list, std::size_t base);
  bool began();
  StreamedList& streamed_list(const Value& list);
  void stream_early();
  ValuePtr segments_so_far();
  void stop_streaming();
  void check_streamed() const;

  // --- trace entries without a tree (pickle_flat_entry.cpp) ------------------------------------
  // At EMPTY_DICT, where streaming has taken every earlier item of a trace list's batch: the
  // entry read from the bytes into m_flat and given to TraceSink::flat_entry; false (nothing
  // changed) where it is not of the common shape or the sink does not take it.
  bool flat_ready() const;
  bool flat_entry();
  const Node* flat_get(std::uint64_t index, std::size_t at);
  FlatEntry m_flat;
  std::vector<Node*> m_flat_last;  // memo nodes whose last GET the entry holds: let go after it

  // With placeholders on the stack, an opcode that would read one (anything but the APPENDS that
  // ends their list's batch) means the pickle does what streaming cannot follow: read it whole.
  void guard_placeholders() const {
    using namespace opcodes;
    std::size_t reach = 0;
    switch (m_op) {
      case APPENDS:
      case SETITEMS:
        // These read the values above the MARK and modify the one below it.
        if (!m_marks.empty() && m_marks.back() <= m_early_end && !(m_op == APPENDS && m_marks.back() == m_early_base))
          throw ReadAgainWhole{};
        return;
      case LIST: case TUPLE: case DICT: case POP_MARK:
        if (!m_marks.empty() && m_marks.back() < m_early_end) throw ReadAgainWhole{};
        return;
      case POP: case DUP: case TUPLE1: case MEMOIZE: case PUT: case BINPUT: case LONG_BINPUT: reach = 1; break;
      case APPEND: case TUPLE2: reach = 2; break;
      case SETITEM: case TUPLE3: reach = 3; break;
      default: return;
    }
    if (m_stack.size() < m_early_end + reach) throw ReadAgainWhole{};
  }
};

}  // namespace memsnap::pickle
