// 16-float vectors for the native CPU kernels: one AVX-512 register, two AVX2 registers
// (GCC lowers the vector types to the ISA -march=native allows), with bf16 loads.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve_cpu {

typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

inline v16 vload(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void vstore(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }
inline v16 load16(const float* p) { return vload(p); }
inline v16 load16(const uint16_t* p) {  // 16 bf16 -> 16 fp32
  u16x16 h;
  std::memcpy(&h, p, sizeof(h));
  const u32x16 w = __builtin_convertvector(h, u32x16) << 16;
  v16 f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
}
inline v16 load16(const int8_t* p) {  // 16 int8 -> 16 fp32 (exact)
  // GCC scalarizes __builtin_convertvector from int8 lanes, hence the intrinsics.
#if defined(__AVX512F__)
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  __m256 f[2];
  for (int h = 0; h < 2; ++h)
    f[h] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h))));
#else
  float f[16];
  for (int i = 0; i < 16; ++i) f[i] = float(p[i]);
#endif
  v16 v;
  std::memcpy(&v, &f, sizeof(v));
  return v;
}
inline float hsum(v16 v) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

}  // namespace radixserve_cpu
