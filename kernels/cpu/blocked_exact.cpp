// The blocked low-bit layout (blocked_linear.cpp, radixserve/model/quant/blocked.py) against
// float32 activations, in float32 throughout:
//   y[m, n] = sum over k of x[m, k] * w[n, k],   w = d * u + m_   (d, m_ fp16; u 4- or 8-bit codes)
// Nothing is rounded but by float32 arithmetic: d * u is exact in float32 (11 bits times at
// most 8), so the one rounding of fma(d, u, m_) is that of d * u + m_, the float32 weight a
// GGUF Q4_1 / Q8_0 loader computes; each (row, channel) sum runs over k in order, one FMA per
// input.  So the vector paths (AVX-512, AVX2) and the scalar one give the same bits on every
// CPU, and the result differs from F.linear on the dense float32 weight by the summation
// order only.  blocked_linear instead splits the activations into int8 parts (~15 bits), as
// bf16 activations need.
//
// Per (block of 16 channels, group of 32 inputs) the record is dequantized once into a
// [32 inputs][16 channels] tile (2 KiB, in L1); each row then gains the tile's products,
// ROWS rows at a time in registers, their running sums kept per block in an [M][16] buffer.
// Calls of at most ROWS rows skip the tile (fused_rows).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t GS = 32;  // inputs per group
constexpr int64_t CH = 16;  // channels per record
constexpr int64_t weight_bytes(int64_t bits) { return bits == 4 ? 256 : 512; }
constexpr int64_t record_bytes(int64_t bits) { return weight_bytes(bits) + 64; }

// code of channel j, input k (0..31) of a record; see the layout in blocked_linear.cpp
template <int BITS>
inline int code(const uint8_t* rec, int j, int k) {
  if constexpr (BITS == 4) return (rec[(k / 8) * 64 + 4 * j + k % 4] >> (k % 8 < 4 ? 0 : 4)) & 0x0F;
  return rec[(k / 4) * 64 + 4 * j + k % 4];
}

#if defined(__AVX512F__)
struct V {  // 16 channels in one vector
  static constexpr int H = 1, ROWS = 8;
  using F = __m512;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static F half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512i loadi(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static F field(__m512i v, int shift, int mask) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, shift), _mm512_set1_epi32(mask)));
  }
};
#define RADIXSERVE_EXACT_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
struct V {  // 8 channels a vector, two per record
  static constexpr int H = 2, ROWS = 4;
  using F = __m256;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m256i loadi(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static F field(__m256i v, int shift, int mask) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, shift), _mm256_set1_epi32(mask)));
  }
};
#define RADIXSERVE_EXACT_SIMD 1
#endif

// tile[k * 16 + j] = d[j] * u[j][k] + m[j] for the 32 inputs k and 16 channels j of a record
template <int BITS>
inline void dequantize(const uint8_t* rec, float* tile) {
  const uint16_t* dm = reinterpret_cast<const uint16_t*>(rec + weight_bytes(BITS));
#ifdef RADIXSERVE_EXACT_SIMD
  constexpr int L = 16 / V::H;
  for (int h = 0; h < V::H; ++h) {
    const V::F d = V::half(dm + h * L), m = V::half(dm + 16 + h * L);
    // a 64-byte run holds 4 bytes of each of the 16 channels (one int32 lane each)
    for (int o = 0; o < (BITS == 4 ? 4 : 8); ++o) {
      const auto v = V::loadi(rec + o * 64 + h * (64 / V::H));
      for (int t = 0; t < 4; ++t) {
        if constexpr (BITS == 4) {
          V::store(tile + (8 * o + t) * CH + h * L, V::fma(d, V::field(v, 8 * t, 0x0F), m));
          V::store(tile + (8 * o + 4 + t) * CH + h * L, V::fma(d, V::field(v, 8 * t + 4, 0x0F), m));
        } else {
          V::store(tile + (4 * o + t) * CH + h * L, V::fma(d, V::field(v, 8 * t, 0xFF), m));
        }
      }
    }
  }
#else
  for (int j = 0; j < CH; ++j) {
    const float d = float(c10::Half(dm[j], c10::Half::from_bits()));
    const float m = float(c10::Half(dm[16 + j], c10::Half::from_bits()));
    for (int k = 0; k < GS; ++k) tile[k * CH + j] = std::fma(d, float(code<BITS>(rec, j, k)), m);
  }
#endif
}

// acc[i * 16 + j] += sum over the group's 32 inputs k, in order, of x[i * K + k] * tile[k * 16 + j]
template <int R>
inline void rows_pass(const float* tile, const float* x, int64_t K, float* acc) {
#ifdef RADIXSERVE_EXACT_SIMD
  constexpr int L = 16 / V::H;
  V::F a[R][V::H];
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < V::H; ++h) a[i][h] = V::load(acc + i * CH + h * L);
  for (int k = 0; k < GS; ++k) {
    V::F w[V::H];
    for (int h = 0; h < V::H; ++h) w[h] = V::load(tile + k * CH + h * L);
    for (int i = 0; i < R; ++i) {
      const V::F b = V::bcast(x + i * K + k);
      for (int h = 0; h < V::H; ++h) a[i][h] = V::fma(b, w[h], a[i][h]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < V::H; ++h) V::store(acc + i * CH + h * L, a[i][h]);
#else
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < GS; ++k)
      for (int j = 0; j < CH; ++j) acc[i * CH + j] = std::fma(x[i * K + k], tile[k * CH + j], acc[i * CH + j]);
#endif
}

#ifdef RADIXSERVE_EXACT_SIMD
constexpr int ROWS = V::ROWS;

// A call of at most ROWS rows (decode): the R rows' sums stay in registers over all G groups and
// each weight vector is dequantized in registers, used by every row, and dropped: no tile, no
// reloads.  The same operations per (row, channel) in the same order as the tile path.
template <int BITS, int R>
inline void fused_rows(const uint8_t* rec, int64_t G, const float* x, int64_t K, float* out) {
  constexpr int L = 16 / V::H;
  constexpr int64_t REC = record_bytes(BITS);
  V::F a[R][V::H];
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < V::H; ++h) a[i][h] = V::F{};
  for (int64_t g = 0; g < G; ++g, rec += REC) {
    for (int64_t l = 0; l < REC; l += 64) __builtin_prefetch(rec + 2 * REC + l);
    const uint16_t* dm = reinterpret_cast<const uint16_t*>(rec + weight_bytes(BITS));
    const float* xg = x + g * GS;
    for (int h = 0; h < V::H; ++h) {
      const V::F d = V::half(dm + h * L), m = V::half(dm + 16 + h * L);
      auto step = [&](const V::F w, int k) {
        for (int i = 0; i < R; ++i) a[i][h] = V::fma(V::bcast(xg + i * K + k), w, a[i][h]);
      };
      for (int o = 0; o < (BITS == 4 ? 4 : 8); ++o) {
        const auto v = V::loadi(rec + o * 64 + h * (64 / V::H));
        if constexpr (BITS == 4) {
          for (int t = 0; t < 4; ++t) step(V::fma(d, V::field(v, 8 * t, 0x0F), m), 8 * o + t);
          for (int t = 0; t < 4; ++t) step(V::fma(d, V::field(v, 8 * t + 4, 0x0F), m), 8 * o + 4 + t);
        } else {
          for (int t = 0; t < 4; ++t) step(V::fma(d, V::field(v, 8 * t, 0xFF), m), 4 * o + t);
        }
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < V::H; ++h) V::store(out + i * CH + h * L, a[i][h]);
}

template <int BITS, int R>
inline void fused_dispatch(int64_t r, const uint8_t* rec, int64_t G, const float* x, int64_t K, float* out) {
  if constexpr (R > 1) {
    if (r < R) return fused_dispatch<BITS, R - 1>(r, rec, G, x, K, out);
  }
  fused_rows<BITS, R>(rec, G, x, K, out);
}
#else
constexpr int ROWS = 1;
#endif

template <int R>
inline void rows_dispatch(int64_t r, const float* tile, const float* x, int64_t K, float* acc) {
  if constexpr (R > 1) {
    if (r < R) return rows_dispatch<R - 1>(r, tile, x, K, acc);
  }
  rows_pass<R>(tile, x, K, acc);
}

template <int BITS>
void exact_impl(const float* x, const uint8_t* w, int64_t M, int64_t K, int64_t NB, float* y) {
  const int64_t G = K / GS, N = NB * CH, REC = record_bytes(BITS);
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  at::parallel_for(0, NB, (NB + threads - 1) / threads, [&](int64_t b0, int64_t b1) {
#ifdef RADIXSERVE_EXACT_SIMD
    if (M <= ROWS) {
      alignas(64) float out[ROWS * CH];
      for (int64_t b = b0; b < b1; ++b) {
        fused_dispatch<BITS, ROWS>(M, w + b * G * REC, G, x, K, out);
        for (int64_t i = 0; i < M; ++i) std::memcpy(y + i * N + b * CH, out + i * CH, CH * sizeof(float));
      }
      return;
    }
#endif
    alignas(64) float tile[GS * CH];
    std::vector<float> acc(M * CH);
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      const uint8_t* rec = w + b * G * REC;
      for (int64_t g = 0; g < G; ++g, rec += REC) {
        for (int64_t l = 0; l < REC; l += 64) __builtin_prefetch(rec + 2 * REC + l);
        dequantize<BITS>(rec, tile);
        for (int64_t m0 = 0; m0 < M; m0 += ROWS)
          rows_dispatch<ROWS>(std::min<int64_t>(ROWS, M - m0), tile, x + m0 * K + g * GS, K, acc.data() + m0 * CH);
      }
      for (int64_t i = 0; i < M; ++i) std::memcpy(y + i * N + b * CH, acc.data() + i * CH, CH * sizeof(float));
    }
  });
}

at::Tensor blocked_linear_exact(const at::Tensor& x, const at::Tensor& w, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "blocked_linear_exact: bits must be 4 or 8");
  TORCH_CHECK(w.dim() == 3 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(2) == record_bytes(bits),
              "blocked_linear_exact: w must be contiguous uint8 [N / 16, K / 32, ", record_bytes(bits), "]");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.size(1) == w.size(1) * GS,
              "blocked_linear_exact: contiguous float32 [M, K] x with K = 32 * w.size(1)");
  at::Tensor y = at::empty({x.size(0), w.size(0) * CH}, x.options());
  if (x.size(0) == 0) return y;
  const float* xp = x.data_ptr<float>();
  if (bits == 4) {
    exact_impl<4>(xp, w.data_ptr<uint8_t>(), x.size(0), x.size(1), w.size(0), y.data_ptr<float>());
  } else {
    exact_impl<8>(xp, w.data_ptr<uint8_t>(), x.size(0), x.size(1), w.size(0), y.data_ptr<float>());
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("blocked_linear_exact(Tensor x, Tensor w, int bits) -> Tensor", &blocked_linear_exact);
}
