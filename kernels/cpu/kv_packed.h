// Packed quantized KV rows (radixserve/mem_cache/kv_quant.py): for one token and KV head, D
// one-byte codes then the row's fp32 scale; a value is code * scale.  The paged-attention kernel
// reads them through KV<...> below (the exact pools' element types too), the store op writes them.
//
// Decoding fp8 with AVX-512F or F16C: a code's bits placed in an fp16 (e5m2: code << 8, which
// is exactly its fp16; e4m3: sign << 15 | rest << 7, the value times 2^-8, subnormals included)
// and widened by the hardware's fp16 -> fp32 conversion; elsewhere a 256-entry table.
#pragma once

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "vec.h"

namespace radixserve_cpu {

// Pool formats (the kv_format argument of paged_attention and store_kv_packed).
enum KVFormat : int64_t { KV_EXACT = 0, KV_INT8 = 1, KV_FP8_E4M3 = 2, KV_FP8_E5M2 = 3 };

struct QInt8 {};
struct QE4M3 {};
struct QE5M2 {};

template <typename F>
inline const std::array<float, 256>& code_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> out{};
    for (int c = 0; c < 256; ++c) {
      if constexpr (std::is_same_v<F, QInt8>) {
        out[c] = float(int8_t(uint8_t(c)));
      } else if constexpr (std::is_same_v<F, QE4M3>) {
        out[c] = float(c10::Float8_e4m3fn(uint8_t(c), c10::Float8_e4m3fn::from_bits()));
      } else {
        out[c] = float(c10::Float8_e5m2(uint8_t(c), c10::Float8_e5m2::from_bits()));
      }
    }
    return out;
  }();
  return t;
}

// 16 codes -> 16 fp32 values (unscaled).
template <typename F>
inline v16 load_codes16(const uint8_t* p) {
  if constexpr (std::is_same_v<F, QInt8>) {
    return load16(reinterpret_cast<const int8_t*>(p));
  } else {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256i h;
    if constexpr (std::is_same_v<F, QE5M2>) {
      h = _mm256_slli_epi16(w, 8);
    } else {
      h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                          _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7));
    }
#if defined(__AVX512F__)
    __m512 f = _mm512_cvtph_ps(h);
    if constexpr (std::is_same_v<F, QE4M3>) f = _mm512_mul_ps(f, _mm512_set1_ps(256.0f));
#else
    __m256 f[2] = {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
    if constexpr (std::is_same_v<F, QE4M3>)
      for (auto& x : f) x = _mm256_mul_ps(x, _mm256_set1_ps(256.0f));
#endif
    v16 v;
    std::memcpy(&v, &f, sizeof(v));
    return v;
#else
    const auto& t = code_table<F>();
    float f[16];
    for (int i = 0; i < 16; ++i) f[i] = t[p[i]];
    return vload(f);
#endif
  }
}

// How the kernel reads a pool of element K: E (the buffer's element), whether rows are packed,
// one value (unscaled), 16 values (unscaled) and a row's scale (1 for an exact pool).
template <typename K>
struct KV {
  using E = K;
  static constexpr bool packed = false;
  static float at(const E* row, int64_t d) { return to_f(row[d]); }
  static v16 load(const E* p) { return load16(p); }
  static float scale(const E*, int64_t) { return 1.0f; }
};

template <typename F>
struct KVPacked {
  using E = uint8_t;
  static constexpr bool packed = true;
  static float at(const E* row, int64_t d) { return code_table<F>()[row[d]]; }
  static v16 load(const E* p) { return load_codes16<F>(p); }
  static float scale(const E* row, int64_t D) {
    float s;
    std::memcpy(&s, row + D, sizeof(s));
    return s;
  }
};
template <>
struct KV<QInt8> : KVPacked<QInt8> {};
template <>
struct KV<QE4M3> : KVPacked<QE4M3> {};
template <>
struct KV<QE5M2> : KVPacked<QE5M2> {};

}  // namespace radixserve_cpu
