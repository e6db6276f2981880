"""The ``kv_format`` codes of a packed (quantized) KV pool, shared by the native CPU kernels
(``cpu/kv_packed.h``'s ``KVFormat``) and the Triton kernels: the pool's form (``KVPool.quant``;
None for a pool in the model's dtype) -> the integer the kernels take."""
KV_FORMATS = {None: 0, "int8": 1, "fp8_e4m3": 2, "fp8_e5m2": 3}
