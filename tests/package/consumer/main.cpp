// A project outside the tree that finds ling with find_package and uses it.
#include <cstdio>
#include <ling/core/dtypes.hpp>
#include <ling/quant/mxfp4.hpp>

int main() {
  std::uint8_t packed = 0x72;  // low nibble 2 (1.0) is element 0, high nibble 7 (6.0) element 1
  ling::Ue8m0 scale{128};      // 2
  float a = ling::quant::Mxfp4::decode(&packed, &scale, 1, 32, 0, 0);
  float b = ling::quant::Mxfp4::decode(&packed, &scale, 1, 32, 0, 1);
  std::printf("ling %s: %g %g\n", ling::kVersion, a, b);
  return (a == 2.0f && b == 12.0f) ? 0 : 1;
}
