#include "ampforge/core/dtype.h"

#include <algorithm>

#include "ampforge/util/error.h"

namespace ampforge {

static_assert(kNumDTypes == 8, "update the tolerance table and the promotion rank when adding a dtype");

DType dtype_from_string(std::string_view s) {
  std::string v(s);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "f32" || v == "fp32" || v == "float32" || v == "float") return DType::F32;
  if (v == "f16" || v == "fp16" || v == "float16" || v == "half") return DType::F16;
  if (v == "bf16" || v == "bfloat16") return DType::BF16;
  if (v == "f64" || v == "fp64" || v == "float64" || v == "double") return DType::F64;
  if (v == "i32" || v == "int32") return DType::I32;
  if (v == "i64" || v == "int64" || v == "long") return DType::I64;
  if (v == "u8" || v == "uint8") return DType::U8;
  if (v == "bool") return DType::Bool;
  AF_THROW(InvalidArgument, "unknown dtype '{}': expected one of f32, f16, bf16, f64, i32, i64, u8, bool", s);
}

namespace {
int float_rank(DType d) {
  switch (d) {
    case DType::F16: return 1;
    case DType::BF16: return 1;
    case DType::F32: return 2;
    case DType::F64: return 3;
    default: return 0;
  }
}
int int_rank(DType d) {
  switch (d) {
    case DType::Bool: return 0;
    case DType::U8: return 1;
    case DType::I32: return 2;
    case DType::I64: return 3;
    default: return -1;
  }
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const bool fa = dtype_is_float(a), fb = dtype_is_float(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    if (dtype_is_16bit_float(a) && dtype_is_16bit_float(b)) return DType::F32;  // F16 + BF16
    return float_rank(a) >= float_rank(b) ? a : b;
  }
  return int_rank(a) >= int_rank(b) ? a : b;
}

}  // namespace ampforge
