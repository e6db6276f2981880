// Every decoder layer of a step in one call (see radixserve/model/layer_stack.py).
//
// A LayerStack holds one model's per-layer weights (the two norms, the four linear layers as
// this step's row count runs them) and its KV pool layers; run() does, per layer, what
// layer_loop.run_layers does from Python: the same ops through the dispatcher, in the same
// order, on the same buffers, so the results are bit-identical.  What it saves is Python: a
// decode step of SmolLM2-135M is ~270 op calls, each ~1-3 us from Python.
//
// Beyond Llama's layer (set once, after construction): Qwen 3's q/k norms (set_qk_norms),
// Gemma's post-attention / pre- and post-feedforward norms (set_gemma_norms), GeGLU
// (set_activation), a rotary table per layer type (set_rotaries: each layer's index into run's
// cos/sin lists) and layers whose attention differs (set_layer_groups: each layer's index into
// run's per-group plan lists: its K/V store slots, request->slot table, plan, window and cap) and
// a packed (quantized) pool (set_kv_format: rotary writes the new K/V into staging rows, which
// store_kv_packed packs into the pool, and the attention reads packed rows), and LoRA adapters
// (set_lora: the slots' stacked A/B per layer and linear layer; set_lora_step before a run whose
// rows use adapters, clear_lora_step after: each linear layer's output then gets lora_sgmv_'s
// deltas, where layer_loop calls LoRAStep.add).
//
// Linear layers, by kind (w, a, b as given per layer):
//   BLOCKED4 / BLOCKED8: blocked_linear(x, w, 4 or 8, a)   (a: the input scale or None)
//   EXACT4:              blocked_linear_exact(x * a, w, 4)  (float32 x; a: the input scale or None)
//   INT8:                int8_linear(x, w, a, b)           (a: scales, b: input scale or None)
//   PACKED:              mkldnn::_linear_pointwise(x, w, a) (oneDNN's prepacked weight, a: bias)
//   DENSE:               at::linear(x, w, a)
// (Prefetching o_proj's first 64 KB before each attention call measured no faster on the AMD
// Zen 4 VM: one core's prefetches stall on its fill buffers instead of overlapping the kernel.)
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mul.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace {

enum Kind : int64_t { INT8 = 1, PACKED = 2, DENSE = 3, BLOCKED4 = 4, EXACT4 = 5, BLOCKED8 = 8 };
enum Act : int64_t { SILU = 0, GELU_TANH = 1 };  // the gated activation: silu_mul or gelu_tanh_mul
constexpr int64_t PER_LAYER = 4;              // qkv, o, gate_up, down

using OptT = std::optional<at::Tensor>;

using TRef = const at::Tensor&;
// the C++ signatures of the ops (as their sources define them)
using BlockedSig = at::Tensor(TRef, TRef, int64_t, const OptT&);
using ExactSig = at::Tensor(TRef, TRef, int64_t);
using Int8Sig = at::Tensor(TRef, TRef, TRef, const OptT&);
using RmsSig = at::Tensor(TRef, TRef, double);
using AddRmsSig = void(at::Tensor, at::Tensor, TRef, double);
using RopeStoreSig = void(TRef, TRef, TRef, TRef, at::Tensor, at::Tensor, TRef, at::Tensor);
using ActMulSig = at::Tensor(TRef);
using NormHeadsSig = void(at::Tensor, TRef, TRef, int64_t, int64_t, double);
using AttentionSig = void(TRef, TRef, TRef, TRef, TRef, TRef, TRef, TRef, TRef, double, at::Tensor, const OptT&,
                          const OptT&, int64_t, double, int64_t);
using StorePackedSig = void(TRef, TRef, TRef, at::Tensor, at::Tensor, int64_t);
using SgmvSig = void(at::Tensor&, TRef, TRef, TRef, TRef, TRef, TRef, int64_t, int64_t, TRef);

template <typename Sig>
c10::TypedOperatorHandle<Sig> typed(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

struct Ops {
  c10::TypedOperatorHandle<BlockedSig> blocked = typed<BlockedSig>("radixserve_cpu::blocked_linear");
  c10::TypedOperatorHandle<ExactSig> exact = typed<ExactSig>("radixserve_cpu::blocked_linear_exact");
  c10::TypedOperatorHandle<Int8Sig> int8 = typed<Int8Sig>("radixserve_cpu::int8_linear");
  c10::TypedOperatorHandle<RmsSig> rms = typed<RmsSig>("radixserve_cpu::rms_norm");
  c10::TypedOperatorHandle<AddRmsSig> add_rms = typed<AddRmsSig>("radixserve_cpu::add_rms_norm");
  c10::TypedOperatorHandle<RopeStoreSig> rope_store = typed<RopeStoreSig>("radixserve_cpu::rope_store_kv");
  c10::TypedOperatorHandle<ActMulSig> silu_mul = typed<ActMulSig>("radixserve_cpu::silu_mul");
  c10::TypedOperatorHandle<ActMulSig> gelu_tanh_mul = typed<ActMulSig>("radixserve_cpu::gelu_tanh_mul");
  c10::TypedOperatorHandle<NormHeadsSig> norm_heads = typed<NormHeadsSig>("radixserve_cpu::rms_norm_heads_");
  c10::TypedOperatorHandle<AttentionSig> attention = typed<AttentionSig>("radixserve_cpu::paged_attention");
  c10::TypedOperatorHandle<StorePackedSig> store_packed = typed<StorePackedSig>("radixserve_cpu::store_kv_packed");
  c10::TypedOperatorHandle<SgmvSig> sgmv = typed<SgmvSig>("radixserve_cpu::lora_sgmv_");
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

using Tensors = std::vector<at::Tensor>;

// A per-layer index (layer l uses entry index[l] of run's lists; empty: entry 0 for all).
std::vector<int64_t> checked_index(std::vector<int64_t> index, size_t layers, const char* what) {
  TORCH_CHECK(index.size() == layers, "LayerStack.", what, ": an index per layer");
  for (int64_t i : index) TORCH_CHECK(i >= 0, "LayerStack.", what, ": indices >= 0");
  return index;
}

// How many entries run's lists need for ``index``.
size_t entries_needed(const std::vector<int64_t>& index) {
  return index.empty() ? 1 : static_cast<size_t>(*std::max_element(index.begin(), index.end())) + 1;
}

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
      TORCH_CHECK(k == INT8 || k == PACKED || k == DENSE || k == BLOCKED4 || k == EXACT4 || k == BLOCKED8,
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
  // Gemma's layer: a pre- and a post-feedforward norm weight per layer; the attention output is
  // normed by the layer's second norm (rms_norm, not add_rms_norm), added by the pre-feedforward
  // one, and the MLP output normed by the post-feedforward one (the stack's eps for all).
  void set_gemma_norms(std::vector<at::Tensor> weights) {
    TORCH_CHECK(weights.size() == 2 * k_bufs_.size(), "LayerStack.set_gemma_norms: two weights per layer");
    ff_norms_ = std::move(weights);
  }
  void set_activation(int64_t act) {
    TORCH_CHECK(act == SILU || act == GELU_TANH, "LayerStack.set_activation: 0 (silu) or 1 (gelu_tanh)");
    act_ = act;
  }
  void set_rotaries(std::vector<int64_t> index) {
    rotary_ = checked_index(std::move(index), k_bufs_.size(), "set_rotaries");
  }
  void set_layer_groups(std::vector<int64_t> index) {
    group_ = checked_index(std::move(index), k_bufs_.size(), "set_layer_groups");
  }
  // The pool's rows are packed (paged_attention's kv_format: 1 int8, 2 fp8_e4m3, 3 fp8_e5m2).
  void set_kv_format(int64_t format) {
    TORCH_CHECK(format >= 0 && format <= 3, "LayerStack.set_kv_format: 0 to 3");
    TORCH_CHECK(format == 0 || (k_bufs_[0].scalar_type() == at::kByte && k_bufs_[0].size(2) > 4),
                "LayerStack.set_kv_format: packed rows are uint8 [S, Hkv, D + 4]");
    kv_format_ = format;
  }
  // LoRA slots (radixserve/worker/lora/slots.py), an entry per layer and linear layer (qkv, o,
  // gate_up, down): the stacked A and B (None: no adapter targets it), its parts and its parts'
  // column bounds; the tensors are filled in place as adapters move in and out of slots.
  void set_lora(c10::List<OptT> a, c10::List<OptT> b, std::vector<int64_t> parts, std::vector<at::Tensor> cols,
                int64_t rank) {
    const size_t n = PER_LAYER * k_bufs_.size();
    TORCH_CHECK(a.size() == n && b.size() == n && parts.size() == n && cols.size() == n && rank > 0,
                "LayerStack.set_lora: an A, B, part count and column bounds per layer and linear layer");
    lora_.clear();
    for (size_t i = 0; i < n; ++i) {
      TORCH_CHECK(a.get(i).has_value() == b.get(i).has_value(), "LayerStack.set_lora: A and B together");
      lora_.push_back(LoraSlot{a.get(i), b.get(i), parts[i], cols[i]});
    }
    lora_rank_ = rank;
  }
  // This step's rows with an adapter, grouped by slot (lora_sgmv_'s rows, bounds and slots).
  void set_lora_step(at::Tensor rows, at::Tensor bounds, at::Tensor slots) {
    TORCH_CHECK(!lora_.empty(), "LayerStack.set_lora_step: set_lora first");
    step_rows_ = std::move(rows);
    step_bounds_ = std::move(bounds);
    step_slots_ = std::move(slots);
    lora_step_ = true;
  }
  void clear_lora_step() {
    lora_step_ = false;
    step_rows_ = step_bounds_ = step_slots_ = at::Tensor();
  }

  // x [T, hidden]: the embeddings (consumed); returns (the last layer's MLP output, the residual
  // stream before it), as layer_loop.run_layers.  cos/sin: a table per rotary (set_rotaries);
  // the other lists: an entry per attention group (set_layer_groups), the native attention
  // backend's for this step (no dense blocks).
  std::tuple<at::Tensor, at::Tensor> run(at::Tensor x, const at::Tensor& positions, Tensors cos, Tensors sin,
                                         Tensors locs, Tensors r2ts, Tensors tasks, Tensors entry_tok,
                                         Tensors tok_ptr, Tensors tok_entries, std::vector<int64_t> windows,
                                         std::vector<double> caps, double scaling) {
    const Ops& o = ops();
    const int64_t tokens = x.size(0), dim = k_bufs_[0].size(2) - (kv_format_ ? 4 : 0);
    const size_t groups = locs.size();
    TORCH_CHECK(x.dim() == 2, "LayerStack.run: x [T, hidden]");
    TORCH_CHECK(cos.size() == sin.size() && cos.size() >= entries_needed(rotary_),
                "LayerStack.run: a cos/sin per rotary");
    TORCH_CHECK(groups >= entries_needed(group_) && r2ts.size() == groups && tasks.size() == groups &&
                    entry_tok.size() == groups && tok_ptr.size() == groups && tok_entries.size() == groups &&
                    windows.size() == groups && caps.size() == groups,
                "LayerStack.run: per attention group a loc, table, plan, window and cap");
    at::Tensor q = at::empty({tokens, heads_, dim}, x.options());  // one rotated-q buffer for every layer
    at::Tensor out = at::empty({tokens, heads_, dim}, kv_format_ ? x.options() : k_bufs_[0].options());
    at::Tensor k_stage, v_stage, stage_loc;  // a packed pool: this step's K/V before they are packed
    if (kv_format_) {
      k_stage = at::empty({tokens, k_bufs_[0].size(1), dim}, x.options());
      v_stage = at::empty({tokens, k_bufs_[0].size(1), dim}, x.options());
      stage_loc = at::arange(tokens, x.options().dtype(at::kLong));
    }
    at::Tensor residual;
    const bool gemma = !ff_norms_.empty();
    for (int64_t l = 0; l < num_layers(); ++l) {
      const Linear* lin = &lin_[PER_LAYER * l];
      const size_t g = group_.empty() ? 0 : group_[l], r = rotary_.empty() ? 0 : rotary_[l];
      if (l == 0) {
        residual = x.to(at::kFloat);
        x = o.rms.call(x.contiguous(), norms_[0], eps_);
      } else {
        o.add_rms.call(x, residual, norms_[2 * l], eps_);
      }
      at::Tensor qkv = linear(lin[0], x);
      lora_add(PER_LAYER * l, x, qkv);
      if (!qk_norms_.empty()) {
        qkv = qkv.contiguous();
        o.norm_heads.call(qkv, qk_norms_[2 * l], qk_norms_[2 * l + 1], heads_, k_bufs_[l].size(1), qk_eps_);
      }
      if (kv_format_) {
        o.rope_store.call(qkv, positions, cos[r], sin[r], k_stage, v_stage, stage_loc, q);
        o.store_packed.call(k_stage, v_stage, locs[g], k_bufs_[l], v_bufs_[l], kv_format_);
      } else {
        o.rope_store.call(qkv, positions, cos[r], sin[r], k_bufs_[l], v_bufs_[l], locs[g], q);
      }
      o.attention.call(q, k_bufs_[l], v_bufs_[l], r2ts[g], tasks[g], entry_tok[g], positions, tok_ptr[g],
                       tok_entries[g], scaling, out, std::nullopt, std::nullopt, windows[g], caps[g], kv_format_);
      const at::Tensor attn_out = out.view({tokens, heads_ * dim});
      x = linear(lin[1], attn_out);
      lora_add(PER_LAYER * l + 1, attn_out, x);
      x = x.contiguous();
      if (gemma) {  // the attention output is normed before it joins the stream
        x = o.rms.call(x, norms_[2 * l + 1], eps_);
        o.add_rms.call(x, residual, ff_norms_[2 * l], eps_);
      } else {
        o.add_rms.call(x, residual, norms_[2 * l + 1], eps_);
      }
      at::Tensor gate_up = linear(lin[2], x).contiguous();
      lora_add(PER_LAYER * l + 2, x, gate_up);
      const at::Tensor h = act_ == SILU ? o.silu_mul.call(gate_up) : o.gelu_tanh_mul.call(gate_up);
      x = linear(lin[3], h).contiguous();
      lora_add(PER_LAYER * l + 3, h, x);
      if (gemma) x = o.rms.call(x, ff_norms_[2 * l + 1], eps_);
    }
    return {x, residual};
  }

 private:
  struct LoraSlot {
    OptT a, b;
    int64_t parts;
    at::Tensor cols;
  };

  // y += each adapter row's delta for input x, as LoRAStep.add (sgmv) does
  void lora_add(size_t i, const at::Tensor& x, at::Tensor& y) const {
    if (!lora_step_ || !lora_[i].a.has_value()) return;
    const LoraSlot& s = lora_[i];
    at::Tensor y2 = y.view({-1, y.size(-1)});
    ops().sgmv.call(y2, x.reshape({-1, x.size(-1)}).contiguous(), *s.a, *s.b, step_rows_, step_bounds_, step_slots_,
                    s.parts, lora_rank_, s.cols);
  }

  at::Tensor linear(const Linear& l, const at::Tensor& x) const {
    switch (l.kind) {
      case BLOCKED4: return ops().blocked.call(x.contiguous(), l.w, 4, l.a);
      case BLOCKED8: return ops().blocked.call(x.contiguous(), l.w, 8, l.a);
      case EXACT4: return ops().exact.call((l.a.has_value() ? at::mul(x, *l.a) : x).contiguous(), l.w, 4);
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

  std::vector<at::Tensor> norms_, k_bufs_, v_bufs_, qk_norms_, ff_norms_;
  std::vector<Linear> lin_;
  std::vector<LoraSlot> lora_;  // per layer and linear layer (empty: no LoRA)
  at::Tensor step_rows_, step_bounds_, step_slots_;
  bool lora_step_ = false;
  int64_t lora_rank_ = 0;
  std::vector<int64_t> rotary_, group_;  // per layer (empty: all 0)
  std::optional<c10::OperatorHandle> packed_;
  double eps_, qk_eps_ = 0.0;
  int64_t heads_, act_ = SILU, kv_format_ = 0;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.class_<LayerStack>("LayerStack")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<at::Tensor>, c10::List<OptT>,
                       c10::List<OptT>, std::vector<at::Tensor>, std::vector<at::Tensor>, double, int64_t>())
      .def("run", &LayerStack::run)
      .def("set_qk_norms", &LayerStack::set_qk_norms)
      .def("set_gemma_norms", &LayerStack::set_gemma_norms)
      .def("set_activation", &LayerStack::set_activation)
      .def("set_rotaries", &LayerStack::set_rotaries)
      .def("set_layer_groups", &LayerStack::set_layer_groups)
      .def("set_kv_format", &LayerStack::set_kv_format)
      .def("set_lora", &LayerStack::set_lora)
      .def("set_lora_step", &LayerStack::set_lora_step)
      .def("clear_lora_step", &LayerStack::clear_lora_step);
}
