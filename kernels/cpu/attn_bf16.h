// AVX-512 / AMX tiles for the paged-attention kernel (included by paged_attention.cpp inside
// its anonymous namespace, after Args and the softmax helpers).
//
// build_kt (AVX-512F): run_task's fp32 key tile kt [D][32] from 16x16 dword transposes.
//
// run_task_bf16 (AVX-512BW, bf16 pools): per 32-key tile the K rows are transposed as dwords
// (a dword = two adjacent dims) into kt [D/2][32]: (d/2, j) = key j's (k[d], k[d+1]); the V rows
// of keys 2i and 2i+1 are interleaved (16-bit unpack) into vt [16][D/16] vectors of
// (v[2i][d], v[2i+1][d]) for 16 dims, in the dim order dim_of() gives (put back at the end).
// Blocks of query rows then run either
//  * row_block_avx on fp32 queries: each pair widened (shift, mask) to two fp32 vectors, fp32
//    FMAs: exact fp32 arithmetic (the pool's values are bf16); no per-key horizontal sums; or
//  * row_block_amx (AMX-BF16, >= AMX_MIN_ROWS rows, up to 16): kt and vt are already the
//    pair-interleaved B operands of TDPBF16PS; A is the bf16 queries (exact) for Q.K, then the
//    probabilities rounded to bf16 (relative 2^-9 per weight) for P.V; fp32 accumulation.
//  * row_block_avx on bf16 query pairs (AVX512-BF16): the same blocks on _mm512_dpbf16_ps, no
//    widening (Q.K exact, the probabilities rounded to bf16 pairs).  Slower than the widened
//    FMAs on the AMX Xeon (one per 2 cycles against two FMAs per cycle), faster on AMD Zen 4:
//    chosen by timing (worker/attention_timing.py, attention_bf16_dot).
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>
#define RADIXSERVE_ATTN_AVX512 1

inline __m512 as_m512(v16 v) {
  __m512 m;
  std::memcpy(&m, &v, sizeof(m));
  return m;
}
inline v16 as_v16(__m512 m) {
  v16 v;
  std::memcpy(&v, &m, sizeof(v));
  return v;
}

// In-register transpose of a 16x16 matrix of dwords: r[i] lane j -> r[j] lane i.
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // u[4k + c], 128-bit lane L: rows 4k..4k+3 of column 4L + c
    u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // 4x4 transpose of 128-bit lanes among u[c], u[4+c], u[8+c], u[12+c]
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// The K tile of run_task, kt [DC][KB] fp32 (dim-major), for keys kb..kb+n of KV head h:
// 16 keys at a time, 16x16 dword transposes of the rows as loaded (bf16: a dword is two
// adjacent dims, widened after the transpose by a shift and a mask).  Keys past n are zero.
template <typename T, int DC>
inline void build_kt(const T* kbuf, const int32_t* slots, int64_t kb, int64_t n, int64_t Hkv, int64_t h, float* kt) {
  constexpr int DPR = 64 / sizeof(T);  // dims per 64-byte load
  alignas(64) static const T zero_row[DC] = {};
  for (int half = 0; half < KB / 16; ++half) {
    if (16 * half >= n) {
      for (int d = 0; d < DC; ++d) _mm512_store_ps(kt + d * KB + 16 * half, _mm512_setzero_ps());
      continue;
    }
    const T* kp[16];
    for (int j = 0; j < 16; ++j) {
      const int64_t key = 16 * half + j;
      kp[j] = key < n ? kbuf + (int64_t(slots[kb + key]) * Hkv + h) * DC : zero_row;
    }
    for (int c = 0; c < DC / DPR; ++c) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(kp[j] + DPR * c);
      transpose16(r);
      if constexpr (sizeof(T) == 4) {
        for (int p = 0; p < 16; ++p) _mm512_store_si512(kt + (16 * c + p) * KB + 16 * half, r[p]);
      } else {  // r[p]: dims 32c + 2p (low half of each dword) and 32c + 2p + 1 (high half)
        const __m512i hi = _mm512_set1_epi32(int(0xFFFF0000u));
        for (int p = 0; p < 16; ++p) {
          _mm512_store_si512(kt + (32 * c + 2 * p) * KB + 16 * half, _mm512_slli_epi32(r[p], 16));
          _mm512_store_si512(kt + (32 * c + 2 * p + 1) * KB + 16 * half, _mm512_and_si512(r[p], hi));
        }
      }
    }
  }
}
#endif


#if defined(__AVX512BW__) && defined(__AVX512F__)
#define RADIXSERVE_ATTN_BF16 1

// The dim held by lane l of P.V accumulator x (16 dims per accumulator, see the header).
constexpr int dim_of(int x, int l) { return 32 * (x / 2) + 8 * (l / 4) + 4 * (x % 2) + l % 4; }

alignas(64) inline const uint16_t kZeroRow[128] = {};

// The keys [lo, lim) of a tile that fall in its 16-key half from key `base` (0 or 16), as lanes.
inline __mmask16 key_mask(int64_t lo, int64_t lim, int64_t base) {
  const uint32_t a = uint32_t(std::clamp<int64_t>(lo - base, 0, 16));
  const uint32_t b = uint32_t(std::clamp<int64_t>(lim - base, 0, 16));
  return __mmask16(((1u << b) - 1) & ~((1u << a) - 1));
}

// softmax_step_v with AVX-512 masks and reductions (scores s0: keys 0..15, s1: 16..31).
inline float softmax_step_512(__m512 s0, __m512 s1, int64_t lo, int64_t lim, float& m, float& l, float* p_out) {
  const __mmask16 k0 = key_mask(lo, lim, 0), k1 = key_mask(lo, lim, 16);
  const __m512 ninf = _mm512_set1_ps(NEG_INF);
  s0 = _mm512_mask_blend_ps(k0, ninf, s0);
  s1 = _mm512_mask_blend_ps(k1, ninf, s1);
  const float mnew = std::max(m, _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
  const __m512 mv = _mm512_set1_ps(mnew);
  const float alpha = _mm512_cvtss_f32(as_m512(vexp_le0(as_v16(_mm512_set1_ps(m - mnew)))));
  const __m512 p0 = _mm512_maskz_mov_ps(k0, as_m512(vexp_le0(as_v16(_mm512_sub_ps(s0, mv)))));
  const __m512 p1 = _mm512_maskz_mov_ps(k1, as_m512(vexp_le0(as_v16(_mm512_sub_ps(s1, mv)))));
  _mm512_store_ps(p_out, p0);
  _mm512_store_ps(p_out + 16, p1);
  l = l * alpha + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  m = mnew;
  return alpha;
}

// Keys [lo, lim) of the tile [kb, kb + n) each of NR query rows sees; false when none sees any.
template <int NR>
inline bool visible_keys(const int64_t* qpos, const ScoreMods& md, int64_t kb, int64_t n, int64_t* lo, int64_t* lim) {
  bool any = false;
  for (int rr = 0; rr < NR; ++rr) {
    lim[rr] = std::min<int64_t>(n, qpos[rr] - kb + 1);
    lo[rr] = key_lo(md, qpos[rr], kb);
    any |= lim[rr] > lo[rr];
  }
  return any;
}

// Q.K and P.V of one register block, exact fp32: each bf16 pair of kt / vt is widened (a
// shift and a mask) to two fp32 vectors; qf: NR fp32 query rows [NR][DC].
template <int DC, int NR>
inline void qk_block(const float* qf, const __m512i* kt, __m512* s0, __m512* s1) {
  const __m512i hi = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int p = 0; p < DC / 2; ++p) {
    const __m512 k0e = _mm512_castsi512_ps(_mm512_slli_epi32(kt[2 * p], 16));
    const __m512 k0o = _mm512_castsi512_ps(_mm512_and_si512(kt[2 * p], hi));
    const __m512 k1e = _mm512_castsi512_ps(_mm512_slli_epi32(kt[2 * p + 1], 16));
    const __m512 k1o = _mm512_castsi512_ps(_mm512_and_si512(kt[2 * p + 1], hi));
#pragma GCC unroll 4
    for (int rr = 0; rr < NR; ++rr) {
      const __m512 qe = _mm512_set1_ps(qf[rr * DC + 2 * p]), qo = _mm512_set1_ps(qf[rr * DC + 2 * p + 1]);
      s0[rr] = _mm512_fmadd_ps(k0e, qe, s0[rr]);
      s1[rr] = _mm512_fmadd_ps(k1e, qe, s1[rr]);
      s0[rr] = _mm512_fmadd_ps(k0o, qo, s0[rr]);
      s1[rr] = _mm512_fmadd_ps(k1o, qo, s1[rr]);
    }
  }
}

template <int DC, int NR>
inline void pv_block(const float (*pf)[KB], int64_t npairs, const __m512i* vt, __m512 (*acc)[DC / 16]) {
  constexpr int DV = DC / 16;
  const __m512i hi = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int64_t i = 0; i < npairs; ++i) {
#pragma GCC unroll 8
    for (int x = 0; x < DV; ++x) {
      const __m512 ve = _mm512_castsi512_ps(_mm512_slli_epi32(vt[i * DV + x], 16));  // key 2i
      const __m512 vo = _mm512_castsi512_ps(_mm512_and_si512(vt[i * DV + x], hi));    // key 2i + 1
#pragma GCC unroll 4
      for (int rr = 0; rr < NR; ++rr) {
        acc[rr][x] = _mm512_fmadd_ps(ve, _mm512_set1_ps(pf[rr][2 * i]), acc[rr][x]);
        acc[rr][x] = _mm512_fmadd_ps(vo, _mm512_set1_ps(pf[rr][2 * i + 1]), acc[rr][x]);
      }
    }
  }
}

#ifdef __AVX512BF16__
#define RADIXSERVE_ATTN_BF16_DOT 1
// The same on AVX512-BF16 dot products (VDPBF16PS), no widening: Q.K straight from the bf16
// query pairs q2 [NR][DC / 2] (exact products, fp32 sums), P.V with the probabilities rounded
// to bf16 pairs (relative 2^-9 per weight, as on AMX).  Faster than the widened FMAs on AMD
// Zen 4 and slower on the AMX Xeon, so worker/attention_timing.py times both and sets
// attention_bf16_dot.
template <int DC, int NR>
inline void qk_block(const uint32_t* q2, const __m512i* kt, __m512* s0, __m512* s1) {
  for (int p = 0; p < DC / 2; ++p) {
    const __m512bh k0 = (__m512bh)kt[2 * p], k1 = (__m512bh)kt[2 * p + 1];
#pragma GCC unroll 4
    for (int rr = 0; rr < NR; ++rr) {
      const __m512bh qp = (__m512bh)_mm512_set1_epi32(int(q2[rr * (DC / 2) + p]));
      s0[rr] = _mm512_dpbf16_ps(s0[rr], k0, qp);
      s1[rr] = _mm512_dpbf16_ps(s1[rr], k1, qp);
    }
  }
}

template <int DC, int NR>
inline void pv_block_dot(const float (*pf)[KB], int64_t npairs, const __m512i* vt, __m512 (*acc)[DC / 16]) {
  constexpr int DV = DC / 16;
  alignas(64) uint32_t pp[NR][KB / 2];  // probabilities as bf16 pairs (keys 2i, 2i + 1)
  for (int rr = 0; rr < NR; ++rr)
    _mm512_store_si512(pp[rr], (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(pf[rr] + 16), _mm512_load_ps(pf[rr])));
  for (int64_t i = 0; i < npairs; ++i) {
    __m512bh pv[NR];
#pragma GCC unroll 4
    for (int rr = 0; rr < NR; ++rr) pv[rr] = (__m512bh)_mm512_set1_epi32(int(pp[rr][i]));
#pragma GCC unroll 8
    for (int x = 0; x < DV; ++x) {
      const __m512bh vv = (__m512bh)vt[i * DV + x];
#pragma GCC unroll 4
      for (int rr = 0; rr < NR; ++rr) acc[rr][x] = _mm512_dpbf16_ps(acc[rr][x], vv, pv[rr]);
    }
  }
}
#endif

// NR query rows (o [NR][DC] accumulators in dim_of order, online-softmax state m, l) against
// one tile of n keys from key position kb (kt, vt as built by run_task_bf16).  Q is float
// (fp32 query rows: exact arithmetic) or uint32_t (bf16 query pairs: the dot products above).
template <int DC, int NR, typename Q>
inline void row_block_avx(const Q* q, float* o, float* m, float* l, const int64_t* qpos, int64_t kb, int64_t n,
                          const __m512i* kt, const __m512i* vt, __m512 scale, const ScoreMods& md) {
  int64_t lo[NR], lim[NR];
  if (!visible_keys<NR>(qpos, md, kb, n, lo, lim)) return;
  __m512 s0[NR], s1[NR];
  for (int rr = 0; rr < NR; ++rr) s0[rr] = s1[rr] = _mm512_setzero_ps();
  qk_block<DC, NR>(q, kt, s0, s1);
  alignas(64) float pf[NR][KB];
  float alpha[NR];
  for (int rr = 0; rr < NR; ++rr) {
    if (lim[rr] <= lo[rr]) {
      _mm512_store_ps(pf[rr], _mm512_setzero_ps());
      _mm512_store_ps(pf[rr] + 16, _mm512_setzero_ps());
      alpha[rr] = 1.0f;
      continue;
    }
    __m512 t0 = _mm512_mul_ps(s0[rr], scale), t1 = _mm512_mul_ps(s1[rr], scale);
    if (md.cap > 0.0f) {
      t0 = as_m512(softcap_v(as_v16(t0), md));
      t1 = as_m512(softcap_v(as_v16(t1), md));
    }
    alpha[rr] = softmax_step_512(t0, t1, lo[rr], lim[rr], m[rr], l[rr], pf[rr]);
  }
  __m512 acc[NR][DC / 16];
#pragma GCC unroll 4
  for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 8
    for (int x = 0; x < DC / 16; ++x)
      acc[rr][x] = _mm512_mul_ps(_mm512_loadu_ps(o + rr * DC + 16 * x), _mm512_set1_ps(alpha[rr]));
  const int64_t npairs = (n + 1) / 2;
#ifdef RADIXSERVE_ATTN_BF16_DOT
  if constexpr (std::is_same_v<Q, uint32_t>)
    pv_block_dot<DC, NR>(pf, npairs, vt, acc);
  else
#endif
    pv_block<DC, NR>(pf, npairs, vt, acc);
#pragma GCC unroll 4
  for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 8
    for (int x = 0; x < DC / 16; ++x) _mm512_storeu_ps(o + rr * DC + 16 * x, acc[rr][x]);
}

// All query rows from r0 of a tile in register blocks of RB rows (GQA 3: one block of 3 last).
template <int DC, int RB, typename Q>
inline void row_blocks(const Q* q, int64_t r0, int64_t rows, float* o, float* m, float* l, const int64_t* qpos,
                       int64_t kb, int64_t n, const __m512i* kt, const __m512i* vt, __m512 scale,
                       const ScoreMods& md) {
  constexpr int QS = std::is_same_v<Q, uint32_t> ? DC / 2 : DC;  // a query row's stride
  for (; r0 + RB <= rows; r0 += RB)
    row_block_avx<DC, RB>(q + r0 * QS, o + r0 * DC, m + r0, l + r0, qpos + r0, kb, n, kt, vt, scale, md);
  switch (rows - r0) {
    case 1: row_block_avx<DC, 1>(q + r0 * QS, o + r0 * DC, m + r0, l + r0, qpos + r0, kb, n, kt, vt, scale, md); break;
    case 2: row_block_avx<DC, 2>(q + r0 * QS, o + r0 * DC, m + r0, l + r0, qpos + r0, kb, n, kt, vt, scale, md); break;
    case 3: row_block_avx<DC, 3>(q + r0 * QS, o + r0 * DC, m + r0, l + r0, qpos + r0, kb, n, kt, vt, scale, md); break;
    default: break;
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
// AMX (Sapphire Rapids and later) for blocks of up to 16 query rows: Q.K and P.V as
// TDPBF16PS tile products (bf16 inputs, fp32 accumulation).  kt rows (a dim pair, 16 keys)
// and vt rows (a key pair, 16 dims) are already the pair-interleaved B layout the
// instruction wants; A is the bf16 query rows, then the probabilities rounded to bf16
// (relative 2^-9 per weight; Q and K stay exact).  Linux gives a process the tile state only
// after arch_prctl(ARCH_REQ_XCOMP_PERM); without it the AVX-512 blocks run instead.
#define RADIXSERVE_ATTN_AMX 1
using radixserve_cpu::amx_permitted;  // amx_tiles.h

inline constexpr radixserve_cpu::TileConfig ATTN_TILES = {  // tiles 0..7 all 16 rows x 64 bytes
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
inline void amx_configure() { _tile_loadconfig(&ATTN_TILES); }  // per thread

// nr <= 16 query rows (qb: bf16 rows of DC, readable for 16 rows) against one tile of n keys
// from key position kb; sb: scratch of 16 x (DC + KB) floats + 16 x KB bf16.
template <int DC>
inline void row_block_amx(const uint16_t* qb, int nr, float* o, float* m, float* l, const int64_t* qpos, int64_t kb,
                          int64_t n, const __m512i* kt, const __m512i* vt, __m512 scale, float* sb,
                          const ScoreMods& md) {
  constexpr int DV = DC / 16;
  int64_t lo[16], lim[16];
  bool any = false;
  for (int rr = 0; rr < nr; ++rr) {
    lim[rr] = std::min<int64_t>(n, qpos[rr] - kb + 1);
    lo[rr] = key_lo(md, qpos[rr], kb);
    any |= lim[rr] > lo[rr];
  }
  if (!any) return;
  float* S = sb;                                        // [16][KB] scores
  float* PV = S + 16 * KB;                              // [16][DC] this tile's P.V, dims as dim_of
  uint16_t* P = reinterpret_cast<uint16_t*>(PV + 16 * DC);  // [16][KB] bf16 probabilities
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < DC / 32; ++c) {  // 32 dims (16 pairs) per step
    _tile_loadd(2, qb + 32 * c, DC * 2);
    _tile_loadd(4, kt + 32 * c, 128);      // pairs 16c.., keys 0..15
    _tile_loadd(5, kt + 32 * c + 1, 128);  // keys 16..31
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 2, 5);
  }
  _tile_stored(0, S, KB * 4);
  _tile_stored(1, S + 16, KB * 4);
  if (md.cap > 0.0f) {  // S becomes the capped scaled scores: the steps below then scale by 1
    for (int rr = 0; rr < nr; ++rr)
      for (int i = 0; i < KB; i += 16)
        _mm512_store_ps(S + rr * KB + i,
                        as_m512(softcap_v(as_v16(_mm512_mul_ps(_mm512_load_ps(S + rr * KB + i), scale)), md)));
    scale = _mm512_set1_ps(1.0f);
  }
  // Online softmax of the 16 rows: the tile maxima first, then one vector exp for every row's
  // rescaling factor, then the probabilities (bf16, into P).
  alignas(64) float mold[16], mnew[16], alpha[16];
  __mmask16 k0[16], k1[16];
  for (int rr = 0; rr < 16; ++rr) {
    mold[rr] = mnew[rr] = 0.0f;
    if (rr >= nr || lim[rr] <= lo[rr]) continue;
    k0[rr] = key_mask(lo[rr], lim[rr], 0);
    k1[rr] = key_mask(lo[rr], lim[rr], 16);
    const __m512 ninf = _mm512_set1_ps(NEG_INF);
    const __m512 s0 = _mm512_mask_blend_ps(k0[rr], ninf, _mm512_mul_ps(_mm512_load_ps(S + rr * KB), scale));
    const __m512 s1 = _mm512_mask_blend_ps(k1[rr], ninf, _mm512_mul_ps(_mm512_load_ps(S + rr * KB + 16), scale));
    mold[rr] = m[rr];
    mnew[rr] = std::max(m[rr], _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
  }
  _mm512_store_ps(alpha, as_m512(vexp_le0(as_v16(_mm512_sub_ps(_mm512_load_ps(mold), _mm512_load_ps(mnew))))));
  for (int rr = 0; rr < 16; ++rr) {
    if (rr >= nr || lim[rr] <= lo[rr]) {
      _mm512_store_si512(P + rr * KB, _mm512_setzero_si512());
      alpha[rr] = 1.0f;
      continue;
    }
    const __m512 mv = _mm512_set1_ps(mnew[rr]);
    const __m512 p0 = _mm512_maskz_mov_ps(k0[rr], as_m512(vexp_le0(as_v16(_mm512_fmsub_ps(_mm512_load_ps(S + rr * KB), scale, mv)))));
    const __m512 p1 =
        _mm512_maskz_mov_ps(k1[rr], as_m512(vexp_le0(as_v16(_mm512_fmsub_ps(_mm512_load_ps(S + rr * KB + 16), scale, mv)))));
    l[rr] = l[rr] * alpha[rr] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
    m[rr] = mnew[rr];
    _mm512_store_si512(P + rr * KB, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
  }
  _tile_loadd(4, P, KB * 2);
  for (int x0 = 0; x0 < DV; x0 += 4) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(5, vt + x0, DV * 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, vt + x0 + 1, DV * 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, vt + x0 + 2, DV * 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, vt + x0 + 3, DV * 64);
    _tile_dpbf16ps(3, 4, 5);
    _tile_stored(0, PV + 16 * x0, DC * 4);
    _tile_stored(1, PV + 16 * (x0 + 1), DC * 4);
    _tile_stored(2, PV + 16 * (x0 + 2), DC * 4);
    _tile_stored(3, PV + 16 * (x0 + 3), DC * 4);
  }
  for (int rr = 0; rr < nr; ++rr) {
    const __m512 al = _mm512_set1_ps(alpha[rr]);
    for (int x = 0; x < DV; ++x)
      _mm512_storeu_ps(o + rr * DC + 16 * x, _mm512_fmadd_ps(_mm512_loadu_ps(o + rr * DC + 16 * x), al,
                                                             _mm512_load_ps(PV + rr * DC + 16 * x)));
  }
}
#endif

// The tiles of run_task_bf16 for KV head h and keys [kb, kb + n) (of a task's keys up to kend):
// kt [NP][2], the K rows transposed as dwords (two 16-key halves, NP/16 transposes of 16
// dwords per key), and vt [16][DV], the V rows of key pairs interleaved.  Keys past n are
// zero.  Prefetches the next tile's K rows.
template <int DC>
inline void build_tiles_bf16(const Args& a, const int32_t* slots, int64_t kb, int64_t n, int64_t kend, int64_t h,
                             __m512i* __restrict kt, __m512i* __restrict vt) {
  constexpr int NP = DC / 2;
  constexpr int DV = DC / 16;
  const uint16_t* kbuf = static_cast<const uint16_t*>(a.k);
  const uint16_t* vbuf = static_cast<const uint16_t*>(a.v);
  for (int half = 0; half < 2; ++half) {
    const uint16_t* kp[16];
    for (int j = 0; j < 16; ++j) {
      const int64_t key = kb + 16 * half + j;
      kp[j] = key < kb + n ? kbuf + (int64_t(slots[key]) * a.Hkv + h) * DC : kZeroRow;
      if (key + KB < kend) prefetch_k_row(a, slots[key + KB], h);
    }
    if (16 * half >= n) {
      for (int p = 0; p < NP; ++p) kt[2 * p + half] = _mm512_setzero_si512();
      continue;
    }
    for (int c = 0; c < NP / 16; ++c) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(kp[j] + 32 * c);
      transpose16(r);
      for (int p = 0; p < 16; ++p) kt[2 * (16 * c + p) + half] = r[p];
    }
  }
  const int64_t npairs = (n + 1) / 2;
  for (int64_t i = 0; i < npairs; ++i) {
    const uint16_t* v0 = vbuf + (int64_t(slots[kb + 2 * i]) * a.Hkv + h) * DC;
    const uint16_t* v1 = 2 * i + 1 < n ? vbuf + (int64_t(slots[kb + 2 * i + 1]) * a.Hkv + h) * DC : kZeroRow;
    for (int c = 0; c < DC / 32; ++c) {
      const __m512i x0 = _mm512_loadu_si512(v0 + 32 * c), x1 = _mm512_loadu_si512(v1 + 32 * c);
      vt[i * DV + 2 * c] = _mm512_unpacklo_epi16(x0, x1);
      vt[i * DV + 2 * c + 1] = _mm512_unpackhi_epi16(x0, x1);
    }
  }
  for (int64_t i = npairs * DV; i < 16 * DV; ++i) vt[i] = _mm512_setzero_si512();
}

// KV heads [h0, h0 + nh) of one task over a bf16 pool, head dim DC (64 or 128); per head the
// same contract as run_task.  Each head's query rows occupy their own span of the scratch
// (nh x rows <= MAX_ROWS).  Per 32-key tile the heads run one after another, so a key's K and
// V rows of every head (adjacent in the pool) are read together: one (task, head) at a time
// read 128 of every 384 bytes (SmolLM2, bf16) and a plain read of that pattern ran at half the
// speed of the contiguous one.  use_amx: the thread's tiles are configured (amx_configure);
// blocks of at least AMX_MIN_ROWS query rows then go to row_block_amx.  use_dot: the other
// blocks run on dot products.
constexpr int64_t AMX_MIN_ROWS = 4;
template <int DC>
void run_task_bf16(const Args& a, int64_t task, int64_t h0, int64_t nh, float* ws, bool use_amx, bool use_dot) {
  constexpr int NP = DC / 2;   // dim pairs (dwords) per row
  constexpr int DV = DC / 16;  // P.V accumulators per row
  constexpr int RB = DC == 128 ? 2 : 4;  // query rows per register block
  const int64_t G = a.H / a.Hkv;
  const int32_t* t = a.tasks + task * 5;
  const int64_t row = t[0], ks = t[1], ke = t[2], es = t[3], ee = t[4];
  const int64_t rows = (ee - es) * G;  // per head
  uint32_t* __restrict q2 = reinterpret_cast<uint32_t*>(ws);  // [nh * rows (+16 padding), NP] query pairs
  float* __restrict o = ws + (MAX_ROWS + 16) * NP;            // [nh * rows, DC], dims as dim_of
  __m512i* __restrict kt = reinterpret_cast<__m512i*>(o + MAX_ROWS * DC);  // [NP][2]
  __m512i* __restrict vt = kt + 2 * NP;                                    // [16][DV]
  float* __restrict qf = reinterpret_cast<float*>(vt + 16 * DV);            // [nh * rows, DC] fp32 queries
  float* __restrict sb = qf + MAX_ROWS * DC;  // scratch of row_block_amx
  float m[MAX_ROWS], l[MAX_ROWS];
  int64_t qpos[MAX_ROWS];
  int64_t maxp = -1;
  for (int64_t hi = 0; hi < nh; ++hi) {
    const int64_t base = hi * rows;
    maxp = for_each_query<uint16_t>(a, es, ee, h0 + hi, DC, [&](int64_t r, const uint16_t* src, int64_t p) {
      std::memcpy(q2 + (base + r) * NP, src, DC * sizeof(uint16_t));
      if (!use_dot)  // the fp32 queries of the widened-FMA blocks (the dot-product and AMX blocks read q2)
        for (int d = 0; d < DC; ++d) qf[(base + r) * DC + d] = to_f(src[d]);
      qpos[base + r] = p;
      m[base + r] = NEG_INF;
      l[base + r] = 0.0f;
    });
  }
  std::fill(o, o + nh * rows * DC, 0.0f);
  const int32_t* slots = a.r2t + row * a.r2t_stride;
  const int64_t kend = std::min<int64_t>(ke, maxp + 1);
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t kb = first_key(a, ks, es, ee); kb < kend; kb += KB) {
    const int64_t n = std::min<int64_t>(KB, kend - kb);
    for (int64_t hi = 0; hi < nh; ++hi) {
      const int64_t h = h0 + hi, base = hi * rows;
      build_tiles_bf16<DC>(a, slots, kb, n, kend, h, kt, vt);
      float* ob = o + base * DC;
      int64_t r0 = 0;
#ifdef RADIXSERVE_ATTN_AMX
      if (use_amx) {
        for (; rows - r0 >= AMX_MIN_ROWS; r0 += 16)
          row_block_amx<DC>(reinterpret_cast<const uint16_t*>(q2 + (base + r0) * NP),
                            int(std::min<int64_t>(16, rows - r0)), ob + r0 * DC, m + base + r0, l + base + r0,
                            qpos + base + r0, kb, n, kt, vt, scale, sb, a.mods);
        r0 = std::min(r0, rows);
      }
#endif
#ifdef RADIXSERVE_ATTN_BF16_DOT
      if (use_dot) {
        row_blocks<DC, RB>(q2 + base * NP, r0, rows, ob, m + base, l + base, qpos + base, kb, n, kt, vt, scale,
                           a.mods);
        continue;
      }
#endif
      row_blocks<DC, RB>(qf + base * DC, r0, rows, ob, m + base, l + base, qpos + base, kb, n, kt, vt, scale,
                         a.mods);
    }
  }
  for (int64_t r = 0; r < nh * rows; ++r) {
    const int64_t hi = r / rows, rr = r % rows;
    const int64_t e = es + rr / G, hh = (h0 + hi) * G + rr % G;
    float* dst = a.part_o + (e * a.H + hh) * DC;
    if (l[r] > 0.0f) {
      const float inv = 1.0f / l[r];
      const float* orow = o + r * DC;
      const __m512 iv = _mm512_set1_ps(inv);
      // back to dim order (dim_of): dims 32c.. are 4-lane groups of accumulators 2c and 2c + 1, alternately
      const __m512i lo_half = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
      const __m512i hi_half = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
      for (int c = 0; c < DC / 32; ++c) {
        const __m512 a0 = _mm512_loadu_ps(orow + 32 * c), a1 = _mm512_loadu_ps(orow + 32 * c + 16);
        _mm512_storeu_ps(dst + 32 * c, _mm512_mul_ps(_mm512_permutex2var_ps(a0, lo_half, a1), iv));
        _mm512_storeu_ps(dst + 32 * c + 16, _mm512_mul_ps(_mm512_permutex2var_ps(a0, hi_half, a1), iv));
      }
      a.part_lse[e * a.H + hh] = m[r] + std::log(l[r]);
    } else {  // no key of this range is visible to the token: weight 0 in the merge
      std::fill(dst, dst + DC, 0.0f);
      a.part_lse[e * a.H + hh] = NEG_INF;
    }
  }
}
#endif
