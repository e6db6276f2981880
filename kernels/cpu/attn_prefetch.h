// Software prefetch of K/V rows for the paged-attention kernel (included by paged_attention.cpp
// inside its anonymous namespace, after Args and KB).
//
// At decode shapes (one query token per request, ~30-600 keys) a (task, KV head) does little
// arithmetic and its K/V rows are scattered over the pool and cold (a decode step streams the
// model's weights between two layers): the kernel waits on memory.  Measured on the AMX Xeon
// (2 threads, SmolLM2 heads, bf16 pool, 30 layers in turn with 512 MB read between passes):
// batch 64 x 40 keys took 250 us a layer cold against 95 us hot.  So:
//  * prefetch_rows: every line of a head's K and V rows (128 bytes for D = 64 in bf16, 256 or
//    512 otherwise; the spatial prefetcher does not reliably bring a row's second line), and
//  * prefetch_item: the first keys of the item (a task's KV heads) a worker will run next, issued
//    before it runs the current one, so the next item's first tile is on its way meanwhile.
// Prefetches never fault and change no result: they only move lines into the cache.
#pragma once

constexpr int64_t PREFETCH_ITEM_KEYS = 2 * KB;  // keys of the next item prefetched ahead

// Every cache line of KV head h's row at pool slot `slot` in `buf` (a.k or a.v; a.row_bytes).
inline void prefetch_head_row(const Args& a, const void* buf, int64_t slot, int64_t h) {
  const int64_t bytes = a.row_bytes;
  const char* p = static_cast<const char*>(buf) + (slot * a.Hkv + h) * bytes;
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// The K and V rows of KV head h at pool slot `slot`.
inline void prefetch_rows(const Args& a, int64_t slot, int64_t h) {
  prefetch_head_row(a, a.k, slot, h);
  prefetch_head_row(a, a.v, slot, h);
}

// The K row alone (the bf16 tiles' next-tile prefetch).  Measured on AMD Zen 4, decode at
// batch 32 x 300 keys, 30 layers cold, in one run: prefetching the K and V rows ran at 8.6
// GB/s, K alone at 10.5 (the V rows come in while the tile's Q.K runs).
inline void prefetch_k_row(const Args& a, int64_t slot, int64_t h) {
  prefetch_head_row(a, a.k, slot, h);
}

// The first keys of an item (KV heads [h0, h0 + nh) of a task): PREFETCH_ITEM_KEYS rows in all.
inline void prefetch_item(const Args& a, int64_t task, int64_t h0, int64_t nh) {
  const int32_t* t = a.tasks + task * 5;
  const int32_t* slots = a.r2t + int64_t(t[0]) * a.r2t_stride;
  const int64_t end = std::min<int64_t>(t[2], t[1] + PREFETCH_ITEM_KEYS / nh);
  for (int64_t j = t[1]; j < end; ++j)
    for (int64_t h = h0; h < h0 + nh; ++h) prefetch_rows(a, slots[j], h);
}
