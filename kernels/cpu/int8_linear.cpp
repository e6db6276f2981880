// Weight-only int8 linear for the few rows of a decode step (see radixserve/model/quant.py):
//   y[m, n] = scale[n] * sum_k x[m, k] * q[n, k]      (the caller adds a bias)
// q is int8 [N, K] (per-output-channel symmetric), x fp32 or bf16 [M, K], y in x's dtype.
// An optional fp32 in_scale [K] multiplies x's columns first (the layer's 1 / input-channel
// scale, model/quant.py), in fp32 while x is widened: no separate op, no rounding to x's dtype.
// A [N, K / 32] scale instead holds one scale per 32 inputs of each channel (the LM head's
// format: per-channel int8 cost it 2 points of argmax agreement on SmolLM2, groups of 32 none):
//   y[m, n] = sum_c scale[n, c] * sum_{k in chunk c} x[m, k] * q[n, k]
// Nothing is dequantized to memory; blocks of NB output channels share every load of x and
// MB rows of x share every widened weight vector; threads split the output channels.
//
// Two inner products, the first where the CPU has AVX-512BW and K % 64 == 0:
//  * int16: x is rounded to int16 per group of 64 inputs (scale = max|x| / 32767 over the
//    group: an error under 2^-15 of the group's largest value, well below bf16's own
//    rounding), the weights are widened to int16 and multiplied exactly into int32 lanes
//    (VPDPWSSD with AVX512-VNNI, else VPMADDWD + VPADDD; no overflow: 4 products per lane per
//    group), and each group's sums are scaled into fp32 accumulators;
//  * fp32: each weight is widened to fp32 in registers (exact) and multiplied in fp32.
// Measured (benchmarks/README.md): torch's _weight_int8pack_mm and _weight_int4pack_mm run
// these decode shapes well below this kernel's rate on the development machine.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common.h"
#include "vec.h"
#include "acts_i16.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace {

#if defined(__AVX512BW__)
using radixserve_cpu::dot_i16;  // the int16 inner product exists only with AVX-512BW
#endif
using radixserve_cpu::from_f;
using radixserve_cpu::G;
using radixserve_cpu::HAVE_I16;
using radixserve_cpu::quantize_i16;
using radixserve_cpu::hsum;
using radixserve_cpu::load16;
using radixserve_cpu::to_f;
using radixserve_cpu::v16;
using radixserve_cpu::vload;

// Cold weights stream at ~7 GB/s per thread on the hardware prefetcher alone (measured on
// the development machine); each block also prefetches the block PREFETCH_BLOCKS ahead.
constexpr int64_t PREFETCH_BLOCKS = 2;

constexpr int64_t WG = 32;  // inputs per weight scale in the grouped format

// Where a block's weight scales are: per channel (applied by the caller), or grouped: ws[j *
// groups + c] for input chunk c of WG inputs of channel n + j.
struct WScales {
  const float* ws;  // nullptr: per channel
  int64_t groups;   // K / WG
};

// out[i * NB + j] = x[i] . q[n + j] (times the grouped weight scales) for i < MB, j < NB
// (K % 16 == 0; K % WG == 0 when grouped)
template <int MB, int NB>
inline void dot_block(const float* x, int64_t K, const int8_t* q, WScales w8, float* out) {
  v16 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = v16{};
  const char* ahead = reinterpret_cast<const char*>(q) + PREFETCH_BLOCKS * NB * K;
  const int64_t step = w8.ws != nullptr ? WG : K;
  for (int64_t k0 = 0; k0 < K; k0 += step) {
    v16 part[MB][NB];
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j) part[i][j] = v16{};
    for (int64_t k = k0; k < k0 + step; k += 16) {
      if (k % 64 == 0)
        for (int j = 0; j < NB; ++j) __builtin_prefetch(ahead + (k / 64 * NB + j) * 64);
      v16 w[NB];
      for (int j = 0; j < NB; ++j) w[j] = load16(q + j * K + k);
      for (int i = 0; i < MB; ++i) {
        const v16 xv = vload(x + i * K + k);
        for (int j = 0; j < NB; ++j) part[i][j] += xv * w[j];
      }
    }
    for (int j = 0; j < NB; ++j) {
      const float s = w8.ws != nullptr ? w8.ws[j * w8.groups + k0 / WG] : 1.0f;
      for (int i = 0; i < MB; ++i) acc[i][j] += part[i][j] * s;
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) out[i * NB + j] = hsum(acc[i][j]);
}

#if defined(__AVX512BW__)

// out[i * NB + j] = sum over groups g of xs[i][g] * (xi[i][group g] . q[n + j][group g]),
// each WG-chunk's product also scaled by its grouped weight scale when w8.ws is set
template <int MB, int NB>
inline void dot_block_i16(const int16_t* x, const float* xs, int64_t K, const int8_t* q, WScales w8, float* out) {
  const int64_t groups = K / G;
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(q) + PREFETCH_BLOCKS * NB * K;
  const int64_t step = w8.ws != nullptr ? WG : G;  // inputs summed in int32 before scaling
  for (int64_t g = 0; g < groups; ++g) {
    for (int j = 0; j < NB; ++j) __builtin_prefetch(ahead + (g * NB + j) * 64);
    for (int64_t k0 = g * G; k0 < (g + 1) * G; k0 += step) {
      __m512i part[MB][NB];
      for (int i = 0; i < MB; ++i)
        for (int j = 0; j < NB; ++j) part[i][j] = _mm512_setzero_si512();
      for (int64_t k = k0; k < k0 + step; k += 32) {
        __m512i w[NB];
        for (int j = 0; j < NB; ++j)
          w[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + j * K + k)));
        for (int i = 0; i < MB; ++i) {
          const __m512i xv = _mm512_loadu_si512(x + i * K + k);
          for (int j = 0; j < NB; ++j) part[i][j] = dot_i16(part[i][j], xv, w[j]);
        }
      }
      for (int j = 0; j < NB; ++j) {
        const float s = w8.ws != nullptr ? w8.ws[j * w8.groups + k0 / WG] : 1.0f;
        for (int i = 0; i < MB; ++i)
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(part[i][j]), _mm512_set1_ps(xs[i * groups + g] * s), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) out[i * NB + j] = _mm512_reduce_add_ps(acc[i][j]);
}
#else
template <int MB, int NB>
inline void dot_block_i16(const int16_t*, const float*, int64_t, const int8_t*, WScales, float*) {}
#endif

// The activations of one call, in the form the chosen inner product reads.
struct Acts {
  const float* f;    // [M, K] fp32 (fp32 path)
  const int16_t* i;  // [M, K] int16 (int16 path), or nullptr
  const float* s;    // [M, K / G] scales of the int16 path
  int64_t K;
};

template <int MB, int NB>
inline void dot_block_any(const Acts& a, int64_t m, const int8_t* q, WScales w8, float* out) {
  if (a.i != nullptr) {
    dot_block_i16<MB, NB>(a.i + m * a.K, a.s + m * (a.K / G), a.K, q, w8, out);
  } else {
    dot_block<MB, NB>(a.f + m * a.K, a.K, q, w8, out);
  }
}

// y rows [m, m + MB), channels [n0, n1); scale: [N] per channel, or [N, K / WG] when grouped
template <int MB, typename T>
void rows_block(const Acts& a, int64_t m, const int8_t* q, const float* scale, bool grouped, int64_t n0,
                int64_t n1, T* y, int64_t N) {
  constexpr int NB = MB <= 2 ? 4 : 2;
  const int64_t K = a.K, groups = K / WG;
  float out[MB * NB];
  T* ym = y + m * N;
  for (int64_t n = n0; n < n1;) {
    const int nb = n + NB <= n1 ? NB : 1;
    const WScales w8{grouped ? scale + n * groups : nullptr, groups};
    if (nb == NB) {
      dot_block_any<MB, NB>(a, m, q + n * K, w8, out);
    } else {
      dot_block_any<MB, 1>(a, m, q + n * K, w8, out);
    }
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < nb; ++j) from_f(ym + i * N + n + j, out[i * nb + j] * (grouped ? 1.0f : scale[n + j]));
    n += nb;
  }
}

template <typename T>
void int8_linear_impl(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const float* in_scale,
                      at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  std::vector<float> xf(M * K);
  if (in_scale) {  // x / s of the input-channel scales, in fp32 (no rounding to x's dtype)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) xf[m * K + k] = to_f(xp[m * K + k]) * in_scale[k];
  } else {
    for (int64_t i = 0; i < M * K; ++i) xf[i] = to_f(xp[i]);
  }
  std::vector<int16_t> xi;
  std::vector<float> xs;
  Acts a{xf.data(), nullptr, nullptr, K};
  if (HAVE_I16 && K % G == 0) {
    xi.resize(M * K);
    xs.resize(M * (K / G));
    quantize_i16(xf.data(), M, K, xi.data(), xs.data());
    a.i = xi.data();
    a.s = xs.data();
  }
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  const bool grouped = scale.dim() == 2;
  T* yp = reinterpret_cast<T*>(y.data_ptr());
  constexpr int64_t CH = 64;  // channels per chunk: enough work to amortize the fork, even splits
  at::parallel_for(0, (N + CH - 1) / CH, 1, [&](int64_t b, int64_t e) {
    const int64_t n0 = b * CH, n1 = std::min(N, e * CH);
    for (int64_t m = 0; m < M; m += 4) {
      switch (std::min<int64_t>(4, M - m)) {
        case 1: rows_block<1>(a, m, qp, sp, grouped, n0, n1, yp, N); break;
        case 2: rows_block<2>(a, m, qp, sp, grouped, n0, n1, yp, N); break;
        case 3: rows_block<3>(a, m, qp, sp, grouped, n0, n1, yp, N); break;
        default: rows_block<4>(a, m, qp, sp, grouped, n0, n1, yp, N); break;
      }
    }
  });
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const std::optional<at::Tensor>& in_scale) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "int8_linear: contiguous [M, K] x");
  TORCH_CHECK(q.dim() == 2 && q.is_contiguous() && q.scalar_type() == at::kChar, "int8_linear: contiguous int8 [N, K] q");
  TORCH_CHECK(q.size(1) == x.size(1) && x.size(1) % 16 == 0, "int8_linear: K must match and be a multiple of 16");
  TORCH_CHECK(scale.is_contiguous() && scale.scalar_type() == at::kFloat &&
                  ((scale.dim() == 1 && scale.size(0) == q.size(0)) ||
                   (scale.dim() == 2 && scale.size(0) == q.size(0) && x.size(1) % WG == 0 &&
                    scale.size(1) == x.size(1) / WG)),
              "int8_linear: fp32 [N] scale, or [N, K / 32] for groups of 32 inputs");
  const float* is = nullptr;
  if (in_scale.has_value()) {
    TORCH_CHECK(in_scale->dim() == 1 && in_scale->is_contiguous() && in_scale->scalar_type() == at::kFloat &&
                    in_scale->size(0) == x.size(1),
                "int8_linear: in_scale must be a contiguous fp32 [K]");
    is = in_scale->data_ptr<float>();
  }
  at::Tensor y = at::empty({x.size(0), q.size(0)}, x.options());
  if (x.scalar_type() == at::kFloat) {
    int8_linear_impl<float>(x, q, scale, is, y);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "int8_linear: float32 or bfloat16 x");
    int8_linear_impl<uint16_t>(x, q, scale, is, y);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor q, Tensor scale, Tensor? in_scale=None) -> Tensor", &int8_linear);
}
