// The quantizing store of a packed KV pool (radixserve/mem_cache/kv_quant.py, kv_packed.h):
// store_kv_packed(k, v, loc, k_buf, v_buf, kv_format) writes, for every new token i and KV head
// h, the packed row of k[i, h] at k_buf[loc[i], h] (and of v at v_buf): scale = max|x| / qmax
// (at least 1e-30 / qmax), code = x / scale rounded half to even and clamped (int8) or converted
// as torch converts fp32 to fp8.  The same arithmetic as kv_quant.quantize, so a row written here
// equals the one torch writes bit for bit.  One call per layer instead of ~10 torch ops.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "kv_packed.h"

namespace {

using namespace radixserve_cpu;

template <typename F>
inline uint8_t encode(float x) {
  if constexpr (std::is_same_v<F, QInt8>) {
    return uint8_t(int8_t(std::min(127.0f, std::max(-127.0f, std::nearbyint(x)))));
  } else if constexpr (std::is_same_v<F, QE4M3>) {
    return c10::Float8_e4m3fn(x).x;
  } else {
    return c10::Float8_e5m2(x).x;
  }
}

template <typename F>
constexpr float qmax() {
  if constexpr (std::is_same_v<F, QInt8>) return 127.0f;
  if constexpr (std::is_same_v<F, QE4M3>) return 448.0f;
  return 57344.0f;
}

// One tensor's rows: src [n, Hkv, D] (rows strided by stride0, heads by stride1, dims contiguous).
template <typename T, typename F>
void pack_rows(const T* src, int64_t stride0, int64_t stride1, const int64_t* loc, uint8_t* dst, int64_t n,
               int64_t Hkv, int64_t D) {
  at::parallel_for(0, n * Hkv, 64, [&](int64_t b, int64_t e) {
    float x[1024];
    for (int64_t r = b; r < e; ++r) {
      const int64_t i = r / Hkv, h = r % Hkv;
      const T* s = src + i * stride0 + h * stride1;
      float amax = 0.0f;
      for (int64_t d = 0; d < D; ++d) {
        x[d] = to_f(s[d]);
        amax = std::max(amax, std::fabs(x[d]));
      }
      const float scale = std::max(amax, 1e-30f) / qmax<F>();
      uint8_t* row = dst + (loc[i] * Hkv + h) * (D + 4);
      for (int64_t d = 0; d < D; ++d) row[d] = encode<F>(x[d] / scale);
      std::memcpy(row + D, &scale, sizeof(scale));
    }
  });
}

template <typename T>
void pack(const at::Tensor& x, const int64_t* loc, at::Tensor& buf, int64_t kv_format) {
  const int64_t n = x.size(0), Hkv = x.size(1), D = x.size(2);
  const T* src = reinterpret_cast<const T*>(x.data_ptr());
  uint8_t* dst = buf.data_ptr<uint8_t>();
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  switch (kv_format) {
    case KV_INT8: return pack_rows<T, QInt8>(src, s0, s1, loc, dst, n, Hkv, D);
    case KV_FP8_E4M3: return pack_rows<T, QE4M3>(src, s0, s1, loc, dst, n, Hkv, D);
    default: return pack_rows<T, QE5M2>(src, s0, s1, loc, dst, n, Hkv, D);
  }
}

void check(const at::Tensor& x, const at::Tensor& buf, const at::Tensor& loc) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.size(2) <= 1024 && x.size(2) % 4 == 0,
              "store_kv_packed: k/v [n, Hkv, D] with contiguous dims, D % 4 == 0, D <= 1024");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "store_kv_packed: k/v in float32 or bfloat16");
  TORCH_CHECK(buf.scalar_type() == at::kByte && buf.is_contiguous() && buf.dim() == 3 && buf.size(1) == x.size(1) &&
                  buf.size(2) == x.size(2) + 4, "store_kv_packed: buffers uint8 [slots, Hkv, D + 4]");
  TORCH_CHECK(loc.scalar_type() == at::kLong && loc.is_contiguous() && loc.size(0) == x.size(0),
              "store_kv_packed: loc int64 [n]");
  const int64_t* l = loc.data_ptr<int64_t>();
  for (int64_t i = 0; i < loc.size(0); ++i)
    TORCH_CHECK(l[i] >= 0 && l[i] < buf.size(0), "store_kv_packed: slot ", l[i], " out of range");
}

void store_kv_packed(const at::Tensor& k, const at::Tensor& v, const at::Tensor& loc, at::Tensor k_buf,
                     at::Tensor v_buf, int64_t kv_format) {
  TORCH_CHECK(kv_format >= KV_INT8 && kv_format <= KV_FP8_E5M2, "store_kv_packed: kv_format 1, 2 or 3");
  check(k, k_buf, loc);
  check(v, v_buf, loc);
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "store_kv_packed: k and v share one dtype");
  const int64_t* l = loc.data_ptr<int64_t>();
  if (k.scalar_type() == at::kFloat) {
    pack<float>(k, l, k_buf, kv_format);
    pack<float>(v, l, v_buf, kv_format);
  } else {
    pack<uint16_t>(k, l, k_buf, kv_format);
    pack<uint16_t>(v, l, v_buf, kv_format);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("store_kv_packed(Tensor k, Tensor v, Tensor loc, Tensor(a!) k_buf, Tensor(b!) v_buf, int kv_format) -> ()",
        &store_kv_packed);
}
