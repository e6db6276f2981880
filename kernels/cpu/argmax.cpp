// Greedy sampling's row argmax (see radixserve/worker/sampler.py): the index of the first
// maximal value of each row of fp32 logits [B, V], or of the row's first NaN when it has one,
// exactly what torch's max(dim=-1).indices returns, in two vectorized passes per row (max and
// NaN count, then the first index that holds it) instead of torch's scalar index-tracking loop.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

int64_t row_argmax(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int32_t nans = 0;
#pragma omp simd reduction(max : mx) reduction(+ : nans)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    nans += v != v;
    mx = v > mx ? v : mx;
  }
  if (nans) {
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(x[i])) return i;
  }
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == mx) return i;
  return 0;  // not reached for n > 0: some element equals the maximum
}

at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1 && x.size(1) > 0,
              "argmax_rows: fp32 [B, V] with V > 0 and contiguous rows");
  const int64_t rows = x.size(0), n = x.size(1), stride = x.stride(0);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) op[r] = row_argmax(xp + r * stride, n);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) { m.def("argmax_rows", &argmax_rows); }
