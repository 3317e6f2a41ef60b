// Tests of the safe pickle reader and the protocol-4 writer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <unordered_set>

#include "test_util.hpp"
#include "torch/pickle.hpp"
#include "torch/pickle_memo_refs.hpp"
#include "torch/pickle_writer.hpp"
#include "torch/snapshot.hpp"

using namespace memsnap;
using pickle::Kind;
using pickle::PickleError;
using pickle::Value;
using pickle::ValuePtr;

namespace {

const char* kFixtures[] = {"snap_native.pickle", "snap_exp.pickle", "snap_oom.pickle"};

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s += static_cast<char>(c);
  return s;
}

// Expects a PickleError whose message contains every `needle` and that reports `offset`.
void expect_error(const std::string& data, std::initializer_list<std::string> needles, long offset = -1) {
  try {
    pickle::read(data);
    ADD_FAILURE() << "no PickleError for input of " << data.size() << " bytes";
  } catch (const PickleError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    if (offset >= 0) {
      EXPECT_EQ(e.offset(), static_cast<std::size_t>(offset)) << msg;
    }
  }
}

std::string pickle_hex(const std::string& data) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : data) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace

TEST(PickleTest, ParsesEveryFixture) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto root = pickle::read_file(test::fixture(name));
    ASSERT_TRUE(root->is_dict());
    ASSERT_NE(root->find("segments"), nullptr);
    ASSERT_NE(root->find("device_traces"), nullptr);
    EXPECT_TRUE(root->at("device_traces").is_list());
    EXPECT_TRUE(root->at("allocator_settings").is_dict());
  }
}

// Memo references must stay shared: the trace's frame lists are the same nodes, so the number of
// distinct frame-list pointers equals the number of distinct list objects Python builds.
TEST(PickleTest, KeepsMemoSharingOfFrameLists) {
  for (const char* name : {"snap_native.pickle", "snap_exp.pickle"}) {
    SCOPED_TRACE(name);
    std::string data = test::read_bytes(test::fixture(name));
    auto root = pickle::read(data);
    std::unordered_set<const Value*> lists;
    std::size_t refs = 0;
    auto note = [&](const Value& owner) {
      if (auto f = owner.find_ptr("frames")) {
        ++refs;
        lists.insert(f.get());
      }
    };
    for (const auto& trace : root->at("device_traces").items())
      for (const auto& e : trace->items()) note(*e);
    for (const auto& seg : root->at("segments").items()) {
      note(*seg);
      for (const auto& b : seg->at("blocks").items()) note(*b);
    }
    auto py = test::run_python(test::quoted(test::script("snapshot_facts.py")) + " " + test::quoted(test::fixture(name)));
    ASSERT_EQ(py.status, 0) << py.output;
    auto facts = nlohmann::json::parse(py.output);
    EXPECT_EQ(refs, facts["frame_list_refs"].get<std::size_t>());
    EXPECT_EQ(lists.size(), facts["frame_list_objects"].get<std::size_t>());

    // Memory stays proportional to the data: every distinct node costs at least one opcode byte,
    // while a deep copy would have as many nodes as references (several times more).
    auto stats = pickle::tree_stats(root);
    EXPECT_LT(stats.unique_nodes, data.size());
    EXPECT_GT(stats.references, 4 * stats.unique_nodes);
  }
}

TEST(PickleTest, RejectsEveryCodeOpcodeWithNameAndOffset) {
  struct Case {
    int op;
    const char* name;
    const char* why;
  };
  const Case cases[] = {
      {'c', "GLOBAL", "would import code"},       {0x93, "STACK_GLOBAL", "would import code"},
      {'R', "REDUCE", "would call code"},         {'b', "BUILD", "would call code"},
      {'i', "INST", "would import code"},         {'o', "OBJ", "would call code"},
      {0x81, "NEWOBJ", "would call code"},        {0x92, "NEWOBJ_EX", "would call code"},
      {'P', "PERSID", "persistent-id"},           {'Q', "BINPERSID", "persistent-id"},
      {0x82, "EXT1", "would import code"},        {0x83, "EXT2", "would import code"},
      {0x84, "EXT4", "would import code"},        {0x97, "NEXT_BUFFER", "buffers"},
      {0x98, "READONLY_BUFFER", "buffers"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    // PROTO 4, a value, then the opcode at byte 4: refused before its arguments are read.
    std::string data = bytes({0x80, 0x04, 'K', 0x01, c.op}) + "os\nsystem\n.";
    char hex[8];
    std::snprintf(hex, sizeof hex, "(0x%02x)", c.op);
    expect_error(data, {std::string("opcode ") + c.name + " ", hex, "at byte 4", c.why, "memsnap reads data only"}, 4);
  }
  // The classic exploit: os.system("echo pwned") through GLOBAL + REDUCE (protocol 0).
  expect_error("cos\nsystem\n(S'echo pwned'\ntR.",
               {"pickle: opcode GLOBAL (0x63) at byte 0 would import code; memsnap reads data only"}, 0);
}

TEST(PickleTest, RejectsUnknownOpcodesAndSets) {
  expect_error(bytes({0x80, 0x04, 0xff}), {"unknown opcode 0xff", "at byte 2"}, 2);
  expect_error(bytes({0x80, 0x04, 0x8f, '.'}), {"EMPTY_SET", "0x8f", "sets are not supported"}, 2);
  expect_error(bytes({0x80, 0x09, 'N', '.'}), {"PROTO", "unsupported protocol 9"}, 0);
}

// Every proper prefix of a real snapshot is an error, never a crash, a hang or a partial value.
TEST(PickleTest, TruncationAtEveryOffsetOfOomFixtureIsAnError) {
  std::string data = test::read_bytes(test::fixture("snap_oom.pickle"));
  ASSERT_NO_THROW(pickle::read(data));
  std::size_t errors = 0;
  for (std::size_t n = 0; n < data.size(); ++n) {
    try {
      pickle::read(std::string_view(data).substr(0, n));
      ADD_FAILURE() << "prefix of " << n << " bytes parsed";
    } catch (const PickleError& e) {
      ++errors;
      EXPECT_LE(e.offset(), n);
    }
  }
  EXPECT_EQ(errors, data.size());
}

TEST(PickleTest, RejectsHugeLengthsBeforeAllocating) {
  // BINUNICODE8 claiming 2^63 bytes, BINBYTES8 claiming 2^64-1, BINUNICODE 4 GiB, LONG4 2 GiB,
  // FRAME of 2^60 bytes, SHORT_BINBYTES past the end.
  expect_error(bytes({0x80, 4, 0x8d, 0, 0, 0, 0, 0, 0, 0, 0x80, 'x'}), {"BINUNICODE8", "needs 9223372036854775808 bytes"}, 2);
  expect_error(bytes({0x80, 4, 0x8e, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), {"BINBYTES8", "needs 18446744073709551615"}, 2);
  expect_error(bytes({0x80, 4, 'X', 0xff, 0xff, 0xff, 0xff, 'a', '.'}), {"BINUNICODE", "4294967295", "only 2 bytes left"}, 2);
  expect_error(bytes({0x80, 4, 0x8b, 0xff, 0xff, 0xff, 0x7f, 1, '.'}), {"LONG4", "needs 2147483647"}, 2);
  expect_error(bytes({0x80, 4, 0x8b, 0xff, 0xff, 0xff, 0xff, '.'}), {"LONG4", "negative length"}, 2);
  expect_error(bytes({0x80, 4, 0x95, 0, 0, 0, 0, 0, 0, 0, 0x10, 'N', '.'}), {"FRAME", "truncated"}, 2);
  expect_error(bytes({0x80, 4, 'C', 200, 'a'}), {"SHORT_BINBYTES", "needs 200"}, 2);
}

TEST(PickleTest, RejectsDeepNestingButReadsModerateDepth) {
  auto nested = [](int depth) {
    std::string s = bytes({0x80, 4});
    for (int i = 0; i < depth; ++i) s += ']';
    for (int i = 1; i < depth; ++i) s += 'a';  // each APPEND puts the top list into the one below
    s += '.';
    return s;
  };
  expect_error(nested(20001), {"APPEND", "nesting deeper than 10000 levels"});
  // 9000 levels parse and destroy without exhausting the stack.
  auto v = pickle::read(nested(9000));
  EXPECT_EQ(v->depth(), 9000u);
  v.reset();
  // Tuples count too.
  std::string tuples = bytes({0x80, 4, ')'});
  for (int i = 0; i < 10001; ++i) tuples += static_cast<char>(0x85);  // TUPLE1
  tuples += '.';
  expect_error(tuples, {"TUPLE1", "nesting deeper"});
}

TEST(PickleTest, RejectsMalformedStructure) {
  expect_error(bytes({0x80, 4, 'h', 5, '.'}), {"BINGET", "memo index 5 was never stored"}, 2);
  expect_error(bytes({0x80, 4, 'N', 0x94, 'j', 1, 0, 0, 0, '.'}), {"LONG_BINGET", "memo index 1"}, 4);
  expect_error(bytes({0x80, 4, 'a', '.'}), {"APPEND", "stack underflow"}, 2);
  expect_error(bytes({0x80, 4, ']', 'K', 1, 'e', '.'}), {"APPENDS", "no MARK"}, 5);
  expect_error(bytes({0x80, 4, '}', ']', 'K', 1, 's', '.'}), {"SETITEM", "dict key of type list is unhashable"}, 6);
  expect_error(bytes({0x80, 4, '}', '(', 'K', 1, 'u', '.'}), {"SETITEMS", "odd number"}, 6);
  expect_error(bytes({0x80, 4, 'K', 1, ']', 'a', '.'}), {"APPEND", "appends to a int"}, 5);
  expect_error(bytes({0x80, 4, 'N', 'N', '.'}), {"STOP", "stack holds 2 values"}, 4);
  expect_error(bytes({0x80, 4, '(', 'N', '.'}), {"STOP", "MARK is still open"}, 4);
  expect_error(bytes({0x80, 4, 'N'}), {"before STOP (truncated)"}, 3);
  // A MARK hides what is below it, as in Python: APPEND cannot reach the list under the MARK.
  expect_error(bytes({0x80, 4, ']', '(', 'K', 1, 'a', '.'}), {"APPEND", "stack underflow", "above the MARK"});
  // Cycles and mutation after nesting: memsnap accepts tree-shaped data only.
  expect_error(bytes({0x80, 4, ']', 0x94, 'h', 0, 'a', '.'}), {"contain itself"});
  expect_error(bytes({0x80, 4, ']', 0x94, ']', 'h', 0, 'a', 'h', 0, 'K', 1, 'a', '.'}), {"already nested"});
}

// Real pickles memoise an empty list and fill it afterwards; every reference sees the items.
TEST(PickleTest, ListFilledAfterMemoizeIsSharedByEveryReference) {
  // EMPTY_LIST MEMOIZE MARK 1 2 APPENDS BINGET 0 TUPLE2 STOP -> ([1, 2], <same list>)
  auto v = pickle::read(bytes({0x80, 4, ']', 0x94, '(', 'K', 1, 'K', 2, 'e', 'h', 0, 0x86, '.'}));
  ASSERT_TRUE(v->is_tuple());
  ASSERT_EQ(v->size(), 2u);
  EXPECT_EQ(v->items()[0].get(), v->items()[1].get());
  EXPECT_EQ(v->items()[0]->size(), 2u);
  EXPECT_EQ(v->at(1).at(1).as_int64(), 2);
}

TEST(PickleTest, DuplicateDictKeysKeepFirstPositionAndLastValue) {
  // {'a': 1, 'b': 2} then 'a' = 3, as Python's dict does; 40 keys also exercise the index path.
  std::string s = bytes({0x80, 4, '}', '(', 0x8c, 1, 'a', 'K', 1, 0x8c, 1, 'b', 'K', 2, 0x8c, 1, 'a', 'K', 3, 'u'});
  s += '(';
  for (int i = 0; i < 40; ++i) s += bytes({'K', i, 'K', i});
  for (int i = 0; i < 40; ++i) s += bytes({'K', i, 'K', 100 + i});
  s += bytes({'u', '.'});
  auto v = pickle::read(s);
  ASSERT_EQ(v->size(), 42u);
  EXPECT_EQ(v->dict_items()[0].first->as_string(), "a");
  EXPECT_EQ(v->at("a").as_int64(), 3);
  EXPECT_EQ(v->dict_items()[2].second->as_int64(), 100);
  EXPECT_EQ(v->dict_items()[41].second->as_int64(), 139);
}

TEST(PickleTest, BigIntegersAreExactAndCheckedOnAccess) {
  // LONG1 of 2^64-1 (9 bytes: ff*8 00), LONG1 of 2^70, LONG1 of -2^63.
  auto u = pickle::read(bytes({0x80, 4, 0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, '.'}));
  EXPECT_EQ(u->kind(), Kind::big_integer);
  EXPECT_EQ(u->as_uint64(), 18446744073709551615ull);
  EXPECT_THROW(u->as_int64(), pickle::ValueError);
  auto big = pickle::read(bytes({0x80, 4, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, '.'}));
  EXPECT_EQ(big->int_decimal(), "1180591620717411303424");
  EXPECT_THROW(big->as_uint64(), pickle::ValueError);
  try {
    big->as_int64();
    ADD_FAILURE();
  } catch (const pickle::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("1180591620717411303424 does not fit in int64"), std::string::npos);
  }
  auto neg = pickle::read(bytes({0x80, 4, 0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80, '.'}));
  EXPECT_EQ(neg->kind(), Kind::integer);
  EXPECT_EQ(neg->as_int64(), INT64_MIN);
  EXPECT_THROW(neg->as_uint64(), pickle::ValueError);
  auto negbig = pickle::read("L-1000000000000000000000000000000L\n.");
  EXPECT_EQ(negbig->int_decimal(), "-1000000000000000000000000000000");
  // Written back exactly.
  auto again = pickle::read(pickle::write(negbig));
  EXPECT_TRUE(again->equals(*negbig));
}

// Protocol 0 output of Python 3.11:
// pickle.dumps({'a':[1,2.5,'x',None,True,(1,2)], 'b': 10**30, 'c': -5, 'd': 'h\u00e9\u20ac'}, protocol=0)
TEST(PickleTest, ReadsTextProtocol) {
  std::string data =
      "(dp0\nVa\np1\n(lp2\nI1\naF2.5\naVx\np3\naNaI01\na(I1\nI2\ntp4\nasVb\np5\n"
      "L1000000000000000000000000000000L\nsVc\np6\nI-5\nsVd\np7\nVh\xe9\\u20ac\np8\ns.";
  auto v = pickle::read(data);
  const Value& a = v->at("a");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a.at(0).as_int64(), 1);
  EXPECT_DOUBLE_EQ(a.at(1).as_double(), 2.5);
  EXPECT_EQ(a.at(2).as_string(), "x");
  EXPECT_TRUE(a.at(3).is_none());
  EXPECT_TRUE(a.at(4).as_bool());
  EXPECT_TRUE(a.at(5).is_tuple());
  EXPECT_EQ(v->at("b").int_decimal(), "1000000000000000000000000000000");
  EXPECT_EQ(v->at("c").as_int64(), -5);
  EXPECT_EQ(v->at("d").as_string(), "h\xc3\xa9\xe2\x82\xac");  // UTF-8
}

TEST(PickleWriterTest, SharedNodeIsWrittenOnceAndReadBackShared) {
  auto frame = Value::dict({{Value::string("name"), Value::string("f")}, {Value::string("line"), Value::integer(3)}});
  auto frames = Value::list({frame, frame});
  std::vector<ValuePtr> entries(5000, frames);
  auto root = Value::list(entries);
  std::string out = pickle::write(root);
  EXPECT_LT(out.size(), 5000u * 3 + 200);  // one BINGET/LONG_BINGET (<= 5 bytes) per reference
  auto back = pickle::read(out);
  ASSERT_EQ(back->size(), 5000u);
  EXPECT_EQ(back->items()[0].get(), back->items()[4999].get());
  EXPECT_LT(pickle::tree_stats(back).unique_nodes, 10u);
  EXPECT_TRUE(back->equals(*root));
}

// Python reads what the writer writes (framed and unframed), including the pure-Python reader,
// which rejects opcodes that straddle frames.
TEST(PickleWriterTest, PythonReadsEveryKind) {
  std::vector<ValuePtr> many;
  for (int i = 0; i < 3000; ++i) many.push_back(Value::string("item" + std::to_string(i)));
  auto root = Value::dict({
      {Value::string("none"), Value::none()},
      {Value::string("bools"), Value::list({Value::boolean(true), Value::boolean(false)})},
      {Value::string("ints"), Value::list({Value::integer(0), Value::integer(255), Value::integer(65535),
                                           Value::integer(-1), Value::integer(1ll << 40), Value::integer(INT64_MIN),
                                           Value::unsigned_integer(UINT64_MAX)})},
      {Value::string("float"), Value::floating(0.1)},
      {Value::string("text"), Value::string("h\xc3\xa9")},
      {Value::string("bytes"), Value::bytes(std::string("\0\1", 2))},
      {Value::string("tuples"), Value::list({Value::tuple({}), Value::tuple({Value::integer(1)}),
                                             Value::tuple({Value::integer(1), Value::integer(2), Value::integer(3),
                                                           Value::integer(4)})})},
      {Value::integer(7), Value::string(std::string(70000, 'x'))},
      {Value::string("many"), Value::list(many)},
  });
  const std::string expected =
      "{'none': None, 'bools': [True, False], 'ints': [0, 255, 65535, -1, 1099511627776, "
      "-9223372036854775808, 18446744073709551615], 'float': 0.1, 'text': 'hé', 'bytes': b'\\x00\\x01', "
      "'tuples': [(), (1,), (1, 2, 3, 4)], 7: 70000, 'many': 3000, 'last': 'item2999'}";
  for (bool frames : {true, false}) {
    SCOPED_TRACE(frames);
    std::string path = test::temp_path(frames ? "kinds_framed.pickle" : "kinds.pickle");
    test::write_bytes(path, pickle::write(root, {frames}));
    for (const char* loader : {"pickle.load", "pickle._Unpickler"}) {
      std::string code = std::string("import pickle; f=open(") + test::quoted(path) + ",'rb'); d=" + loader +
                         (std::string(loader) == "pickle.load" ? "(f)" : "(f).load()") +
                         "; d[7]=len(d[7]); d['last']=d['many'][-1]; d['many']=len(d['many']); print(d)";
      auto r = test::run_python("-c \"" + code + "\"");
      EXPECT_EQ(r.status, 0) << r.output;
      EXPECT_EQ(r.output, expected + "\n") << loader;
    }
    std::filesystem::remove(path);
  }
}

// --- memo pruning and streaming --------------------------------------------------------------

namespace {

// A TraceSink that keeps what it is given.
struct RecordingSink : pickle::TraceSink {
  bool accept = true;
  int begins = 0;
  ValuePtr segments;
  std::vector<std::pair<std::size_t, std::size_t>> places;  // (device, position)
  std::vector<ValuePtr> entries;
  bool begin(const ValuePtr& segs) override {
    ++begins;
    segments = segs;
    return accept;
  }
  void entry(std::size_t device, std::size_t position, const ValuePtr& e) override {
    places.emplace_back(device, position);
    entries.push_back(e);
  }
};

ValuePtr str(const char* s) { return Value::string(s); }
ValuePtr trace_entry(std::int64_t t, ValuePtr frames) {
  return Value::dict({{str("action"), str("alloc")}, {str("addr"), Value::integer(4096 * t)},
                      {str("size"), Value::integer(512)}, {str("time_us"), Value::integer(t)},
                      {str("frames"), std::move(frames)}});
}
// A snapshot-shaped root: segments first, then device traces, as torch writes them.
ValuePtr snapshot_root(std::vector<ValuePtr> traces, pickle::DictItems more = {}) {
  pickle::DictItems items{{str("segments"), Value::list({Value::dict({{str("address"), Value::integer(0)}})})},
                          {str("device_traces"), Value::list(std::move(traces))}};
  for (auto& kv : more) items.push_back(std::move(kv));
  return Value::dict(std::move(items));
}

}  // namespace

// Only nodes that a later GET names are kept (and marked shared); the reference is the same node.
TEST(PickleTest, MemoKeepsOnlyReferencedNodes) {
  auto shared = Value::list({Value::integer(1)});
  auto root = Value::dict({{str("a"), shared}, {str("b"), shared}, {str("c"), Value::list({Value::integer(2)})}});
  auto back = pickle::read(pickle::write(root));
  ASSERT_EQ(back->find_ptr("a"), back->find_ptr("b"));
  EXPECT_TRUE(back->at("a").is_shared());
  EXPECT_FALSE(back->at("c").is_shared());

  // Explicit PUT far out, then MEMOIZE: Python's MEMOIZE index is the memo's length (1 here, so
  // the second list is index 1), and a 32-bit index past the bytes read is looked up too. (Python's
  // pure unpickler is the reference: the C one refuses so large an index for want of memory.)
  std::string data = bytes({0x80, 0x04, '(', ']', 'r', 0xf0, 0xff, 0xff, 0xff, ']', 0x94,  //
                            'j', 0xf0, 0xff, 0xff, 0xff, 'h', 0x01, 't', '.'});
  auto tuple = pickle::read(data);
  ASSERT_EQ(tuple->size(), 4u);
  EXPECT_EQ(tuple->items()[0], tuple->items()[2]);
  EXPECT_EQ(tuple->items()[1], tuple->items()[3]);
  EXPECT_NE(tuple->items()[0], tuple->items()[1]);
  auto py = test::run_python("-c \"import pickle,sys; t=pickle._loads(bytes.fromhex(sys.argv[1])); "
                             "print(t[0] is t[2], t[1] is t[3], t[0] is t[1])\" " + pickle_hex(data));
  EXPECT_EQ(py.output, "True True False\n");
  // A GET of an index never stored is still an error naming it.
  expect_error(bytes({0x80, 0x04, ']', 0x94, 'h', 0x01, '.'}), {"BINGET", "memo index 1 was never stored", "at byte 4"}, 4);
}

// The memo pre-pass finds each referenced index and the byte of its last GET in one pass, or in
// two where indices go past what one pass keeps offsets for; both give the same answer.
TEST(PickleTest, MemoRefsFindTheLastGetOfEachReferencedIndex) {
  // ( ] MEMOIZE ] MEMOIZE ] MEMOIZE BINGET 0, BINGET 1, BINGET 0 t .: index 2 is never named.
  const std::string data = bytes({0x80, 0x04, '(', ']', 0x94, ']', 0x94, ']', 0x94,  //
                                  'h', 0, 'h', 1, 'h', 0, 't', '.'});
  for (std::uint64_t cap : {std::uint64_t{0}, std::uint64_t{1}, pickle::MemoRefs::kOnePassIndices}) {
    SCOPED_TRACE(cap);
    const pickle::MemoRefs refs(data, nullptr, cap);
    ASSERT_EQ(refs.slots(), 2u);
    EXPECT_EQ(refs.slot(0), 0u);
    EXPECT_EQ(refs.slot(1), 1u);
    EXPECT_EQ(refs.slot(2), pickle::MemoRefs::kNone);
    EXPECT_EQ(refs.last_gets()[0], 13u);
    EXPECT_EQ(refs.last_gets()[1], 11u);
    EXPECT_EQ(refs.passes(), cap > 1 ? 1 : 2);
  }
  // A real snapshot: every index answers alike whatever the split between the passes.
  const std::string real = test::read_bytes(test::fixture("snap_native.pickle"));
  const pickle::MemoRefs one(real, nullptr);
  ASSERT_EQ(one.passes(), 1);
  ASSERT_GT(one.slots(), 100u);
  for (std::uint64_t cap : {0, 7, 300}) {
    SCOPED_TRACE(cap);
    const pickle::MemoRefs two(real, nullptr, cap);
    EXPECT_EQ(two.passes(), 2);
    EXPECT_EQ(two.last_gets(), one.last_gets());
    for (std::uint64_t i = 0; i < 100000; ++i) ASSERT_EQ(two.slot(i), one.slot(i)) << i;
  }
}

// The entries of each device trace go to the sink, in order, and are not stored; the rest is.
TEST(PickleTest, StreamingHandsTraceEntriesToTheSink) {
  auto frames = Value::list({Value::dict({{str("name"), str("f")}})});
  auto root = snapshot_root({Value::list({trace_entry(1, frames), trace_entry(2, frames)}), Value::none(),
                             Value::list({trace_entry(3, Value::list({}))})},
                            {{str("allocator_settings"), Value::dict({})}});
  const std::string data = pickle::write(root);
  RecordingSink sink;
  auto read = pickle::read_streaming(data, sink);
  ASSERT_TRUE(read.streamed);
  EXPECT_EQ(sink.begins, 1);
  ASSERT_TRUE(sink.segments);
  EXPECT_EQ(sink.segments, read.root->find_ptr("segments"));
  EXPECT_EQ(sink.places, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {0, 1}, {2, 0}}));
  EXPECT_EQ(sink.entries[1]->at("time_us").as_int64(), 2);
  // The frames list referenced twice is one shared node.
  EXPECT_EQ(sink.entries[0]->find_ptr("frames"), sink.entries[1]->find_ptr("frames"));
  EXPECT_TRUE(sink.entries[0]->at("frames").is_shared());
  const auto& traces = read.root->at("device_traces");
  ASSERT_EQ(traces.size(), 3u);
  EXPECT_EQ(traces.at(0).size(), 0u);
  EXPECT_TRUE(traces.at(1).is_none());
  EXPECT_TRUE(read.root->at("allocator_settings").is_dict());

  // A sink that declines gets the whole tree.
  RecordingSink no;
  no.accept = false;
  auto whole = pickle::read_streaming(data, no);
  EXPECT_FALSE(whole.streamed);
  EXPECT_TRUE(no.entries.empty());
  EXPECT_TRUE(whole.root->equals(*root));
}

// A trace list the pickle refers to again (here from another key) cannot be streamed: the read
// gives the whole tree, whatever the sink saw, so every reference sees every entry.
TEST(PickleTest, StreamingFallsBackWhenATraceIsReferencedAgain) {
  auto trace = Value::list({trace_entry(1, Value::list({})), trace_entry(2, Value::list({}))});
  auto root = snapshot_root({trace}, {{str("alias"), trace}});
  RecordingSink sink;
  auto read = pickle::read_streaming(pickle::write(root), sink);
  EXPECT_FALSE(read.streamed);
  EXPECT_TRUE(read.root->equals(*root));
  EXPECT_EQ(read.root->at("device_traces").at(0).size(), 2u);

  // The same entry twice in a trace is streamed twice (it is complete when appended).
  auto e = trace_entry(5, Value::list({}));
  RecordingSink twice;
  auto again = pickle::read_streaming(pickle::write(snapshot_root({Value::list({e, e})})), twice);
  EXPECT_TRUE(again.streamed);
  ASSERT_EQ(twice.entries.size(), 2u);
  EXPECT_EQ(twice.entries[0], twice.entries[1]);

  // Segments after the traces: the sink is told there are none yet, and declines.
  auto late = Value::dict({{str("device_traces"), Value::list({Value::list({e})})}, {str("segments"), Value::list({})}});
  RecordingSink order;
  order.accept = false;
  auto late_read = pickle::read_streaming(pickle::write(late), order);
  EXPECT_FALSE(late_read.streamed);
  EXPECT_EQ(order.begins, 1);
  EXPECT_FALSE(order.segments);
}

// The mapped file gives the same bytes as reading it, and a missing file is one clear error.
TEST(PickleTest, MappedFileReadsTheBytes) {
  const std::string path = test::fixture("snap_oom.pickle");
  pickle::MappedFile file(path);
  EXPECT_EQ(std::string(file.data()), test::read_bytes(path));
  file.release(0, file.data().size());  // pages come back from the file when touched again
  EXPECT_EQ(std::string(file.data()), test::read_bytes(path));
  pickle::MappedFile moved(std::move(file));
  EXPECT_TRUE(pickle::read(moved.data())->is_dict());
  try {
    pickle::MappedFile missing("/nonexistent/x.pickle");
    ADD_FAILURE();
  } catch (const PickleError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.pickle"), std::string::npos) << e.what();
  }
}

// Entries go to the sink as soon as the next one starts (one entry in memory at a time); a pickle
// that then uses them otherwise than by APPENDS into their trace is read again whole.
TEST(PickleTest, EarlyStreamedEntriesFallBackWhenUsedOtherwise) {
  auto text = [](const std::string& s) { return bytes({0x8c, static_cast<int>(s.size())}) + s; };
  auto entry = [&](int v) { return std::string("}") + text("a") + bytes({'K', v, 's'}); };
  const std::string head = bytes({0x80, 0x04}) + "}(" + text("segments") + "]" + text("device_traces") + "](](";
  // [[e1, e2, e3]] by APPENDS, and the same entries made into a tuple appended as one.
  const std::string appends = head + entry(1) + entry(2) + entry(3) + "eeu.";
  const std::string tuple = head + entry(1) + entry(2) + entry(3) + "taeu.";
  RecordingSink sink;
  auto streamed = pickle::read_streaming(appends, sink);
  EXPECT_TRUE(streamed.streamed);
  EXPECT_EQ(sink.entries.size(), 3u);
  EXPECT_EQ(sink.entries[2]->at("a").as_int64(), 3);
  RecordingSink other;
  auto whole = pickle::read_streaming(tuple, other);
  EXPECT_FALSE(whole.streamed);
  EXPECT_TRUE(whole.root->equals(*pickle::read(tuple)));
  EXPECT_EQ(whole.root->at("device_traces").at(0).at(0).size(), 3u);  // the tuple, whole
  // A POP of the last entry drops it; one more would reach a streamed one: read whole.
  RecordingSink popped;
  auto one_pop = pickle::read_streaming(head + entry(1) + entry(2) + "0eeu.", popped);
  EXPECT_TRUE(one_pop.streamed);
  EXPECT_EQ(popped.places.size(), 1u);
  RecordingSink popped2;
  const std::string two_pops = head + entry(1) + entry(2) + "00eeu.";
  auto two = pickle::read_streaming(two_pops, popped2);
  EXPECT_FALSE(two.streamed);
  EXPECT_TRUE(two.root->equals(*pickle::read(two_pops)));
  // After a POP, a MARK right above a streamed entry: SETITEMS modifies that entry (a fuzzer found
  // this): read whole. A dict started and dropped there changes nothing: streamed.
  const std::string modified = head + entry(1) + entry(2) + entry(3) + "0(" + text("k") + bytes({'K', 5}) + "ueeu.";
  RecordingSink sets;
  auto r = pickle::read_streaming(modified, sets);
  EXPECT_FALSE(r.streamed);
  EXPECT_TRUE(r.root->equals(*pickle::read(modified)));
  EXPECT_EQ(r.root->at("device_traces").at(0).at(1).size(), 2u);
  RecordingSink dropped;
  auto d = pickle::read_streaming(head + entry(1) + entry(2) + entry(3) + "0(}1eeu.", dropped);
  EXPECT_TRUE(d.streamed);
  EXPECT_EQ(dropped.entries.size(), 2u);
}

// The memo lets go of a node after the last GET that names it: a frames list two entries share is
// freed with the second, not kept to the end of the read.
TEST(PickleTest, MemoReleasesANodeAfterItsLastReference) {
  struct WatchingSink : pickle::TraceSink {
    std::vector<pickle::WeakValuePtr> frames;
    std::vector<bool> alive_at;  // at each entry: is entry 0's frames list still alive?
    bool begin(const ValuePtr&) override { return true; }
    void entry(std::size_t, std::size_t, const ValuePtr& e) override {
      frames.emplace_back(e->find_ptr("frames"));
      alive_at.push_back(!frames.front().expired());
    }
  };
  auto shared = Value::list({Value::dict({{str("name"), str("f")}})});
  auto root = snapshot_root({Value::list({trace_entry(1, shared), trace_entry(2, shared), trace_entry(3, Value::list({})),
                                          trace_entry(4, Value::list({}))})});
  WatchingSink sink;
  auto read = pickle::read_streaming(pickle::write(root), sink);
  ASSERT_TRUE(read.streamed);
  EXPECT_EQ(sink.alive_at, (std::vector<bool>{true, true, false, false}));
}

// A streamed import finds a frames list two entries share by its node, and forgets it once it is
// freed: thousands of such lists, each freed after its second entry (so the allocator hands their
// memory to the next ones), each with frames of its own. Every event gets the stack the whole
// tree's import gives it.
TEST(PickleTest, StreamedImportKnowsSharedNodesOnlyWhileTheyLive) {
  auto text = [](const std::string& s) { return bytes({0x8c, static_cast<int>(s.size())}) + s; };
  auto uint = [](unsigned v) { return bytes({'J', int(v & 0xff), int((v >> 8) & 0xff), int((v >> 16) & 0xff), 0}); };
  auto get = [&](unsigned memo) { return std::string("j") + uint(memo).substr(1); };  // LONG_BINGET
  unsigned memo = 0;
  auto memoize = [&] {
    ++memo;
    return std::string(1, '\x94');  // MEMOIZE: the next memo index
  };
  std::string data = bytes({0x80, 0x04}) + "}(" + text("segments") + "]" + text("device_traces") + "](](";
  constexpr unsigned kPairs = 3000;
  for (unsigned k = 0; k < kPairs; ++k) {
    // A list of two frames whose name and filename strs are shared between them (as Python writes
    // a repeated str): frame dicts found by those str nodes, and by their content.
    const unsigned list = memo;
    std::string frames = "]" + memoize() + "(";
    const unsigned name = memo;
    frames += "}(" + text("name") + text("f" + std::to_string(k)) + memoize();
    const unsigned file = memo;
    frames += text("filename") + text("m" + std::to_string(k % 7) + ".py") + memoize() + text("line") + uint(1) + "u";
    frames += "}(" + text("name") + get(name) + text("filename") + get(file) + text("line") + uint(2) + "ue";
    for (int second = 0; second < 2; ++second) {
      data += "}(" + text("action") + text(second ? "free_requested" : "alloc") + text("addr") + uint(0x1000 + k) +
              text("size") + uint(512) + text("stream") + uint(0) + text("time_us") + uint(2 * k + second) +
              text("frames") + (second ? get(list) : frames) + "u";
    }
    if (k % 500 == 499 && k + 1 < kPairs) data += "e(";  // APPENDS in batches, as Python writes them
  }
  data += "eeu.";
  const auto streamed = torch::import_snapshot_data(data, "reuse", torch::ImportOptions{});
  const auto tree = torch::import_snapshot_full(*pickle::read(data), torch::ImportOptions{});
  const auto& events = streamed.record.windows.at(0).events;
  ASSERT_EQ(events.size(), 2 * kPairs);
  ASSERT_EQ(streamed.record.stacks.size(), kPairs);
  EXPECT_EQ(streamed.record.stacks, tree.record.stacks);
  EXPECT_EQ(streamed.record.frames, tree.record.frames);
  for (std::size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].stack_id, tree.record.windows.at(0).events.at(i).stack_id) << "event " << i;
    ASSERT_EQ(events[i].stack_id, i / 2) << "event " << i;
  }
}

// --- trace entries read without a tree ---------------------------------------------------------

namespace {

// What an entry holds, one "key=value" line per item, from the tree or from a FlatEntry: the
// same text either way when the flat reading is right.
std::string describe(const Value& v) {
  switch (v.kind()) {
    case Kind::none: return "None";
    case Kind::integer: return std::to_string(v.as_int64());
    case Kind::string: return "'" + v.as_string() + "'";
    case Kind::list: {
      std::string s = "[";
      for (const auto& item : v.items()) s += describe(*item) + ",";
      return s + "]";
    }
    case Kind::dict: {
      std::string s = "{";
      for (const auto& [k, item] : v.dict_items()) s += describe(*k) + ":" + describe(*item) + ",";
      return s + "}";
    }
    default: return pickle::kind_name(v.kind());
  }
}
std::string describe(const pickle::FlatEntry& fe) {
  using Is = pickle::FlatEntry::Is;
  std::string s = "{";
  for (std::size_t i = 0; i < fe.count; ++i) {
    const auto& item = fe.items[i];
    s += item.key ? describe(**item.key) : "'" + std::string(item.key_text) + "'";
    s += ":";
    switch (item.is) {
      case Is::node: s += describe(**item.node); break;
      case Is::integer: s += std::to_string(item.integer); break;
      case Is::text: s += "'" + std::string(item.text) + "'"; break;
      case Is::none: s += "None"; break;
      case Is::frames:
        s += "[";
        for (auto f : fe.frames) s += describe(**f) + ",";
        s += "]";
        break;
    }
    s += ",";
  }
  return s + "}";
}

// Takes every entry it is offered flat (or none, `flat` false), describing each as it comes.
struct FlatSink : pickle::TraceSink {
  bool flat = true;
  std::vector<std::string> seen;  // "F " or "T " (flat, tree), then the entry
  std::vector<pickle::WeakValuePtr> frames_nodes;  // the nodes flat reading made for named lists
  bool begin(const ValuePtr&) override { return true; }
  void entry(std::size_t, std::size_t position, const ValuePtr& e) override {
    seen.push_back("T " + std::to_string(position) + " " + describe(*e));
  }
  bool flat_entry(std::size_t, std::size_t position, const pickle::FlatEntry& fe) override {
    if (!flat) return false;
    seen.push_back("F " + std::to_string(position) + " " + describe(fe));
    if (fe.frames_node) frames_nodes.emplace_back(*fe.frames_node);
    return true;
  }
};

}  // namespace

// Entries of torch's shape (keys and frames by memo reference, ints and strs inline) go to the
// sink without a tree, with the values the tree holds; the first of each key, a frame met for the
// first time, an out-of-order PUT, too many keys go through the stack machine. A sink that takes
// none gets the same entries as trees, and the read's result is the same.
TEST(PickleTest, FlatEntriesHoldWhatTheTreeHolds) {
  auto text = [](const std::string& s) { return bytes({0x8c, static_cast<int>(s.size())}) + s; };
  auto get = [](unsigned memo) { return memo < 256 ? bytes({'h', static_cast<int>(memo)}) : bytes({'j', int(memo & 0xff), int(memo >> 8), 0, 0}); };
  unsigned memo = 0;
  auto memoize = [&] {
    ++memo;
    return std::string(1, '\x94');
  };
  std::string data = bytes({0x80, 0x04}) + "}" + memoize() + "(" + text("segments") + memoize() + "]" + memoize() +
                     text("device_traces") + memoize() + "]" + memoize() + "(]" + memoize() + "(";
  // Entry 0: every key inline and memoised (named later), a frame dict of its own, the list
  // named by entry 2.
  std::vector<unsigned> key;
  std::string e0 = "}" + memoize() + "(";
  for (const char* k : {"action", "addr", "size", "time_us", "frames"}) {
    key.push_back(memo);
    e0 += text(k) + memoize();
    if (std::string(k) == "action") {
      e0 += text("alloc") + memoize();
    } else if (std::string(k) == "frames") {
      e0 += "]" + memoize() + "(}" + memoize() + "(" + text("name") + memoize() + text("f") + memoize() + "ue";
    } else {
      e0 += bytes({'K', 1});
    }
  }
  e0 += "u";
  const unsigned alloc = key[0] + 1, frame0 = key[4] + 2, list0 = key[4] + 1;
  // Entry 1: all by reference, ints of every width (a negative LONG1, an 8-byte one), a str and
  // None inline, a new list of two frames (MARK ... APPENDS, then GET APPEND) that entry 2 names.
  const unsigned list1 = memo + 3;  // after the entry's dict, "note" and "N/A"
  std::string e1 = "}" + memoize() + "(" + get(key[0]) + get(alloc) + get(key[1]) +
                   bytes({0x8a, 8, 1, 2, 3, 4, 5, 6, 7, 0x7f}) + get(key[2]) + bytes({'M', 0x34, 0x12}) + get(key[3]) +
                   bytes({0x8a, 1, 0xfb}) + text("note") + memoize() + text("N/A") + memoize() + text("meta") + "N" +
                   get(key[4]) + "]" + memoize() + "(" + get(frame0) + get(frame0) + "e" + get(frame0) + "au";
  // Entry 2: frames by reference to entry 0's list and a BINPUT of the next index; entry 3 names
  // entry 1's list; entry 4 thirteen keys; entry 5 a BINPUT out of order.
  std::string e2 = "}" + bytes({'q', static_cast<int>(memo)}) + "(" + get(key[0]) + get(alloc) + get(key[1]) + bytes({'J', 0, 0, 0, 0x80}) + get(key[4]) + get(list0) + "u";
  ++memo;
  std::string e3 = "}" + memoize() + "(" + get(key[0]) + get(alloc) + get(key[4]) + get(list1) + "u";
  std::string e4 = "}" + bytes({'q', 250}) + "(" + get(key[0]) + get(alloc) + "u";
  std::string e5 = "}(";
  for (int i = 0; i < 13; ++i) e5 += text("k" + std::to_string(i)) + bytes({'K', i});
  e5 += "u";
  const std::string prefix = data + e0 + e1 + e2 + e3;
  data = prefix + e5 + e4 + "eeu.";

  FlatSink flat;
  const auto read = pickle::read_streaming(data, flat);
  ASSERT_TRUE(read.streamed);
  FlatSink tree;
  tree.flat = false;
  const auto whole = pickle::read_streaming(data, tree);
  ASSERT_TRUE(whole.streamed);
  EXPECT_TRUE(read.root->equals(*whole.root));
  ASSERT_EQ(flat.seen.size(), 6u);
  ASSERT_EQ(tree.seen.size(), 6u);
  const std::string kinds = std::string() + flat.seen[0][0] + flat.seen[1][0] + flat.seen[2][0] + flat.seen[3][0] +
                            flat.seen[4][0] + flat.seen[5][0];
  EXPECT_EQ(kinds, "TFFFTT");
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(flat.seen[i].substr(1), tree.seen[i].substr(1)) << i;
  EXPECT_EQ(flat.seen[1],
            "F 1 {'action':'alloc','addr':9153291386265731585,'size':4660,'time_us':-5,'note':'N/A','meta':None,"
            "'frames':[{'name':'f',},{'name':'f',},{'name':'f',},],}");
  EXPECT_EQ(flat.seen[2], "F 2 {'action':'alloc','addr':-2147483648,'frames':[{'name':'f',},],}");
  // The list entry 1 wrote inline became a node for entry 3's GET, and was let go after it.
  ASSERT_EQ(flat.frames_nodes.size(), 1u);
  EXPECT_TRUE(flat.frames_nodes[0].expired());

  // The stack machine's own errors come where they did: a GET of a never stored index.
  const std::string bad = prefix + "}(" + get(key[0]) + get(999) + "ueeu.";
  FlatSink again;
  try {
    pickle::read_streaming(bad, again);
    ADD_FAILURE() << "no error";
  } catch (const PickleError& e) {
    EXPECT_NE(std::string(e.what()).find("memo index 999 was never stored"), std::string::npos) << e.what();
    EXPECT_EQ(e.offset(), bad.size() - 10);
  }
}
