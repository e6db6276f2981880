// Low-bit linear for the few rows of a decode step (see radixserve/model/blocked.py):
//   y[m, n] = sum over groups g of 32 inputs of  d[n, g] * (x[m] . u[n])_g + m_[n, g] * sum_g x[m]
// with unsigned weight codes u (4 bits: GGUF Q4_1's grid w = d * u + m; 8 bits: int8 stored
// as u = q + 128 with m = -128 d), d and m in fp16.
//
// Activations are split per group of 32 inputs of a row into two int8 parts, x ~ s (xh + xl /
// 254) with s = max|x| / 127: xh is llama.cpp's Q8 rounding, xl the rounding of its residual,
// so x carries ~15 bits, as bf16 activations need (xh alone cost SmolLM2 2.5 points of
// teacher-forced argmax agreement with int4 weights, over the 97% bar).  Each group's sum of x
// is kept exact in fp32 for the m term.  The integer dot products run four bytes per int32
// lane (VPDPBUSD with VNNI), in int32, exactly; the groups' sums are scaled into fp32.
//
// Weight layout, uint8 [N / 16, K / 32, REC]: one record per (16 output channels, group):
//   4 bits: 4 x 64 bytes; in the o-th 64 bytes, byte 4 j + t holds u[16 b + j][32 g + 8 o + t]
//           in its low nibble and u[...][32 g + 8 o + 4 + t] in its high nibble;
//   8 bits: 8 x 64 bytes; in the o-th, byte 4 j + t = u[16 b + j][32 g + 4 o + t];
//   then 64 bytes: d of the 16 channels (fp16), then their m.
// So one 64-byte load serves 16 channels (one int32 lane each) against a broadcast of 4 or 8
// inputs: no horizontal sums, no shuffles, and one sequential stream per thread.  From
// AMX_MIN_ROWS rows on, where the CPU has AMX-INT8, tiles do the same products (blocked_amx.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "blocked_amx.h"
#include "blocked_isa.h"
#include "common.h"

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

using radixserve_cpu::from_f;
using radixserve_cpu::to_f;

constexpr int64_t GS = 32;  // inputs per group (weights and activations)
constexpr int64_t PREFETCH_RECORDS = 4;
constexpr int64_t AMX_MIN_ROWS = 16;  // from here on AMX tiles where the CPU and the OS allow them (at 8, half a tile: slower)
std::atomic<int> amx_mode{1};         // 0: never (tests compare the paths), 1: from AMX_MIN_ROWS rows

constexpr int64_t weight_bytes(int64_t bits) { return bits == 4 ? 256 : 512; }
constexpr int64_t record_bytes(int64_t bits) { return weight_bytes(bits) + 64; }

// x split per group: xh, xl [M, K] (x ~ s (xh + xl / 254)), ds = s / 254 [M, G], exact sums xs [M, G]
// (all after in_scale)
struct QActs {
  std::vector<int8_t> xh, xl;
  std::vector<float> ds, xs;
};

// One group of 32 inputs: xh, xl, the scale / 254 and the exact sum (after in_scale, when set).
template <typename T>
inline void quantize_group(const T* src, const float* is, int8_t* xh, int8_t* xl, float* ds, float* xs) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  __m512 v[2];
  for (int h = 0; h < 2; ++h) {
    if constexpr (std::is_same_v<T, float>) {
      v[h] = _mm512_loadu_ps(src + 16 * h);
    } else {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16 * h));
      v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    if (is) v[h] = _mm512_mul_ps(v[h], _mm512_loadu_ps(is + 16 * h));
  }
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
  *xs = _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1]));
  const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
  const __m512 inv = _mm512_set1_ps(1.0f / s), k254 = _mm512_set1_ps(254.0f);
  constexpr int RN = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int h = 0; h < 2; ++h) {
    const __m512 t = _mm512_mul_ps(v[h], inv), hi = _mm512_roundscale_ps(t, RN);
    const __m512 lo = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(t, hi), k254), RN);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xh + 16 * h), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(hi)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xl + 16 * h), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(lo)));
  }
  *ds = s / 254.0f;
#else
  float v[GS], amax = 0.0f, sum = 0.0f;
  for (int64_t k = 0; k < GS; ++k) {
    v[k] = to_f(src[k]) * (is ? is[k] : 1.0f);
    amax = std::max(amax, std::fabs(v[k]));
    sum += v[k];
  }
  const float s = amax > 0.0f ? amax / 127.0f : 1.0f, inv = 1.0f / s;
  for (int64_t k = 0; k < GS; ++k) {
    const float t = v[k] * inv, h = std::nearbyint(t);
    xh[k] = int8_t(h);
    xl[k] = int8_t(std::nearbyint((t - h) * 254.0f));
  }
  *ds = s / 254.0f;
  *xs = sum;
#endif
}

// rows >= M: the arrays are allocated (zeros) for that many rows (the AMX tiles read 16 at a time)
template <typename T>
QActs quantize_acts(const T* x, const float* in_scale, int64_t M, int64_t K, int64_t rows) {
  const int64_t G = K / GS;
  QActs a{std::vector<int8_t>(rows * K), std::vector<int8_t>(rows * K), std::vector<float>(rows * G),
          std::vector<float>(rows * G)};
  at::parallel_for(0, M * G, 2048, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t k0 = (r % G) * GS;
      quantize_group(x + (r / G) * K + k0, in_scale ? in_scale + k0 : nullptr, a.xh.data() + r * GS,
                     a.xl.data() + r * GS, a.ds.data() + r, a.xs.data() + r);
    }
  });
  return a;
}

#if RADIXSERVE_BLOCKED_SIMD
using radixserve_cpu::BlockedIsa;

// out[i * 16 + j] = y[m0 + i, 16 b + j] for the block b whose records start at rec.  Each row
// sums its int32 products in two independent chains (xh and xl) and, for 8-bit codes without
// VNNI, two more (high nibbles); a single row with AVX-512 in twice as many (P = 2: alternate
// 4-input runs), since VPDPBUSD's latency would otherwise bound it.  One block at a time keeps
// one sequential stream per thread: two blocks at a time (two streams) ran the cold decode
// linears of SmolLM2 at 17-19 GB/s on the AMD Zen 4 VM, one block with P = 2 at 24-25.
template <int BITS, int MB>
inline void block_rows(const uint8_t* rec, int64_t G, const int8_t* xh, const int8_t* xl, const float* ds,
                       const float* xs, int64_t K, float* out) {
  using S = BlockedIsa;
  using I = typename S::I;
  using F = typename S::F;
  constexpr int H = 16 / S::L;  // vectors per 16 channels
  constexpr bool SPLIT8 = BITS == 8 && !S::VNNI;  // 8-bit codes as two nibbles (VPMADDUBSW's exact range)
  constexpr int P = MB == 1 && S::L == 16 && !SPLIT8 ? 2 : 1;
  constexpr int64_t WB = weight_bytes(BITS), REC = record_bytes(BITS);
  F acc[MB][H];
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < H; ++h) acc[i][h] = S::fzero();
  for (int64_t g = 0; g < G; ++g, rec += REC) {
    // PREFETCH_RECORDS ahead: past the block's last group, into the next block (this thread's next)
    for (int64_t l = 0; l < REC; l += 64) __builtin_prefetch(rec + PREFETCH_RECORDS * REC + l);
    I ah[P][MB][H], al[P][MB][H], ah16[SPLIT8 ? MB : 1][H], al16[SPLIT8 ? MB : 1][H];
    for (int p = 0; p < P; ++p)
      for (int i = 0; i < MB; ++i)
        for (int h = 0; h < H; ++h) ah[p][i][h] = al[p][i][h] = S::izero();
    if constexpr (SPLIT8)
      for (int i = 0; i < MB; ++i)
        for (int h = 0; h < H; ++h) ah16[i][h] = al16[i][h] = S::izero();
    const int64_t xo = g * GS;
    // u: the codes of one 4-input run of 16 channels (a vector per h); x at xo + at; p: the chains
    auto run = [&](const I (&u)[H], int64_t at, int p) {
      for (int i = 0; i < MB; ++i) {
        const I bh = S::bcast4(xh + i * K + xo + at), bl = S::bcast4(xl + i * K + xo + at);
        for (int h = 0; h < H; ++h) {
          if constexpr (SPLIT8) {
            const I lo = S::lo4(u[h]), hi = S::hi4(u[h]);
            ah[p][i][h] = S::dot4(ah[p][i][h], lo, bh);
            al[p][i][h] = S::dot4(al[p][i][h], lo, bl);
            ah16[i][h] = S::dot4(ah16[i][h], hi, bh);
            al16[i][h] = S::dot4(al16[i][h], hi, bl);
          } else {
            ah[p][i][h] = S::dot4(ah[p][i][h], u[h], bh);
            al[p][i][h] = S::dot4(al[p][i][h], u[h], bl);
          }
        }
      }
    };
    if constexpr (BITS == 4) {
      for (int o = 0; o < 4; ++o) {
        I lo[H], hi[H];
        for (int h = 0; h < H; ++h) {
          const I v = S::load(rec + o * 64 + h * (64 / H));
          lo[h] = S::lo4(v);
          hi[h] = S::hi4(v);
        }
        run(lo, 8 * o, 0);
        run(hi, 8 * o + 4, P - 1);
      }
    } else {
      for (int o = 0; o < 8; ++o) {
        I u[H];
        for (int h = 0; h < H; ++h) u[h] = S::load(rec + o * 64 + h * (64 / H));
        run(u, 4 * o, o % P);
      }
    }
    const F k254 = S::set1(254.0f);
    const uint16_t* dm = reinterpret_cast<const uint16_t*>(rec + WB);
    for (int h = 0; h < H; ++h) {
      const F d = S::half(dm + h * S::L), m = S::half(dm + 16 + h * S::L);
      for (int i = 0; i < MB; ++i) {
        I sh = ah[0][i][h], sl = al[0][i][h];
        if constexpr (P == 2) {
          sh = S::add(sh, ah[1][i][h]);
          sl = S::add(sl, al[1][i][h]);
        }
        if constexpr (SPLIT8) {
          sh = S::add_x16(sh, ah16[i][h]);
          sl = S::add_x16(sl, al16[i][h]);
        }
        const F dot = S::fma(S::tof(sh), k254, S::tof(sl));  // in units of s / 254
        acc[i][h] = S::fma(dot, S::mul(d, S::set1(ds[i * G + g])), acc[i][h]);
        acc[i][h] = S::fma(m, S::set1(xs[i * G + g]), acc[i][h]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < H; ++h) S::store(out + i * 16 + h * S::L, acc[i][h]);
}
constexpr int MAX_MB = BlockedIsa::L == 16 ? 4 : 2;  // rows per pass: AVX2 has half the registers
#else
// Without AVX2: the same arithmetic, one lane at a time.
template <int BITS, int MB>
inline void block_rows(const uint8_t* rec, int64_t G, const int8_t* xh, const int8_t* xl, const float* ds,
                       const float* xs, int64_t K, float* out) {
  constexpr int64_t WB = weight_bytes(BITS), REC = record_bytes(BITS);
  for (int i = 0; i < MB * 16; ++i) out[i] = 0.0f;
  for (int64_t g = 0; g < G; ++g, rec += REC) {
    const uint16_t* dm = reinterpret_cast<const uint16_t*>(rec + WB);
    for (int j = 0; j < 16; ++j) {
      const float d = float(c10::Half(dm[j], c10::Half::from_bits()));
      const float m = float(c10::Half(dm[16 + j], c10::Half::from_bits()));
      for (int i = 0; i < MB; ++i) {
        const int64_t x0 = i * K + g * GS;
        int32_t sh = 0, sl = 0;
        for (int k = 0; k < GS; ++k) {
          const int u = BITS == 4 ? (rec[(k / 8) * 64 + 4 * j + k % 4] >> (k % 8 < 4 ? 0 : 4)) & 0x0F
                                  : rec[(k / 4) * 64 + 4 * j + k % 4];
          sh += u * xh[x0 + k];
          sl += u * xl[x0 + k];
        }
        out[i * 16 + j] += (float(sh) * 254.0f + float(sl)) * (d * ds[i * G + g]) + m * xs[i * G + g];
      }
    }
  }
}
constexpr int MAX_MB = 1;
#endif

template <int BITS, int MB>
inline void rows_pass(const uint8_t* rec, int64_t G, const QActs& a, int64_t m0, int64_t K, float* out) {
  block_rows<BITS, MB>(rec, G, a.xh.data() + m0 * K, a.xl.data() + m0 * K, a.ds.data() + m0 * G,
                            a.xs.data() + m0 * G, K, out);
}

bool use_amx(int64_t M) {
#if RADIXSERVE_BLOCKED_AMX
  return M >= AMX_MIN_ROWS && amx_mode.load() == 1 && radixserve_cpu::amx_permitted();
#else
  return false;
#endif
}

template <int BITS, typename T>
void blocked_impl(const QActs& a, const uint8_t* w, int64_t M, int64_t K, int64_t NB, T* y) {
  const int64_t G = K / GS, N = NB * 16, REC = record_bytes(BITS);
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const bool amx = use_amx(M);
  at::parallel_for(0, NB, (NB + threads - 1) / threads, [&](int64_t b0, int64_t b1) {
    float out[16 * 16];
    auto store = [&](int64_t b, int64_t m0, int64_t mb, const float* o) {
      for (int64_t i = 0; i < mb; ++i)
        for (int j = 0; j < 16; ++j) from_f(y + (m0 + i) * N + b * 16 + j, o[i * 16 + j]);
    };
#if RADIXSERVE_BLOCKED_AMX
    if (amx) {
      radixserve_cpu::blocked_amx_configure();
      for (int64_t b = b0; b < b1; ++b)
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
          radixserve_cpu::amx_block<BITS>(w + b * G * REC, G, a.xh.data() + m0 * K, a.xl.data() + m0 * K,
                                          a.ds.data() + m0 * G, a.xs.data() + m0 * G, K, out);
          store(b, m0, std::min<int64_t>(16, M - m0), out);
        }
      return;
    }
#endif
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* rec = w + b * G * REC;
      for (int64_t m0 = 0; m0 < M; m0 += MAX_MB) {
        const int64_t mb = std::min<int64_t>(MAX_MB, M - m0);
        switch (mb) {
#if RADIXSERVE_BLOCKED_SIMD
          case 4: rows_pass<BITS, (MAX_MB >= 4 ? 4 : 1)>(rec, G, a, m0, K, out); break;
          case 3: rows_pass<BITS, (MAX_MB >= 3 ? 3 : 1)>(rec, G, a, m0, K, out); break;
          case 2: rows_pass<BITS, 2>(rec, G, a, m0, K, out); break;
#endif
          default: rows_pass<BITS, 1>(rec, G, a, m0, K, out); break;
        }
        store(b, m0, mb, out);
      }
    }
  });
}

template <typename T>
void dispatch(const at::Tensor& x, const at::Tensor& w, int64_t bits, const float* in_scale, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), NB = w.size(0);
  const int64_t rows = use_amx(M) ? (M + 15) / 16 * 16 : M;
  const QActs a = quantize_acts(reinterpret_cast<const T*>(x.data_ptr()), in_scale, M, K, rows);
  T* yp = reinterpret_cast<T*>(y.data_ptr());
  if (bits == 4) {
    blocked_impl<4>(a, w.data_ptr<uint8_t>(), M, K, NB, yp);
  } else {
    blocked_impl<8>(a, w.data_ptr<uint8_t>(), M, K, NB, yp);
  }
}

at::Tensor blocked_linear(const at::Tensor& x, const at::Tensor& w, int64_t bits,
                          const std::optional<at::Tensor>& in_scale) {
  TORCH_CHECK(bits == 4 || bits == 8, "blocked_linear: bits must be 4 or 8");
  TORCH_CHECK(w.dim() == 3 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(2) == record_bytes(bits),
              "blocked_linear: w must be contiguous uint8 [N / 16, K / 32, ", record_bytes(bits), "]");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) == w.size(1) * GS,
              "blocked_linear: contiguous [M, K] x with K = 32 * w.size(1)");
  const float* is = nullptr;
  if (in_scale.has_value()) {
    TORCH_CHECK(in_scale->dim() == 1 && in_scale->is_contiguous() && in_scale->scalar_type() == at::kFloat &&
                    in_scale->size(0) == x.size(1),
                "blocked_linear: in_scale must be a contiguous fp32 [K]");
    is = in_scale->data_ptr<float>();
  }
  at::Tensor y = at::empty({x.size(0), w.size(0) * 16}, x.options());
  if (x.size(0) == 0) return y;
  if (x.scalar_type() == at::kFloat) {
    dispatch<float>(x, w, bits, is, y);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "blocked_linear: float32 or bfloat16 x");
    dispatch<uint16_t>(x, w, bits, is, y);
  }
  return y;
}

// n = 0 or 1 sets whether calls of AMX_MIN_ROWS rows or more use the AMX tiles; n < 0 only reads.
// Returns the mode in force: 1 only where the CPU and the OS allow the tiles.
int64_t blocked_amx_mode(int64_t n) {
  if (n >= 0) amx_mode.store(n > 0 ? 1 : 0);
#if RADIXSERVE_BLOCKED_AMX
  return amx_mode.load() == 1 && radixserve_cpu::amx_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("blocked_linear(Tensor x, Tensor w, int bits, Tensor? in_scale=None) -> Tensor", &blocked_linear);
  m.def("blocked_amx_mode(int n) -> int", &blocked_amx_mode);
}
