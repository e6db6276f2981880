// The fp32 attention task for CPUs with AVX2 and FMA but no AVX-512 (included by
// paged_attention.cpp inside its anonymous namespace, after run_direct).
//
// Why a path of its own: the generic tiles use 16-float GCC vectors, which GCC 12 lowers on
// AVX2 through the stack (each of the tile loops' arrays of such vectors was spilled and
// rebuilt with 128-bit inserts; perf showed most of run_task's time in those moves).  On the
// development AMD EPYC (Zen 3, AVX2 only) that made the kernel 9 to 14 times slower than
// torch's flash attention on prompts and 3.3 GB/s on decode.
//
// Here every vector is an __m256 held in registers, and nothing is transposed: per 32-key block
// each query row dots its keys straight from the pool, four keys at a time (one hadd tree
// turns the four partial vectors into four scores), takes the online-softmax step of the
// generic path (softmax_step), then adds its probability-weighted V rows, also read in place.
// A block's K/V rows (8 KB each for D = 64) stay in L1 across the task's rows; the next block's
// rows are prefetched.  Same results as the generic path up to the order of the sums.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define RADIXSERVE_ATTN_AVX2 1

// The four dot products sum(a_i) (a_i: 8 partial sums each) as [d0, d1, d2, d3].
inline __m128 hsum4_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Scores of keys [lo, lim) of a block for one query row (qv: the row, DV vectors), into s.
template <int DV>
inline void scores_avx2(const __m256* qv, const float* const* kp, int64_t lo, int64_t lim, float* s) {
  int64_t j = lo;
  for (; j + 4 <= lim; j += 4) {
    __m256 a0 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kp[j]));
    __m256 a1 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kp[j + 1]));
    __m256 a2 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kp[j + 2]));
    __m256 a3 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kp[j + 3]));
#pragma GCC unroll 16
    for (int x = 1; x < DV; ++x) {
      a0 = _mm256_fmadd_ps(qv[x], _mm256_loadu_ps(kp[j] + 8 * x), a0);
      a1 = _mm256_fmadd_ps(qv[x], _mm256_loadu_ps(kp[j + 1] + 8 * x), a1);
      a2 = _mm256_fmadd_ps(qv[x], _mm256_loadu_ps(kp[j + 2] + 8 * x), a2);
      a3 = _mm256_fmadd_ps(qv[x], _mm256_loadu_ps(kp[j + 3] + 8 * x), a3);
    }
    _mm_storeu_ps(s + j, hsum4_avx2(a0, a1, a2, a3));
  }
  for (; j < lim; ++j) {
    __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kp[j]));
#pragma GCC unroll 16
    for (int x = 1; x < DV; ++x) a = _mm256_fmadd_ps(qv[x], _mm256_loadu_ps(kp[j] + 8 * x), a);
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    s[j] = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  }
}

// o[0..8*DV) = o * alpha + sum over keys [lo, lim) of p[j] * V row j, in chunks of 8 vectors.
template <int DV>
inline void weighted_values_avx2(float* o, float alpha, const float* const* vp, const float* p, int64_t lo,
                                 int64_t lim) {
  constexpr int C = DV < 8 ? DV : 8;  // accumulators held at once
  const __m256 al = _mm256_set1_ps(alpha);
  for (int c = 0; c < DV; c += C) {
    __m256 acc[C];
#pragma GCC unroll 8
    for (int x = 0; x < C; ++x) acc[x] = _mm256_mul_ps(_mm256_loadu_ps(o + 8 * (c + x)), al);
    for (int64_t j = lo; j < lim; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const float* v = vp[j] + 8 * c;
#pragma GCC unroll 8
      for (int x = 0; x < C; ++x) acc[x] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * x), acc[x]);
    }
#pragma GCC unroll 8
    for (int x = 0; x < C; ++x) _mm256_storeu_ps(o + 8 * (c + x), acc[x]);
  }
}

// run_task for an fp32 pool and fp32 queries, DC a multiple of 8: the same task, the same
// partial outputs (part_o, part_lse).
template <int DC>
void run_task_avx2(const Args& a, int64_t task, int64_t h, float* ws) {
  static_assert(DC % 8 == 0, "head dim a multiple of 8");
  constexpr int DV = DC / 8;
  const int64_t G = a.H / a.Hkv;
  const int32_t* t = a.tasks + task * 5;
  const int64_t row = t[0], ks = t[1], ke = t[2], es = t[3], ee = t[4];
  const int64_t rows = (ee - es) * G;
  const float* kbuf = static_cast<const float*>(a.k);
  const float* vbuf = static_cast<const float*>(a.v);
  const int64_t RS = a.row_stride;
  float* __restrict qf = ws;                // [rows, DC]
  float* __restrict o = qf + MAX_ROWS * DC;  // [rows, DC], unnormalized output
  float m[MAX_ROWS], l[MAX_ROWS];
  int64_t qpos[MAX_ROWS];
  const int64_t maxp = load_queries<float>(a, es, ee, h, DC, rows, qf, o, m, l, qpos);
  const int32_t* slots = a.r2t + row * a.r2t_stride;
  const int64_t kend = std::min<int64_t>(ke, maxp + 1);
  const int64_t kfirst = first_key(a, ks, es, ee);
  const float* kp[KB];
  const float* vp[KB];
  alignas(64) float s[KB];
  std::fill(s, s + KB, 0.0f);
  for (int64_t kb = kfirst; kb < kend; kb += KB) {
    const int64_t n = std::min<int64_t>(KB, kend - kb);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t off = (int64_t(slots[kb + j]) * a.Hkv + h) * RS;
      kp[j] = kbuf + off;
      vp[j] = vbuf + off;
    }
    const int64_t next = std::min<int64_t>(KB, kend - kb - KB);  // the next block's rows, while this one runs
    for (int64_t j = 0; j < next; ++j) {
      const int64_t off = (int64_t(slots[kb + KB + j]) * a.Hkv + h) * RS;
      for (int64_t b = 0; b < DC * 4; b += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(kbuf + off) + b);
        __builtin_prefetch(reinterpret_cast<const char*>(vbuf + off) + b);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t lim = std::min<int64_t>(n, qpos[r] - kb + 1), lo = key_lo(a.mods, qpos[r], kb);
      if (lim <= lo) continue;  // no key of this block is visible to the row
      __m256 qv[DV];
#pragma GCC unroll 16
      for (int x = 0; x < DV; ++x) qv[x] = _mm256_loadu_ps(qf + r * DC + 8 * x);
      scores_avx2<DV>(qv, kp, lo, lim, s);
      if (a.mods.cap > 0.0f) softcap_row(s, a.mods);
      const float alpha = softmax_step(s, lo, lim, m[r], l[r]);
      weighted_values_avx2<DV>(o + r * DC, alpha, vp, s, lo, lim);
    }
  }
  store_partials(a, es, h, G, rows, DC, o, m, l);
}

#endif  // AVX2 without AVX-512
