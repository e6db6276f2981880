// Multi-LoRA's deltas for a batch whose rows use different adapters (radixserve/worker/lora/):
// a segmented gather matrix-vector product (S-LoRA / Punica's SGMV) over the stacked slots of
// worker/lora/slots.py.  Rows are grouped by slot (segments); for each block of up to 8 rows of
// one segment, t = A_slot x (the slot's parts x rank rows of A, each read once for the block) and
// then y[:, part columns] += t_part B_part (the part's own columns only, skipping the zero
// blocks the stacked B holds for the GEMM path).  fp32 accumulation; bf16 rows are rounded once.
//
// lora_sgmv_(y [T, N], x [T, K], a [S*P*R, K], b [S*P*R, N], rows [T'] (the rows, grouped),
//            bounds [nseg + 1], slots [nseg], parts P, rank R, cols [P + 1]) -> y changed in place.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"
#include "vec.h"

namespace {

using namespace radixserve_cpu;

constexpr int64_t BLOCK = 8;  // rows of one segment sharing each read of A and B

template <typename T>
void to_float(float* out, const T* in, int64_t n) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) vstore(out + k, load16(in + k));
  for (; k < n; ++k) out[k] = to_f(in[k]);
}

// t[r][i] = A[i] . xf[r] for the block's n rows (xf: fp32 [n, K]); each 16 floats of A are
// converted once and used for every row
template <typename T>
void block_t(float* t, const T* a, const float* xf, int64_t n, int64_t PR, int64_t K) {
  for (int64_t i = 0; i < PR; ++i) {
    const T* arow = a + i * K;
    v16 acc[BLOCK];
    for (int64_t r = 0; r < n; ++r) acc[r] = v16{};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const v16 av = load16(arow + k);
      for (int64_t r = 0; r < n; ++r) acc[r] += av * vload(xf + r * K + k);
    }
    for (int64_t r = 0; r < n; ++r) {
      float s = hsum(acc[r]);
      for (int64_t kk = k; kk < K; ++kk) s += to_f(arow[kk]) * xf[r * K + kk];
      t[r * PR + i] = s;
    }
  }
}

// acc[r][c0:c0+width] += sum_j t[r][j] * B[j][c0:...] over the part's R rows; each 16 values of B
// are converted once and used for every row
template <typename T>
void block_b(float* acc, const float* t, const T* b, int64_t n, int64_t PR, int64_t R, int64_t N, int64_t c0,
             int64_t width) {
  int64_t c = 0;
  for (; c + 16 <= width; c += 16) {
    v16 y[BLOCK];
    for (int64_t r = 0; r < n; ++r) y[r] = vload(acc + r * N + c0 + c);
    for (int64_t j = 0; j < R; ++j) {
      const v16 bv = load16(b + j * N + c0 + c);
      for (int64_t r = 0; r < n; ++r) y[r] += bv * t[r * PR + j];
    }
    for (int64_t r = 0; r < n; ++r) vstore(acc + r * N + c0 + c, y[r]);
  }
  for (; c < width; ++c)
    for (int64_t j = 0; j < R; ++j) {
      const float bv = to_f(b[j * N + c0 + c]);
      for (int64_t r = 0; r < n; ++r) acc[r * N + c0 + c] += bv * t[r * PR + j];
    }
}

template <typename T>
void sgmv(T* y, const T* x, const T* a, const T* b, const int64_t* rows, const int64_t* bounds, const int64_t* slots,
          int64_t nseg, int64_t K, int64_t N, int64_t P, int64_t R, const int64_t* cols) {
  std::vector<std::pair<int64_t, int64_t>> items;  // (segment, first row index into rows)
  for (int64_t s = 0; s < nseg; ++s)
    for (int64_t i = bounds[s]; i < bounds[s + 1]; i += BLOCK) items.emplace_back(s, i);
  const int64_t PR = P * R;
  at::parallel_for(0, int64_t(items.size()), 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> t(BLOCK * PR), acc(BLOCK * N), xf(BLOCK * K);
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t seg = items[it].first, first = items[it].second;
      const int64_t n = std::min(BLOCK, bounds[seg + 1] - first);
      const int64_t base = slots[seg] * PR;
      for (int64_t r = 0; r < n; ++r) {
        to_float(xf.data() + r * K, x + rows[first + r] * K, K);
        to_float(acc.data() + r * N, y + rows[first + r] * N, N);
      }
      block_t(t.data(), a + base * K, xf.data(), n, PR, K);
      for (int64_t p = 0; p < P; ++p)
        block_b(acc.data(), t.data() + p * R, b + (base + p * R) * N, n, PR, R, N, cols[p], cols[p + 1] - cols[p]);
      for (int64_t r = 0; r < n; ++r) {
        T* yr = y + rows[first + r] * N;
        for (int64_t c = 0; c < N; ++c) from_f(yr + c, acc[r * N + c]);
      }
    }
  });
}

void lora_sgmv_(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, const at::Tensor& rows,
                const at::Tensor& bounds, const at::Tensor& slots, int64_t parts, int64_t rank, const at::Tensor& cols) {
  const auto dt = y.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "lora_sgmv_: fp32 or bf16");
  TORCH_CHECK(x.scalar_type() == dt && a.scalar_type() == dt && b.scalar_type() == dt, "lora_sgmv_: one dtype");
  TORCH_CHECK(y.dim() == 2 && x.dim() == 2 && a.dim() == 2 && b.dim() == 2 && y.is_contiguous() && x.is_contiguous()
              && a.is_contiguous() && b.is_contiguous(), "lora_sgmv_: contiguous 2-D tensors");
  const int64_t K = x.size(1), N = y.size(1), nseg = slots.numel();
  TORCH_CHECK(x.size(0) == y.size(0) && a.size(1) == K && b.size(1) == N && a.size(0) == b.size(0)
              && a.size(0) % (parts * rank) == 0, "lora_sgmv_: shapes");
  TORCH_CHECK(bounds.numel() == nseg + 1 && cols.numel() == parts + 1, "lora_sgmv_: bounds/cols sizes");
  for (auto* t : {&rows, &bounds, &slots, &cols})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "lora_sgmv_: int64 index tensors");
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* bp = bounds.data_ptr<int64_t>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* cp = cols.data_ptr<int64_t>();
  const int64_t num_slots = a.size(0) / (parts * rank);
  TORCH_CHECK(bp[0] == 0 && bp[nseg] == rows.numel() && cp[0] == 0 && cp[parts] == N, "lora_sgmv_: bounds/cols");
  for (int64_t s = 0; s < nseg; ++s) TORCH_CHECK(0 <= sp[s] && sp[s] < num_slots, "lora_sgmv_: slot out of range");
  for (int64_t i = 0; i < rows.numel(); ++i) TORCH_CHECK(0 <= rp[i] && rp[i] < y.size(0), "lora_sgmv_: row out of range");
  if (dt == at::kFloat) {
    sgmv<float>(y.data_ptr<float>(), x.data_ptr<float>(), a.data_ptr<float>(), b.data_ptr<float>(), rp, bp, sp, nseg,
                K, N, parts, rank, cp);
  } else {
    auto u = [](const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
    sgmv<uint16_t>(u(y), u(x), u(a), u(b), rp, bp, sp, nseg, K, N, parts, rank, cp);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("lora_sgmv_(Tensor(a!) y, Tensor x, Tensor a, Tensor b, Tensor rows, Tensor bounds, Tensor slots, int parts, "
        "int rank, Tensor cols) -> ()", &lora_sgmv_);
}
