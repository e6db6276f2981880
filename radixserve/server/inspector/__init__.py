"""The radix-cache inspector: ``GET /cache/tree``, ``GET /cache/stats`` and the ``/dashboard``
page (docs/INSPECTOR.md).

Owns: ``routes`` (``inspector_router``; text previews decoded only with
``--cache-inspector-text``), ``models`` (the response models) and the static ``dashboard/`` page.
Must not touch: the tree -- the scheduler owns it and answers ``ControlReq`` ("cache_tree",
"cache_stats") with token ids; this package only renders those answers and never shows a
salted (tenant) node's text.  From ``server`` it imports only ``openapi_doc``, ``req_state``
and ``tenancy.accounting`` (the caller's key).
Modules are imported directly; nothing is re-exported here.
"""
