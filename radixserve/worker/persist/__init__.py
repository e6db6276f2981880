"""Warm restart's worker side (``--cache-persist-dir``; docs/WARM_RESTART.md).

Owns: ``store.PrefixStore`` (copies the KV of the requested slots out of the pool and writes
the file on a background thread; restores KV into the slots the scheduler reserved;
``fingerprint``: the model and numerics a file must match) and ``file_format`` (``PrefixFile``:
token ids and KV, versioned and checksummed; ``write_prefix_file`` / ``read_prefix_file``).
Must not touch: the tree or the allocator -- the scheduler picks the prefixes and reserves the
slots (``scheduler/cache_persist.py``); it runs on the worker's thread between steps only, and
a bad file is skipped with a warning, never raised.
Modules are imported directly; nothing is re-exported here.
"""
