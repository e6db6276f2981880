"""The data-parallel router: one HTTP front for several radixserve replicas, routing each
request to the replica most likely to hold its prefix in cache (``radixserve router``).

Owns: ``app`` (``Router``, ``create_router_app``: the replicas' routes proxied, admin routes),
``prefix_tree.PrefixTree`` (approximate, per replica), ``route_key`` (the text a request is routed
by), ``policy`` (``RoundRobin``, ``LeastLoad``, ``CacheAware``), ``proxy.Proxy`` (retries, clean
failures), ``replicas.ReplicaSet`` (health, requests in flight), ``metrics`` and ``launch``
(``run_router``; ``serve_dp`` for ``serve --dp-size N``).
Must not touch: any replica's internals -- it is a client of their HTTP API only; it imports
``config``, ``proc`` and ``server.http_utils``, never engine, scheduler, worker, model or torch.
Modules are imported directly; nothing is re-exported here.
"""
