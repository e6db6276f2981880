// Every decoder layer of a Llama-family step in one call (see radixserve/model/layer_stack.py).
//
// A LayerStack holds one model's per-layer weights (the two norms, the four linear layers as
// this step's row count runs them) and its KV pool layers; run() does, per layer, what
// layer_loop.run_layers does from Python: the same ops through the dispatcher, in the same
// order, on the same buffers, so the results are bit-identical.  What it saves is Python: a
// decode step of SmolLM2-135M is ~270 op calls, each ~1-3 us from Python.
//
// Linear layers, by kind (w, a, b as given per layer):
//   BLOCKED4 / BLOCKED8: blocked_linear(x, w, 4 or 8, a)   (a: the input scale or None)
//   INT8:                int8_linear(x, w, a, b)           (a: scales, b: input scale or None)
//   PACKED:              mkldnn::_linear_pointwise(x, w, a) (oneDNN's prepacked weight, a: bias)
//   DENSE:               at::linear(x, w, a)
// (Prefetching o_proj's first 64 KB before each attention call measured no faster on the AMD
// Zen 4 VM: one core's prefetches stall on its fill buffers instead of overlapping the kernel.)
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace {

enum Kind : int64_t { INT8 = 1, PACKED = 2, DENSE = 3, BLOCKED4 = 4, BLOCKED8 = 8 };
constexpr int64_t PER_LAYER = 4;              // qkv, o, gate_up, down

using OptT = std::optional<at::Tensor>;

using TRef = const at::Tensor&;
// the C++ signatures of the ops (as their sources define them)
using BlockedSig = at::Tensor(TRef, TRef, int64_t, const OptT&);
using Int8Sig = at::Tensor(TRef, TRef, TRef, const OptT&);
using RmsSig = at::Tensor(TRef, TRef, double);
using AddRmsSig = void(at::Tensor, at::Tensor, TRef, double);
using RopeStoreSig = void(TRef, TRef, TRef, TRef, at::Tensor, at::Tensor, TRef, at::Tensor);
using SiluMulSig = at::Tensor(TRef);
using NormHeadsSig = void(at::Tensor, TRef, TRef, int64_t, int64_t, double);
using AttentionSig = void(TRef, TRef, TRef, TRef, TRef, TRef, TRef, TRef, TRef, double, at::Tensor, const OptT&,
                          const OptT&, int64_t, double);

template <typename Sig>
c10::TypedOperatorHandle<Sig> typed(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

struct Ops {
  c10::TypedOperatorHandle<BlockedSig> blocked = typed<BlockedSig>("radixserve_cpu::blocked_linear");
  c10::TypedOperatorHandle<Int8Sig> int8 = typed<Int8Sig>("radixserve_cpu::int8_linear");
  c10::TypedOperatorHandle<RmsSig> rms = typed<RmsSig>("radixserve_cpu::rms_norm");
  c10::TypedOperatorHandle<AddRmsSig> add_rms = typed<AddRmsSig>("radixserve_cpu::add_rms_norm");
  c10::TypedOperatorHandle<RopeStoreSig> rope_store = typed<RopeStoreSig>("radixserve_cpu::rope_store_kv");
  c10::TypedOperatorHandle<SiluMulSig> silu_mul = typed<SiluMulSig>("radixserve_cpu::silu_mul");
  c10::TypedOperatorHandle<NormHeadsSig> norm_heads = typed<NormHeadsSig>("radixserve_cpu::rms_norm_heads_");
  c10::TypedOperatorHandle<AttentionSig> attention = typed<AttentionSig>("radixserve_cpu::paged_attention");
};

const Ops& ops() {
  static const Ops o;  // after every source's ops are registered (first use, not load time)
  return o;
}

struct Linear {
  int64_t kind;
  at::Tensor w;
  OptT a, b;
};

class LayerStack : public torch::CustomClassHolder {
 public:
  LayerStack(std::vector<at::Tensor> norms, std::vector<int64_t> kinds, std::vector<at::Tensor> w,
             c10::List<OptT> a, c10::List<OptT> b, std::vector<at::Tensor> k_bufs, std::vector<at::Tensor> v_bufs,
             double eps, int64_t heads)
      : norms_(std::move(norms)), k_bufs_(std::move(k_bufs)), v_bufs_(std::move(v_bufs)), eps_(eps), heads_(heads) {
    const size_t layers = k_bufs_.size();
    TORCH_CHECK(layers > 0 && v_bufs_.size() == layers && norms_.size() == 2 * layers &&
                    kinds.size() == PER_LAYER * layers && w.size() == kinds.size() && a.size() == kinds.size() &&
                    b.size() == kinds.size(),
                "LayerStack: per layer two norms, four linear layers and a K and a V buffer");
    TORCH_CHECK(heads > 0 && k_bufs_[0].dim() == 3, "LayerStack: heads > 0 and K/V buffers [S, Hkv, D]");
    for (size_t i = 0; i < kinds.size(); ++i) {
      const int64_t k = kinds[i];
      TORCH_CHECK(k == INT8 || k == PACKED || k == DENSE || k == BLOCKED4 || k == BLOCKED8,
                  "LayerStack: unknown linear kind ", k);
      TORCH_CHECK(k != INT8 || a.get(i).has_value(), "LayerStack: int8_linear needs its scales");
      lin_.push_back(Linear{k, w[i], a.get(i), b.get(i)});
    }
    ops();
    if (std::find(kinds.begin(), kinds.end(), int64_t(PACKED)) != kinds.end())
      packed_ = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  }

  int64_t num_layers() const { return static_cast<int64_t>(k_bufs_.size()); }
  // Qwen 3's per-head q/k RMSNorms: a q and a k weight per layer, applied to the fused projection
  // in place before rotary (rms_norm_heads_, as layer_loop does).
  void set_qk_norms(std::vector<at::Tensor> weights, double eps) {
    TORCH_CHECK(weights.size() == 2 * k_bufs_.size(), "LayerStack.set_qk_norms: a q and a k weight per layer");
    qk_norms_ = std::move(weights);
    qk_eps_ = eps;
  }

  // x [T, hidden]: the embeddings (consumed); returns (the last layer's MLP output, the residual
  // stream before it), as layer_loop.run_layers.  The plan's tensors are the native attention
  // backend's for this step (no dense blocks).
  std::tuple<at::Tensor, at::Tensor> run(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos,
                                         const at::Tensor& sin, const at::Tensor& loc, const at::Tensor& r2t,
                                         const at::Tensor& tasks, const at::Tensor& entry_tok,
                                         const at::Tensor& tok_ptr, const at::Tensor& tok_entries, double scaling) {
    const Ops& o = ops();
    const int64_t tokens = x.size(0), dim = k_bufs_[0].size(2);
    TORCH_CHECK(x.dim() == 2, "LayerStack.run: x [T, hidden]");
    at::Tensor q = at::empty({tokens, heads_, dim}, x.options());  // one rotated-q buffer for every layer
    at::Tensor out = at::empty({tokens, heads_, dim}, k_bufs_[0].options());
    at::Tensor residual;
    for (int64_t l = 0; l < num_layers(); ++l) {
      const Linear* lin = &lin_[PER_LAYER * l];
      if (l == 0) {
        residual = x.to(at::kFloat);
        x = o.rms.call(x.contiguous(), norms_[0], eps_);
      } else {
        o.add_rms.call(x, residual, norms_[2 * l], eps_);
      }
      at::Tensor qkv = linear(lin[0], x);
      if (!qk_norms_.empty()) {
        qkv = qkv.contiguous();
        o.norm_heads.call(qkv, qk_norms_[2 * l], qk_norms_[2 * l + 1], heads_, k_bufs_[l].size(1), qk_eps_);
      }
      o.rope_store.call(qkv, positions, cos, sin, k_bufs_[l], v_bufs_[l], loc, q);
      o.attention.call(q, k_bufs_[l], v_bufs_[l], r2t, tasks, entry_tok, positions, tok_ptr, tok_entries, scaling,
                       out, std::nullopt, std::nullopt, 0, 0.0);  // plain layers only (no window, no cap)
      x = linear(lin[1], out.view({tokens, heads_ * dim})).contiguous();
      o.add_rms.call(x, residual, norms_[2 * l + 1], eps_);
      x = linear(lin[3], o.silu_mul.call(linear(lin[2], x).contiguous())).contiguous();
    }
    return {x, residual};
  }

 private:
  at::Tensor linear(const Linear& l, const at::Tensor& x) const {
    switch (l.kind) {
      case BLOCKED4: return ops().blocked.call(x.contiguous(), l.w, 4, l.a);
      case BLOCKED8: return ops().blocked.call(x.contiguous(), l.w, 8, l.a);
      case INT8: return ops().int8.call(x.contiguous(), l.w, *l.a, l.b);
      case DENSE: return at::linear(x, l.w, l.a);
      default: {  // PACKED: the op's schema is oneDNN's (X, W, B?, attr, scalars, algorithm?)
        torch::jit::Stack stack{x.contiguous(), l.w, l.a.has_value() ? c10::IValue(*l.a) : c10::IValue(),
                                c10::IValue(std::string("none")), c10::IValue(c10::List<std::optional<at::Scalar>>()),
                                c10::IValue(std::string(""))};
        packed_->callBoxed(&stack);
        return stack[0].toTensor();
      }
    }
  }

  std::vector<at::Tensor> norms_, k_bufs_, v_bufs_, qk_norms_;
  std::vector<Linear> lin_;
  std::optional<c10::OperatorHandle> packed_;
  double eps_, qk_eps_ = 0.0;
  int64_t heads_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.class_<LayerStack>("LayerStack")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<at::Tensor>, c10::List<OptT>,
                       c10::List<OptT>, std::vector<at::Tensor>, std::vector<at::Tensor>, double, int64_t>())
      .def("run", &LayerStack::run)
      .def("set_qk_norms", &LayerStack::set_qk_norms);
}
