// AMX-INT8 tiles for the blocked low-bit linear (included by blocked_linear.cpp) at batch
// sizes (>= AMX_MIN_ROWS rows): the same integer products as the VNNI path, 16 rows x 16
// channels x 32 inputs per TDPBSUD (signed activations, unsigned codes), then the same fp32
// epilogue per group.  The records' 64-byte runs are the B tile's rows as the instruction
// wants them (16 channels x 4 inputs); 4-bit codes are first split into a 512-byte 8-bit copy.
// Without the tile permission (amx_tiles.h), or on a CPU without AMX, the VNNI path runs.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512BW__) && defined(__linux__)
#define RADIXSERVE_BLOCKED_AMX 1
#include <immintrin.h>

#include "amx_tiles.h"

namespace radixserve_cpu {

// Per thread (other kernels configure the tiles their own way): C tiles 0, 1 (16 x 16 int32),
// A tiles 2, 3 (16 rows x 32 int8), B tile 4 (8 rows of 16 channels x 4 codes).
inline constexpr TileConfig BLOCKED_TILES = {1, 0, {}, {64, 64, 32, 32, 64}, {16, 16, 16, 16, 8}};
inline void blocked_amx_configure() { _tile_loadconfig(&BLOCKED_TILES); }

// out[i * 16 + j] (fp32) = y[r0 + i, 16 b + j] for the 16 rows from r0 (xh, xl: int8 [rows, K],
// readable for all 16; ds, xs: [rows, G]) and the block whose G records start at rec.
template <int BITS>
inline void amx_block(const uint8_t* rec, int64_t G, const int8_t* xh, const int8_t* xl, const float* ds,
                      const float* xs, int64_t K, float* out) {
  constexpr int64_t WB = BITS == 4 ? 256 : 512, REC = WB + 64;
  alignas(64) uint8_t codes[512];
  alignas(64) int32_t c[2][256];
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const __m512 k254 = _mm512_set1_ps(254.0f);
  for (int64_t g = 0; g < G; ++g, rec += REC) {
    const uint8_t* b = rec;
    if constexpr (BITS == 4) {  // run o's low nibbles are B row 2o, its high nibbles row 2o + 1
      const __m512i mask = _mm512_set1_epi8(0x0F);
      for (int o = 0; o < 4; ++o) {
        const __m512i v = _mm512_loadu_si512(rec + 64 * o);
        _mm512_store_si512(codes + 128 * o, _mm512_and_si512(v, mask));
        _mm512_store_si512(codes + 128 * o + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
      }
      b = codes;
    }
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(4, b, 64);
    _tile_loadd(2, xh + g * 32, K);
    _tile_loadd(3, xl + g * 32, K);
    _tile_dpbsud(0, 2, 4);
    _tile_dpbsud(1, 3, 4);
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    const uint16_t* dm = reinterpret_cast<const uint16_t*>(rec + WB);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 16)));
    for (int i = 0; i < 16; ++i) {
      const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[0] + 16 * i)), k254,
                                         _mm512_cvtepi32_ps(_mm512_load_si512(c[1] + 16 * i)));
      acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(ds[i * G + g])), acc[i]);
      acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[i * G + g]), acc[i]);
    }
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + 16 * i, acc[i]);
}

}  // namespace radixserve_cpu
#else
#define RADIXSERVE_BLOCKED_AMX 0
#endif
