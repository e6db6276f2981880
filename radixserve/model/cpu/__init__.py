"""The CPU step's fast path; each piece equals the module path it replaces
(tests/core/test_layer_loop.py, tests/kernels/test_fused_ops.py).

- ``fused_ops``: ``TorchOps`` (the reference) and ``NativeCpuOps`` (the fused C++ elementwise ops)
- ``layer_loop``: ``run_layers``, the decoder layers as one flat loop over the native ops
- ``layer_stack``: ``LayerStack``, every decoder layer of a step in one native call
"""
