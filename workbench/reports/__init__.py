"""Generated blocks of the papers and the README, read from data/measurements (no measured number typed by hand).

- :mod:`~workbench.reports.papers`: the block machinery every paper shares (render, ``--check``, tables);
- one module per paper: :mod:`~workbench.reports.ddtree` (``papers/ddtree_kernels.md``),
  :mod:`~workbench.reports.moe` with :mod:`~workbench.reports.moe_plots` (``papers/moe_int4.md``),
  :mod:`~workbench.reports.projection` (``papers/b300_projection.md``), :mod:`~workbench.reports.context`
  (``papers/context_diagnosis.md``), :mod:`~workbench.reports.acceptance` (``papers/drafter_acceptance.md``),
  :mod:`~workbench.reports.serving` (``papers/serving.md``);
- :mod:`~workbench.reports.readme`: the README's findings and results blocks.
"""
