// Sliding windows and logit soft-capping in the paged-attention kernel (included by
// paged_attention.cpp inside its anonymous namespace, after KB, Args and vexp_le0).
//
// A layer's ScoreMods (Hugging Face's semantics): with a window W > 0, a query at position p
// sees the keys at positions p - W + 1 .. p only; with a cap c > 0, its scaled scores s become
// c * tanh(s / c) before the mask and the softmax.  Per 32-key tile a query row sees the keys
// [lo, lim) of the tile (lo = 0 without a window, lim the causal end), and a task starts at its
// entries' first visible key (first_key): keys left of every entry's window are never read.
// Plain layers (window 0, cap 0) take exactly the arithmetic they took before.
#pragma once

// The first key of the tile starting at key position kb that a query at position p sees
// under the window (0 without one; lim computes the causal end).
inline int64_t key_lo(const ScoreMods& md, int64_t p, int64_t kb) {
  return md.window > 0 ? std::max<int64_t>(0, p - md.window + 1 - kb) : 0;
}

// The first key position from ks that one of the entries [es, ee) sees: ks without a window.
inline int64_t first_key(const Args& a, int64_t ks, int64_t es, int64_t ee) {
  if (a.mods.window <= 0) return ks;
  int64_t minp = std::numeric_limits<int64_t>::max();
  for (int64_t e = es; e < ee; ++e) minp = std::min(minp, a.pos[a.entry_tok[e]]);
  return std::max(ks, minp - a.mods.window + 1);
}

// tanh to about one ulp: an odd polynomial (fitted to tanh(x) / x in x^2 on [0, 0.625^2])
// below |x| = 0.625, (1 - e) / (1 + e) with e = exp(-2|x|) above, where nothing cancels.
inline v16 vtanh(v16 x) {
  i32x16 bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const i32x16 sign = bits & int32_t(0x80000000u);
  const i32x16 abits = bits & int32_t(0x7FFFFFFF);
  v16 ax;
  std::memcpy(&ax, &abits, sizeof(ax));
  const v16 u = x * x;
  v16 p = v16{} - 5.659988616e-03f;
  p = p * u + 2.059098706e-02f;
  p = p * u - 5.372106656e-02f;
  p = p * u + 1.333112717e-01f;
  p = p * u - 3.333325982e-01f;
  p = p * u + 1.0f;
  const v16 small = x * p;
  const v16 e = vexp_le0(ax * -2.0f);
  const v16 big_abs = (1.0f - e) / (1.0f + e);
  i32x16 big_bits;
  std::memcpy(&big_bits, &big_abs, sizeof(big_bits));
  big_bits |= sign;
  v16 big;
  std::memcpy(&big, &big_bits, sizeof(big));
  const v16 threshold = v16{} + 0.625f;
  return ax < threshold ? small : big;
}

// cap * tanh(s / cap) for 16 scaled scores (md.cap > 0).
inline v16 softcap_v(v16 s, const ScoreMods& md) { return vtanh(s * md.inv_cap) * md.cap; }

// The same in place over a tile's KB scores of one row.
inline void softcap_row(float* s, const ScoreMods& md) {
  for (int i = 0; i < KB; i += 16) vstore(s + i, softcap_v(vload(s + i), md));
}
