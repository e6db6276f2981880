"""One module per workload of the programs suite, each with ``make(n, seed=0, *, scale=1.0)``
returning a ``spec.Workload`` (``registry.WORKLOADS`` lists them in order):

``mmlu`` (5-shot select over A-D), ``hellaswag`` (20-shot select over 4 endings),
``tree_of_thought`` (fork, gen, select), ``branch_solve_merge`` (an LLM judge: fork per criterion,
merge), ``skeleton_of_thought`` (skeleton gens stopped at newlines, fork to expand),
``react_agent`` (six Thought/Action gens with a fake tool), ``json_regex`` and ``json_schema``
(constrained JSON extraction), ``multi_turn_short`` and ``multi_turn_long`` (4-turn chat, 16- and
128-token replies), ``rag_pipeline`` (retrieve, gen an answer, select whether it is supported).
"""
