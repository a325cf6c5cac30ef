// Built by the install test (tests/install/install_test.cmake) with nothing but the flags of the installed
// ampforge.pc: a matmul (OpenBLAS) and a reduction through the public headers of the installed library.
#include <cstdio>

#include "ampforge/autograd/functions.h"
#include "ampforge/util/build_info.h"

namespace af = ampforge;

int main() {
  const af::Tensor a = af::Tensor::from_vector(std::vector<float>{1, 2, 3}, af::Shape{1, 3});
  const af::Tensor b = af::ones(af::Shape{3, 2});
  const double s = af::sum(af::matmul(a, b)).item() / 2;  // (1 + 2 + 3) per column
  std::printf("ampforge %s: sum %g\n", AMPFORGE_VERSION_STRING, s);
  return s == 6 ? 0 : 1;
}
