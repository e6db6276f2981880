"""API keys, per-key budgets and usage accounting (``--api-keys-file``, ``--usage-db``; docs/KEYS.md).

Owns: ``keys`` (the keys file, parsed strictly and reloadable: ``KeyStore``),
``key_auth.KeyAuthMiddleware`` (ASGI authentication), ``budget.Ledger`` (token budgets and
rates: reserve at admission, charge at the end), ``accounting.Accounting`` (the one charge
point: ``TokenizerManager.submit`` admits, the end of each sequence settles; a key's salt
namespaces its requests' cache), ``usage_db.UsageDB`` (SQLite) and ``usage_api`` (/v1/usage).
Must not touch: generation -- it admits, refuses, salts and counts, nothing else.  From
``server`` it imports only ``http_utils`` and ``req_state`` (never ``app``, ``launcher`` or
``tokenizer_manager``).
Modules are imported directly; nothing is re-exported here.
"""
