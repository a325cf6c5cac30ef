// Test helpers shared by the CPU convolution tests (conv_test.cpp: im2col against direct loops;
// conv_onednn_test.cpp: oneDNN against im2col).
#pragma once

#include <cstdint>

#include "ampforge/core/attrs.h"

namespace ampforge::testutil {

inline Conv2dAttrs conv_attrs(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                              int64_t groups) {
  Conv2dAttrs a;
  a.stride[0] = sh, a.stride[1] = sw, a.padding[0] = ph, a.padding[1] = pw;
  a.dilation[0] = dh, a.dilation[1] = dw, a.groups = groups;
  return a;
}

// One problem: input (N, C, H, W), weight (Co, C / groups, KH, KW), attributes, with or without a bias.
struct ConvCase {
  const char* name;
  int64_t N, C, H, W, Co, KH, KW;
  Conv2dAttrs a;
  bool bias;
};

}  // namespace ampforge::testutil
