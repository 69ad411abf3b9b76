"""Throughput diagnosis (notebook 03, papers/context_diagnosis.md, ``workbench sweep``).

- :mod:`workbench.rates` (shared with the HTTP client :mod:`workbench.client`): the rate arithmetic
  (two-point, sustained, accepted length / step time and how far a measured rate is from it);
- :mod:`workbench.sweep.engine`: the engine sweep over contexts, methods and concurrency;
- :mod:`workbench.sweep.phases`: the captured step's terms by kernel family (CUDA profiler records);
- :mod:`workbench.sweep.eager_phases`: per-phase times of the eager reference decode;
- :mod:`workbench.sweep.layout`: KV layout under churn (fragmentation metric, attention time);
- :mod:`workbench.sweep.run`: one sweep end to end (the synthetic model, every part, merging runs);
- :mod:`workbench.sweep.figures`: the plotly figures of notebook 03.
"""
