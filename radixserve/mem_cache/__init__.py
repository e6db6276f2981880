"""KV memory: the token slots (page size 1), who holds each one, and the tensors behind them.

Owns: ``allocator.SlotAllocator`` (free slots; slot 0 is reserved padding), ``kv_pool.KVPool``
(per-layer K/V tensors indexed by slot), ``req_to_token.ReqToTokenPool`` (request row ->
slots), the prefix caches behind ``prefix_cache.PrefixCache`` (``radix_cache.RadixCache`` over
``tree_node.TreeNode``; ``no_prefix_cache.NoPrefixCache``) and read-only views of the tree:
``continuation`` (speculation), ``hot_prefixes`` (warm restart), ``cache_stats`` and
``tree_inspect`` (the inspector); for models with sliding-window layers, ``swa_slots`` (the
second pool's slots beside the full ones) and ``swa_reclaim`` (which sliding KV no window reads).  The invariant -- every slot is free, owned by one tree node
or held by one running request, with lock counts matching -- is ``invariants.check_memory_invariants``.
Must not touch: policy -- it decides nothing.  ``scheduler.kv_manager.KVManager`` is the only
writer of the allocator, the tree and the scheduler's table (scheduler thread only); only the
worker writes the ``KVPool``.  It imports only ``ipc.persist_link`` (never scheduler, worker, model).
Modules are imported directly; nothing is re-exported here.
"""
