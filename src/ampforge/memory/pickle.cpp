// The data-only pickle reader (pickle.h). One pass over the bytes with Python's unpickler model: a value
// stack, a stack of MARK positions and a memo table; opcodes and their arguments as documented in CPython's
// Lib/pickletools.py. Nothing here recurses over the input, and values nest at most kPickleMaxDepth deep
// (so even destroying the tree cannot exhaust the stack).
#include "ampforge/memory/pickle.h"

#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "ampforge/util/error.h"

namespace ampforge::memory {

const PyValue* PyValue::get(std::string_view key) const {
  if (kind != Dict) return nullptr;
  for (size_t k = items.size(); k >= 2; k -= 2) {
    const PyValue& kv = *items[k - 2];
    if (kv.kind == Str && kv.s == key) return items[k - 1].get();
  }
  return nullptr;
}

const char* PyValue::type_name() const {
  switch (kind) {
    case None: return "None";
    case Bool: return "bool";
    case Int: return "int";
    case Float: return "float";
    case Str: return "str";
    case Bytes: return "bytes";
    case List: return "list";
    case Tuple: return "tuple";
    case Dict: return "dict";
  }
  return "?";
}

bool looks_like_pickle(std::string_view data) {
  return data.size() >= 2 && static_cast<uint8_t>(data[0]) == 0x80 && data[1] >= 2 && data[1] <= 5;
}

namespace {

// Opcodes that would run Python code, or that belong to protocols 0/1 (text forms), by byte.
const char* refused_opcode(uint8_t op) {
  switch (op) {
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    case 0x96: return "BYTEARRAY8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'p': return "PUT";
    case 'g': return "GET";
    default: return nullptr;
  }
}

bool runs_code(uint8_t op) {
  switch (op) {
    case 'c': case 0x93: case 'R': case 'b': case 'i': case 'o': case 0x81: case 0x92: case 'P': case 'Q':
    case 0x82: case 0x83: case 0x84: return true;
    default: return false;
  }
}

class Unpickler {
 public:
  Unpickler(std::string_view data, const std::string& source) : d_(data), source_(source) {}

  PyRef run() {
    if (d_.empty()) fail(0, "the file is empty");
    while (true) {
      if (pos_ >= d_.size()) fail(pos_, "the data ends before the STOP opcode (a truncated file?)");
      const size_t at = pos_;
      const uint8_t op = static_cast<uint8_t>(d_[pos_++]);
      switch (op) {
        case 0x80: {  // PROTO
          const uint8_t v = u8(at);
          if (v < 2 || v > 5)
            fail(at, fmt::format("protocol {} is not supported (memory snapshots use protocols 2 to 5)", v));
          break;
        }
        case 0x95: {  // FRAME: a length hint; the frame's bytes follow as ordinary opcodes
          const uint64_t n = le(at, 8);
          if (n > d_.size() - pos_) fail(at, fmt::format("a frame of {} bytes runs past the end of the data (a truncated file?)", n));
          break;
        }
        case '.': {  // STOP
          if (stack_.size() != 1 || !marks_.empty())
            fail(at, fmt::format("STOP with {} values and {} marks on the stack (expected one value)", stack_.size(),
                                 marks_.size()));
          if (pos_ != d_.size())
            fail(pos_, fmt::format("{} bytes after the STOP opcode", d_.size() - pos_));
          return stack_.back();
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '0': pop(at); break;                           // POP
        case '1': stack_.resize(pop_mark(at)); break;       // POP_MARK: drops the values above the mark
        case '2': push(top(at)); break;                     // DUP
        case 'N': push(make(PyValue::None)); break;
        case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
          PyRef v = make(PyValue::Bool);
          v->i = op == 0x88;
          push(v);
          break;
        }
        case 'J': push(int_value(static_cast<int32_t>(le(at, 4)))); break;  // BININT
        case 'K': push(int_value(u8(at))); break;                           // BININT1
        case 'M': push(int_value(static_cast<int64_t>(le(at, 2)))); break;  // BININT2
        case 0x8a: long_int(at, u8(at)); break;                              // LONG1
        case 0x8b: {                                                         // LONG4
          const int64_t n = static_cast<int32_t>(le(at, 4));
          if (n < 0) fail(at, "LONG4 with a negative length");
          long_int(at, static_cast<uint64_t>(n));
          break;
        }
        case 'G': {  // BINFLOAT: 8 bytes, big-endian IEEE 754
          need(at, 8);
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<uint8_t>(d_[pos_ + k]);
          pos_ += 8;
          PyRef v = make(PyValue::Float);
          std::memcpy(&v->f, &bits, sizeof bits);
          push(v);
          break;
        }
        case 0x8c: text(at, PyValue::Str, u8(at)); break;      // SHORT_BINUNICODE
        case 'X': text(at, PyValue::Str, le(at, 4)); break;    // BINUNICODE
        case 0x8d: text(at, PyValue::Str, le(at, 8)); break;   // BINUNICODE8
        case 'C': text(at, PyValue::Bytes, u8(at)); break;     // SHORT_BINBYTES
        case 'B': text(at, PyValue::Bytes, le(at, 4)); break;  // BINBYTES
        case 0x8e: text(at, PyValue::Bytes, le(at, 8)); break; // BINBYTES8
        case ']': push(make(PyValue::List)); break;            // EMPTY_LIST
        case '}': push(make(PyValue::Dict)); break;            // EMPTY_DICT
        case ')': push(make(PyValue::Tuple)); break;           // EMPTY_TUPLE
        case 'l': case 't': {                                  // LIST, TUPLE: the items since the last MARK
          const size_t m = pop_mark(at);
          PyRef c = make(op == 'l' ? PyValue::List : PyValue::Tuple);
          for (size_t k = m; k < stack_.size(); ++k) add(at, *c, stack_[k]);
          stack_.resize(m);
          push(c);
          break;
        }
        case 'd': {  // DICT
          const size_t m = pop_mark(at);
          if ((stack_.size() - m) % 2 != 0) fail(at, "DICT with an odd number of items since the mark");
          PyRef c = make(PyValue::Dict);
          for (size_t k = m; k < stack_.size(); ++k) add(at, *c, stack_[k]);
          stack_.resize(m);
          push(c);
          break;
        }
        case 0x85: case 0x86: case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
          const size_t n = op - 0x84u;
          if (stack_.size() < n + floor()) fail(at, fmt::format("TUPLE{} with fewer than {} values on the stack", n, n));
          PyRef c = make(PyValue::Tuple);
          for (size_t k = stack_.size() - n; k < stack_.size(); ++k) add(at, *c, stack_[k]);
          stack_.resize(stack_.size() - n);
          push(c);
          break;
        }
        case 'a': {  // APPEND
          PyRef v = pop(at);
          PyValue& list = container(at, PyValue::List, "APPEND");
          add(at, list, v);
          break;
        }
        case 'e': {  // APPENDS
          const size_t m = pop_mark(at);
          if (m == 0) fail(at, "APPENDS with no list below the mark");
          PyValue& list = container_at(at, m - 1, PyValue::List, "APPENDS");
          for (size_t k = m; k < stack_.size(); ++k) add(at, list, stack_[k]);
          stack_.resize(m);
          break;
        }
        case 's': {  // SETITEM
          PyRef v = pop(at);
          PyRef k = pop(at);
          PyValue& dict = container(at, PyValue::Dict, "SETITEM");
          add(at, dict, k);
          add(at, dict, v);
          break;
        }
        case 'u': {  // SETITEMS
          const size_t m = pop_mark(at);
          if (m == 0) fail(at, "SETITEMS with no dict below the mark");
          if ((stack_.size() - m) % 2 != 0) fail(at, "SETITEMS with an odd number of items since the mark");
          PyValue& dict = container_at(at, m - 1, PyValue::Dict, "SETITEMS");
          for (size_t k = m; k < stack_.size(); ++k) add(at, dict, stack_[k]);
          stack_.resize(m);
          break;
        }
        case 0x94: memo_put(at, memo_count_); break;   // MEMOIZE: the next index is the memo's length
        case 'q': memo_put(at, u8(at)); break;          // BINPUT
        case 'r': memo_put(at, le(at, 4)); break;       // LONG_BINPUT
        case 'h': memo_get(at, u8(at)); break;          // BINGET
        case 'j': memo_get(at, le(at, 4)); break;       // LONG_BINGET
        default: {
          if (const char* name = refused_opcode(op)) {
            if (runs_code(op))
              fail(at, fmt::format("opcode {} (0x{:02x}) is refused: it would import or call Python code, which "
                                   "ampforge never does (a PyTorch memory snapshot holds only dicts, lists, tuples, "
                                   "strings, numbers, booleans and None)",
                                   name, op));
            fail(at, fmt::format("opcode {} (0x{:02x}) is not supported (only the data opcodes of protocols 2 to 5 "
                                 "that memory snapshots use)",
                                 name, op));
          }
          fail(at, fmt::format("unknown opcode 0x{:02x} (not a pickle, or a damaged one)", op));
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    AF_THROW(InvalidArgument, "{}: not a readable memory snapshot pickle: {} at byte {}", source_, what, at);
  }
  void need(size_t at, uint64_t n) const {
    if (n > d_.size() - pos_)
      fail(at, fmt::format("the data ends inside an opcode's argument ({} bytes needed, {} left; a truncated file?)", n,
                           d_.size() - pos_));
  }
  uint8_t u8(size_t at) {
    need(at, 1);
    return static_cast<uint8_t>(d_[pos_++]);
  }
  uint64_t le(size_t at, int n) {
    need(at, static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(d_[pos_ + static_cast<size_t>(k)]);
    pos_ += static_cast<size_t>(n);
    return v;
  }
  static PyRef make(PyValue::Kind k) {
    PyRef v = std::make_shared<PyValue>();
    v->kind = k;
    if (k == PyValue::List || k == PyValue::Tuple || k == PyValue::Dict) v->depth = 1;
    return v;
  }
  // Small non-negative ints (line numbers, flags, small sizes) are shared: a snapshot has hundreds of thousands.
  PyRef int_value(int64_t i) {
    if (i >= 0 && i < kSmallInts) {
      if (small_ints_.empty()) small_ints_.resize(kSmallInts);
      PyRef& s = small_ints_[static_cast<size_t>(i)];
      if (s == nullptr) {
        s = make(PyValue::Int);
        s->i = i;
      }
      return s;
    }
    PyRef v = make(PyValue::Int);
    v->i = i;
    return v;
  }
  // LONG1/LONG4: n bytes, little-endian two's complement. Kept when it fits int64 or uint64.
  void long_int(size_t at, uint64_t n) {
    need(at, n);
    const auto* p = reinterpret_cast<const uint8_t*>(d_.data() + pos_);
    pos_ += n;
    const bool negative = n > 0 && (p[n - 1] & 0x80) != 0;
    // Significant bytes: drop the sign-extension bytes at the top.
    uint64_t len = n;
    while (len > 0 && p[len - 1] == (negative ? 0xff : 0x00)) --len;
    PyRef v = make(PyValue::Int);
    if (negative) {
      // The value fits int64 when at most 8 bytes remain and bit 63 of the sign-extended value is set.
      if (len > 8 || (len == 8 && (p[7] & 0x80) == 0)) fail(at, "an integer below -2^63");
      uint64_t bits = ~uint64_t{0};
      for (uint64_t k = 0; k < len; ++k) bits = (bits & ~(uint64_t{0xff} << (8 * k))) | (uint64_t{p[k]} << (8 * k));
      v->i = static_cast<int64_t>(bits);
    } else {
      if (len > 8) fail(at, "an integer of 2^64 or more");
      uint64_t bits = 0;
      for (uint64_t k = 0; k < len; ++k) bits |= uint64_t{p[k]} << (8 * k);
      v->i = static_cast<int64_t>(bits);
      v->big = bits > static_cast<uint64_t>(INT64_MAX);
    }
    push(v);
  }
  void text(size_t at, PyValue::Kind k, uint64_t n) {
    need(at, n);
    PyRef v = make(k);
    v->s.assign(d_.data() + pos_, n);
    pos_ += n;
    push(v);
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(PyRef v) { stack_.push_back(std::move(v)); }
  const PyRef& top(size_t at) const {
    if (stack_.size() <= floor()) fail(at, "an opcode needs a value but the stack is empty");
    return stack_.back();
  }
  PyRef pop(size_t at) {
    PyRef v = top(at);
    stack_.pop_back();
    return v;
  }
  size_t pop_mark(size_t at) {
    if (marks_.empty()) fail(at, "an opcode needs a MARK but there is none");
    const size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  PyValue& container(size_t at, PyValue::Kind k, const char* op) { return container_at(at, stack_.size() - 1, k, op, true); }
  PyValue& container_at(size_t at, size_t index, PyValue::Kind k, const char* op, bool from_top = false) {
    if (from_top && stack_.size() <= floor()) fail(at, fmt::format("{} with nothing below it on the stack", op));
    if (index >= stack_.size()) fail(at, fmt::format("{} with nothing below it on the stack", op));
    PyValue& c = *stack_[index];
    if (c.kind != k)
      fail(at, fmt::format("{} applied to a {} (expected a {})", op, c.type_name(), k == PyValue::List ? "list" : "dict"));
    return c;
  }
  // Puts `child` into `parent` (list, tuple or dict). The freeze rule (pickle.h) keeps the tree acyclic and
  // its depth exact.
  void add(size_t at, PyValue& parent, const PyRef& child) {
    if (parent.frozen)
      fail(at, fmt::format("a {} is changed after it was put inside another container (the pickle module never "
                           "writes that)",
                           parent.type_name()));
    if (child.get() == &parent) fail(at, fmt::format("a {} is put inside itself", parent.type_name()));
    if (child->depth > 0) {
      child->frozen = true;
      if (child->depth + 1 > kPickleMaxDepth)
        fail(at, fmt::format("containers nest deeper than {} levels", kPickleMaxDepth));
      parent.depth = std::max<uint8_t>(parent.depth, static_cast<uint8_t>(child->depth + 1));
    }
    parent.items.push_back(child);
  }
  // The memo: a vector for the dense indices the pickler writes (MEMOIZE counts up; BINPUT usually too), a map
  // for any index far beyond them, so that no index can make the vector large.
  void memo_put(size_t at, uint64_t index) {
    const PyRef& v = top(at);
    if (index < dense_.size() + 4096) {
      if (index >= dense_.size()) dense_.resize(index + 1);
      memo_count_ += dense_[index] == nullptr;
      dense_[index] = v;
      return;
    }
    const auto [it, added] = memo_.insert_or_assign(index, v);
    (void)it;
    memo_count_ += added;
  }
  void memo_get(size_t at, uint64_t index) {
    if (index < dense_.size() && dense_[index] != nullptr) {
      push(dense_[index]);
      return;
    }
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail(at, fmt::format("memo entry {} is read before it was written", index));
    push(it->second);
  }

  std::string_view d_;
  const std::string& source_;
  size_t pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::vector<PyRef> dense_;
  std::unordered_map<uint64_t, PyRef> memo_;
  uint64_t memo_count_ = 0;
  static constexpr int64_t kSmallInts = 4096;
  std::vector<PyRef> small_ints_;
};

}  // namespace

PyRef pickle_load(std::string_view data, const std::string& source) { return Unpickler(data, source).run(); }

}  // namespace ampforge::memory
