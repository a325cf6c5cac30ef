// The data-only pickle reader: every data opcode of protocols 2-5 (bytes written by hand from CPython's
// Lib/pickletools.py), the refusal of every code-running opcode by name and offset, and its bounds (truncation at
// every byte, nesting, cycles, integers beyond 64 bits).
#include "ampforge/memory/pickle.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "ampforge/util/error.h"

namespace ampforge::memory {
namespace {

std::string bytes(std::initializer_list<int> v) {
  std::string s;
  for (int c : v) s.push_back(static_cast<char>(c));
  return s;
}

std::string error_of(const std::string& data) {
  try {
    pickle_load(data, "p.pickle");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string fixture(const std::string& name) {
  std::ifstream in(std::string(AMPFORGE_TEST_DATA_DIR) + "/torch_snapshots/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Pickle, ReadsEveryDataOpcode) {
  // PROTO 4, FRAME, then a tuple of: None, True, False, BININT1 7, BININT2 513, BININT -2, LONG1 2^40,
  // LONG1 -1, LONG1 2^64-1 (unsigned), LONG4 5, BINFLOAT 1.5, 'ab' (SHORT_BINUNICODE), 'c' (BINUNICODE),
  // 'd' (BINUNICODE8), b'x' (SHORT_BINBYTES), b'y' (BINBYTES), b'z' (BINBYTES8).
  std::string body = bytes({'(', 'N', 0x88, 0x89, 'K', 7, 'M', 1, 2, 'J', 0xfe, 0xff, 0xff, 0xff,
                            0x8a, 6, 0, 0, 0, 0, 0, 1,                                  // 2^40
                            0x8a, 1, 0xff,                                              // -1
                            0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,  // 2^64 - 1
                            0x8b, 1, 0, 0, 0, 5,                                        // LONG4 5
                            'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0,                          // 1.5
                            0x8c, 2, 'a', 'b', 'X', 1, 0, 0, 0, 'c', 0x8d, 1, 0, 0, 0, 0, 0, 0, 0, 'd',
                            'C', 1, 'x', 'B', 1, 0, 0, 0, 'y', 0x8e, 1, 0, 0, 0, 0, 0, 0, 0, 'z', 't', '.'});
  std::string p = bytes({0x80, 4, 0x95}) + std::string(8, '\0') + body;
  p[3] = static_cast<char>(body.size());
  const PyRef v = pickle_load(p, "t");
  ASSERT_EQ(v->kind, PyValue::Tuple);
  const auto& it = v->items;
  ASSERT_EQ(it.size(), 17u);
  EXPECT_EQ(it[0]->kind, PyValue::None);
  EXPECT_EQ(it[1]->kind, PyValue::Bool);
  EXPECT_EQ(it[1]->i, 1);
  EXPECT_EQ(it[2]->i, 0);
  EXPECT_EQ(it[3]->i, 7);
  EXPECT_EQ(it[4]->i, 513);
  EXPECT_EQ(it[5]->i, -2);
  EXPECT_EQ(it[6]->i, int64_t{1} << 40);
  EXPECT_EQ(it[7]->i, -1);
  EXPECT_TRUE(it[8]->big);
  EXPECT_EQ(it[8]->u(), UINT64_MAX);
  EXPECT_EQ(it[9]->i, 5);
  EXPECT_EQ(it[10]->f, 1.5);
  EXPECT_EQ(it[11]->s, "ab");
  EXPECT_EQ(it[12]->s, "c");
  EXPECT_EQ(it[13]->s, "d");
  EXPECT_EQ(it[14]->kind, PyValue::Bytes);
  EXPECT_EQ(it[15]->s, "y");
  EXPECT_EQ(it[16]->s, "z");
}

TEST(Pickle, ContainersMemoAndStackOpcodes) {
  // {'k': [1, 2, 3], 'm': (x, x)} where x = [] memoized; with POP_MARK, POP and DUP on the way.
  const std::string p = bytes({0x80, 2, '}', 0x94, '(', 0x8c, 1, 'k', ']', 'q', 1, '(', 'K', 1, 'K', 2, 'e', 'K', 3, 'a',
                               0x8c, 1, 'm', ']', 'r', 9, 0, 0, 0, 'j', 9, 0, 0, 0, 0x86, 'u',
                               '(', 'K', 9, '1',        // MARK, 9, POP_MARK: nothing left
                               'N', '0',                // None, POP
                               '2', 's'});              // DUP the dict, then SETITEM needs key+value: not there
  EXPECT_NE(error_of(p + ".").find("SETITEM with nothing below it on the stack"), std::string::npos);
  const std::string ok = p.substr(0, p.size() - 2) + ".";
  const PyRef v = pickle_load(ok, "t");
  ASSERT_TRUE(v->is_dict());
  const PyValue* k = v->get("k");
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->items.size(), 3u);
  EXPECT_EQ(k->items[2]->i, 3);
  const PyValue* m = v->get("m");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->items.size(), 2u);
  EXPECT_EQ(m->items[0].get(), m->items[1].get()) << "BINGET shares the memoized object";
  EXPECT_EQ(v->get("absent"), nullptr);
}

TEST(Pickle, RefusesEveryOpcodeThatRunsCodeByNameAndOffset) {
  struct Case {
    int op;
    const char* name;
  } cases[] = {{'c', "GLOBAL"}, {0x93, "STACK_GLOBAL"}, {'R', "REDUCE"},   {'b', "BUILD"},   {'i', "INST"},
               {'o', "OBJ"},    {0x81, "NEWOBJ"},       {0x92, "NEWOBJ_EX"}, {'P', "PERSID"}, {'Q', "BINPERSID"},
               {0x82, "EXT1"},  {0x83, "EXT2"},         {0x84, "EXT4"}};
  for (const Case& c : cases) {
    const std::string e = error_of(bytes({0x80, 2, 'N', c.op, '.'}));
    EXPECT_NE(e.find(std::string("opcode ") + c.name + " ("), std::string::npos) << e;
    EXPECT_NE(e.find("at byte 3"), std::string::npos) << e;
    EXPECT_NE(e.find("import or call Python code"), std::string::npos) << e;
  }
  for (const char* name : {"bad_global.pickle", "bad_reduce.pickle", "bad_object.pickle"}) {
    const std::string e = error_of(fixture(name));
    EXPECT_NE(e.find("is refused"), std::string::npos) << name << ": " << e;
  }
  EXPECT_NE(error_of(fixture("bad_global.pickle")).find("GLOBAL (0x63) is refused"), std::string::npos);
  EXPECT_NE(error_of(fixture("bad_reduce.pickle")).find("REDUCE (0x52) is refused"), std::string::npos);
  // Text opcodes of protocols 0/1 and sets are not data a snapshot uses.
  EXPECT_NE(error_of(bytes({0x80, 2, 'I', '1', '\n', '.'})).find("opcode INT"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 2, 0x8f, '.'})).find("opcode EMPTY_SET"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 2, 0xff, '.'})).find("unknown opcode 0xff"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 1, 'N', '.'})).find("protocol 1 is not supported"), std::string::npos);
}

TEST(Pickle, EveryTruncationIsAClearError) {
  const std::string good = fixture("new_basic.pickle");
  ASSERT_GT(good.size(), 100u);
  (void)pickle_load(good, "good");
  for (size_t n = 0; n < good.size(); ++n) {
    try {
      pickle_load(good.substr(0, n), "cut");
      ADD_FAILURE() << "accepted the first " << n << " bytes";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    }
  }
  EXPECT_NE(error_of(good + "x").find("1 bytes after the STOP opcode"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 4, 0x8c, 200, 'a'})).find("the data ends inside an opcode's argument"),
            std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 4, 'X', 0xff, 0xff, 0xff, 0x7f, 'a'})).find("2147483647 bytes needed"),
            std::string::npos)
      << "a length is checked before anything is allocated";
}

TEST(Pickle, NestingCyclesAndLargeIntegersAreBounded) {
  // 64 nested lists are fine, 65 are not.
  auto nested = [](int n) {
    std::string p = bytes({0x80, 2});
    for (int k = 0; k < n; ++k) p += "]";
    for (int k = 1; k < n; ++k) p += "a";
    return p + ".";
  };
  EXPECT_EQ(pickle_load(nested(kPickleMaxDepth), "t")->depth, kPickleMaxDepth);
  EXPECT_NE(error_of(nested(kPickleMaxDepth + 1)).find("nest deeper than 64"), std::string::npos);
  // A list appended to itself (memo), and a list changed after it went inside another.
  EXPECT_NE(error_of(bytes({0x80, 2, ']', 'q', 0, 'h', 0, 'a', '.'})).find("put inside itself"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 2, ']', ']', 'q', 1, 'a', 'h', 1, 'N', 'a', '0', '.'}))
                .find("changed after it was put inside another container"),
            std::string::npos);
  // Integers: 2^64 and -2^63 - 1 do not fit; -2^63 does.
  EXPECT_NE(error_of(bytes({0x80, 2, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1, '.'})).find("2^64 or more"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 2, 0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, '.'}))
                .find("below -2^63"),
            std::string::npos);
  EXPECT_EQ(pickle_load(bytes({0x80, 2, 0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80, '.'}), "t")->i, INT64_MIN);
  EXPECT_NE(error_of(bytes({0x80, 2, 'h', 3, '.'})).find("memo entry 3 is read before it was written"),
            std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 2, 'a', '.'})).find("needs a value but the stack is empty"), std::string::npos);
  EXPECT_NE(error_of(bytes({0x80, 2, 'N', 'N', '.'})).find("STOP with 2 values"), std::string::npos);
}

}  // namespace
}  // namespace ampforge::memory
