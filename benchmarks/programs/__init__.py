"""The programs suite (issue 45): LLM programs in the spirit of the SGLang paper's benchmarks
(MMLU, HellaSwag, tree of thought, an LLM judge, skeleton of thought, a ReAct agent, JSON
decoding, multi-turn chat, RAG), each written once in ``frontend_lang`` and run unchanged on
every engine.

``spec`` (what a workload is: ``spec.Workload``, the ``scale`` rule, the feature names),
``data`` (local data only: ShareGPT text, MT-Bench-style questions, generated facts),
``workloads/`` (one module per workload, each with ``make(n, seed)``), ``registry``
(``registry.WORKLOADS``: name -> ``make``, in the suite's order), ``run`` (the runner: every
workload on every engine at several concurrencies), ``engines`` (the engines behind one
interface), ``completions_backend`` and ``offline_backend`` (``frontend_lang`` backends over
OpenAI-compatible servers and over vLLM's offline API) and ``report`` (the results as tables).

Tests: tests/frontend/test_programs_suite.py runs every workload, small, in process and over
HTTP on the tiny test model and checks the two agree.
"""
