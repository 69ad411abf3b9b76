"""Throughput diagnosis (issue 26, notebook 03, ``workbench sweep``).

- :mod:`workbench.sweep.rates`: the rate arithmetic (two-point, sustained, accepted length /
  step time and how far a measured rate is from it);
- :mod:`workbench.sweep.engine`: the engine sweep over contexts, methods and concurrency;
- :mod:`workbench.sweep.layout`: KV layout under churn (fragmentation metric, attention time);
- :mod:`workbench.sweep.figures`: the plotly figures of notebook 03.
"""
