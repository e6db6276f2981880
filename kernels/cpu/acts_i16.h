// Activations rounded to int16 for the integer inner products of the quantized linears
// (int8_linear.cpp): x ~ xi * s with one scale s = max|x| / 32767 per group
// of G inputs of a row, an error under 2^-15 of the group's largest value (bf16's own
// rounding of x is 2^-8 of each value).  Weights widened to int16 multiply them exactly into
// int32 lanes: VPDPWSSD with AVX512-VNNI, else VPMADDWD + VPADDD.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace radixserve_cpu {

constexpr int64_t G = 64;  // inputs per activation scale

#if defined(__AVX512BW__)
constexpr bool HAVE_I16 = true;
inline __m512i dot_i16(__m512i acc, __m512i x, __m512i w) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, x, w);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(x, w));
#endif
}
#else
constexpr bool HAVE_I16 = false;
#endif

// x [M, K] (K % G == 0) -> xi [M, K] and xs [M, K / G]: xi = round(x / s) per group.
inline void quantize_i16(const float* x, int64_t M, int64_t K, int16_t* xi, float* xs) {
  for (int64_t g = 0; g < M * (K / G); ++g) {
    const float* src = x + g * G;
    float amax = 0.0f;
    for (int64_t k = 0; k < G; ++k) amax = std::max(amax, std::fabs(src[k]));
    const float s = amax > 0.0f ? amax / 32767.0f : 1.0f;
    const float inv = 1.0f / s;
    for (int64_t k = 0; k < G; ++k) xi[g * G + k] = int16_t(std::nearbyint(src[k] * inv));
    xs[g] = s;
  }
}

}  // namespace radixserve_cpu
