// Fused elementwise ops for the CPU decode step (see radixserve/model/fused_ops.py): each
// replaces a chain of small torch ops (and their dispatch and temporaries) with one pass.
// Math in fp32; bf16 results are rounded at the same points as the torch ops they replace.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

using radixserve_cpu::exp_approx;
using radixserve_cpu::from_f;
using radixserve_cpu::to_f;
inline float round_as(float x, float*) { return x; }
inline float round_as(float x, uint16_t*) {  // the value as the output dtype stores it
  uint16_t b;
  from_f(&b, x);
  return to_f(b);
}

template <typename T>
T* ptr(const at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }

// out = weight * round(in * rsqrt(mean(in^2) + eps)) over one row of dim (out may be in).
template <typename T, typename R>
inline void norm_row(T* out, const R* in, const T* w, int64_t dim, double eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t d = 0; d < dim; ++d) {
    const float v = to_f(in[d]);
    ss += v * v;
  }
  const float inv = 1.0f / std::sqrt(ss / float(dim) + float(eps));
  for (int64_t d = 0; d < dim; ++d) from_f(out + d, to_f(w[d]) * round_as(to_f(in[d]) * inv, out));
}

// residual = x + residual (if add); x = weight * round(residual * rsqrt(mean(residual^2) + eps)).
// The residual stream R may be fp32 under a bf16 x (T): a bf16 model keeps it in fp32.
template <typename T, typename R = T>
void add_rms_norm_impl(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps, bool add) {
  const int64_t rows = x.size(0), dim = x.size(1);
  T* xp = ptr<T>(x);
  R* rp = ptr<R>(residual);
  const T* wp = ptr<T>(weight);
  at::parallel_for(0, rows, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      T* xr = xp + i * dim;
      R* rr = rp + i * dim;
      if (add) {
        for (int64_t d = 0; d < dim; ++d) from_f(rr + d, to_f(xr[d]) + to_f(rr[d]));
      }
      norm_row(xr, rr, wp, dim, eps);
    }
  });
}

void add_rms_norm(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.is_contiguous() && x.sizes() == residual.sizes(),
              "add_rms_norm: contiguous [tokens, hidden] x and residual");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() &&
                  (residual.scalar_type() == x.scalar_type() || residual.scalar_type() == at::kFloat),
              "add_rms_norm: x and weight of one dtype, residual of it or float32");
  if (x.scalar_type() == at::kFloat) return add_rms_norm_impl<float>(x, residual, weight, eps, true);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "add_rms_norm: float32 or bfloat16");
  if (residual.scalar_type() == at::kFloat) return add_rms_norm_impl<uint16_t, float>(x, residual, weight, eps, true);
  add_rms_norm_impl<uint16_t>(x, residual, weight, eps, true);
}

// out = rms_norm(x) (x unchanged)
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == weight.scalar_type(), "rms_norm: [tokens, hidden]");
  at::Tensor out = at::empty_like(x);
  at::Tensor src = x;  // add=false: reads residual (x), writes out
  if (x.scalar_type() == at::kFloat) {
    add_rms_norm_impl<float>(out, src, weight, eps, false);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "rms_norm: float32 or bfloat16");
    add_rms_norm_impl<uint16_t>(out, src, weight, eps, false);
  }
  return out;
}

// One head of rotate-half rotary over its first 2 * half dims (a partial rotary leaves the rest
// as they are): dst = (x1 cos - x2 sin, x2 cos + x1 sin) for src = (x1, x2, rest), rounded to T;
// dst may be src (in place), else the D - 2 * half unrotated dims are copied.  rope_ and
// rope_store_kv share it, so both round alike.
template <typename T>
inline void rotate_half(const T* src, T* dst, const float* c, const float* s, int64_t half, int64_t D) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = to_f(src[i]), x2 = to_f(src[i + half]);
    from_f(dst + i, x1 * c[i] - x2 * s[i]);
    from_f(dst + i + half, x2 * c[i + half] + x1 * s[i + half]);
  }
  if (dst != src && D > 2 * half) std::memcpy(dst + 2 * half, src + 2 * half, sizeof(T) * (D - 2 * half));
}

// In place, rotate-half: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, for q [T, H, D] and
// k [T, Hkv, D] (rows may be strided views of the fused qkv output); cos/sin fp32 [P, R] with
// R <= D (R < D: a partial rotary of the first R dims).
template <typename T>
void rope_impl(at::Tensor& q, at::Tensor& k, const at::Tensor& positions, const at::Tensor& cos,
               const at::Tensor& sin) {
  const int64_t tokens = q.size(0), D = q.size(2), R = cos.size(1), half = R / 2;
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* c = cp + pos[t] * R;
      const float* s = sp + pos[t] * R;
      for (at::Tensor* x : {&q, &k}) {
        T* base = ptr<T>(*x) + t * x->stride(0);
        for (int64_t h = 0; h < x->size(1); ++h)
          rotate_half(base + h * x->stride(1), base + h * x->stride(1), c, s, half, D);
      }
    }
  });
}

void rope_(at::Tensor q, at::Tensor k, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1 && q.stride(1) == q.size(2) &&
                  k.stride(1) == k.size(2) && q.scalar_type() == k.scalar_type(),
              "rope_: q [T,H,D], k [T,Hkv,D] with contiguous heads");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous() && positions.scalar_type() == at::kLong && cos.size(1) <= q.size(2) &&
                  cos.size(1) % 2 == 0,
              "rope_: fp32 cos/sin tables [P, R <= D], int64 positions");
  if (q.scalar_type() == at::kFloat) return rope_impl<float>(q, k, positions, cos, sin);
  TORCH_CHECK(q.scalar_type() == at::kBFloat16, "rope_: float32 or bfloat16");
  rope_impl<uint16_t>(q, k, positions, cos, sin);
}

// The attention prologue of a step in one pass: for qkv [T, (H + 2 Hkv) D] (= [q | k | v] per
// token, last dim contiguous), q_out[t] = rope(q), k_buf[loc[t]] = rope(k), v_buf[loc[t]] = v,
// with the same rounding as rope_ in place followed by index_copy_ into the pool.
template <typename T>
void rope_store_kv_impl(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
                        const at::Tensor& sin, at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& loc,
                        at::Tensor& q_out) {
  const int64_t tokens = qkv.size(0), H = q_out.size(1), D = q_out.size(2), R = cos.size(1), half = R / 2;
  const int64_t hkv = k_buf.size(1), row_stride = qkv.stride(0), slot = k_buf.stride(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* lp = loc.data_ptr<int64_t>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const T* in = ptr<T>(qkv);
  T* qo = ptr<T>(q_out);
  T* kb = ptr<T>(k_buf);
  T* vb = ptr<T>(v_buf);
  at::parallel_for(0, tokens, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* c = cp + pos[t] * R;
      const float* s = sp + pos[t] * R;
      const T* row = in + t * row_stride;
      for (int64_t h = 0; h < H; ++h) rotate_half(row + h * D, qo + (t * H + h) * D, c, s, half, D);
      for (int64_t h = 0; h < hkv; ++h) rotate_half(row + (H + h) * D, kb + lp[t] * slot + h * D, c, s, half, D);
      std::memcpy(vb + lp[t] * slot, row + (H + hkv) * D, sizeof(T) * hkv * D);
    }
  });
}

void rope_store_kv(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                   at::Tensor k_buf, at::Tensor v_buf, const at::Tensor& loc, at::Tensor q_out) {
  TORCH_CHECK(q_out.dim() == 3 && q_out.is_contiguous() && k_buf.dim() == 3 && k_buf.is_contiguous() &&
                  v_buf.is_contiguous() && v_buf.sizes() == k_buf.sizes() && k_buf.size(2) == q_out.size(2),
              "rope_store_kv: contiguous q_out [T,H,D] and k_buf/v_buf [S,Hkv,D]");
  const int64_t tokens = q_out.size(0), width = (q_out.size(1) + 2 * k_buf.size(1)) * q_out.size(2);
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(0) == tokens && qkv.size(1) == width && qkv.stride(1) == 1,
              "rope_store_kv: qkv [T, (H + 2 Hkv) D] with a contiguous last dim");
  TORCH_CHECK(qkv.scalar_type() == q_out.scalar_type() && qkv.scalar_type() == k_buf.scalar_type() &&
                  qkv.scalar_type() == v_buf.scalar_type(),
              "rope_store_kv: qkv, q_out and the pool in one dtype");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.size(1) <= q_out.size(2) && cos.size(1) % 2 == 0 &&
                  positions.scalar_type() == at::kLong &&
                  loc.scalar_type() == at::kLong && positions.numel() == tokens && loc.numel() == tokens &&
                  positions.is_contiguous() && loc.is_contiguous(),
              "rope_store_kv: fp32 cos/sin tables [P, R <= D], int64 positions and loc [T]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* lp = loc.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {  // checked up front: the parallel loop must not throw
    TORCH_CHECK(lp[t] >= 0 && lp[t] < k_buf.size(0), "rope_store_kv: slot ", lp[t], " out of range");
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "rope_store_kv: position ", pos[t], " out of range");
  }
  if (qkv.scalar_type() == at::kFloat) return rope_store_kv_impl<float>(qkv, positions, cos, sin, k_buf, v_buf, loc, q_out);
  TORCH_CHECK(qkv.scalar_type() == at::kBFloat16, "rope_store_kv: float32 or bfloat16");
  rope_store_kv_impl<uint16_t>(qkv, positions, cos, sin, k_buf, v_buf, loc, q_out);
}

// In place over the fused projection qkv [T, (H + 2 Hkv) D] (last dim contiguous): each query head
// x = q_w * round(normalize(x)), each key head with k_w, as rms_norm rounds (Qwen 3's q/k norms).
template <typename T>
void rms_norm_heads_impl(at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w, int64_t H, int64_t hkv,
                         double eps) {
  const int64_t tokens = qkv.size(0), D = q_w.size(0), row_stride = qkv.stride(0);
  T* base = ptr<T>(qkv);
  const T* qw = ptr<T>(q_w);
  const T* kw = ptr<T>(k_w);
  at::parallel_for(0, tokens, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      for (int64_t h = 0; h < H + hkv; ++h) {
        T* x = base + t * row_stride + h * D;
        norm_row(x, x, h < H ? qw : kw, D, eps);
      }
    }
  });
}

void rms_norm_heads_(at::Tensor qkv, const at::Tensor& q_w, const at::Tensor& k_w, int64_t H, int64_t hkv,
                     double eps) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && q_w.dim() == 1 && q_w.sizes() == k_w.sizes() &&
                  q_w.is_contiguous() && k_w.is_contiguous() && qkv.size(1) == (H + 2 * hkv) * q_w.size(0) &&
                  qkv.scalar_type() == q_w.scalar_type() && qkv.scalar_type() == k_w.scalar_type(),
              "rms_norm_heads_: qkv [T, (H + 2 Hkv) D], q_w and k_w [D], one dtype");
  if (qkv.scalar_type() == at::kFloat) return rms_norm_heads_impl<float>(qkv, q_w, k_w, H, hkv, eps);
  TORCH_CHECK(qkv.scalar_type() == at::kBFloat16, "rms_norm_heads_: float32 or bfloat16");
  rms_norm_heads_impl<uint16_t>(qkv, q_w, k_w, H, hkv, eps);
}

// The gated activations: silu(x) = x sigmoid(x); gelu_tanh(x) = 0.5 x (1 + tanh(y)) = x sigmoid(2y)
// with y = sqrt(2 / pi) (x + 0.044715 x^3) (GeGLU, Gemma's MLP).
struct Silu {
  static inline float f(float x) { return x / (1.0f + exp_approx(-x)); }
};
struct GeluTanh {
  static inline float f(float x) {
    const float y = 0.7978845608f * (x + 0.044715f * x * x * x);
    return x / (1.0f + exp_approx(-2.0f * y));
  }
};

// [T, 2I] (gate | up) -> [T, I]: round(act(gate)) * up
template <typename Act, typename T>
void act_mul_impl(const at::Tensor& gu, at::Tensor& out) {
  const int64_t tokens = gu.size(0), inter = out.size(1);
  const T* in = ptr<T>(gu);
  T* op = ptr<T>(out);
  at::parallel_for(0, tokens * inter, 4096, [&](int64_t b, int64_t e) {
    int64_t t = b / inter, i = b % inter;
    for (int64_t n = b; n < e;) {
      const int64_t stop = std::min<int64_t>(inter, i + (e - n));
      const T* g = in + t * 2 * inter;
      T* o = op + t * inter;
#pragma omp simd
      for (int64_t j = i; j < stop; ++j) from_f(o + j, round_as(Act::f(to_f(g[j])), o) * to_f(g[inter + j]));
      n += stop - i;
      i = 0;
      ++t;
    }
  });
}

template <typename Act>
at::Tensor act_mul(const at::Tensor& gate_up, const char* name) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, name, ": [T, 2I]");
  at::Tensor out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat) {
    act_mul_impl<Act, float>(gate_up, out);
  } else {
    TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16, name, ": float32 or bfloat16");
    act_mul_impl<Act, uint16_t>(gate_up, out);
  }
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) { return act_mul<Silu>(gate_up, "silu_mul"); }
at::Tensor gelu_tanh_mul(const at::Tensor& gate_up) { return act_mul<GeluTanh>(gate_up, "gelu_tanh_mul"); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("add_rms_norm", &add_rms_norm);
  m.def("rms_norm", &rms_norm);
  m.def("rope_", &rope_);
  m.def("rope_store_kv", &rope_store_kv);
  m.def("silu_mul", &silu_mul);
  m.def("rms_norm_heads_", &rms_norm_heads_);
  m.def("gelu_tanh_mul", &gelu_tanh_mul);
}
