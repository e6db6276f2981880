// Online-softmax steps of the paged-attention kernel (included by paged_attention.cpp inside
// its anonymous namespace, after KB, NEG_INF and exp_le0).
#pragma once

// Online-softmax update of one row from its scores s[0..KB) (keys lo <= j < lim visible, lo < lim):
// turns s into probabilities and returns the factor the row's accumulated output must be scaled by.
inline float softmax_step(float* s, int64_t lo, int64_t lim, float& m, float& l) {
  float mloc = NEG_INF;
  for (int64_t j = lo; j < lim; ++j) mloc = std::max(mloc, s[j]);
  const float mnew = std::max(m, mloc);
  const float alpha = exp_le0(m - mnew);
  float psum = 0.0f;
#pragma omp simd reduction(+ : psum)
  for (int j = 0; j < KB; ++j) {
    const float p = j >= lo && j < lim ? exp_le0(s[j] - mnew) : 0.0f;
    s[j] = p;
    psum += p;
  }
  l = l * alpha + psum;
  m = mnew;
  return alpha;
}

// Vector forms of exp_le0 and of softmax_step for a 32-key tile held in two registers.
inline v16 vexp_le0(v16 x) {
  const v16 lo = v16{} - 87.0f;
  x = x < lo ? lo : x;
  const v16 shift = v16{} + 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest
  const v16 n = (x * 1.44269504088896341f + shift) - shift;
  const v16 p = radixserve_cpu::exp_reduced(x, n);
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}
inline float hmax(v16 v) {
  float mx = v[0];
  for (int i = 1; i < 16; ++i) mx = std::max(mx, v[i]);
  return mx;
}
inline float softmax_step_v(v16 s0, v16 s1, int64_t lo, int64_t lim, float& m, float& l, float* p_out) {
  const v16 idx0 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const v16 idx1 = idx0 + 16.0f;
  const v16 limv = v16{} + float(lim), lov = v16{} + float(lo), ninf = v16{} + NEG_INF, zero = v16{};
  const auto in0 = (idx0 < limv) & (idx0 >= lov), in1 = (idx1 < limv) & (idx1 >= lov);
  s0 = in0 ? s0 : ninf;
  s1 = in1 ? s1 : ninf;
  const float mnew = std::max(m, hmax(s0 > s1 ? s0 : s1));
  const float alpha = exp_le0(m - mnew);
  const v16 p0 = in0 ? vexp_le0(s0 - mnew) : zero;
  const v16 p1 = in1 ? vexp_le0(s1 - mnew) : zero;
  vstore(p_out, p0);
  vstore(p_out + 16, p1);
  l = l * alpha + hsum(p0 + p1);
  m = mnew;
  return alpha;
}
