// Element types. Every per-dtype table is generated from AF_FOR_EACH_DTYPE, so adding a dtype is one line.
// F64 exists for reference arithmetic (finite-difference gradient checks) on the CPU.
#pragma once

#include <cstdint>
#include <string_view>

#include "ampforge/core/half.h"

namespace ampforge {

//        name  C++ type  bytes  is_float  short name
#define AF_FOR_EACH_DTYPE(X)              \
  X(F32, float, 4, true, "f32")           \
  X(F16, Half, 2, true, "f16")            \
  X(BF16, BFloat16, 2, true, "bf16")      \
  X(F64, double, 8, true, "f64")          \
  X(I32, int32_t, 4, false, "i32")        \
  X(I64, int64_t, 8, false, "i64")        \
  X(U8, uint8_t, 1, false, "u8")          \
  X(Bool, bool, 1, false, "bool")

enum class DType : uint8_t {
#define AF_DTYPE_ENUM(name, type, bytes, is_float, str) name,
  AF_FOR_EACH_DTYPE(AF_DTYPE_ENUM)
#undef AF_DTYPE_ENUM
};

#define AF_DTYPE_COUNT_ONE(...) +1
inline constexpr int kNumDTypes = 0 AF_FOR_EACH_DTYPE(AF_DTYPE_COUNT_ONE);
#undef AF_DTYPE_COUNT_ONE

constexpr int64_t dtype_size(DType d) {
  switch (d) {
#define AF_DTYPE_SIZE(name, type, bytes, is_float, str) \
  case DType::name: return bytes;
    AF_FOR_EACH_DTYPE(AF_DTYPE_SIZE)
#undef AF_DTYPE_SIZE
  }
  return 0;
}

constexpr bool dtype_is_float(DType d) {
  switch (d) {
#define AF_DTYPE_FLOAT(name, type, bytes, is_float, str) \
  case DType::name: return is_float;
    AF_FOR_EACH_DTYPE(AF_DTYPE_FLOAT)
#undef AF_DTYPE_FLOAT
  }
  return false;
}

constexpr std::string_view dtype_name(DType d) {
  switch (d) {
#define AF_DTYPE_NAME(name, type, bytes, is_float, str) \
  case DType::name: return str;
    AF_FOR_EACH_DTYPE(AF_DTYPE_NAME)
#undef AF_DTYPE_NAME
  }
  return "?";
}

constexpr bool dtype_is_16bit_float(DType d) { return d == DType::F16 || d == DType::BF16; }

// Parses "f32", "float32", "fp16", "bf16", ...; throws InvalidArgument naming the accepted values.
DType dtype_from_string(std::string_view s);

// Type promotion for binary ops (PyTorch's rules for the types we have): float beats int; among
// floats the wider wins, and F16 with BF16 gives F32; among ints the wider wins; Bool is lowest.
DType promote_types(DType a, DType b);

// C++ type <-> DType.
template <class T>
struct dtype_of;
#define AF_DTYPE_OF(name, type, bytes, is_float, str) \
  template <>                                         \
  struct dtype_of<type> {                             \
    static constexpr DType value = DType::name;       \
  };
AF_FOR_EACH_DTYPE(AF_DTYPE_OF)
#undef AF_DTYPE_OF

// Calls f(T{}) with T the C++ type of `d`. Kernels use it to instantiate per dtype.
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
#define AF_DTYPE_VISIT(name, type, bytes, is_float, str) \
  case DType::name: return f(type{});
    AF_FOR_EACH_DTYPE(AF_DTYPE_VISIT)
#undef AF_DTYPE_VISIT
  }
  return f(float{});
}

}  // namespace ampforge
