"""The toy world every target runs on: the bigram target model and its vocabulary
(``model``, ``vocab``), the paged attention over the memory pools (``attention``,
``mem_cache``), the kernel stand-ins (``verify``, ``drafter``, ``ngram``, ``tree``,
``graph_runner``, ``bitmask``, declared through ``kernel_op``), host staging (``memory``),
the requests' lifecycle every engine keeps (``requests``) and the server args they all read
(``server_args``).

The mirror (``impl/``), the sglang target and the vLLM target each drive their own engine
over these same pieces, so a trial of one is judged like a trial of another. Like
``impl/``, it reaches the rest of the tree only through the fault-point hooks
(``seams.faults``) and the run's words (``seams.vocab``).
"""
