"""KV memory: the token slots (page size 1), who holds each one, and the tensors behind them.

Owns: ``allocator.SlotAllocator`` (free slots; slot 0 is reserved padding), ``kv_pool.KVPool``
(per-layer K/V tensors indexed by slot), ``kv_quant`` (the packed rows of a quantized pool and
host tier: one-byte int8/fp8 codes and an fp32 scale per token and KV head),
``req_to_token.ReqToTokenPool`` (request row -> slots), the prefix caches behind
``prefix_cache.PrefixCache`` (``radix_cache.RadixCache`` over ``tree_node.TreeNode``;
``no_prefix_cache.NoPrefixCache``; ``hiradix_cache.HiRadixCache``, the hierarchical cache, whose
nodes also live in a host and a disk tier: ``tier_state.TierState`` keeps those tiers' slots,
blocks and counters and ``tier_eviction`` demotes pool -> host -> disk -> out, every move sent to
the worker as an ``ipc.tier_link`` request), the tree's readers ``continuation`` (speculation)
and ``tree_inspect`` (the inspector), the counters ``cache_stats``, and warm restart's
``hot_prefixes`` (picks the hottest prefixes, puts restored ones back); for models with
sliding-window layers, ``swa_slots`` (the second pool's slots beside the full ones) and
``swa_reclaim`` (which sliding KV no window reads).  The invariant -- every slot is free, owned
by one tree node or held by one running request, with lock counts matching -- is
``invariants.check_memory_invariants``.
Must not touch: policy -- it decides nothing.  ``scheduler.kv_manager.KVManager`` is the only
writer of the allocator, the tree and the scheduler's table (scheduler thread only); only the
worker writes the ``KVPool``.  It imports only ``ipc.persist_link`` and ``ipc.tier_link`` (never
scheduler, worker, model).
Modules are imported directly; nothing is re-exported here.
"""
