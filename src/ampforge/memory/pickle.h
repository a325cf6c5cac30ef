// A reader for the data-only subset of Python's pickle format: what `pickle.dump` writes for dicts, lists,
// tuples, str, bytes, int, float, bool and None under protocols 2 to 5 (PyTorch's memory snapshots,
// torch/cuda/memory.py `_dump_snapshot`, are exactly that). It never imports, calls or builds a Python object:
// every opcode that would (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID,
// BINPERSID, EXT1/2/4, out-of-band buffers) and the text opcodes of protocols 0 and 1 are refused with an
// InvalidArgument error naming the opcode and its byte offset.
//
// Opcode meanings are those of CPython's Lib/pickletools.py (the format's own documentation).
// Bounds: nesting at most kPickleMaxDepth containers; every length is checked against the bytes left before
// anything is allocated, so memory stays proportional to the input; integers must fit 64 bits (signed, or
// unsigned for the LONG opcodes: addresses and CUDA stream handles). A container that has been put inside
// another is frozen (the pickler never changes one afterwards); changing it is refused, so no input can make
// a cycle or a nesting deeper than it says.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ampforge::memory {

inline constexpr int kPickleMaxDepth = 64;

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

struct PyValue {
  enum Kind : uint8_t { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict };
  Kind kind = None;
  bool big = false;     // Int: the value is above INT64_MAX; `u()` reads it
  bool frozen = false;  // List/Dict: inside another container; no further change is accepted
  uint8_t depth = 0;    // containers: 1 + the deepest child container
  union {
    int64_t i = 0;  // Int, Bool (0/1)
    double f;       // Float
  };
  std::string s;            // Str (UTF-8 as pickled) and Bytes
  std::vector<PyRef> items;  // List, Tuple; Dict: key, value, key, value, ... in insertion order

  bool is_int() const { return kind == Int; }
  bool is_str() const { return kind == Str; }
  bool is_list() const { return kind == List || kind == Tuple; }
  bool is_dict() const { return kind == Dict; }
  uint64_t u() const { return static_cast<uint64_t>(i); }
  // Dict lookup by string key (the last insertion wins, as in Python); null when absent or not a dict.
  const PyValue* get(std::string_view key) const;
  // The Python type name, for messages: "dict", "list", "int", ...
  const char* type_name() const;
};

// Parses `data` (a whole pickle, ending with STOP; bytes after STOP are an error). `source` names the file in
// messages. Errors: InvalidArgument "<source>: pickle ...: <what> at byte <offset>".
PyRef pickle_load(std::string_view data, const std::string& source);

// True when `data` starts like a pickle of protocol 2 or later (PROTO 2..5).
bool looks_like_pickle(std::string_view data);

}  // namespace ampforge::memory
