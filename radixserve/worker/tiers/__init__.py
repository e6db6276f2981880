"""The hierarchical cache's worker side (``--enable-hierarchical-cache``; docs/HIERARCHICAL_CACHE.md).

Owns: ``host_tier.TierStore`` (the host tier's KV buffers; carries out the scheduler's
``KVTierReq`` moves between the pool, the host tier and the disk tier), ``kv_codec.HostRows``
(how the host tier stores a token's K or V: exactly, or quantized to int8/fp8_e4m3 rows) and
``block_store.BlockStore`` (the disk tier's block files: written on a background thread in
warm restart's file format, read back with their checksum and fingerprint checked).
Must not touch: the tree, the allocators or the block table -- the scheduler decides every
move (``mem_cache/hiradix_cache.py``).  Runs on the worker's thread between steps; a block that
cannot be read is reported as a failed move, never raised.
Modules are imported directly; nothing is re-exported here.
"""
