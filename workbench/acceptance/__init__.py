"""Real acceptance (issue 28): DDTree on a Hugging Face target, a DFlash-style block drafter trained by
self-distillation, acceptance measured per text type and budget.

- :mod:`workbench.acceptance.target` - :class:`HFTarget` (verify forward over a tree with a 4D mask,
  KV commit, hidden-state capture), :func:`ddtree_generate`, :func:`greedy_generate`, :func:`tiny_llama`;
- :mod:`workbench.acceptance.textdata` - text by type (prose, code, math) from packages, seeded
  disjoint train / held-out splits;
- :mod:`workbench.acceptance.train` - self-distillation data and the drafter's training loop;
- :mod:`workbench.acceptance.measure` - accepted length, histograms, per-depth hit rates, speedup;
  :func:`acceptance_for` reads the committed H200 measurements;
- :mod:`workbench.acceptance.figures` - the notebook's plotly figures.
"""
