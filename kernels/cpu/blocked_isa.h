// The vector operations of the blocked low-bit linear (blocked_linear.cpp), for one ISA:
// AVX-512BW (16 int32/fp32 lanes) or AVX2 (8 lanes), with or without VNNI.
//
// dot4(acc, w, x): each int32 lane of acc gains the sum of the 4 products of its 4 bytes of
// w (unsigned) and of x (signed).  With VNNI that is VPDPBUSD (exact, no saturation);
// without, VPMADDUBSW + VPMADDWD, which saturates the int16 pair sums unless w <= 127: the
// kernel feeds it nibbles only (<= 15), so every path is exact.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve_cpu {

#if defined(__AVX512BW__) && defined(__AVX512F__)
#define RADIXSERVE_BLOCKED_SIMD 1
struct BlockedIsa {
  using I = __m512i;
  using F = __m512;
  static constexpr int L = 16;  // lanes
#if defined(__AVX512VNNI__)
  static constexpr bool VNNI = true;
  static I dot4(I acc, I w, I x) { return _mm512_dpbusd_epi32(acc, w, x); }
#else
  static constexpr bool VNNI = false;
  static I dot4(I acc, I w, I x) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
  }
#endif
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I lo4(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I hi4(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static I bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static I izero() { return _mm512_setzero_si512(); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I add_x16(I acc, I hi) { return _mm512_add_epi32(acc, _mm512_slli_epi32(hi, 4)); }
  static F tof(I v) { return _mm512_cvtepi32_ps(v); }
  static F half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F set1(float f) { return _mm512_set1_ps(f); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define RADIXSERVE_BLOCKED_SIMD 1
struct BlockedIsa {
  using I = __m256i;
  using F = __m256;
  static constexpr int L = 8;
#if defined(__AVXVNNI__)
  static constexpr bool VNNI = true;
  static I dot4(I acc, I w, I x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
#else
  static constexpr bool VNNI = false;
  static I dot4(I acc, I w, I x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
#endif
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I lo4(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I hi4(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static I bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  static I izero() { return _mm256_setzero_si256(); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I add_x16(I acc, I hi) { return _mm256_add_epi32(acc, _mm256_slli_epi32(hi, 4)); }
  static F tof(I v) { return _mm256_cvtepi32_ps(v); }
  static F half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F set1(float f) { return _mm256_set1_ps(f); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};
#else
#define RADIXSERVE_BLOCKED_SIMD 0
#endif

}  // namespace radixserve_cpu
