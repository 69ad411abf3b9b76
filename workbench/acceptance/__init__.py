"""The drafter and its acceptance on real text: a DFlash-style block drafter trained for a real target
(SmolLM2-135M-Instruct) on chat, math and code, and DDTree's accepted length measured the way the field does.

- :mod:`~workbench.acceptance.corpora` - offline corpora from PyPI packages (chat, math, code), with licences and
  held-out splits; :mod:`~workbench.acceptance.gguf_target` - the packaged GGUF target and its loader;
- :mod:`~workbench.acceptance.target` - :class:`HFTarget` (verify forward over a tree, KV commit, hidden-state
  capture), :func:`ddtree_generate`, :func:`greedy_generate`, :func:`tiny_llama`;
  :mod:`~workbench.acceptance.fastllama` - a static-KV-cache Llama whose greedy decode is one CUDA graph (the data);
- :mod:`~workbench.acceptance.train` - the drafter's training (KL + CE, validation, best checkpoint, early stop);
- :mod:`~workbench.acceptance.simulate` - the replayed measurement (chain, budgets, prompt lookup);
  :mod:`~workbench.acceptance.measure` - accepted length, intervals, hit rates, :func:`acceptance_for`;
- :mod:`~workbench.acceptance.run` - the pipeline end to end; :mod:`~workbench.acceptance.drafters` - the shipped
  drafters under data/drafters; :mod:`~workbench.acceptance.cli` - ``workbench drafter``;
- :mod:`~workbench.acceptance.figures` - notebook 06's demo, figures and reading.
"""
