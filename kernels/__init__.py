"""Triton kernels for attention over the paged KV pool (page size 1).

Importable only as ``radixserve.kernels`` (pyproject maps this folder there); never as a
bare ``kernels`` module.  Importing it requires triton.  Under ``TRITON_INTERPRET=1`` the
kernels run on CPU tensors (that is how tests/test_kernels.py checks them).
"""
from radixserve.kernels.decode_attention import alloc_decode_buffers, decode_attention_fwd
from radixserve.kernels.extend_attention import extend_attention_fwd
from radixserve.kernels.kv_store import store_kv

__all__ = ["alloc_decode_buffers", "decode_attention_fwd", "extend_attention_fwd", "store_kv"]
