// Scalar helpers shared by the native CPU kernels: bf16 <-> fp32 and a vectorizable exp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace radixserve_cpu {

inline float to_f(float x) { return x; }
inline float to_f(uint16_t x) {  // bf16 bits -> fp32
  uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void from_f(float* p, float x) { *p = x; }
inline void from_f(uint16_t* p, float x) {  // round to nearest even, as torch does
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  *p = uint16_t(u >> 16);
}

// exp(n ln2 + r) / 2^n for |r| <= ln2 / 2, given n: the reduction and polynomial shared by the
// scalar exp_approx and the vector exp of the attention kernel (V: float or a float vector).
template <typename V>
inline V exp_reduced(V x, V n) {
  const V r = x - n * 0.693359375f + n * 2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// exp(x) to ~2 ulp on [-87, 88], branch-free so that loops over it vectorize; -inf -> ~1e-38.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float p = exp_reduced(x, n);
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

}  // namespace radixserve_cpu
