// Attention over radixserve's paged KV pool on the CPU (compiled on first use by
// kernels/cpu_attention.py; the plan it runs is built by radixserve/attention/cpu_plan.py).
//
// A *task* is (request row, key range [ks, ke) of that row, entries [es, ee)).  Its keys are
// req_to_token[row, ks:ke] read straight from the pool in the pool's dtype (no gather copy,
// no dtype conversion of the context); an *entry* is one query token (entry_tok) attending to
// that key range causally (key position <= the token's position).  Requests that share
// leading KV slots get one task over the shared part whose entries are all their tokens, so
// the shared K/V is read once per step; long ranges may be split across tasks.  Each
// (task, KV head) writes, per entry and query head, the normalized partial output and its
// log-sum-exp; a second pass merges the entries of each token (online-softmax merge).
// The query heads of one KV head (GQA) share every K/V tile.  fp32 accumulation throughout.
// With AVX-512, key tiles are built with 16x16 transposes (attn_bf16.h); a bf16 pool runs the
// tiles of attn_bf16.h (pair-interleaved bf16 K/V tiles, exact fp32 FMAs, AMX tile products
// for blocks of >= 4 query rows where the CPU and the OS allow); run_task is the generic path.
// Per call, a layer's sliding window and logit soft-cap (attn_mods.h): a window masks the keys
// left of each query's window and skips the tiles left of every entry's window; a cap maps the
// scaled scores through cap * tanh(s / cap) before the online softmax.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "amx_tiles.h"
#include "common.h"
#include "kv_packed.h"
#include "vec.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int KB = 32;        // keys per tile
constexpr int32_t IOTA_SLOTS[KB] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
constexpr int MAX_ROWS = 128;  // query rows (entries x query heads of one KV head) per task
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
std::atomic<int64_t> g_bf16_mode{2};  // Args::bf16_mode, capped by what the build and the OS allow
std::atomic<int64_t> g_bf16_dot{0};   // Args::bf16_dot (attention_bf16_dot)

using radixserve_cpu::from_f;
using radixserve_cpu::KV;
using radixserve_cpu::hsum;
using radixserve_cpu::i32x16;
using radixserve_cpu::load16;
using radixserve_cpu::v16;
using radixserve_cpu::vload;
using radixserve_cpu::vstore;
using radixserve_cpu::to_f;
inline float exp_le0(float x) { return radixserve_cpu::exp_approx(x); }  // x <= 0 here

// What a layer's attention does beyond causal softmax(q.k * scale) (attn_mods.h).
struct ScoreMods {
  int64_t window = 0;                 // > 0: a query at position p sees keys > p - window only
  float cap = 0.0f, inv_cap = 0.0f;  // cap > 0: scaled scores s -> cap * tanh(s / cap)
};

struct Args {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* r2t;
  int64_t r2t_stride;
  const int32_t* tasks;
  const int32_t* entry_tok;
  const int64_t* pos;
  float* part_o;
  float* part_lse;
  int64_t H, Hkv, D;
  float scale;
  int64_t bf16_mode;  // bf16 pool: 0 the generic fp32 tiles, 1 the AVX-512 bf16 tiles, 2 those with AMX blocks
  int64_t bf16_dot;   // modes 1-2: blocks not on AMX use AVX512-BF16 dot products
  ScoreMods mods;
  int64_t row_stride;  // elements of the pool's buffers per (slot, KV head): D, or D + 4 packed bytes
  int64_t row_bytes;   // bytes of such a row
};

// Calls fn(r, src, p) for every query row of entries [es, ee) and KV head h (row r = i * G + g
// for entry i and query head g of the group), src its D values, p its position; returns the
// largest position.
template <typename T, typename F>
int64_t for_each_query(const Args& a, int64_t es, int64_t ee, int64_t h, int64_t D, F&& fn) {
  const T* q = static_cast<const T*>(a.q);
  const int64_t G = a.H / a.Hkv;
  int64_t maxp = -1;
  for (int64_t i = 0; i < ee - es; ++i) {
    const int64_t tok = a.entry_tok[es + i];
    const int64_t p = a.pos[tok];
    maxp = std::max(maxp, p);
    for (int64_t g = 0; g < G; ++g) fn(i * G + g, q + (tok * a.H + h * G + g) * D, p);
  }
  return maxp;
}

// Loads the query rows of a task (pre-scaled) and clears its accumulators; rows are padded to
// a multiple of RB with rows that see no key.  Returns the largest query position.
template <typename T>
int64_t load_queries(const Args& a, int64_t es, int64_t ee, int64_t h, int64_t D, int64_t rows_p, float* qf,
                     float* o, float* m, float* l, int64_t* qpos) {
  std::fill(qf, qf + rows_p * D, 0.0f);
  std::fill(o, o + rows_p * D, 0.0f);
  for (int64_t r = 0; r < rows_p; ++r) {
    m[r] = NEG_INF;
    l[r] = 0.0f;
    qpos[r] = -1;
  }
  return for_each_query<T>(a, es, ee, h, D, [&](int64_t r, const T* src, int64_t p) {
    for (int64_t d = 0; d < D; ++d) qf[r * D + d] = to_f(src[d]) * a.scale;
    qpos[r] = p;
  });
}

#include "attn_softmax.h"
#include "attn_mods.h"
#include "attn_prefetch.h"

constexpr int64_t DIRECT_ROWS = 4;
constexpr int64_t PREFETCH_KEYS = 16;  // keys ahead whose K/V rows are prefetched (slots are scattered)

// Both cache lines of a head's K or V row (<= 128 bytes for D = 64 in bf16; the first two
// lines otherwise: the hardware prefetcher follows within a row).
template <typename T>
inline void prefetch_row(const T* p) {
  __builtin_prefetch(p);
  __builtin_prefetch(reinterpret_cast<const char*>(p) + 64);
}

// The task's keys [ks, kend) for at most DIRECT_ROWS query rows: each K row is read from the
// pool once and dotted with every query row (a horizontal sum per key and row), each V row is
// read once and accumulated into every row; nothing is copied into a tile.
template <typename K, int DC>
void run_direct(const Args& a, const typename KV<K>::E* kbuf, const typename KV<K>::E* vbuf, const int32_t* slots,
                int64_t h, int64_t ks, int64_t kend, int64_t rows_p, const float* qf, float* o, float* m, float* l,
                const int64_t* qpos) {
  using R = KV<K>;
  using T = typename R::E;
  constexpr int64_t DV = DC / 16;
  const int64_t RS = a.row_stride;
  alignas(64) float s[DIRECT_ROWS][KB];
  v16 qv[DIRECT_ROWS][DV], acc[DIRECT_ROWS][DV];
  for (int64_t r = 0; r < rows_p; ++r)
    for (int64_t x = 0; x < DV; ++x) {
      qv[r][x] = vload(qf + r * DC + 16 * x);
      acc[r][x] = v16{};
    }
  for (int64_t kb = ks; kb < kend; kb += KB) {
    const int64_t n = std::min<int64_t>(KB, kend - kb);
    for (int64_t j = 0; j < n; ++j) {
      if (kb + j + PREFETCH_KEYS < kend) {
        const int64_t ahead = (int64_t(slots[kb + j + PREFETCH_KEYS]) * a.Hkv + h) * RS;
        prefetch_row(kbuf + ahead);
      }
      prefetch_row(vbuf + (int64_t(slots[kb + j]) * a.Hkv + h) * RS);  // read after this block's softmax
      const T* kp = kbuf + (int64_t(slots[kb + j]) * a.Hkv + h) * RS;
      v16 kv[DV];
      for (int64_t x = 0; x < DV; ++x) kv[x] = R::load(kp + 16 * x);
      for (int64_t r = 0; r < rows_p; ++r) {
        v16 d = qv[r][0] * kv[0];
        for (int64_t x = 1; x < DV; ++x) d += qv[r][x] * kv[x];
        s[r][j] = hsum(d);
      }
      if constexpr (R::packed) {  // the key's scale multiplies its scores
        const float sc = R::scale(kp, DC);
        for (int64_t r = 0; r < rows_p; ++r) s[r][j] *= sc;
      }
    }
    float alpha[DIRECT_ROWS];
    for (int64_t r = 0; r < rows_p; ++r) {
      const int64_t lim = std::min<int64_t>(n, qpos[r] - kb + 1), lo = key_lo(a.mods, qpos[r], kb);
      if (lim <= lo) {
        std::fill(s[r], s[r] + KB, 0.0f);
        alpha[r] = 1.0f;
      } else {
        if (a.mods.cap > 0.0f) softcap_row(s[r], a.mods);
        alpha[r] = softmax_step(s[r], lo, lim, m[r], l[r]);
      }
      for (int64_t x = 0; x < DV; ++x) acc[r][x] *= alpha[r];
    }
    for (int64_t j = 0; j < n; ++j) {
      const T* vp = vbuf + (int64_t(slots[kb + j]) * a.Hkv + h) * RS;
      v16 vv[DV];
      for (int64_t x = 0; x < DV; ++x) vv[x] = R::load(vp + 16 * x);
      const float vsc = R::scale(vp, DC);  // the value's scale multiplies its weights
      for (int64_t r = 0; r < rows_p; ++r) {
        const float pj = R::packed ? s[r][j] * vsc : s[r][j];
        for (int64_t x = 0; x < DV; ++x) acc[r][x] += pj * vv[x];
      }
    }
  }
  for (int64_t r = 0; r < rows_p; ++r)
    for (int64_t x = 0; x < DV; ++x) vstore(o + r * DC + 16 * x, acc[r][x]);
}

}  // namespace

namespace {
// A task's rows (entries es.., query head h * G + r % G) normalized into part_o / part_lse:
// o [rows, D] unnormalized, m / l the running max and sum per row.
inline void store_partials(const Args& a, int64_t es, int64_t h, int64_t G, int64_t rows, int64_t D, const float* o,
                           const float* m, const float* l) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t e = es + r / G, hh = h * G + r % G;
    float* dst = a.part_o + (e * a.H + hh) * D;
    if (l[r] > 0.0f) {
      const float inv = 1.0f / l[r];
      for (int64_t d = 0; d < D; ++d) dst[d] = o[r * D + d] * inv;
      a.part_lse[e * a.H + hh] = m[r] + std::log(l[r]);
    } else {  // no key of this range is visible to the token: weight 0 in the merge
      std::fill(dst, dst + D, 0.0f);
      a.part_lse[e * a.H + hh] = NEG_INF;
    }
  }
}

#include "attn_bf16.h"
#include "attn_avx2.h"

// T: the queries' element (float, or uint16_t for bf16); K: the pool's (T itself, or a packed
// format of kv_packed.h, whose rows are dequantized into the fp32 tiles).
template <typename T, typename K, int DC>
void run_task(const Args& a, int64_t task, int64_t h, float* ws) {
#ifdef RADIXSERVE_ATTN_AVX2
  if constexpr (std::is_same_v<T, float> && std::is_same_v<K, float> && DC > 0 && DC % 8 == 0) {
    run_task_avx2<DC>(a, task, h, ws);  // attn_avx2.h: the tiles below spill on AVX2
    return;
  }
#endif
  using R = KV<K>;
  using E = typename R::E;
  constexpr int64_t DV = DC / 16;  // 16-float vectors per row (DC > 0)
#ifdef __AVX512F__
  constexpr int64_t RB = DC == 128 ? 2 : 4;  // query rows per register block
#else
  constexpr int64_t RB = DC == 128 ? 1 : 2;
#endif
  const int64_t D = DC ? DC : a.D;
  const int64_t G = a.H / a.Hkv;
  const int32_t* t = a.tasks + task * 5;
  const int64_t row = t[0], ks = t[1], ke = t[2], es = t[3], ee = t[4];
  const int64_t rows = (ee - es) * G;
  const int64_t rb = DC ? RB : 1;
  const int64_t rows_p = (rows + rb - 1) / rb * rb;
  const E* kbuf = static_cast<const E*>(a.k);
  const E* vbuf = static_cast<const E*>(a.v);
  const int64_t RS = a.row_stride;
  float* __restrict qf = ws;                 // [rows_p, D]
  float* __restrict o = qf + MAX_ROWS * D;   // [rows_p, D], unnormalized output
  float* __restrict kt = o + MAX_ROWS * D;   // [D, KB], the key tile transposed
  float* __restrict vt = kt + D * KB;        // [KB, D]
  float* __restrict kd = vt + KB * D;        // [KB, D]: a packed pool's keys, dequantized, before the transpose
  float m[MAX_ROWS], l[MAX_ROWS];
  int64_t qpos[MAX_ROWS];
  const int64_t maxp = load_queries<T>(a, es, ee, h, D, rows_p, qf, o, m, l, qpos);
  const int32_t* slots = a.r2t + row * a.r2t_stride;
  const int64_t kend = std::min<int64_t>(ke, maxp + 1);
  const int64_t kfirst = first_key(a, ks, es, ee);
  alignas(64) float s[RB][KB];
  bool kend_done = false;
  if constexpr (DC > 0) {
    if (rows_p <= DIRECT_ROWS) {  // few query rows (decode): read K/V in place, no tiles
      run_direct<K, DC>(a, kbuf, vbuf, slots, h, kfirst, kend, rows_p, qf, o, m, l, qpos);
      kend_done = true;
    }
  }
  for (int64_t kb = kfirst; kb < kend && !kend_done; kb += KB) {
    const int64_t n = std::min<int64_t>(KB, kend - kb);
    bool kt_done = false;
#ifdef RADIXSERVE_ATTN_AVX512
    if constexpr (DC > 0 && !R::packed) {
      build_kt<T, DC>(kbuf, slots, kb, n, a.Hkv, h, kt);
      kt_done = true;
    }
#endif
    for (int64_t j = 0; j < n; ++j) {
      const int64_t off = (int64_t(slots[kb + j]) * a.Hkv + h) * RS;
      const E* kp = kbuf + off;
      const E* vp = vbuf + off;
      if (kb + j + PREFETCH_KEYS < kend) {
        const int64_t ahead = (int64_t(slots[kb + j + PREFETCH_KEYS]) * a.Hkv + h) * RS;
        prefetch_row(kbuf + ahead);
        prefetch_row(vbuf + ahead);
      }
      const float ksc = R::scale(kp, D), vsc = R::scale(vp, D);
      if constexpr (DC > 0) {
        if constexpr (R::packed) {
          for (int64_t x = 0; x < DC / 16; ++x) {
            vstore(kd + j * DC + 16 * x, R::load(kp + 16 * x) * ksc);
            vstore(vt + j * DC + 16 * x, R::load(vp + 16 * x) * vsc);
          }
        } else {
          for (int64_t x = 0; x < DC / 16; ++x) vstore(vt + j * DC + 16 * x, load16(vp + 16 * x));
        }
      } else {
        for (int64_t d = 0; d < D; ++d) vt[j * D + d] = R::at(vp, d) * vsc;
      }
      if (!kt_done && !(DC > 0 && R::packed))
        for (int64_t d = 0; d < D; ++d) kt[d * KB + j] = R::at(kp, d) * ksc;
    }
    if constexpr (DC > 0 && R::packed) {  // the dequantized keys, transposed as an fp32 pool's
#ifdef RADIXSERVE_ATTN_AVX512
      build_kt<float, DC>(kd, IOTA_SLOTS, 0, n, 1, 0, kt);
      kt_done = true;
#else
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) kt[d * KB + j] = kd[j * D + d];
#endif
    }
    for (int64_t j = n; j < KB; ++j) {
      if (!kt_done)
        for (int64_t d = 0; d < D; ++d) kt[d * KB + j] = 0.0f;
      for (int64_t d = 0; d < D; ++d) vt[j * D + d] = 0.0f;
    }
    if constexpr (DC > 0) {
      for (int64_t r0 = 0; r0 < rows_p; r0 += RB) {
        int64_t lim[RB], lo[RB];
        bool any = false;
        for (int64_t rr = 0; rr < RB; ++rr) {
          lim[rr] = std::min<int64_t>(n, qpos[r0 + rr] - kb + 1);
          lo[rr] = key_lo(a.mods, qpos[r0 + rr], kb);
          any |= lim[rr] > lo[rr];
        }
        if (!any) continue;
        v16 s0[RB], s1[RB];
#pragma GCC unroll 4
        for (int64_t rr = 0; rr < RB; ++rr) s0[rr] = s1[rr] = v16{};
        for (int64_t d = 0; d < DC; ++d) {
          const v16 k0 = vload(kt + d * KB), k1 = vload(kt + d * KB + 16);
#pragma GCC unroll 4
          for (int64_t rr = 0; rr < RB; ++rr) {
            const float qd = qf[(r0 + rr) * DC + d];
            s0[rr] += qd * k0;
            s1[rr] += qd * k1;
          }
        }
        float alpha[RB];
        for (int64_t rr = 0; rr < RB; ++rr) {
          if (lim[rr] <= lo[rr]) {
            vstore(s[rr], v16{});
            vstore(s[rr] + 16, v16{});
            alpha[rr] = 1.0f;
          } else {
            if (a.mods.cap > 0.0f) {
              s0[rr] = softcap_v(s0[rr], a.mods);
              s1[rr] = softcap_v(s1[rr], a.mods);
            }
            alpha[rr] = softmax_step_v(s0[rr], s1[rr], lo[rr], lim[rr], m[r0 + rr], l[r0 + rr], s[rr]);
          }
        }
        v16 acc[RB][DV];
#pragma GCC unroll 4
        for (int64_t rr = 0; rr < RB; ++rr)
#pragma GCC unroll 8
          for (int64_t x = 0; x < DV; ++x) acc[rr][x] = vload(o + (r0 + rr) * DC + 16 * x) * alpha[rr];
        for (int64_t j = 0; j < n; ++j) {
          v16 vr[DV];
#pragma GCC unroll 8
          for (int64_t x = 0; x < DV; ++x) vr[x] = vload(vt + j * DC + 16 * x);
#pragma GCC unroll 4
          for (int64_t rr = 0; rr < RB; ++rr) {
            const float pj = s[rr][j];
#pragma GCC unroll 8
            for (int64_t x = 0; x < DV; ++x) acc[rr][x] += pj * vr[x];
          }
        }
#pragma GCC unroll 4
        for (int64_t rr = 0; rr < RB; ++rr)
#pragma GCC unroll 8
          for (int64_t x = 0; x < DV; ++x) vstore(o + (r0 + rr) * DC + 16 * x, acc[rr][x]);
      }
    } else {  // any head size: one row at a time
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t lim = std::min<int64_t>(n, qpos[r] - kb + 1), lo = key_lo(a.mods, qpos[r], kb);
        if (lim <= lo) continue;
        float* sr = s[0];
        const float* qr = qf + r * D;
        std::fill(sr, sr + KB, 0.0f);
        for (int64_t d = 0; d < D; ++d) {
          const float qd = qr[d];
          const float* kr = kt + d * KB;
#pragma omp simd
          for (int j = 0; j < KB; ++j) sr[j] += qd * kr[j];
        }
        if (a.mods.cap > 0.0f) softcap_row(sr, a.mods);
        const float alpha = softmax_step(sr, lo, lim, m[r], l[r]);
        float* orow = o + r * D;
        for (int64_t d = 0; d < D; ++d) orow[d] *= alpha;
        for (int64_t j = lo; j < lim; ++j) {
          const float pj = sr[j];
          const float* vr = vt + j * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) orow[d] += pj * vr[d];
        }
      }
    }
  }
  store_partials(a, es, h, G, rows, D, o, m, l);
}

// Workers pull items (a task and a range of its KV heads) from a shared counter: tasks differ
// in cost, and the plan lists the costly ones first.  Over a bf16 pool a task whose rows fit
// the scratch for every KV head at once is one item for all its heads (run_task_bf16: each
// key's K/V rows of all heads read together), when there are enough tasks to keep the
// workers busy; otherwise each (task, KV head) is an item.
template <typename T, typename K, int DC>
void run_all(const Args& a, int64_t num_tasks) {
  constexpr bool bf16_pool = std::is_same_v<T, uint16_t> && std::is_same_v<K, uint16_t> && DC > 0;
  const int64_t D = DC ? DC : a.D;
  const int64_t ws_size = 3 * MAX_ROWS * D + 2 * KB * D + 16 * (D + 2 * KB);
  const int64_t G = a.H / a.Hkv;
  const int64_t threads = at::get_num_threads();
  bool bf16_tiles = false;
#ifdef RADIXSERVE_ATTN_BF16
  if constexpr (bf16_pool) bf16_tiles = a.bf16_mode >= 1;
#endif
  // items as (task, first KV head, KV heads)
  std::vector<int32_t> items;
  items.reserve(3 * num_tasks * a.Hkv);
  const bool group_heads = bf16_tiles && a.Hkv > 1 && num_tasks >= 2 * threads;
  for (int64_t i = 0; i < num_tasks; ++i) {
    const int32_t* t = a.tasks + i * 5;
    if (group_heads && (t[4] - t[3]) * G * a.Hkv <= MAX_ROWS) {
      items.insert(items.end(), {int32_t(i), 0, int32_t(a.Hkv)});
      continue;
    }
    for (int64_t h = 0; h < a.Hkv; ++h) items.insert(items.end(), {int32_t(i), int32_t(h), 1});
  }
  const int64_t n = int64_t(items.size()) / 3;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(threads, std::max<int64_t>(n, 1));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    // The thread's scratch persists across calls (OpenMP's threads do): a fresh zero-filled
    // vector here (120 KB for D = 64) was a malloc and a memset per worker and layer.
    thread_local std::vector<float> buf;
    if (buf.size() < size_t(ws_size + 16)) buf.resize(ws_size + 16);
    float* ws = buf.data() + (16 - (reinterpret_cast<uintptr_t>(buf.data()) / sizeof(float)) % 16) % 16;  // 64-byte aligned
    bool amx = false;
#ifdef RADIXSERVE_ATTN_AMX
    if constexpr (bf16_pool) {
      amx = a.bf16_mode >= 2 && amx_permitted();
      if (amx) amx_configure();
    }
#endif
    for (int64_t i = next++, j = 0; i < n; i = j) {
      j = next++;  // claimed now: its first keys load while item i runs
      if (j < n) prefetch_item(a, items[3 * j], items[3 * j + 1], items[3 * j + 2]);
      const int64_t task = items[3 * i], h0 = items[3 * i + 1], nh = items[3 * i + 2];
#ifdef RADIXSERVE_ATTN_BF16
      if constexpr (bf16_pool) {
        if (bf16_tiles) {
          run_task_bf16<DC>(a, task, h0, nh, ws, amx, a.bf16_dot != 0);
          continue;
        }
      }
#endif
      run_task<T, K, DC>(a, task, h0, ws);  // nh == 1 here
    }
#ifdef RADIXSERVE_ATTN_AMX
    if (amx) _tile_release();
#endif
  });
}

template <typename T>
void merge(const float* part_o, const float* part_lse, const int32_t* tok_ptr, const int32_t* tok_entries,
           T* out, int64_t num_tokens, int64_t H, int64_t D) {
  at::parallel_for(0, num_tokens, 16, [&](int64_t b, int64_t e) {
    std::vector<float> acc(D);
    for (int64_t t = b; t < e; ++t) {
      const int32_t first = tok_ptr[t], last = tok_ptr[t + 1];
      for (int64_t h = 0; h < H; ++h) {
        T* dst = out + (t * H + h) * D;
        if (last - first == 1) {
          const float* src = part_o + (int64_t(tok_entries[first]) * H + h) * D;
          for (int64_t d = 0; d < D; ++d) from_f(dst + d, src[d]);
          continue;
        }
        float mx = NEG_INF;
        for (int32_t k = first; k < last; ++k) mx = std::max(mx, part_lse[int64_t(tok_entries[k]) * H + h]);
        std::fill(acc.begin(), acc.end(), 0.0f);
        float wsum = 0.0f;
        for (int32_t k = first; k < last; ++k) {
          const int64_t ent = tok_entries[k];
          const float w = exp_le0(part_lse[ent * H + h] - mx);
          if (w == 0.0f) continue;
          const float* src = part_o + (ent * H + h) * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * src[d];
          wsum += w;
        }
        const float inv = 1.0f / wsum;
        for (int64_t d = 0; d < D; ++d) from_f(dst + d, acc[d] * inv);
      }
    }
  });
}

template <typename T, typename K>
void dispatch_dim(const Args& a, int64_t num_tasks) {
  if (a.D == 64) return run_all<T, K, 64>(a, num_tasks);
  if (a.D == 128) return run_all<T, K, 128>(a, num_tasks);
  run_all<T, K, 0>(a, num_tasks);
}

// T: the queries' element; kv_format (kv_packed.h): the pool's, T itself when exact.
template <typename T>
void dispatch(const Args& a, int64_t num_tasks, int64_t kv_format) {
  using namespace radixserve_cpu;
  switch (kv_format) {
    case KV_INT8: return dispatch_dim<T, QInt8>(a, num_tasks);
    case KV_FP8_E4M3: return dispatch_dim<T, QE4M3>(a, num_tasks);
    case KV_FP8_E5M2: return dispatch_dim<T, QE5M2>(a, num_tasks);
    default: return dispatch_dim<T, T>(a, num_tasks);
  }
}

void paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                     const at::Tensor& req_to_token, const at::Tensor& tasks, const at::Tensor& entry_tok,
                     const at::Tensor& positions, const at::Tensor& tok_ptr, const at::Tensor& tok_entries,
                     double scale, at::Tensor out, const c10::optional<at::Tensor>& part_o_in,
                     const c10::optional<at::Tensor>& part_lse_in, int64_t window, double softcap, int64_t kv_format) {
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.dim() == 3, "q [T,H,D], k/v [S,Hkv,D]");
  TORCH_CHECK(q.is_contiguous() && k_buf.is_contiguous() && v_buf.is_contiguous() && out.is_contiguous(),
              "paged_attention: q, k_buf, v_buf and out must be contiguous");
  TORCH_CHECK(kv_format >= radixserve_cpu::KV_EXACT && kv_format <= radixserve_cpu::KV_FP8_E5M2,
              "paged_attention: kv_format is 0 (exact), 1 (int8), 2 (fp8_e4m3) or 3 (fp8_e5m2)");
  const bool packed = kv_format != radixserve_cpu::KV_EXACT;
  TORCH_CHECK(q.scalar_type() == out.scalar_type() &&
                  (packed ? k_buf.scalar_type() == at::kByte && v_buf.scalar_type() == at::kByte
                          : q.scalar_type() == k_buf.scalar_type() && q.scalar_type() == v_buf.scalar_type()),
              "paged_attention: q and out share one dtype, and the pool's (uint8 packed rows when kv_format > 0)");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt && req_to_token.stride(1) == 1, "req_to_token: int32 rows");
  TORCH_CHECK(tasks.scalar_type() == at::kInt && tasks.is_contiguous() && tasks.size(1) == 5, "tasks: int32 [n, 5]");
  TORCH_CHECK(entry_tok.scalar_type() == at::kInt && tok_ptr.scalar_type() == at::kInt &&
                  tok_entries.scalar_type() == at::kInt && positions.scalar_type() == at::kLong,
              "paged_attention: int32 plan, int64 positions");
  TORCH_CHECK(window >= 0 && softcap >= 0.0, "paged_attention: window and softcap are >= 0 (0: none)");
  const int64_t H = q.size(1), D = q.size(2), Hkv = k_buf.size(1);
  const int64_t row_stride = packed ? D + 4 : D;
  TORCH_CHECK(H % Hkv == 0 && H / Hkv <= MAX_ROWS && k_buf.size(2) == row_stride && v_buf.size(2) == row_stride &&
                  v_buf.size(1) == Hkv && (!packed || D % 4 == 0),
              "paged_attention: head shapes (a packed row is head_dim + 4 bytes, head_dim % 4 == 0)");
  const int64_t num_entries = entry_tok.size(0), T = q.size(0), G = H / Hkv;
  TORCH_CHECK(tok_ptr.size(0) == T + 1 && tok_entries.size(0) == num_entries && positions.size(0) == T,
              "paged_attention: plan sizes do not match q");
  const int32_t* tp = tasks.data_ptr<int32_t>();
  for (int64_t i = 0; i < tasks.size(0); ++i, tp += 5) {  // a bad plan must raise, never read out of bounds
    TORCH_CHECK(tp[0] >= 0 && tp[0] < req_to_token.size(0) && tp[1] >= 0 && tp[1] <= tp[2] &&
                    tp[2] <= req_to_token.size(1) && tp[3] >= 0 && tp[3] <= tp[4] && tp[4] <= num_entries &&
                    (tp[4] - tp[3]) * G <= MAX_ROWS,
                "paged_attention: task ", i, " is out of range");
  }
  const int32_t* et = entry_tok.data_ptr<int32_t>();
  for (int64_t i = 0; i < num_entries; ++i) TORCH_CHECK(et[i] >= 0 && et[i] < T, "paged_attention: entry out of range");
  // The caller may pass the partial buffers with some entries already filled (dense groups,
  // radixserve/attention/cpu_plan.py): the tasks fill the others, the merge reads them all.
  TORCH_CHECK(part_o_in.has_value() == part_lse_in.has_value(), "paged_attention: part_o and part_lse go together");
  at::Tensor part_o, part_lse;
  if (part_o_in.has_value()) {
    part_o = *part_o_in;
    part_lse = *part_lse_in;
    TORCH_CHECK(part_o.scalar_type() == at::kFloat && part_o.is_contiguous() && part_o.dim() == 3 &&
                    part_o.size(0) == num_entries && part_o.size(1) == H && part_o.size(2) == D,
                "paged_attention: part_o must be contiguous fp32 [entries, H, D]");
    TORCH_CHECK(part_lse.scalar_type() == at::kFloat && part_lse.is_contiguous() && part_lse.dim() == 2 &&
                    part_lse.size(0) == num_entries && part_lse.size(1) == H,
                "paged_attention: part_lse must be contiguous fp32 [entries, H]");
  } else {
    part_o = at::empty({num_entries, H, D}, q.options().dtype(at::kFloat));
    part_lse = at::empty({num_entries, H}, q.options().dtype(at::kFloat));
  }
  Args a{q.data_ptr(), k_buf.data_ptr(), v_buf.data_ptr(), req_to_token.data_ptr<int32_t>(),
         req_to_token.stride(0), tasks.data_ptr<int32_t>(), entry_tok.data_ptr<int32_t>(),
         positions.data_ptr<int64_t>(), part_o.data_ptr<float>(), part_lse.data_ptr<float>(), H, Hkv, D,
         static_cast<float>(scale), g_bf16_mode.load(std::memory_order_relaxed),
         g_bf16_dot.load(std::memory_order_relaxed),
         ScoreMods{window, static_cast<float>(softcap), softcap > 0.0 ? static_cast<float>(1.0 / softcap) : 0.0f},
         row_stride, row_stride * int64_t(k_buf.element_size())};
  const int64_t num_tasks = tasks.size(0);
  if (q.scalar_type() == at::kFloat) {
    dispatch<float>(a, num_tasks, kv_format);
    merge<float>(a.part_o, a.part_lse, tok_ptr.data_ptr<int32_t>(), tok_entries.data_ptr<int32_t>(),
                 out.data_ptr<float>(), T, H, D);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "paged_attention: float32 or bfloat16");
    dispatch<uint16_t>(a, num_tasks, kv_format);
    merge<uint16_t>(a.part_o, a.part_lse, tok_ptr.data_ptr<int32_t>(), tok_entries.data_ptr<int32_t>(),
                    reinterpret_cast<uint16_t*>(out.data_ptr()), T, H, D);
  }
}

// The bf16-pool path (Args::bf16_mode: 0 generic fp32 tiles, 1 AVX-512 bf16 tiles, 2 with AMX
// blocks) for later calls, capped by what this build and the OS allow; returns the mode set.
// A negative mode changes nothing and returns the mode in effect.  Setting is for tests and
// benchmarks; the default is the best available.
int64_t attention_bf16_mode(int64_t mode) {
  if (mode < 0) {
    const int64_t cur = g_bf16_mode.load();
    return cur >= 2 ? attention_bf16_mode(cur) : cur;  // the default 2 is capped on first ask
  }
  int64_t best = 0;
#ifdef RADIXSERVE_ATTN_BF16
  best = 1;
#endif
#ifdef RADIXSERVE_ATTN_AMX
  if (amx_permitted()) best = 2;
#endif
  mode = std::max<int64_t>(0, std::min(mode, best));
  g_bf16_mode.store(mode);
  return mode;
}

// Whether bf16 blocks that do not run on AMX use AVX512-BF16 dot products (1) or widened fp32
// FMAs (0, the default), where this build has them; a negative value only asks.  Returns the
// setting in effect.
int64_t attention_bf16_dot(int64_t on) {
#ifdef RADIXSERVE_ATTN_BF16_DOT
  if (on >= 0) g_bf16_dot.store(on ? 1 : 0);
#else
  g_bf16_dot.store(0);
#endif
  return g_bf16_dot.load();
}

}  // namespace

TORCH_LIBRARY(radixserve_cpu, m) {
  // window: a sliding window of that many keys (0: none); softcap: the logit soft-cap (0: none);
  // kv_format: 0 the pool is in q's dtype, else packed rows (kv_packed.h: 1 int8, 2 fp8_e4m3, 3 fp8_e5m2)
  m.def("paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, Tensor tasks, Tensor entry_tok, "
        "Tensor positions, Tensor tok_ptr, Tensor tok_entries, float scale, Tensor out, Tensor? part_o, "
        "Tensor? part_lse, int window=0, float softcap=0.0, int kv_format=0) -> ()",
        &paged_attention);
  m.def("attention_bf16_mode", &attention_bf16_mode);
  m.def("attention_bf16_dot", &attention_bf16_dot);
}
